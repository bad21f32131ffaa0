"""The im2col memory lesson: the column matrix is ~kh*kw times the input; tiling output rows bounds it.

Workspace of a full im2col (bytes):   N * (C*kh*kw) * (OH*OW) * itemsize     (≈ kh*kw/stride² × the input)
Tiled ("implicit-ish") im2col processes R output rows at a time: each tile needs only the input rows
[r0*sh, (r1-1)*sh + dh*(kh-1)] of the padded input, lowers them and runs the GEMM, so the workspace is

    N * (C*kh*kw) * (R*OW) * itemsize

at the cost of more, smaller GEMMs (lower BLAS efficiency) — the time/memory trade-off plotted in notebook 02.
A fully implicit GEMM (cuDNN's IMPLICIT_GEMM) goes to the limit and forms columns tile-by-tile in registers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._params import window_params
from .conv2d import _prepare, conv2d_forward
from .im2col import pad_nchw


def im2col_workspace_bytes(
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    rows: int | None = None,
    itemsize: int = 4,
) -> int:
    """Bytes of the column matrix for conv2d(x, w) (``rows`` output rows per tile; None = all of them)."""
    x_shape, w_shape = tuple(int(v) for v in x_shape), tuple(int(v) for v in w_shape)
    if len(w_shape) != 4:
        raise ValueError(f"weight: expected a 4-D [OC, C/groups, kh, kw] shape, got {w_shape}")
    if len(x_shape) != 4 or x_shape[1] != w_shape[1] * groups:
        raise ValueError(f"x: shape {x_shape} does not match weight shape {w_shape} with groups={groups}")
    k, _, _, _, (OH, OW) = window_params(x_shape, w_shape[2:], stride, padding, dilation, "x")
    R = OH if rows is None else max(1, min(int(rows), OH))
    return x_shape[0] * x_shape[1] * k[0] * k[1] * R * OW * int(itemsize)


def conv2d_tiled(
    x: Any,
    w: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    rows_per_tile: int | None = None,
    max_workspace_bytes: int | None = None,
    *,
    backend: str | None = None,
) -> np.ndarray:
    """conv2d computed ``rows_per_tile`` output rows at a time (or as many as fit in ``max_workspace_bytes``).

    Same result as conv2d (same per-output GEMM dot products); peak extra memory is one tile's column matrix.
    """
    x, w, b, g, k, s, p, d, (OH, OW) = _prepare(x, w, bias, stride, padding, dilation, groups, backend)
    N, C = x.shape[:2]
    row_bytes = N * C * k[0] * k[1] * OW * x.dtype.itemsize
    if rows_per_tile is not None:
        if isinstance(rows_per_tile, bool) or not isinstance(rows_per_tile, int | np.integer) or rows_per_tile < 1:
            raise ValueError(f"rows_per_tile: must be a positive int, got {rows_per_tile!r}")
        R = int(rows_per_tile)
    elif max_workspace_bytes is not None:
        if max_workspace_bytes < row_bytes:
            raise MemoryError(
                f"max_workspace_bytes: {max_workspace_bytes} B cannot hold one output row of columns "
                f"({row_bytes} B for x shape {x.shape}, weight shape {w.shape})"
            )
        R = int(max_workspace_bytes // row_bytes)
    else:
        R = OH
    R = min(R, OH)
    xp = pad_nchw(x, p)
    y = np.empty((N, w.shape[0], OH, OW), dtype=x.dtype)
    ext = d[0] * (k[0] - 1) + 1
    for r0 in range(0, OH, R):
        r1 = min(OH, r0 + R)
        rows = xp[:, :, r0 * s[0] : (r1 - 1) * s[0] + ext]
        y[:, :, r0:r1], _ = conv2d_forward(rows, w, b, s, 0, d, g, backend=backend)
    return y
