"""Per-parameter-group dynamic loss scaling (``tl.amp.PerGroupScaler``) -- seed question Q253.

One global loss scale S must satisfy max_l |g_l| * S < 65504 (fp16 max) for *every* layer, so a single layer
with large gradients forces a small S, and a layer whose gradients are 1e-6 of that then sits below fp16's
2^-25 rounding-to-zero threshold: its gradient underflows. A per-group scaler keeps one scale S_l per group
(the gradient entering group l is multiplied by S_l, e.g. by a backward hook at the group boundary, and
unscaled in fp32 before the step). Each group runs the GradScaler state machine on its own overflow flag:

    group l overflowed:  S_l *= backoff_factor; tracker_l = 0       (only that group's step is skipped)
    else:                tracker_l += 1; tracker_l == growth_interval -> S_l *= growth_factor; tracker_l = 0

``fp16_grad_roundtrip`` models the fp16 path of one gradient: fp32 g -> fp16(g * S) -> fp32 / S, and reports
whether it overflowed. ``PerGroupScaler.roundtrip`` applies it to every group with that group's scale.

Adaptive growth from the gradient distribution and the layer's sensitivity (``sensitivity=``, e.g. each group's
Hutchinson Hessian trace per parameter from ``tl.amp.hutchinson_trace``): ``roundtrip`` also measures, per group,
the fraction of nonzero gradient entries that fp16 flushed to zero (``last_underflow``). A group whose underflow is
above its tolerance grows at once instead of waiting for ``growth_interval`` clean steps, and the tolerance is
``underflow_tol`` divided by the group's sensitivity relative to the mean (a layer twice as sensitive tolerates half
the underflow): the sensitive layers climb out of underflow first, the insensitive ones keep their scale (and their
overflow margin) longer.

    group l overflowed:                       S_l *= backoff_factor; tracker_l = 0
    underflow_l > underflow_tol / rel_sens_l: S_l *= growth_factor;  tracker_l = 0
    else:                                     the interval rule above
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .args import is_int
from .grad_scaler import update_scale

__all__ = ["PerGroupScaler", "fp16_grad_roundtrip"]


def fp16_grad_roundtrip(grad: np.ndarray, scale: float) -> tuple[np.ndarray, bool]:
    """(fp32 gradient after ``fp16(grad * scale) / scale``, overflowed?) -- the fp16 storage of a scaled grad."""
    if not isinstance(grad, np.ndarray) or grad.dtype.kind != "f":
        raise ValueError(f"grad: expected a floating numpy array, got {type(grad).__name__}")
    if not (np.isfinite(scale) and scale > 0):
        raise ValueError(f"scale: must be finite and > 0, got {scale}")
    with np.errstate(over="ignore", invalid="ignore"):
        h = (grad.astype(np.float32) * np.float32(scale)).astype(np.float16)
    overflow = not bool(np.isfinite(h).all())
    return h.astype(np.float32) / np.float32(scale), overflow


class PerGroupScaler:
    """One dynamic loss scale per parameter group; each backs off / grows on its own overflow history."""

    def __init__(
        self,
        n_groups: int,
        init_scale: float = 65536.0,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 100,
        sensitivity: Sequence[float] | None = None,
        underflow_tol: float = float("inf"),
    ) -> None:
        """``sensitivity`` (one value > 0 per group) and ``underflow_tol`` (the fraction of a group's nonzero gradient
        entries fp16 may flush to zero before it grows early) switch on the adaptive rule; the default tolerance
        (infinite) keeps the plain GradScaler rule per group."""
        if not is_int(n_groups) or n_groups < 1:
            raise ValueError(f"n_groups: must be a positive int, got {n_groups!r}")
        if not init_scale > 0:
            raise ValueError(f"init_scale: must be > 0, got {init_scale}")
        if not growth_factor > 1.0:
            raise ValueError(f"growth_factor: must be > 1.0, got {growth_factor}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"backoff_factor: must be in (0, 1), got {backoff_factor}")
        if not is_int(growth_interval) or growth_interval < 1:
            raise ValueError(f"growth_interval: must be a positive int, got {growth_interval!r}")
        n_groups, growth_interval = int(n_groups), int(growth_interval)
        if not (isinstance(underflow_tol, (int, float)) and not isinstance(underflow_tol, bool) and underflow_tol > 0):
            raise ValueError(f"underflow_tol: must be a number > 0, got {underflow_tol!r}")
        if sensitivity is None:
            rel = np.ones(n_groups)
        else:
            sens = np.asarray(sensitivity, dtype=np.float64)
            if sens.shape != (n_groups,) or not np.isfinite(sens).all() or (sens <= 0).any():
                raise ValueError(f"sensitivity: expected {n_groups} finite values > 0, got {sensitivity!r}")
            rel = sens / sens.mean()
        self.underflow_tol = [float(underflow_tol) / float(r) for r in rel]
        self.last_underflow = [0.0] * n_groups
        self.n_early_growth = [0] * n_groups
        self.scales = [np.float32(init_scale)] * n_groups
        self.trackers = [0] * n_groups
        self.growth_factor = np.float32(growth_factor)
        self.backoff_factor = np.float32(backoff_factor)
        self.growth_interval = growth_interval
        self.n_skipped = [0] * n_groups

    @property
    def n_groups(self) -> int:
        return len(self.scales)

    def get_scales(self) -> list[float]:
        return [float(s) for s in self.scales]

    def roundtrip(self, grads: Sequence[np.ndarray]) -> tuple[list[np.ndarray], list[bool]]:
        """Each group's gradient through fp16 at its own scale: (unscaled fp32 gradients, overflow flags)."""
        if len(grads) != self.n_groups:
            raise ValueError(f"grads: expected {self.n_groups} group gradients, got {len(grads)}")
        out = [fp16_grad_roundtrip(g, float(s)) for g, s in zip(grads, self.scales)]
        for i, (g, (h, _)) in enumerate(zip(grads, out)):  # the gradient distribution: what fp16 flushed to zero
            nz = np.count_nonzero(g)
            self.last_underflow[i] = float(np.count_nonzero((h == 0) & (g != 0)) / nz) if nz else 0.0
        return [o[0] for o in out], [o[1] for o in out]

    def update(self, found_inf: Sequence[bool]) -> None:
        """Per group: back off on its overflow; grow at once when the last ``roundtrip`` flushed more than the group's
        tolerance of its gradient to zero; else grow after ``growth_interval`` clean steps of that group."""
        if len(found_inf) != self.n_groups:
            raise ValueError(f"found_inf: expected {self.n_groups} flags, got {len(found_inf)}")
        for i, bad in enumerate(found_inf):
            self.n_skipped[i] += bool(bad)
            if not bad and self.last_underflow[i] > self.underflow_tol[i]:  # underflowing: grow now
                self.scales[i], self.trackers[i] = np.float32(self.scales[i] * self.growth_factor), 0
                self.n_early_growth[i] += 1
                continue
            self.scales[i], self.trackers[i] = update_scale(
                self.scales[i], self.trackers[i], bool(bad), self.growth_factor, self.backoff_factor,
                self.growth_interval,
            )  # fmt: skip
