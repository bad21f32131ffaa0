"""Adam and AdamW (Kingma & Ba 2015; Loshchilov & Hutter 2019) — torch's update rule with bias correction:

Adam:  g <- g + wd * w                 AdamW:  w <- w * (1 - lr * wd)      (decoupled decay)
m <- b1 m + (1 - b1) g                 v <- b2 v + (1 - b2) g^2
w <- w - (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
amsgrad: v_max <- max(v_max, v) is used in place of v in the denominator.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..autograd.tensor import Tensor
from .optimizer import Optimizer, check_betas, check_hyper, register_step


class Adam(Optimizer):
    op = "optim.adam_step"
    _decoupled = False

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        maximize: bool = False,
        *,
        backend: str | None = None,
    ) -> None:
        for name, v in (("lr", lr), ("eps", eps), ("weight_decay", weight_decay)):
            check_hyper(name, v)
        check_betas(betas)
        super().__init__(
            params,
            dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize),
            backend=backend,
        )


class AdamW(Adam):
    _decoupled = True

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        maximize: bool = False,
        *,
        backend: str | None = None,
    ) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize, backend=backend)


def _init_state(w: np.ndarray, state: dict[str, Any], group: dict[str, Any]) -> None:
    if not state:
        state["step"] = 0
        state["exp_avg"] = np.zeros_like(w)
        state["exp_avg_sq"] = np.zeros_like(w)
        if group["amsgrad"]:
            state["max_exp_avg_sq"] = np.zeros_like(w)


def _step_numpy(opt: Adam, w: np.ndarray, g: np.ndarray, state: dict[str, Any], group: dict[str, Any]) -> None:
    _init_state(w, state, group)
    lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
    if group["maximize"]:
        g = -g
    if wd:
        if opt._decoupled:
            w *= w.dtype.type(1 - lr * wd)
        else:
            g = g + wd * w
    state["step"] += 1
    t = state["step"]
    dt = w.dtype.type
    m, v = state["exp_avg"], state["exp_avg_sq"]
    tmp = opt.scratch(w)
    m *= dt(b1)
    m += np.multiply(g, dt(1 - b1), out=tmp)
    v *= dt(b2)
    np.multiply(g, g, out=tmp)
    tmp *= dt(1 - b2)
    v += tmp
    if group["amsgrad"]:
        np.maximum(state["max_exp_avg_sq"], v, out=state["max_exp_avg_sq"])
        v = state["max_exp_avg_sq"]
    bc1 = 1 - b1**t
    bc2_sqrt = math.sqrt(1 - b2**t)
    denom = np.sqrt(v, out=tmp)
    denom /= dt(bc2_sqrt)
    denom += dt(eps)
    np.divide(m, denom, out=tmp)  # tmp = m / denom
    tmp *= dt(lr / bc1)
    w -= tmp


def _step_cpp(opt: Adam, w: np.ndarray, g: np.ndarray, state: dict[str, Any], group: dict[str, Any]) -> None:
    """One fused pass (tinylearn._C.optim.adam_step) when the arrays allow it, else the numpy passes."""
    _init_state(w, state, group)
    lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
    vmax = state.get("max_exp_avg_sq", state["exp_avg_sq"])
    if opt.fused_ok(w, g, state["exp_avg"], state["exp_avg_sq"], vmax):
        state["step"] += 1
        opt._fused.adam_step(
            w,
            g,
            state["exp_avg"],
            state["exp_avg_sq"],
            vmax,
            lr,
            b1,
            b2,
            eps,
            wd,
            state["step"],
            opt._decoupled,
            group["amsgrad"],
            group["maximize"],
            **opt._omp_kw,
        )
        return
    _step_numpy(opt, w, g, state, group)


def _example(rng: np.random.Generator) -> tuple[tuple, dict]:
    """One AdamW step (amsgrad) on a [5, 37] float32 parameter at step 3, with moment estimates."""
    w, g, m = (rng.standard_normal((5, 37)).astype(np.float32) for _ in range(3))
    v = np.abs(rng.standard_normal((5, 37))).astype(np.float32)
    opt = AdamW([Tensor(w.copy(), requires_grad=True)], lr=1e-2, amsgrad=True)
    state = {"step": 3, "exp_avg": m, "exp_avg_sq": v, "max_exp_avg_sq": v * 1.5}
    return (opt, w, g, state, opt.param_groups[0]), {}


register_step(Adam.op, _step_numpy, _step_cpp, example=_example)
