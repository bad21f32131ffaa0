"""conv1d/2d/3d and their transposes (conv_transpose1d/2d/3d) on numpy arrays, lowered to the 2-D im2col/col2im.

Every op runs on a 5-D [N, C, D, H, W] view (1-d: D = H = 1; 2-d: D = 1). The 3-D column matrix is built from
the 2-D one: for each depth tap ``a`` the strided depth slices ``xpad[:, :, a*dd + od*sd]`` are folded into the
batch and unfolded by the registered ``conv.im2col`` kernel, so with K3 = C*kd*kh*kw and M = N*OD*OH*OW:

    cols[(c, a, i, j), (n, od, oh, ow)] = xpad[n, c, od*sd + a*dd, oh*sh + i*dh, ow*sw + j*dw]     [K3, M]

and col2im_3d is its adjoint (each depth tap is a 2-D ``conv.col2im`` added back into its depth slices).

    conv               y  = W @ cols(x) (+ b)         dW = dY @ cols(x)ᵀ      dX = col2im(Wᵀ @ dY)
    conv_transpose     y  = col2im(Wᵀ @ x) (+ b)      dW = x @ cols(dY)ᵀ      dX = W @ cols(dY)

conv_transpose is the adjoint of conv with the same weight (torch stores it as [C_in, C_out/groups, k...]), so its
forward is conv's input-gradient and its input-gradient is conv's forward. Its output size along each axis is

    out = (in - 1)*stride - 2*padding + dilation*(k - 1) + output_padding + 1,

output_padding (< stride or < dilation, torch's rule) only adds rows at the end that no input reaches (zeros + b).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._params import ntuple, window_params_nd
from .im2col import col2im_raw, im2col_raw

Geo = tuple[tuple[int, ...], ...]


def im2col_3d(x: np.ndarray, k, s, p, d, out, backend: str | None) -> np.ndarray:
    """Column matrix [C*kd*kh*kw, N*OD*OH*OW] of a 5-D x (validated geometry), via the 2-D im2col per depth tap."""
    N, C, D, H, W = x.shape
    OD = out[0]
    M = N * OD * out[1] * out[2]  # explicit sizes everywhere: reshape(-1) is ambiguous for an empty batch
    if M == 0:  # empty batch: nothing to unfold (the compiled KNL kernels reject a zero batch)
        return np.zeros((C * k[0] * k[1] * k[2], 0), dtype=x.dtype)
    xp = x if p[0] == 0 else np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (0, 0), (0, 0)))
    parts = []
    for a in range(k[0]):
        lo = a * d[0]
        xs = xp[:, :, lo : lo + s[0] * (OD - 1) + 1 : s[0]]  # [N, C, OD, H, W]
        xs = np.ascontiguousarray(xs.transpose(0, 2, 1, 3, 4)).reshape(N * OD, C, H, W)
        c2 = im2col_raw(xs, k[1:], s[1:], p[1:], d[1:], out[1:], backend, layout="KNL")
        parts.append(c2.reshape(C, 1, k[1] * k[2], M))
    cols = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
    return cols.reshape(C * k[0] * k[1] * k[2], M)


def col2im_3d(cols: np.ndarray, N: int, C: int, size, k, s, p, d, out, backend: str | None) -> np.ndarray:
    """Adjoint of im2col_3d: fold [C*kd*kh*kw, N*OD*OH*OW] back into [N, C, D, H, W], summing overlaps."""
    D, H, W = size
    OD = out[0]
    M = N * OD * out[1] * out[2]
    if M == 0:
        return np.zeros((N, C, D, H, W), dtype=cols.dtype)
    c4 = cols.reshape(C, k[0], k[1] * k[2], M)
    xp = np.zeros((N, C, D + 2 * p[0], H, W), dtype=cols.dtype)
    for a in range(k[0]):
        ca = np.ascontiguousarray(c4[:, a]).reshape(C * k[1] * k[2], M)
        part = col2im_raw(ca, N * OD, C, H, W, k[1:], s[1:], p[1:], d[1:], out[1:], backend, layout="KNL")
        lo = a * d[0]
        xp[:, :, lo : lo + s[0] * (OD - 1) + 1 : s[0]] += part.reshape(N, OD, C, H, W).transpose(0, 2, 1, 3, 4)
    return xp[:, :, p[0] : p[0] + D]


def to5d(a: np.ndarray, nd: int) -> np.ndarray:
    """[N, C, *spatial(nd)] -> [N, C, D, H, W] view (leading spatial axes of size 1)."""
    return a.reshape(a.shape[:2] + (1,) * (3 - nd) + a.shape[2:])


def pad3(t: tuple[int, ...], fill: int) -> tuple[int, ...]:
    return (fill,) * (3 - len(t)) + tuple(t)


def check_groups(groups: Any) -> int:
    if isinstance(groups, bool) or not isinstance(groups, int | np.integer) or groups < 1:
        raise ValueError(f"groups: must be a positive int, got {groups!r}")
    return int(groups)


def conv_geometry(x_shape, w_shape, b_shape, stride, padding, dilation, groups, nd: int, name: str) -> tuple:
    """Validate conv{nd}d shapes; returns (groups, k, s, p, d, out) as nd-tuples."""
    if len(x_shape) != nd + 2:
        raise ValueError(
            f"input: {name} expects a {nd + 2}-D [N, C, {'D, H, W'[-3 * nd + 2 :]}] tensor, got shape {tuple(x_shape)}"
        )
    if len(w_shape) != nd + 2:
        raise ValueError(
            f"weight: {name} expects a {nd + 2}-D [out_channels, in_channels/groups, *kernel] tensor, "
            f"got shape {tuple(w_shape)}"
        )
    g = check_groups(groups)
    C, OC = x_shape[1], w_shape[0]
    if OC % g:
        raise ValueError(f"groups: out_channels {OC} (weight shape {tuple(w_shape)}) not divisible by groups={g}")
    if w_shape[1] * g != C:
        raise ValueError(
            f"weight: shape {tuple(w_shape)} with groups={g} expects {w_shape[1] * g} input channels, but input shape "
            f"{tuple(x_shape)} has {C}"
        )
    if b_shape is not None and tuple(b_shape) != (OC,):
        raise ValueError(f"bias: expected shape ({OC},) for weight shape {tuple(w_shape)}, got {tuple(b_shape)}")
    k, s, p, d, out = window_params_nd(tuple(x_shape[2:]), tuple(w_shape[2:]), stride, padding, dilation, "input")
    return g, k, s, p, d, out


def conv_transpose_geometry(
    x_shape, w_shape, b_shape, stride, padding, output_padding, dilation, groups, nd: int, name: str
) -> tuple:
    """Validate conv_transpose{nd}d shapes; returns (groups, k, s, p, d, out_size, cols_out, geo_out) nd-tuples."""
    if len(x_shape) != nd + 2:
        raise ValueError(f"input: {name} expects a {nd + 2}-D [N, C_in, *spatial] tensor, got shape {tuple(x_shape)}")
    if len(w_shape) != nd + 2:
        raise ValueError(
            f"weight: {name} expects a {nd + 2}-D [in_channels, out_channels/groups, *kernel] tensor, "
            f"got shape {tuple(w_shape)}"
        )
    g = check_groups(groups)
    C = x_shape[1]
    if w_shape[0] != C:
        raise ValueError(
            f"weight: shape {tuple(w_shape)} expects {w_shape[0]} input channels (dim 0), but input shape "
            f"{tuple(x_shape)} has {C}"
        )
    if C % g:
        raise ValueError(f"groups: in_channels {C} (input shape {tuple(x_shape)}) not divisible by groups={g}")
    OC = w_shape[1] * g
    if b_shape is not None and tuple(b_shape) != (OC,):
        raise ValueError(f"bias: expected shape ({OC},) for weight shape {tuple(w_shape)}, got {tuple(b_shape)}")
    k = ntuple(tuple(w_shape[2:]), nd, "weight")
    s = ntuple(stride, nd, "stride")
    p = ntuple(padding, nd, "padding")
    op = ntuple(output_padding, nd, "output_padding")
    d = ntuple(dilation, nd, "dilation")
    if min(s) < 1:
        raise ValueError(f"stride: must be positive, got {s}")
    if min(d) < 1:
        raise ValueError(f"dilation: must be positive, got {d}")
    if min(p) < 0 or min(op) < 0:
        raise ValueError(f"padding/output_padding: must be non-negative, got padding={p}, output_padding={op}")
    for i in range(nd):
        if op[i] >= s[i] and op[i] >= d[i]:
            raise ValueError(
                f"output_padding: must be smaller than either stride or dilation, got output_padding={op}, "
                f"stride={s}, dilation={d}"
            )
    size = tuple((x_shape[2 + i] - 1) * s[i] - 2 * p[i] + d[i] * (k[i] - 1) + op[i] + 1 for i in range(nd))
    if min(size) < 1 or min(x_shape[2:]) < 1:
        raise ValueError(
            f"padding: {name} output size {size} is not positive (input shape {tuple(x_shape)}, kernel {k}, "
            f"stride={s}, padding={p}, output_padding={op}, dilation={d})"
        )
    k, s2, p, d2, geo_out = window_params_nd(size, k, s, p, d, "output")
    # geo_out != input size only when output_padding >= stride: the compiled kernels derive the window count from
    # the geometry, so the caller must then use the numpy kernels (which take it as given)
    return g, k, s2, p, d2, size, tuple(x_shape[2:]), geo_out


def conv_nd_forward(x, w, b, g, k, s, p, d, out, backend):
    """y [N, OC, *out] and cols for x [N, C, *sp] (nd = x.ndim - 2), geometry from conv_geometry."""
    nd = x.ndim - 2
    N, OC = x.shape[0], w.shape[0]
    k3, s3, p3, d3, o3 = pad3(k, 1), pad3(s, 1), pad3(p, 0), pad3(d, 1), pad3(out, 1)
    cols = im2col_3d(to5d(x, nd), k3, s3, p3, d3, o3, backend)
    wg = w.reshape(g, OC // g, int(np.prod(w.shape[1:])))
    y2 = np.matmul(wg, cols.reshape(g, cols.shape[0] // g, cols.shape[1])).reshape(OC, N, *out)
    y = np.ascontiguousarray(np.moveaxis(y2, 0, 1))
    if b is not None:
        y += b.reshape((1, OC) + (1,) * nd)
    return y, cols


def conv_nd_backward(gy, x, w, cols, g, k, s, p, d, out, backend, needs):
    nd = x.ndim - 2
    N, C = x.shape[:2]
    OC = w.shape[0]
    k3, s3, p3, d3, o3 = pad3(k, 1), pad3(s, 1), pad3(p, 0), pad3(d, 1), pad3(out, 1)
    dyT = np.ascontiguousarray(np.moveaxis(gy, 1, 0)).reshape(g, OC // g, int(np.prod((gy.shape[0],) + gy.shape[2:])))
    dx = dw = db = None
    if needs[1]:
        if cols is None:
            cols = im2col_3d(to5d(x, nd), k3, s3, p3, d3, o3, backend)
        dw = np.matmul(dyT, cols.reshape(g, cols.shape[0] // g, cols.shape[1]).transpose(0, 2, 1)).reshape(w.shape)
    if needs[0]:
        dcols = np.matmul(w.reshape(g, OC // g, int(np.prod(w.shape[1:]))).transpose(0, 2, 1), dyT).reshape(
            g * int(np.prod(w.shape[1:])), dyT.shape[2]
        )
        dx = col2im_3d(dcols, N, C, pad3(x.shape[2:], 1), k3, s3, p3, d3, o3, backend).reshape(x.shape)
    if needs[2]:
        db = gy.sum(axis=(0,) + tuple(range(2, gy.ndim)))
    return dx, dw, db


def conv_transpose_nd_forward(x, w, b, g, k, s, p, d, size, cols_out, backend):
    """y [N, C_out, *size] = col2im(Wᵀ @ x) (+ b) for x [N, C_in, *sp], w [C_in, C_out/g, *k]."""
    nd = x.ndim - 2
    N, C = x.shape[:2]
    OC = w.shape[1] * g
    xT = np.ascontiguousarray(np.moveaxis(x, 1, 0)).reshape(g, C // g, int(np.prod((x.shape[0],) + x.shape[2:])))
    wg = w.reshape(g, C // g, int(np.prod(w.shape[1:])))
    dcols = np.matmul(wg.transpose(0, 2, 1), xT).reshape(g * int(np.prod(w.shape[1:])), xT.shape[2])
    k3, s3, p3, d3, o3 = pad3(k, 1), pad3(s, 1), pad3(p, 0), pad3(d, 1), pad3(cols_out, 1)
    y = col2im_3d(dcols, N, OC, pad3(size, 1), k3, s3, p3, d3, o3, backend).reshape((N, OC) + tuple(size))
    y = np.ascontiguousarray(y)
    if b is not None:
        y += b.reshape((1, OC) + (1,) * nd)
    return y


def conv_transpose_nd_backward(gy, x, w, g, k, s, p, d, cols_out, backend, needs):
    nd = x.ndim - 2
    N, C = x.shape[:2]
    k3, s3, p3, d3, o3 = pad3(k, 1), pad3(s, 1), pad3(p, 0), pad3(d, 1), pad3(cols_out, 1)
    cols = im2col_3d(to5d(gy, nd), k3, s3, p3, d3, o3, backend)  # [C_out*K, N*L]
    colsg = cols.reshape(g, cols.shape[0] // g, cols.shape[1])
    dx = dw = db = None
    if needs[0]:
        dxT = np.matmul(w.reshape(g, C // g, int(np.prod(w.shape[1:]))), colsg).reshape((C, N) + x.shape[2:])
        dx = np.ascontiguousarray(np.moveaxis(dxT, 0, 1))
    if needs[1]:
        xT = np.ascontiguousarray(np.moveaxis(x, 1, 0)).reshape(g, C // g, int(np.prod((x.shape[0],) + x.shape[2:])))
        dw = np.matmul(xT, colsg.transpose(0, 2, 1)).reshape(w.shape)
    if needs[2]:
        db = gy.sum(axis=(0,) + tuple(range(2, gy.ndim)))
    return dx, dw, db
