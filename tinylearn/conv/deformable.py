"""Deformable convolution (Dai et al. 2017, v1; modulated v2 of Zhu et al. 2019) as bilinear-sampled im2col + GEMM.

A regular conv reads ``x[n, c, oh*s - p + i*d, ow*s - p + j*d]`` for kernel tap (i, j). Deformable conv adds a
learned, per-output-pixel offset (dy, dx) to every tap and reads the input there with bilinear interpolation
(samples outside the image read 0), optionally scaled by a modulation scalar m in [0, 1] (v2):

    cols[n, (c*kh + i)*kw + j, oh*OW + ow] = m[n, k, oh, ow] * bilinear(x[n, c], py, px)
    py = oh*s - p + i*d + offset[n, 2k, oh, ow],  px = ow*s - p + j*d + offset[n, 2k + 1, oh, ow],  k = i*kw + j

(the offset / mask layouts of ``torchvision.ops.deform_conv2d`` with one offset group). Then, exactly as in
``conv2d``, ``Y = W.reshape(OC, C*kh*kw) @ cols + b``. With zero offsets (and no mask) every sample lands on an
integer pixel, the bilinear weights are (1, 0, 0, 0): the columns equal ``im2col``'s bit for bit and the output
equals ``conv2d`` up to GEMM summation order.

``deform_conv2d_direct`` is the same computation as seven Python loops (tiny sizes only), the reference the
vectorised version is checked against. ``sampling_footprint`` counts, per tile of output pixels, how many distinct
input pixels the bilinear corners touch: the quantity a tile scheduler must bound to keep a tile's gather in cache.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._params import window_params

__all__ = ["deform_conv2d", "deform_conv2d_direct", "deform_im2col", "sampling_footprint"]


def _check(x: Any, offset: Any, kernel: Any, stride: Any, padding: Any, dilation: Any, mask: Any) -> tuple:
    x = np.asarray(x)
    offset = np.asarray(offset)
    if x.ndim != 4:
        raise ValueError(f"x: expected a 4-d (N, C, H, W) array, got shape {x.shape}")
    if not np.issubdtype(x.dtype, np.floating):
        raise TypeError(f"x: expected a floating dtype, got {x.dtype}")
    k, s, p, d, (oh, ow) = window_params(x.shape, kernel, stride, padding, dilation, "x")
    kk = k[0] * k[1]
    want = (x.shape[0], 2 * kk, oh, ow)
    if offset.shape != want:
        raise ValueError(f"offset: expected shape {want} (N, 2*kh*kw, OH, OW), got {offset.shape}")
    if not np.all(np.isfinite(offset)):
        raise ValueError("offset: contains NaN or Inf")
    if mask is not None:
        mask = np.asarray(mask)
        if mask.shape != (x.shape[0], kk, oh, ow):
            raise ValueError(f"mask: expected shape {(x.shape[0], kk, oh, ow)} (N, kh*kw, OH, OW), got {mask.shape}")
    return x, offset.astype(x.dtype, copy=False), k, s, p, d, oh, ow, mask


def _bilinear_weights(py: np.ndarray, px: np.ndarray, H: int, W: int) -> list[tuple[np.ndarray, ...]]:
    """The four (row, col, weight) corners of each sample; out-of-image corners get weight 0 (and index 0)."""
    y0, x0 = np.floor(py), np.floor(px)
    ly, lx = py - y0, px - x0
    y0, x0 = y0.astype(np.int64), x0.astype(np.int64)
    corners = []
    for dy, wy in ((0, 1 - ly), (1, ly)):
        for dx, wx in ((0, 1 - lx), (1, lx)):
            yy, xx = y0 + dy, x0 + dx
            ok = (yy >= 0) & (yy < H) & (xx >= 0) & (xx < W)
            corners.append((np.where(ok, yy, 0), np.where(ok, xx, 0), np.where(ok, wy * wx, 0)))
    return corners


def deform_im2col(
    x: Any, offset: Any, kernel_size: Any, stride: Any = 1, padding: Any = 0, dilation: Any = 1, mask: Any = None
) -> np.ndarray:
    """Bilinearly sampled columns ``[N, C*kh*kw, OH*OW]`` (the F.unfold layout), see the module docstring."""
    x, offset, k, s, p, d, oh, ow, mask = _check(x, offset, kernel_size, stride, padding, dilation, mask)
    N, C, H, W = x.shape
    kh, kw = k
    cols = np.zeros((N, C, kh * kw, oh * ow), x.dtype)
    base_y = (np.arange(oh) * s[0] - p[0])[:, None]
    base_x = (np.arange(ow) * s[1] - p[1])[None, :]
    n_idx = np.arange(N)[:, None, None]
    for i in range(kh):
        for j in range(kw):
            t = i * kw + j
            py = base_y + i * d[0] + offset[:, 2 * t]  # (N, OH, OW)
            px = base_x + j * d[1] + offset[:, 2 * t + 1]
            acc = np.zeros((N, oh, ow, C), x.dtype)
            for yy, xx, wgt in _bilinear_weights(py, px, H, W):
                acc += wgt[..., None].astype(x.dtype) * x[n_idx, :, yy, xx]  # gather: (N, OH, OW, C)
            if mask is not None:
                acc *= mask[:, t, :, :, None].astype(x.dtype)
            cols[:, :, t, :] = acc.reshape(N, oh * ow, C).transpose(0, 2, 1)
    return cols.reshape(N, C * kh * kw, oh * ow)


def deform_conv2d(
    x: Any,
    offset: Any,
    weight: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    mask: Any = None,
) -> np.ndarray:
    """Deformable conv forward: ``deform_im2col`` then one GEMM per image (groups = 1, one offset group)."""
    x = np.asarray(x)
    weight = np.asarray(weight)
    if weight.ndim != 4 or x.ndim != 4 or weight.shape[1] != x.shape[1]:
        raise ValueError(f"weight: expected (OC, C={x.shape[1] if x.ndim == 4 else '?'}, kh, kw), got {weight.shape}")
    cols = deform_im2col(x, offset, weight.shape[2:], stride, padding, dilation, mask)
    _, _, _, _, (oh, ow) = window_params(x.shape, weight.shape[2:], stride, padding, dilation, "x")
    y = np.matmul(weight.reshape(weight.shape[0], -1).astype(x.dtype), cols)
    if bias is not None:
        bias = np.asarray(bias)
        if bias.shape != (weight.shape[0],):
            raise ValueError(f"bias: expected shape ({weight.shape[0]},), got {bias.shape}")
        y += bias.astype(x.dtype)[:, None]
    return y.reshape(x.shape[0], weight.shape[0], oh, ow)


def deform_conv2d_direct(
    x: Any,
    offset: Any,
    weight: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    mask: Any = None,
) -> np.ndarray:
    """The definition as nested Python loops with a scalar bilinear sampler (reference; tiny sizes only)."""
    x, offset, k, s, p, d, oh, ow, mask = _check(
        x, offset, np.asarray(weight).shape[2:], stride, padding, dilation, mask
    )
    weight = np.asarray(weight)
    N, C, H, W = x.shape
    OC, _, kh, kw = weight.shape

    def sample(n: int, c: int, py: float, px: float) -> float:
        y0, x0 = int(np.floor(py)), int(np.floor(px))
        v = 0.0
        for yy, wy in ((y0, 1 - (py - y0)), (y0 + 1, py - y0)):
            for xx, wx in ((x0, 1 - (px - x0)), (x0 + 1, px - x0)):
                if 0 <= yy < H and 0 <= xx < W:
                    v += wy * wx * float(x[n, c, yy, xx])
        return v

    y = np.zeros((N, OC, oh, ow), np.float64)
    for n in range(N):
        for o in range(OC):
            for a in range(oh):
                for b in range(ow):
                    acc = 0.0 if bias is None else float(np.asarray(bias)[o])
                    for i in range(kh):
                        for j in range(kw):
                            t = i * kw + j
                            py = a * s[0] - p[0] + i * d[0] + float(offset[n, 2 * t, a, b])
                            px = b * s[1] - p[1] + j * d[1] + float(offset[n, 2 * t + 1, a, b])
                            m = 1.0 if mask is None else float(mask[n, t, a, b])
                            for c in range(C):
                                acc += float(weight[o, c, i, j]) * m * sample(n, c, py, px)
                    y[n, o, a, b] = acc
    return y


def sampling_footprint(
    offset: Any,
    in_hw: tuple[int, int],
    kernel_size: Any,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    tile: tuple[int, int] = (4, 4),
) -> dict[str, float]:
    """Per output tile (th x tw pixels, image 0): distinct in-image input pixels read by the bilinear corners.

    Returns {"samples": taps per tile (th*tw*kh*kw), "distinct": mean distinct pixels per tile,
    "reuse": 4*samples/distinct (corner reads per distinct pixel; high = cache friendly), "bbox": mean area of the
    bounding box of the touched pixels (what a rectangular prefetch of the tile's input would load)}.
    """
    offset = np.asarray(offset)
    H, W = in_hw
    th, tw = tile
    if th < 1 or tw < 1:
        raise ValueError(f"tile: expected positive sizes, got {tile}")
    fake = np.empty((offset.shape[0], 1, H, W), np.float32)
    _, offset, k, s, p, d, oh, ow, _ = _check(fake, offset, kernel_size, stride, padding, dilation, None)
    kh, kw = k
    ii, jj = np.meshgrid(np.arange(kh), np.arange(kw), indexing="ij")
    taps = (ii * kw + jj).ravel()
    distinct, bbox, count = 0.0, 0.0, 0
    for a0 in range(0, oh, th):
        for b0 in range(0, ow, tw):
            a = np.arange(a0, min(a0 + th, oh))[:, None, None]
            b = np.arange(b0, min(b0 + tw, ow))[None, :, None]
            py = (
                a * s[0]
                - p[0]
                + ii.ravel() * d[0]
                + offset[0, 2 * taps][:, a0 : a0 + th, b0 : b0 + tw].transpose(1, 2, 0)
            )
            px = (
                b * s[1]
                - p[1]
                + jj.ravel() * d[1]
                + offset[0, 2 * taps + 1][:, a0 : a0 + th, b0 : b0 + tw].transpose(1, 2, 0)
            )
            pts = set()
            for yy, xx, wgt in _bilinear_weights(py, px, H, W):
                inside = wgt != 0
                pts.update(zip(yy[inside].tolist(), xx[inside].tolist()))
            if pts:
                arr = np.array(sorted(pts))
                bbox += float(np.ptp(arr[:, 0]) + 1) * float(np.ptp(arr[:, 1]) + 1)
            distinct += len(pts)
            count += 1
    samples = float(th * tw * kh * kw)
    mean_distinct = distinct / count
    return {"samples": samples, "distinct": mean_distinct, "reuse": 4 * samples / mean_distinct, "bbox": bbox / count}
