"""Dynamic sparse training: prune-and-regrow at constant sparsity (RigL, Evci et al. 2020; SNFS-style momentum).

Every ``delta_t`` steps until ``t_end``, in every layer, with ``k = round(f(t) * n_active)`` and the cosine-decayed
update fraction ``f(t) = alpha/2 * (1 + cos(pi * t / t_end))``:

- **drop** the k active weights of smallest |w| (they contribute least to the output now);
- **grow** k connections that are inactive after the drop, with the largest grow score: |dL/dW| of the *dense*
  gradient (RigL; the gradient the loss would have w.r.t. a connection that is currently zero), |momentum of that
  gradient| (Dettmers & Zettlemoyer's sparse momentum, Q128), or uniformly at random (SET, Mocanu et al.);
- grown weights start at 0 (so the function is unchanged at the moment of growth) and are then trained.

A pruned-too-early connection can come back when its gradient says it matters: that is the regrowth mechanism.
The number of active weights per layer never changes, so the sparsity (and the sparse-kernel cost) is constant.

The masks here are plain arrays applied to the weights after every optimizer step (``weight *= mask``); the
dense gradient is the ordinary ``.grad`` of the weight Parameter, which the weight_orig * weight_mask
reparameterisation of ``tl.prune`` would zero on pruned entries (that is why this trainer does not use it).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._inputs import as_int

__all__ = ["RigL", "cosine_update_fraction", "drop_and_grow", "train_rigl"]


def cosine_update_fraction(step: int, alpha: float, t_end: int) -> float:
    """``alpha/2 * (1 + cos(pi * step / t_end))`` for step < t_end, else 0 (RigL's drop-fraction decay)."""
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"alpha: must be in (0, 1], got {alpha}")
    t_end = as_int(t_end, "t_end", min=1)
    step = as_int(step, "step", min=0)
    return 0.0 if step >= t_end else alpha / 2 * (1 + math.cos(math.pi * step / t_end))


