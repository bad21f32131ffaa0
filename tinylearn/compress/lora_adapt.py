"""Adaptive LoRA: a gate that runs LoRA branches only for hard inputs [Q195]; a rank advisor + exact resize [Q218].

GatedLoRA [Q195]. LoRA adds r (in + out) MACs per row per adapted layer. When most inputs are already served well
by the base model, a small gate g(x) = sigmoid(MLP(x)) decides per input whether the LoRA path runs:

    g(x) >  threshold   -> model(x) with every LoRA branch on (the adapted path)
    g(x) <= threshold   -> fallback: model(x) with every LoRA branch disabled (the frozen base path)

The gate is trained (tinylearn autograd, Adam, binary cross-entropy) on a difficulty signal computed without
labels at serving time being needed later: hard = the base model's per-input loss (or predictive entropy) above
a threshold. ``lora_flops(model)`` counts the LoRA MACs per row, so ``stats`` reports the fraction routed, and the
fraction of LoRA FLOPs saved (1 - routed; the gate's own cost is reported beside it). ``digits_gating_experiment``
is the worked, labelled example: sklearn digits (CLEAN images: easy) plus the same digits rotated 90 degrees
(SHIFTED: hard for a base trained on clean ones), LoRA fine-tuned on the mixture.

RankAdvisor [Q218]. Per LoRA layer it keeps a window of gradient energies ||dL/dA||^2 + ||dL/dB||^2 (``observe()``
after each backward) and the spectrum of the effective update dW = s B A (singular values via QR of B and A^T, an
r x r SVD). energy_rank(k) = smallest k with sum_{i<k} sigma_i^2 >= energy * sum sigma^2. Suggestions:

    "up"    hot (window-mean gradient energy >= hot_factor x the median over layers) and saturated
            (energy_rank == r: every direction is in use) -> r' = min(2 r, min(in, out))
    "down"  not hot and energy_rank < r -> r' = max(1, energy_rank)   (the update lives in fewer directions)
    "keep"  otherwise

``resize_rank(layer, new_r)`` keeps scaling s = alpha / r fixed (alpha is rescaled to s * new_r) so that:
  - increase: A gains kaiming-initialised rows, B gains zero columns -> B'A' = BA, outputs unchanged (up to the
    summation order of the longer inner product);
  - decrease: B A = U S V^T (via QR of B and A^T), B' = U_k S_k^1/2, A' = S_k^1/2 V_k^T: s B' A' is the best
    rank-k approximation of dW (Eckart-Young), ||dW - dW'||_F = s sqrt(sum of the dropped S_i^2).
New Parameters replace the old ones: rebuild the optimizer after a resize.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np

from ..autograd.tensor import Tensor
from ..nn import functional as F
from ..nn import init
from ..nn.layers import Linear, ReLU
from ..nn.module import Module
from ..nn.parameter import Parameter
from .lora import LoRALinear, lora_layers


def lora_flops(model: Module) -> int:
    """LoRA multiply-accumulates per input row: sum over LoRA layers of r (in + out)."""
    return sum(m.r * (m.in_features + m.out_features) for _, m in lora_layers(model))


def set_lora_enabled(model: Module, enabled: bool) -> None:
    for _, m in lora_layers(model):
        m.disabled = not enabled


def difficulty_labels(
    logits: np.ndarray, target: np.ndarray | None = None, threshold: float = 1.0, signal: str = "loss"
) -> np.ndarray:
    """1.0 where the base model's per-row cross-entropy (signal="loss") or predictive entropy exceeds threshold."""
    z = np.asarray(logits, np.float64)
    logp = z - z.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    if signal == "loss":
        if target is None:
            raise ValueError("target: needed for signal='loss'")
        score = -logp[np.arange(len(z)), np.asarray(target)]
    elif signal == "entropy":
        score = -(np.exp(logp) * logp).sum(1)
    else:
        raise ValueError(f"signal: expected 'loss' or 'entropy', got {signal!r}")
    return (score > threshold).astype(np.float32)


