"""numba backend of im2col / col2im: ``prange`` over the N*C image planes, plain loops inside.

Imported only when ``backend="numba"`` is requested, so ``import tinylearn.conv`` does not pay numba's import and
JIT cost. Same layout and summation order as the numpy reference (see im2col.py), so results are bit-identical.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(parallel=True, cache=True)
def _im2col_kernel(x, cols, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW, bs, rs):  # pragma: no cover - compiled
    N, C, H, W = x.shape
    for nc in numba.prange(N * C):
        n = nc // C
        c = nc % C
        for i in range(kh):
            for j in range(kw):
                start = n * bs + ((c * kh + i) * kw + j) * rs
                for oh in range(OH):
                    ih = oh * sh - ph + i * dh
                    base = start + oh * OW
                    if ih < 0 or ih >= H:
                        for ow in range(OW):
                            cols[base + ow] = 0
                    else:
                        for ow in range(OW):
                            iw = ow * sw - pw + j * dw
                            if iw >= 0 and iw < W:
                                cols[base + ow] = x[n, c, ih, iw]
                            else:
                                cols[base + ow] = 0


@numba.njit(parallel=True, cache=True)
def _col2im_kernel(cols, x, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW, bs, rs):  # pragma: no cover - compiled
    N, C, H, W = x.shape
    for nc in numba.prange(N * C):
        n = nc // C
        c = nc % C
        for i in range(kh):
            for j in range(kw):
                start = n * bs + ((c * kh + i) * kw + j) * rs
                for oh in range(OH):
                    ih = oh * sh - ph + i * dh
                    if ih < 0 or ih >= H:
                        continue
                    base = start + oh * OW
                    for ow in range(OW):
                        iw = ow * sw - pw + j * dw
                        if iw >= 0 and iw < W:
                            x[n, c, ih, iw] += cols[base + ow]


def im2col_numba(x: np.ndarray, k, s, p, d, out, layout: str = "NKL") -> np.ndarray:
    N, C = x.shape[:2]
    K, L = C * k[0] * k[1], out[0] * out[1]
    shape = (N, K, L) if layout == "NKL" else (K, N * L)
    bs, rs = (K * L, L) if layout == "NKL" else (L, N * L)
    cols = np.empty(shape, dtype=x.dtype)
    _im2col_kernel(x, cols.reshape(-1), k[0], k[1], s[0], s[1], p[0], p[1], d[0], d[1], out[0], out[1], bs, rs)
    return cols


def col2im_numba(cols: np.ndarray, N: int, C: int, H: int, W: int, k, s, p, d, out, layout: str = "NKL") -> np.ndarray:
    K, L = C * k[0] * k[1], out[0] * out[1]
    bs, rs = (K * L, L) if layout == "NKL" else (L, N * L)
    x = np.zeros((N, C, H, W), dtype=cols.dtype)
    _col2im_kernel(cols.reshape(-1), x, k[0], k[1], s[0], s[1], p[0], p[1], d[0], d[1], out[0], out[1], bs, rs)
    return x
