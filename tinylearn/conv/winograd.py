"""Winograd minimal filtering F(2x2, 3x3) (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2016).

For one 4x4 input tile d and one 3x3 filter g, the 2x2 output tile is

    Y = Aᵀ [ (G g Gᵀ) ⊙ (Bᵀ d B) ] A

    Bᵀ = [[1, 0, -1, 0],      G = [[1,    0,    0  ],      Aᵀ = [[1, 1,  1,  0],
          [0, 1,  1, 0],           [1/2,  1/2,  1/2],             [0, 1, -1, -1]]
          [0, -1, 1, 0],           [1/2, -1/2,  1/2],
          [0, 1,  0, -1]]          [0,    0,    1  ]]

Multiplication count per 2x2 output tile and (input channel, output channel) pair: direct convolution needs
2*2 outputs x 3*3 taps = 36 multiplies; Winograd needs the 4*4 = 16 elementwise products of the ⊙ — 2.25x fewer.
The transforms are additions (and the 1/2 scalings of G, done once per filter); Bᵀ d B is shared by all output
channels and G g Gᵀ by all tiles, so their cost amortises. Across channels the ⊙ + channel sum becomes 16
independent GEMMs  M[ξ,ν] = U[ξ,ν] (OC x C) @ V[ξ,ν] (C x tiles).

Numerics: the transforms mix values of different magnitudes (the 1/2 entries, cancellations in Bᵀ d B), so the
error vs direct convolution is a few ulps larger in fp32 and noticeably larger in fp16 (see notebook 02).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ._params import as_float_array, pair

BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype=np.float64)
G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], dtype=np.float64)
AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], dtype=np.float64)

MULS_DIRECT_PER_TILE = 2 * 2 * 3 * 3  # 36
MULS_WINOGRAD_PER_TILE = 4 * 4  # 16


def filter_transform(w: np.ndarray) -> np.ndarray:
    """U = G g Gᵀ for every (oc, c): [OC, C, 3, 3] -> [OC, C, 4, 4]."""
    g = G.astype(w.dtype)
    return g @ w @ g.T


def input_transform(tiles: np.ndarray) -> np.ndarray:
    """V = Bᵀ d B for every 4x4 tile: [..., 4, 4] -> [..., 4, 4] (additions only)."""
    bt = BT.astype(tiles.dtype)
    return bt @ tiles @ bt.T


def output_transform(m: np.ndarray) -> np.ndarray:
    """Y = Aᵀ M A for every 4x4 tile: [..., 4, 4] -> [..., 2, 2]."""
    at = AT.astype(m.dtype)
    return at @ m @ at.T


def winograd_conv2d(x: Any, w: Any, bias: Any = None, padding: Any = 0) -> np.ndarray:
    """3x3, stride-1 convolution (torch.nn.functional.conv2d semantics, NCHW) with Winograd F(2x2, 3x3).

    Computes in the input's float dtype (float16 / float32 / float64); odd output sizes are handled by padding the
    last tile and cropping.
    """
    x = as_float_array(x, "x")
    w = as_float_array(w, "weight")
    if x.ndim != 4:
        raise ValueError(f"x: expected a 4-D [N, C, H, W] array, got shape {x.shape}")
    if w.ndim != 4 or w.shape[2:] != (3, 3):
        raise ValueError(f"weight: Winograd F(2x2,3x3) needs a [OC, C, 3, 3] weight, got shape {w.shape}")
    if w.shape[1] != x.shape[1]:
        raise ValueError(
            f"weight: shape {w.shape} expects {w.shape[1]} input channels, x shape {x.shape} has {x.shape[1]}"
        )
    p = pair(padding, "padding")
    if min(p) < 0:
        raise ValueError(f"padding: must be non-negative, got {p}")
    dt = np.result_type(x.dtype, w.dtype)
    x, w = x.astype(dt, copy=False), w.astype(dt, copy=False)
    N, C, H, W = x.shape
    OC = w.shape[0]
    OH, OW = H + 2 * p[0] - 2, W + 2 * p[1] - 2
    if OH < 1 or OW < 1:
        raise ValueError(f"kernel_size: 3x3 kernel is larger than the padded input {(H + 2 * p[0], W + 2 * p[1])}")
    if bias is not None:
        bias = as_float_array(bias, "bias")
        if bias.shape != (OC,):
            raise ValueError(f"bias: expected shape ({OC},), got {bias.shape}")
    th, tw = (OH + 1) // 2, (OW + 1) // 2  # 2x2 output tiles
    # padded input big enough for th x tw overlapping 4x4 tiles with stride 2
    xp = np.zeros((N, C, 2 * th + 2, 2 * tw + 2), dtype=dt)
    xp[:, :, p[0] : p[0] + H, p[1] : p[1] + W] = x
    sN, sC, sH, sW = xp.strides
    tiles = as_strided(xp, (N, C, th, tw, 4, 4), (sN, sC, 2 * sH, 2 * sW, sH, sW), writeable=False)
    V = input_transform(tiles)  # [N, C, th, tw, 4, 4]
    U = filter_transform(w)  # [OC, C, 4, 4]
    # 16 GEMMs: M[ξν] (OC x N*tiles) = U[ξν] (OC x C) @ V[ξν] (C x N*tiles)
    Vm = V.transpose(4, 5, 1, 0, 2, 3).reshape(16, C, N * th * tw)
    Um = U.transpose(2, 3, 0, 1).reshape(16, OC, C)
    M = np.matmul(Um, Vm).reshape(4, 4, OC, N, th, tw).transpose(3, 2, 4, 5, 0, 1)  # [N, OC, th, tw, 4, 4]
    Y = output_transform(M)  # [N, OC, th, tw, 2, 2]
    y = Y.transpose(0, 1, 2, 4, 3, 5).reshape(N, OC, 2 * th, 2 * tw)[:, :, :OH, :OW]
    if bias is not None:
        y = y + bias.astype(dt)[None, :, None, None]
    return np.ascontiguousarray(y)
