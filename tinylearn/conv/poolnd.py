"""1-d/2-d/3-d pooling, unpooling, adaptive pooling and interpolation on numpy arrays [N, C, *spatial].

Windows are a strided view [N, C, *out, *k] of the padded input (no copy until reduced). Output length per axis
(torch's pooling_output_shape):

    out = floor_or_ceil((L + 2p - d(k-1) - 1) / s) + 1,   in ceil_mode minus 1 if the last window starts at >= L + p

ceil_mode pads the right end with ``extra = (out-1)*s + d(k-1) + 1 - (L + 2p)`` more cells (-inf / 0).

    max:   y = max over window, idx = flat index into the input plane of the first maximum (NaN wins); integer
           inputs keep their dtype (padding = the dtype's minimum, never chosen over a real cell)
           dx = scatter-add of dy to idx                                  (also adaptive max, and max_unpool's adjoint)
    avg:   y = window sum / divisor; divisor = divisor_override, or the window clipped to [-p, L + p) per axis
           (count_include_pad), or clipped to the input [0, L) (count_include_pad=False). dx spreads dy / divisor.
    adaptive windows: start = floor(o*L/O), end = ceil((o+1)*L/O); the average is separable (one [O, L] matrix per
           axis), the maximum loops over output cells.
    interpolate: separable per axis; nearest src = min(floor(dst*scale), L-1) with scale = L/O (or 1/scale_factor),
           linear src = scale*(dst + 0.5) - 0.5 clamped at 0 (align_corners: src = dst*(L-1)/(O-1)),
           y = (1-t)*x[i0] + t*x[i1]; cubic: Keys' kernel (A=-0.75) on taps floor(src)-1..+2 clamped to the edge,
           src unclamped; the backward adds the same weights back (a segmented sum: indices are monotone).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ._params import ntuple, pool_params_nd


def pool_geometry(
    spatial: tuple[int, ...],
    kernel_size: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    ceil_mode: bool,
    what: str = "input",
) -> tuple[tuple[int, ...], ...]:
    """(k, s, p, d, out, extra) n-tuples for a pool over ``spatial`` (``_params.pool_params_nd``)."""
    return pool_params_nd(spatial, kernel_size, stride, padding, dilation, ceil_mode, what)


def _pad(x: np.ndarray, p, extra, value: float) -> np.ndarray:
    if not any(p) and not any(extra):
        return x
    widths = ((0, 0), (0, 0)) + tuple((p[i], p[i] + extra[i]) for i in range(len(p)))
    return np.pad(x, widths, constant_values=value)


def windows(xp: np.ndarray, k, s, d, out) -> np.ndarray:
    """Read-only view [N, C, *out, *k] of padded ``xp``."""
    st = xp.strides
    n = len(k)
    shape = xp.shape[:2] + tuple(out) + tuple(k)
    strides = st[:2] + tuple(st[2 + i] * s[i] for i in range(n)) + tuple(st[2 + i] * d[i] for i in range(n))
    return as_strided(xp, shape=shape, strides=strides, writeable=False)


def _flat_index(local: np.ndarray, spatial, k, s, p, d, out) -> np.ndarray:
    """Window-local argmax (0..prod(k)-1) -> flat index into the input's spatial plane (torch's indices)."""
    n = len(k)
    kc = np.unravel_index(local, k)
    flat = np.zeros(local.shape, dtype=np.int64)
    for i in range(n):
        o = np.arange(out[i], dtype=np.int64).reshape((1, 1) + tuple(-1 if j == i else 1 for j in range(n)))
        coord = o * s[i] - p[i] + kc[i].astype(np.int64) * d[i]
        flat = flat * spatial[i] + coord
    return flat


def max_pool_nd(x: np.ndarray, k, s, p, d, out, extra) -> tuple[np.ndarray, np.ndarray]:
    """(y, indices) of max pooling over the last len(k) axes of a [N, C, *spatial] array."""
    n = len(k)
    integer = x.dtype.kind in "iu"  # pad with the dtype's minimum (ints have no -inf), dtype kept
    win = windows(_pad(x, p, extra, np.iinfo(x.dtype).min if integer else -np.inf), k, s, d, out)
    win = win.reshape(win.shape[: 2 + n] + (int(np.prod(k)),))
    if integer and (any(p) or any(extra)):  # a real minimum ties with the padding: first maximum among real cells
        real = windows(_pad(np.ones((1, 1) + x.shape[2:], bool), p, extra, False), k, s, d, out)
        real = real.reshape(real.shape[: 2 + n] + (int(np.prod(k)),))
        local = np.argmax((win == win.max(axis=-1, keepdims=True)) & real, axis=-1)
    else:
        local = np.argmax(win, axis=-1)
    y = np.take_along_axis(win, local[..., None], axis=-1)[..., 0]
    return y, _flat_index(local, x.shape[2:], k, s, p, d, out)


def scatter_add_flat(g: np.ndarray, idx: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """dx [N, C, *spatial] with dx.flat_plane[n, c, idx] += g (the adjoint of a gather by flat plane index)."""
    NC = shape[0] * shape[1]
    P = int(np.prod(shape[2:], dtype=np.int64))
    lin = (np.arange(NC, dtype=np.int64)[:, None] * P + idx.reshape(NC, int(np.prod(idx.shape[2:])))).ravel()
    dx = np.bincount(lin, weights=g.reshape(-1).astype(np.float64), minlength=NC * P)
    return dx.astype(g.dtype).reshape(shape)


def gather_flat(g: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """out[n, c, *] = g.flat_plane[n, c, idx[n, c, *]] (g [N, C, *spatial])."""
    N, C = g.shape[:2]
    gf, idf = g.reshape(N, C, int(np.prod(g.shape[2:]))), idx.reshape(N, C, int(np.prod(idx.shape[2:])))
    return np.take_along_axis(gf, idf, axis=2).reshape(idx.shape)


def _avg_divisor(spatial, k, s, p, out, count_include_pad: bool, divisor_override, dtype) -> np.ndarray | float:
    if divisor_override is not None:
        return float(divisor_override)
    n = len(k)
    div = np.ones((1,) * n, dtype=np.float64)
    for i in range(n):
        start = np.arange(out[i]) * s[i] - p[i]
        end = np.minimum(start + k[i], spatial[i] + p[i])
        cnt = end - start if count_include_pad else np.minimum(end, spatial[i]) - np.maximum(start, 0)
        div = div * cnt.reshape(tuple(-1 if j == i else 1 for j in range(n)))
    return div.astype(dtype)


def avg_pool_nd(x, k, s, p, out, extra, count_include_pad, divisor_override) -> np.ndarray:
    n = len(k)
    win = windows(_pad(x, p, extra, 0.0), k, s, (1,) * n, out)
    tot = win.sum(axis=tuple(range(2 + n, 2 + 2 * n)))
    div = _avg_divisor(x.shape[2:], k, s, p, out, count_include_pad, divisor_override, x.dtype)
    return (tot / div).astype(x.dtype, copy=False)


def avg_pool_nd_backward(g, x_shape, k, s, p, out, extra, count_include_pad, divisor_override) -> np.ndarray:
    n = len(k)
    sp = x_shape[2:]
    gd = (g / _avg_divisor(sp, k, s, p, out, count_include_pad, divisor_override, g.dtype)).astype(g.dtype)
    xp = np.zeros(tuple(x_shape[:2]) + tuple(sp[i] + 2 * p[i] + extra[i] for i in range(n)), dtype=g.dtype)
    for off in itertools.product(*(range(ki) for ki in k)):  # one strided plane per kernel tap
        sl = tuple(slice(off[i], off[i] + s[i] * (out[i] - 1) + 1, s[i]) for i in range(n))
        xp[(Ellipsis,) + sl] += gd
    return xp[(Ellipsis,) + tuple(slice(p[i], p[i] + sp[i]) for i in range(n))]


def adaptive_bounds(L: int, O: int) -> tuple[np.ndarray, np.ndarray]:
    o = np.arange(O, dtype=np.int64)
    return (o * L) // O, ((o + 1) * L + O - 1) // O


def adaptive_avg_matrix(L: int, O: int, dtype) -> np.ndarray:
    """[O, L] averaging matrix of adaptive pooling along one axis."""
    start, end = adaptive_bounds(L, O)
    j = np.arange(L)
    m = (j[None, :] >= start[:, None]) & (j[None, :] < end[:, None])
    return (m / (end - start)[:, None]).astype(dtype)


def apply_along(x: np.ndarray, mats: list[np.ndarray], transpose: bool = False) -> np.ndarray:
    """Contract the last len(mats) axes of x with mats ([O, L] each; transposed: [L, O] direction)."""
    n = len(mats)
    for i, m in enumerate(mats):
        x = _along(x, m.T if transpose else m, x.ndim - n + i)
    return np.ascontiguousarray(x)


def adaptive_max_nd(x: np.ndarray, out: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    n = len(out)
    sp = x.shape[2:]
    bounds = [adaptive_bounds(sp[i], out[i]) for i in range(n)]
    N, C = x.shape[:2]
    y = np.empty((N, C) + tuple(out), dtype=x.dtype)
    idx = np.empty((N, C) + tuple(out), dtype=np.int64)
    for o in itertools.product(*(range(v) for v in out)):
        lo = [int(bounds[i][0][o[i]]) for i in range(n)]
        hi = [int(bounds[i][1][o[i]]) for i in range(n)]
        w = x[(Ellipsis,) + tuple(slice(lo[i], hi[i]) for i in range(n))].reshape(
            N, C, int(np.prod([hi[i] - lo[i] for i in range(n)]))
        )
        a = np.argmax(w, axis=-1)
        y[(Ellipsis,) + o] = np.take_along_axis(w, a[..., None], axis=-1)[..., 0]
        loc = np.unravel_index(a, tuple(hi[i] - lo[i] for i in range(n)))
        flat = np.zeros(a.shape, dtype=np.int64)
        for i in range(n):
            flat = flat * sp[i] + lo[i] + loc[i]
        idx[(Ellipsis,) + o] = flat
    return y, idx


# ---------------------------------------------------------------- interpolation
def _source_scale(L: int, O: int, align_corners: bool, scale: float | None, ct) -> Any:
    if align_corners:
        return ct((L - 1) / (O - 1)) if O > 1 else ct(0.0)
    return ct(1.0 / scale) if scale is not None and scale > 0 else ct(L) / ct(O)


def _cubic_weights(t: np.ndarray, ct) -> list[np.ndarray]:
    """Keys' cubic convolution (A = -0.75, torch's) for taps at -1, 0, 1, 2 around floor(src), fraction t."""
    A = ct(-0.75)

    def near(x):  # |x| <= 1
        return ((A + 2) * x - (A + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A

    one = ct(1.0)
    return [far(t + one), near(t), near(one - t), far(one - t + one)]


def interp_axis(L: int, O: int, mode: str, align_corners: bool, scale: float | None, dtype) -> list[tuple]:
    """Per-axis source taps [(index [O], weight [O] or None), ...]: 1 for nearest, 2 linear, 4 cubic."""
    dst = np.arange(O)
    if mode in ("nearest", "nearest-exact"):
        # torch computes the source index in float32
        sc = np.float32(1.0 / scale) if scale is not None and scale > 0 else np.float32(L) / np.float32(O)
        off = np.float32(0.5) if mode == "nearest-exact" else np.float32(0.0)
        i0 = np.floor((dst.astype(np.float32) + off) * sc).astype(np.int64)
        if mode == "nearest" and O == L:
            i0 = dst.astype(np.int64)
        return [(np.minimum(i0, L - 1), None)]
    ct = np.float64 if dtype == np.float64 else np.float32
    sc = _source_scale(L, O, align_corners, scale, ct)
    src = sc * dst.astype(ct) if align_corners else sc * (dst.astype(ct) + ct(0.5)) - ct(0.5)
    if mode == "cubic":
        i0 = np.floor(src).astype(np.int64)
        t = src - i0.astype(ct)
        ws = _cubic_weights(t, ct)
        return [(np.clip(i0 - 1 + j, 0, L - 1), ws[j].astype(dtype)) for j in range(4)]
    src = np.maximum(src, ct(0.0))
    i0 = np.minimum(np.floor(src).astype(np.int64), L - 1)
    i1 = np.minimum(i0 + 1, L - 1)
    w1 = (src - i0.astype(ct)).astype(dtype)
    w0 = (np.ones((), dtype=dtype) - w1).astype(dtype)
    return [(i0, w0), (i1, w1)]


def _bshape(ndim: int, ax: int) -> tuple[int, ...]:
    return (-1,) + (1,) * (ndim - 1 - ax)


DENSE_INTERP_MAX = 256  # axes up to this size (in and out) resample as one small dense matrix product


def interp_matrices(taps: list[list[tuple]], in_spatial: tuple[int, ...], dtype: np.dtype) -> list[np.ndarray] | None:
    """Each axis's taps as a dense [O, L] matrix (M[o, idx[o]] += w[o]; nearest: weight 1), or None where the dense
    form does not pay (an axis longer than DENSE_INTERP_MAX) or numpy has no BLAS for the dtype. Applying the
    matrices is a BLAS product per axis: the same sums as the taps plus exact zeros, and the backward is the product
    with M^T instead of a segmented scatter-add (np.add.reduceat along an axis is ~20x slower)."""
    if np.dtype(dtype).type not in (np.float32, np.float64):
        return None
    mats = []
    for ax_taps, L in zip(taps, in_spatial, strict=True):
        O = len(ax_taps[0][0])
        if max(L, O) > DENSE_INTERP_MAX:
            return None
        m = np.zeros((O, L), dtype)
        for idx, w in ax_taps:
            np.add.at(m, (np.arange(O), idx), 1 if w is None else w)  # clipped cubic taps may repeat an index
        mats.append(m)
    return mats


def _along(x: np.ndarray, m: np.ndarray, ax: int) -> np.ndarray:
    """Contract axis ``ax`` of x with the columns of m ([O, L]): that axis becomes length O."""
    if ax == x.ndim - 1:
        return x @ m.T
    if ax == x.ndim - 2:
        return np.matmul(m, x)
    return np.moveaxis(np.tensordot(m, x, axes=([1], [ax])), 0, ax)


def interp_forward_dense(x: np.ndarray, mats: list[np.ndarray]) -> np.ndarray:
    """interp_forward with the per-axis matrices of interp_matrices (last axis first, as the taps)."""
    n = len(mats)
    for i in reversed(range(n)):
        x = _along(x, mats[i], x.ndim - n + i)
    return np.ascontiguousarray(x)


def interp_backward_dense(g: np.ndarray, mats: list[np.ndarray]) -> np.ndarray:
    """The adjoint: contract each axis with M^T."""
    n = len(mats)
    for i in range(n):
        g = _along(g, mats[i].T, g.ndim - n + i)
    return np.ascontiguousarray(g)


def interp_forward(x: np.ndarray, taps: list[list[tuple]]) -> np.ndarray:
    """Apply the per-axis taps, last axis first (torch's order of the bilinear / bicubic products); np.take along
    each axis copies whole rows, so no axis is gathered through a transposed view."""
    n = len(taps)
    for i in reversed(range(n)):
        ax = x.ndim - n + i
        y = None
        for idx, w in taps[i]:
            term = np.take(x, idx, axis=ax)
            if w is not None:
                term *= w.reshape(_bshape(x.ndim, ax))
            if y is None:
                y = term
            else:
                y += term
        x = y
    return np.ascontiguousarray(x)


def interp_backward(g: np.ndarray, in_spatial: tuple[int, ...], taps: list[list[tuple]]) -> np.ndarray:
    """Adjoint of interp_forward. Every tap's source index is non-decreasing in the output index, so the scatter-add
    is a segmented sum (np.add.reduceat over runs of equal index) written to the distinct indices."""
    n = len(taps)
    for i in range(n):
        ax = g.ndim - n + i
        acc = np.zeros(g.shape[:ax] + (in_spatial[i],) + g.shape[ax + 1 :], dtype=g.dtype)
        lead = (slice(None),) * ax
        for idx, w in taps[i]:
            v = g if w is None else g * w.reshape(_bshape(g.ndim, ax))
            if v.size == 0:
                continue
            starts = np.flatnonzero(np.concatenate(([True], idx[1:] != idx[:-1])))
            if np.any(np.diff(idx) < 0):  # not produced by interp_axis; keep a correct (slower) path anyway
                np.add.at(acc, lead + (idx,), v)
                continue
            acc[lead + (idx[starts],)] += np.add.reduceat(v, starts, axis=ax)
        g = acc
    return np.ascontiguousarray(g)


def interp_output_size(spatial, size, scale_factor) -> tuple[tuple[int, ...], list[float | None]]:
    """Output size and per-axis scale (None when size= is given) following torch.nn.functional.interpolate."""
    n = len(spatial)
    if (size is None) == (scale_factor is None):
        raise ValueError("size/scale_factor: exactly one of size or scale_factor must be given")
    if size is not None:
        out = ntuple(size, n, "size")
        if min(out) < 1:
            raise ValueError(f"size: must be positive, got {out}")
        return out, [None] * n
    if isinstance(scale_factor, tuple | list):
        if len(scale_factor) != n:
            raise ValueError(f"scale_factor: expected {n} values for a {n}-d input, got {scale_factor!r}")
        sf = [float(v) for v in scale_factor]
    else:
        sf = [float(scale_factor)] * n
    if min(sf) <= 0 or not all(math.isfinite(v) for v in sf):
        raise ValueError(f"scale_factor: must be positive and finite, got {scale_factor!r}")
    out = tuple(int(math.floor(spatial[i] * sf[i])) for i in range(n))
    if min(out) < 1:
        raise ValueError(f"scale_factor: {scale_factor!r} gives an empty output {out} for spatial size {spatial}")
    return out, list(sf)
