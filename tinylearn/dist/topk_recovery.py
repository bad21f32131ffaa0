"""Top-k with recovery of starved coordinates: sampled, residual-ranked extra slots and a staleness bound
(notebook 06 §8e).

Plain top-k sends the k largest |g| every step. Without error feedback a coordinate whose gradient is always small
is never sent (it starves: its parameter never moves); with error feedback its residual grows until it wins a slot,
but a zero-mean noisy coordinate can wait a very long time. ``RecoveringTopK`` adds m = ceil(extra_ratio * n)
extra slots per step, filled from the coordinates top-k dropped:

1. residual accumulation: every unsent coordinate keeps v = g + e in its residual e (error feedback) and an age
   (steps since it was last sent);
2. overdue coordinates (age >= max_staleness) are sent first, oldest first;
3. the remaining extra slots go to a random sample of ``sample`` dropped coordinates (every step, seeded), ranked by
   the size of their accumulated residual |e| -- the "historical residual" that says how much they are owed.

Every coordinate is sent again within max_staleness + ceil(n / m) steps (overdue ones queue at m per step), so the
staleness is bounded whatever the gradients are. Payload per step: (k + m) int32 indices + values.

    rt = RecoveringTopK(numel, ratio=0.01, extra_ratio=0.005, max_staleness=100, sample=512)
    idx, vals = rt.step(grad)              # indices and values to send this step
    rt.max_age                             # largest staleness seen so far
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .compression import topk_error_feedback

__all__ = ["RecoveringTopK", "topk_staleness"]


class RecoveringTopK:
    """Top-k + m recovery slots (overdue first, then sampled dropped coordinates by |residual|), error feedback."""

    def __init__(
        self,
        numel: int,
        ratio: float = 0.01,
        extra_ratio: float = 0.005,
        max_staleness: int = 100,
        sample: int = 512,
        seed: int = 0,
    ) -> None:
        if numel < 1:
            raise ValueError(f"numel: expected >= 1, got {numel}")
        if not 0 < ratio <= 1:
            raise ValueError(f"ratio: expected 0 < ratio <= 1, got {ratio}")
        if not 0 < extra_ratio <= 1:
            raise ValueError(f"extra_ratio: expected 0 < extra_ratio <= 1, got {extra_ratio}")
        if not max_staleness >= 1:
            raise ValueError(f"max_staleness: expected >= 1, got {max_staleness}")
        if not sample >= 1:
            raise ValueError(f"sample: expected >= 1, got {sample}")
        self.numel = numel
        self.k = min(numel, math.ceil(ratio * numel))
        self.m = min(numel - self.k, math.ceil(extra_ratio * numel))
        self.max_staleness, self.sample = max_staleness, sample
        self.residual = np.zeros(numel, dtype=np.float32)
        self.age = np.zeros(numel, dtype=np.int64)
        self.max_age = 0
        self.rng = np.random.default_rng(seed)

    @property
    def bound(self) -> int:
        """Guaranteed staleness bound: max_staleness + ceil(n / m) (or max_staleness if there are no extra slots)."""
        return self.max_staleness + (math.ceil(self.numel / self.m) if self.m else 0)

    def step(self, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Indices (int64, sorted) and values of the k + m coordinates sent this step; updates residual and ages."""
        g = grad.detach().reshape(-1).float().numpy()
        if g.size != self.numel:
            raise ValueError(f"grad: expected {self.numel} elements, got {g.size}")
        v = g + self.residual
        sent = np.zeros(self.numel, dtype=bool)
        sent[np.argpartition(-np.abs(v), self.k - 1)[: self.k]] = True
        if self.m:
            dropped = np.flatnonzero(~sent)
            overdue = dropped[self.age[dropped] >= self.max_staleness]
            overdue = overdue[np.lexsort((overdue, -self.age[overdue]))[: self.m]]  # oldest first, then lower index
            sent[overdue] = True
            room = self.m - overdue.size
            if room:
                pool = np.flatnonzero(~sent)
                cand = self.rng.choice(pool, size=min(self.sample, pool.size), replace=False)
                r = np.abs(self.residual[cand])
                pick = cand[np.lexsort((cand, -r))[: min(room, cand.size)]]  # largest |residual|, then lower index
                sent[pick] = True
        idx = np.flatnonzero(sent)
        vals = v[idx].copy()
        self.residual = np.where(sent, np.float32(0), v)
        self.age = np.where(sent, 0, self.age + 1)
        self.max_age = max(self.max_age, int(self.age.max()))
        return torch.from_numpy(idx), torch.from_numpy(vals)


def topk_staleness(grads: torch.Tensor, k: int, error_feedback: bool = True) -> tuple[int, int]:
    """Plain top-k over a stream of gradients (rows of ``grads``): (largest staleness reached, number of coordinates
    never sent). With ``error_feedback`` top-k picks from g + residual, else from g alone."""
    if grads.ndim != 2 or grads.shape[0] < 1:
        raise ValueError(f"grads: expected a 2-D (steps, numel) tensor with >= 1 step, got shape {tuple(grads.shape)}")
    n = grads.shape[1]
    if not 1 <= k <= n:
        raise ValueError(f"k: expected 1 <= k <= {n}, got {k}")
    resid = torch.zeros(n)
    age = torch.zeros(n, dtype=torch.int64)
    ever = torch.zeros(n, dtype=torch.bool)
    worst = 0
    for g in grads.float():
        if error_feedback:
            idx, _, resid = topk_error_feedback(g, resid, k)
        else:
            idx = torch.topk(g.abs(), k, sorted=False).indices
        sent = torch.zeros(n, dtype=torch.bool)
        sent[idx] = True
        ever |= sent
        age = torch.where(sent, torch.zeros_like(age), age + 1)
        worst = max(worst, int(age.max()))
    return worst, int((~ever).sum())
