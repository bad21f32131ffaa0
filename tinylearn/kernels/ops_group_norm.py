"""The GroupNorm entry points of the kernels dispatcher (``kernels.group_norm`` / ``group_norm_backward``, registered
in ops.py): validate, reshape x [N, C, *] to the kernels' canonical [N, C, HW], call one backend (numpy reference or
the C++ kernel of cpp_src/kernels_groupnorm.cpp). ``tl.nn.functional.group_norm`` (GroupNormFn) calls the same
registered kernels directly on its [N, C, HW] arrays (its arguments are checked by then)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .ops import _as_float, _compute_dtype, _kernel, _prep


def _gn_prep(
    x: np.ndarray, num_groups: Any, params: tuple[tuple[str, Any], ...], ct: type
) -> tuple[int, list[np.ndarray | None]]:
    """Checks x [N, C, *], num_groups (a positive divisor of C) and the per-channel params; returns G and the params
    as contiguous [C] arrays of the compute dtype (None stays None)."""
    if x.ndim < 2:
        raise ValueError(f"x: group_norm needs >= 2 dims [N, C, ...], got shape {x.shape}")
    if isinstance(num_groups, bool) or not isinstance(num_groups, int | np.integer) or num_groups < 1:
        raise ValueError(f"num_groups: must be a positive int, got {num_groups!r}")
    c = x.shape[1]
    if c % num_groups:
        raise ValueError(f"num_groups: {c} channels (x shape {x.shape}) not divisible by {num_groups} groups")
    out = []
    for nm, p in params:
        if p is not None:
            p = _as_float(p, nm)
            if p.shape != (c,):
                raise ValueError(f"{nm}: expected shape ({c},) for {c} channels, got {p.shape}")
            p = _prep(p, ct)
        out.append(p)
    return int(num_groups), out


def _nchw(a: np.ndarray, ct: type) -> np.ndarray:
    return _prep(a, ct).reshape(a.shape[0], a.shape[1], math.prod(a.shape[2:]))


def group_norm(
    x: np.ndarray,
    num_groups: int,
    weight: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    eps: float = 1e-5,
    *,
    backend: str | None = None,
    return_stats: bool = False,
) -> np.ndarray | tuple[np.ndarray, np.ndarray, np.ndarray]:
    """torch.nn.functional.group_norm on x [N, C, *]: statistics (biased variance) over each group of C/num_groups
    channels and all spatial positions of one sample; weight/bias [C] or None. ``return_stats=True`` also returns
    (mean, rstd), shape [N, num_groups], for the backward."""
    x = _as_float(x, "x")
    mod = _kernel("group_norm", backend)
    ct = _compute_dtype(mod, x.dtype, "x")
    if isinstance(eps, bool) or not (isinstance(eps, int | float | np.integer | np.floating) and eps >= 0):
        raise ValueError(f"eps: must be a number >= 0, got {eps!r}")
    g, (w, b) = _gn_prep(x, num_groups, (("weight", weight), ("bias", bias)), ct)
    if x.size == 0:
        y, mean, rstd = (
            np.empty(x.shape, x.dtype),
            np.full((x.shape[0], g), np.nan, ct),
            np.full((x.shape[0], g), np.nan, ct),
        )
    else:
        y, mean, rstd = mod(_nchw(x, ct), w, b, g, float(eps))
    y = y.reshape(x.shape).astype(x.dtype, copy=False)
    return (y, mean, rstd) if return_stats else y


def group_norm_backward(
    dy: np.ndarray,
    x: np.ndarray,
    num_groups: int,
    weight: np.ndarray | None,
    mean: np.ndarray,
    rstd: np.ndarray,
    *,
    backend: str | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dx, dweight [C], dbias [C]) from the forward's (mean, rstd) [N, num_groups]; weight None means ones (dweight
    and dbias are returned either way)."""
    x, dy = _as_float(x, "x"), _as_float(dy, "dy")
    if dy.shape != x.shape:
        raise ValueError(f"dy: shape {dy.shape} does not match x shape {x.shape}")
    mod = _kernel("group_norm_backward", backend)
    ct = _compute_dtype(mod, x.dtype, "x")
    g, (w,) = _gn_prep(x, num_groups, (("weight", weight),), ct)
    mean, rstd = _as_float(mean, "mean"), _as_float(rstd, "rstd")
    for nm, s in (("mean", mean), ("rstd", rstd)):
        if s.shape != (x.shape[0], g):
            raise ValueError(f"{nm}: shape {s.shape} must be ({x.shape[0]}, {g})")
    if x.size == 0:
        c = x.shape[1]
        return np.zeros(x.shape, x.dtype), np.zeros(c, ct), np.zeros(c, ct)
    dx, dw, db = mod(_nchw(dy, ct), _nchw(x, ct), w, _prep(mean, ct), _prep(rstd, ct), g)
    return dx.reshape(x.shape).astype(x.dtype, copy=False), dw, db
