"""Error feedback for 2-3 bit gradients: an adaptive feedback scale gamma from the residual variance (notebook 06
§8d), and a test problem to compare feedback rules and codecs on (``compression.ClippedLowBit``, §8f).

Error feedback with a scale: v = g + gamma * e; send C(v); e <- v - D(C(v)). gamma = 1 is classic error feedback.
With a very coarse quantiser (2-bit: {-s, 0, +s}, s = max|v|) most entries are rounded to 0, their residual piles
up until it crosses s/2 and is released as a full +-s burst: the residual energy saw-tooths and the parameters
oscillate. ``AdaptiveGamma`` measures the residual variance var(e) against the gradient variance var(g)
(exponential averages) and sets gamma = clip(target * sqrt(var(g) / var(e)), gamma_min, 1): while the residual
stays at the gradient's scale it is fed back fully, when it grows past it the feedback is damped (the damped part,
(1 - gamma) * e, is dropped: a bias traded for stability).

    ag = AdaptiveGamma(target=1.0)
    gamma = ag.update(grad, residual)      # before forming v = grad + gamma * residual
    run = ef_quadratic(TwoBit(), steps=200, gamma="adaptive")
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

__all__ = ["AdaptiveGamma", "ef_quadratic"]


class AdaptiveGamma:
    """gamma = clip(target * sqrt(EMA var(g) / EMA var(e)), gamma_min, gamma_max), updated once per step."""

    def __init__(
        self, target: float = 1.0, smoothing: float = 0.9, gamma_min: float = 0.1, gamma_max: float = 1.0
    ) -> None:
        if not (math.isfinite(target) and target > 0):
            raise ValueError(f"target: expected a finite value > 0, got {target}")
        if not 0 <= smoothing < 1:
            raise ValueError(f"smoothing: expected 0 <= smoothing < 1, got {smoothing}")
        if not 0 < gamma_min <= gamma_max:
            raise ValueError(
                f"gamma_min / gamma_max: expected 0 < gamma_min <= gamma_max, got {gamma_min}, {gamma_max}"
            )
        self.target, self.smoothing = target, smoothing
        self.gamma_min, self.gamma_max = gamma_min, gamma_max
        self.var_g: float | None = None
        self.var_e: float | None = None
        self.gamma = gamma_max

    def update(self, grad: torch.Tensor, residual: torch.Tensor) -> float:
        """Feed this step's gradient and current residual; returns the gamma to use for this step."""
        if grad.shape != residual.shape:
            raise ValueError(f"residual: expected shape {tuple(grad.shape)}, got {tuple(residual.shape)}")
        vg, ve = float(grad.float().pow(2).mean()), float(residual.float().pow(2).mean())
        a = self.smoothing
        self.var_g = vg if self.var_g is None else a * self.var_g + (1 - a) * vg
        self.var_e = ve if self.var_e is None else a * self.var_e + (1 - a) * ve
        if self.var_e > 0:
            g = self.target * math.sqrt(self.var_g / self.var_e)
            self.gamma = min(self.gamma_max, max(self.gamma_min, g))
        else:
            self.gamma = self.gamma_max
        return self.gamma


def ef_quadratic(
    compressor: Any,
    steps: int = 200,
    gamma: float | str = 1.0,
    n: int = 512,
    lr: float = 0.5,
    noise: float = 0.1,
    seed: int = 0,
    **adaptive: float,
) -> dict[str, list[float]]:
    """SGD with (scaled) error feedback on a test problem (a model): L(w) = sum h (w - w*)^2 / 2 with h log-uniform
    in [0.01, 1], w0 - w* ~ N(0, 1), gradients h (w - w*) + noise * N(0, 1). ``gamma`` is a fixed scale or
    "adaptive" (``AdaptiveGamma(**adaptive)``); ``compressor=None`` is dense SGD (the reference).

    Returns per step: "loss" (after the step), "resid" (mean e^2 after the step), "gamma"."""
    if steps < 1:
        raise ValueError(f"steps: expected >= 1, got {steps}")
    if n < 1:
        raise ValueError(f"n: expected >= 1, got {n}")
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr: expected a finite value > 0, got {lr}")
    if not (math.isfinite(noise) and noise >= 0):
        raise ValueError(f"noise: expected a finite value >= 0, got {noise}")
    if isinstance(gamma, str):
        if gamma != "adaptive":
            raise ValueError(f"gamma: expected a number in (0, 1] or 'adaptive', got {gamma!r}")
        ag: AdaptiveGamma | None = AdaptiveGamma(**adaptive)
    else:
        if not 0 < gamma <= 1:
            raise ValueError(f"gamma: expected a number in (0, 1] or 'adaptive', got {gamma!r}")
        ag = None
    rng = np.random.default_rng(seed)
    h = torch.from_numpy(10 ** rng.uniform(-2, 0, n)).float()
    x = torch.from_numpy(rng.standard_normal(n)).float()  # w - w*
    e = torch.zeros(n)
    out: dict[str, list[float]] = {"loss": [], "resid": [], "gamma": []}
    for _ in range(steps):
        g = h * x + noise * torch.from_numpy(rng.standard_normal(n)).float()
        gm = ag.update(g, e) if ag is not None else float(gamma)
        v = g + gm * e
        d = v if compressor is None else compressor.decompress(compressor.compress(v), n, torch.float32)
        e = v - d
        x = x - lr * d
        out["loss"].append(float(0.5 * (h * x * x).sum()))
        out["resid"].append(float(e.pow(2).mean()))
        out["gamma"].append(gm)
    return out