def drop_and_grow(
    weight: np.ndarray, mask: np.ndarray, grow_score: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One layer's update: returns (new mask, dropped flat indices, grown flat indices).

    Drops the ``k`` active entries of smallest |weight| and grows the ``k`` entries inactive after the drop with
    the largest |grow_score| (ties: lower flat index first for both). Active count is preserved.
    """
    weight, mask, grow_score = np.asarray(weight), np.asarray(mask), np.asarray(grow_score)
    if mask.shape != weight.shape or grow_score.shape != weight.shape:
        raise ValueError(f"mask/grow_score: shapes {mask.shape}/{grow_score.shape} must equal weight {weight.shape}")
    m = mask.astype(bool).ravel()
    n_active = int(m.sum())
    k = as_int(k, "k")
    if not 0 <= k <= n_active:
        raise ValueError(f"k: must be in [0, {n_active}] (the number of active entries), got {k}")
    if k == 0:
        return mask.astype(bool).copy(), np.empty(0, np.int64), np.empty(0, np.int64)
    active = np.flatnonzero(m)
    order = np.argsort(np.abs(weight.ravel()[active]), kind="stable")
    dropped = active[order[:k]]
    m_after = m.copy()
    m_after[dropped] = False
    cand = np.flatnonzero(~m_after)
    order = np.argsort(-np.abs(grow_score.ravel()[cand]), kind="stable")
    grown = cand[order[:k]]
    m_after[grown] = True
    return m_after.reshape(mask.shape), dropped, grown


class RigL:
    """Masks + prune/regrow for a list of weight Parameters (tinylearn Tensors with ``.data`` and ``.grad``).

    ``sparsity`` per layer (uniform; every layer keeps at least one active weight, so a small layer can end up
    less sparse than asked), random initial masks (seeded). ``grow``: "gradient" (RigL),
    "momentum" (EMA of the dense gradient, ``beta``), or "random" (SET).
    """

    def __init__(
        self,
        weights: list[Any],
        sparsity: float,
        delta_t: int = 100,
        t_end: int = 1000,
        alpha: float = 0.3,
        grow: str = "gradient",
        beta: float = 0.9,
        seed: int = 0,
    ) -> None:
        if not 0.0 <= sparsity < 1.0:
            raise ValueError(f"sparsity: must be in [0, 1), got {sparsity}")
        delta_t = as_int(delta_t, "delta_t", min=1)
        if grow not in ("gradient", "momentum", "random"):
            raise ValueError(f"grow: expected 'gradient', 'momentum' or 'random', got {grow!r}")
        cosine_update_fraction(0, alpha, t_end)  # validates alpha, t_end
        t_end = as_int(t_end, "t_end")
        if not weights:
            raise ValueError("weights: empty list")
        self.weights, self.sparsity, self.delta_t, self.t_end = list(weights), sparsity, delta_t, t_end
        self.alpha, self.grow, self.beta = alpha, grow, beta
        self.rng = np.random.default_rng(seed)
        self.masks: list[np.ndarray] = []
        for w in self.weights:
            n = w.data.size
            # at least one active weight per layer: round(0.95 * 10) = 10 would leave a 10-weight layer dead (no
            # output signal, nothing to drop, nothing the gradient score could ever grow back)
            keep = min(n, max(1, n - int(round(sparsity * n))))
            m = np.zeros(n, bool)
            m[self.rng.permutation(n)[:keep]] = True
            self.masks.append(m.reshape(w.data.shape))
        self.momentum = [np.zeros_like(w.data) for w in self.weights]
        self.history: list[dict[str, float]] = []
        self.apply()

    def apply(self) -> None:
        """Zero the pruned weights (call after every optimizer step)."""
        for w, m in zip(self.weights, self.masks):
            w.data *= m

    def observe(self) -> None:
        """Update the gradient momentum from the current ``.grad`` (call after backward, every step)."""
        for i, w in enumerate(self.weights):
            if w.grad is not None:
                self.momentum[i] = self.beta * self.momentum[i] + (1 - self.beta) * w.grad.data

    def should_update(self, step: int) -> bool:
        step = as_int(step, "step")
        return step > 0 and step % self.delta_t == 0 and step < self.t_end

    def update(self, step: int) -> dict[str, float]:
        """Drop/grow in every layer with fraction ``cosine_update_fraction(step)``; newly grown weights are zeroed."""
        step = as_int(step, "step", min=0)
        f = cosine_update_fraction(step, self.alpha, self.t_end)
        changed, total, regrown_before = 0, 0, 0
        for i, w in enumerate(self.weights):
            k = int(round(f * self.masks[i].sum()))
            if self.grow == "gradient":
                score = np.zeros_like(w.data) if w.grad is None else w.grad.data
            elif self.grow == "momentum":
                score = self.momentum[i]
            else:
                score = self.rng.random(w.data.shape)
            old = self.masks[i]
            new, dropped, grown = drop_and_grow(w.data, old, score, k)
            # grown connections start at zero; written through the weight itself (a reshape(-1) of a transposed or
            # sliced weight is a copy, and writing into the copy left the regrown weights at their old values)
            w.data[np.unravel_index(grown, w.data.shape)] = 0.0
            regrown_before += int(np.isin(grown, dropped).sum())
            changed += int((new & ~old).sum())
            total += int(old.sum())
            self.masks[i] = new
        self.apply()
        rec = {"step": float(step), "fraction": f, "swapped": changed / max(total, 1), "regrown_same": regrown_before}
        self.history.append(rec)
        return rec

    def global_sparsity(self) -> float:
        return 1.0 - sum(int(m.sum()) for m in self.masks) / sum(m.size for m in self.masks)


def train_rigl(
    model: Any,
    rigl: RigL,
    X: np.ndarray,
    y: np.ndarray,
    epochs: int,
    lr: float = 1e-3,
    batch_size: int = 64,
    seed: int = 0,
    X_val: np.ndarray | None = None,
    y_val: np.ndarray | None = None,
) -> dict[str, list[float]]:
    """Adam training with ``rigl``'s masks: forward, backward (dense grads), observe, maybe drop/grow, step, mask."""
    from ..data.loader import DataLoader
    from ..nn.functional_loss import cross_entropy
    from ..nn.training import _make_optimizer, evaluate

    if epochs < 1:
        raise ValueError(f"epochs: must be >= 1, got {epochs}")
    opt = _make_optimizer(model, "adam", lr, 0.0)
    loader = DataLoader(X, y, batch_size=batch_size, shuffle=True, seed=seed)
    hist: dict[str, list[float]] = {"loss": [], "sparsity": []}
    if X_val is not None:
        hist["val_acc"] = []
    step = 0
    model.train()
    for _ in range(epochs):
        tot, n = 0.0, 0
        for xb, yb in loader:
            loss = cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            rigl.observe()
            if rigl.should_update(step):
                rigl.update(step)
            opt.step()
            rigl.apply()
            tot += float(loss.data) * len(yb.data)
            n += len(yb.data)
            step += 1
        hist["loss"].append(tot / n)
        hist["sparsity"].append(rigl.global_sparsity())
        if X_val is not None:
            hist["val_acc"].append(evaluate(model, X_val, y_val))
            model.train()
    model.eval()
    return hist