class GatedLoRA(Module):
    """Route each input through the LoRA path (gate on) or the frozen base path (gate off)."""

    def __init__(self, model: Module, in_features: int, hidden: int = 16, threshold: float = 0.5) -> None:
        super().__init__()
        if not lora_layers(model):
            raise ValueError(f"model: {type(model).__name__} has no LoRALinear layers (call apply_lora first)")
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold: must be in (0, 1), got {threshold}")
        self.model, self.threshold = model, float(threshold)
        self.gate_fc1, self.gate_act, self.gate_fc2 = Linear(in_features, hidden), ReLU(), Linear(hidden, 1)
        self.in_features, self.hidden = in_features, hidden
        self.last_routed: np.ndarray | None = None

    def gate_logits(self, x: Tensor) -> Tensor:
        x = x.reshape(x.shape[0], -1)
        return self.gate_fc2(self.gate_act(self.gate_fc1(x))).reshape(x.shape[0])

    def gate_parameters(self) -> list[Parameter]:
        return [p for m in (self.gate_fc1, self.gate_fc2) for p in m.parameters()]

    def fit_gate(self, x: np.ndarray, hard: np.ndarray, epochs: int = 60, lr: float = 1e-2, seed: int = 0) -> list:
        """Train the gate on (x, hard in {0, 1}) with BCE; full-batch Adam; returns the loss per epoch."""
        from ..optim import Adam

        x, y = np.asarray(x, np.float32), np.asarray(hard, np.float32)
        if len(x) != len(y):
            raise ValueError(f"hard: {len(y)} labels for {len(x)} inputs")
        for p in self.gate_parameters():
            p.requires_grad = True
        pos = max(float(y.mean()), 1e-3)
        w = Tensor(np.where(y > 0, 0.5 / pos, 0.5 / max(1 - pos, 1e-3)).astype(np.float32))  # class-balanced
        opt, xt, yt, losses = Adam(self.gate_parameters(), lr=lr), Tensor(x), Tensor(y), []
        for _ in range(epochs):
            opt.zero_grad()
            z = self.gate_logits(xt)
            bce = (F.relu(z) - z * yt + ((-z.abs()).exp() + 1.0).log()) * w  # stable BCE-with-logits
            loss = bce.mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    def forward(self, x: Any) -> Tensor:
        """Inference: gate, then the LoRA path for routed rows and the base path for the others."""
        xt = x if isinstance(x, Tensor) else Tensor(np.asarray(x, np.float32))
        from ..autograd import no_grad

        with no_grad():
            routed = self.gate_logits(xt).numpy() > math.log(self.threshold / (1.0 - self.threshold))  # g > t
            self.last_routed = routed
            out: np.ndarray | None = None
            for on, rows in ((True, np.flatnonzero(routed)), (False, np.flatnonzero(~routed))):
                if rows.size == 0:
                    continue
                set_lora_enabled(self.model, on)
                try:
                    y = self.model(Tensor(xt.data[rows])).numpy()
                finally:
                    set_lora_enabled(self.model, True)
                if out is None:
                    out = np.empty((len(routed),) + y.shape[1:], y.dtype)
                out[rows] = y
        return Tensor(out)

    def stats(self) -> dict[str, float]:
        if self.last_routed is None:
            raise RuntimeError("stats: call forward first")
        routed = float(self.last_routed.mean())
        per_row = lora_flops(self.model)
        gate = self.hidden * (self.in_features + 1)
        return {
            "routed_fraction": routed,
            "lora_flops_saved_fraction": 1.0 - routed,
            "lora_macs_per_row": float(per_row),
            "gate_macs_per_row": float(gate),
            "net_macs_saved_per_row": (1.0 - routed) * per_row - gate,
        }


def _accuracy(model: Module, x: np.ndarray, y: np.ndarray) -> float:
    from ..autograd import no_grad

    with no_grad():
        return float((model(Tensor(x)).numpy().argmax(1) == y).mean())


def _train(params: list, model: Module, x: np.ndarray, y: np.ndarray, epochs: int, lr: float, seed: int) -> None:
    from ..optim import Adam

    opt, rng = Adam(params, lr=lr), np.random.default_rng(seed)
    for _ in range(epochs):
        for idx in np.array_split(rng.permutation(len(x)), max(1, len(x) // 64)):
            opt.zero_grad()
            F.cross_entropy(model(Tensor(x[idx])), Tensor(y[idx])).backward()
            opt.step()


def digits_gating_experiment(seed: int = 0, r: int = 8, epochs: int = 15) -> dict[str, float]:
    """Digits (CLEAN) + digits rotated 90 degrees (SHIFTED, the hard inputs): base trained on clean, LoRA on both,
    gate trained on base-loss difficulty. Returns accuracies (always-off / always-on / gated) on a held-out split,
    routed fractions on clean and shifted inputs and the LoRA FLOPs saved. Small and seeded: a labelled demo."""
    from ..autograd.factory import manual_seed
    from ..data import load_digits
    from ..nn import Sequential
    from .lora import apply_lora

    manual_seed(seed)
    x, y = load_digits()
    x = np.asarray(x, np.float32).reshape(len(x), 8, 8) / 16.0
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(x))
    tr, te = perm[: len(x) * 3 // 4], perm[len(x) * 3 // 4 :]
    rot = np.rot90(x, 1, axes=(1, 2))
    clean, shifted = x.reshape(len(x), 64), np.ascontiguousarray(rot).reshape(len(x), 64)
    y = np.asarray(y, np.int64)
    model = Sequential(Linear(64, 64), ReLU(), Linear(64, 10))
    _train(list(model.parameters()), model, clean[tr], y[tr], epochs, 1e-2, seed)
    apply_lora(model, ["0", "2"], r=r, alpha=2 * r)
    xm, ym = np.concatenate([clean[tr], shifted[tr]]), np.concatenate([y[tr], y[tr]])
    set_lora_enabled(model, False)
    from ..autograd import no_grad

    with no_grad():
        base_logits = model(Tensor(xm)).numpy()
    set_lora_enabled(model, True)
    _train([p for p in model.parameters() if p.requires_grad], model, xm, ym, epochs, 1e-2, seed + 1)
    hard = difficulty_labels(base_logits, ym, threshold=1.0)
    gated = GatedLoRA(model, 64, hidden=4)
    gated.fit_gate(xm, hard, epochs=150, lr=1e-2)
    xt, yt = np.concatenate([clean[te], shifted[te]]), np.concatenate([y[te], y[te]])
    out: dict[str, float] = {}
    set_lora_enabled(model, False)
    out["acc_always_off"] = _accuracy(model, xt, yt)
    set_lora_enabled(model, True)
    out["acc_always_on"] = _accuracy(model, xt, yt)
    out["acc_gated"] = float((gated(xt).numpy().argmax(1) == yt).mean())
    out.update(gated.stats())
    n = len(te)
    out["routed_clean"], out["routed_shifted"] = (
        float(gated.last_routed[:n].mean()),
        float(gated.last_routed[n:].mean()),
    )
    return out


class RankAdvisor:
    """Per-LoRA-layer gradient-energy window + spectrum of s B A -> rank up / down / keep suggestions."""

    def __init__(self, model: Module, window: int = 20, energy: float = 0.9, hot_factor: float = 2.0) -> None:
        if window < 1:
            raise ValueError(f"window: must be >= 1, got {window}")
        if not 0.0 < energy <= 1.0:
            raise ValueError(f"energy: must be in (0, 1], got {energy}")
        if hot_factor <= 0:
            raise ValueError(f"hot_factor: must be > 0, got {hot_factor}")
        self.model, self.energy, self.hot_factor = model, float(energy), float(hot_factor)
        self.history: dict[str, deque] = {n: deque(maxlen=window) for n, _ in lora_layers(model)}
        if not self.history:
            raise ValueError(f"model: {type(model).__name__} has no LoRALinear layers")

    def observe(self, grads: dict[str, float] | None = None) -> None:
        """Record ||dA||^2 + ||dB||^2 per layer (from the layers' .grad, or ``grads`` name -> energy)."""
        for n, m in lora_layers(self.model):
            if grads is not None:
                e = float(grads[n])
            else:
                e = sum(
                    float(np.sum(p.grad.numpy().astype(np.float64) ** 2))
                    for p in (m.lora_A, m.lora_B)
                    if p.grad is not None
                )
            self.history.setdefault(n, deque(maxlen=self.history[next(iter(self.history))].maxlen)).append(e)

    @staticmethod
    def spectrum(layer: LoRALinear) -> np.ndarray:
        """Singular values of s B A (descending), from an r x r SVD of R_B R_A^T."""
        b, a = layer.lora_B.data.astype(np.float64), layer.lora_A.data.astype(np.float64)
        rb, ra = np.linalg.qr(b, mode="r"), np.linalg.qr(a.T, mode="r")
        return layer.scaling * np.linalg.svd(rb @ ra.T, compute_uv=False)

    def energy_rank(self, sv: np.ndarray) -> int:
        e = sv.astype(np.float64) ** 2
        if e.sum() == 0:
            return 0
        return int(np.searchsorted(np.cumsum(e) / e.sum(), self.energy - 1e-12) + 1)

    def suggest(self) -> dict[str, dict[str, Any]]:
        layers = dict(lora_layers(self.model))
        means = {n: float(np.mean(h)) if h else 0.0 for n, h in self.history.items() if n in layers}
        med = float(np.median(list(means.values())))
        out = {}
        for n, m in layers.items():
            k = self.energy_rank(self.spectrum(m))
            hot = means[n] > 0 and means[n] >= self.hot_factor * med
            if hot and k >= m.r and m.r < min(m.in_features, m.out_features):
                action, new_r = "up", min(2 * m.r, m.in_features, m.out_features)
            elif not hot and k < m.r:
                action, new_r = "down", max(1, k)
            else:
                action, new_r = "keep", m.r
            out[n] = {
                "action": action,
                "r": m.r,
                "suggested_r": new_r,
                "energy_rank": k,
                "grad_energy": means[n],
                "hot": hot,
            }
        return out


def resize_rank(layer: LoRALinear, new_r: int) -> LoRALinear:
    """Change the rank in place keeping s = alpha / r: on increase the new directions get B = 0, so the function is
    unchanged (up to the summation order of the longer inner product); on decrease, Eckart-Young optimal."""
    if not isinstance(layer, LoRALinear):
        raise TypeError(f"layer: expected a LoRALinear, got {type(layer).__name__}")
    if isinstance(new_r, bool) or not isinstance(new_r, int | np.integer):
        raise TypeError(f"new_r: expected an int, got {type(new_r).__name__}")
    if not 1 <= new_r <= min(layer.in_features, layer.out_features):
        raise ValueError(f"new_r: must be in [1, {min(layer.in_features, layer.out_features)}], got {new_r}")
    if layer.merged:
        raise RuntimeError("resize_rank: the layer is merged; unmerge it first")
    s, r, dt = layer.scaling, layer.r, layer.lora_A.data.dtype
    a, b = layer.lora_A.data, layer.lora_B.data
    if new_r >= r:
        extra = Parameter(np.zeros((new_r - r, layer.in_features), dtype=dt))
        if new_r > r:
            init.kaiming_uniform_(extra, a=math.sqrt(5))
        a2 = np.concatenate([a, extra.data])
        b2 = np.concatenate([b, np.zeros((layer.out_features, new_r - r), dt)], axis=1)
    else:
        qb, rb = np.linalg.qr(b.astype(np.float64))
        qa, ra = np.linalg.qr(a.T.astype(np.float64))
        u, sv, vt = np.linalg.svd(rb @ ra.T)  # B A = (qb u) diag(sv) (qa vt^T)^T
        root = np.sqrt(sv[:new_r])
        b2 = ((qb @ u[:, :new_r]) * root).astype(dt)
        a2 = (root[:, None] * (qa @ vt[:new_r].T).T).astype(dt)
    layer.lora_A = Parameter(a2)
    layer.lora_B = Parameter(b2)
    layer.r, layer.alpha = int(new_r), s * new_r
    return layer
