"""Reference answers for exercises/05_fused_kernels: thin adapters over tinylearn.kernels."""

from __future__ import annotations

import numpy as np

import tinylearn as tl
from tinylearn.kernels import reference as _ref


def online_softmax_update(m: np.ndarray, d: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return _ref.online_softmax_update(m, d, x)


def online_softmax(x: np.ndarray) -> np.ndarray:
    return _ref.softmax_online(x, chunk=1)


def layer_norm_backward(dy, x, w, mean, rstd):
    return tl.kernels.layer_norm_backward(dy, x, w, mean, rstd, backend="numpy")


def gelu_grad(u: np.ndarray, approximate: str = "none") -> np.ndarray:
    return _ref.gelu_grad(u, approximate)


def triton_softmax(x: np.ndarray) -> np.ndarray:
    return tl.kernels.softmax(x, backend="triton")


def block_reduce_sum(x: np.ndarray) -> float:
    from tinylearn.kernels import numba_sim  # imported here: the simulator must be chosen before numba loads

    return numba_sim.block_reduce_sum(x)


def flash_tile_update(m, l_sum, acc, s_tile, v_tile):
    return _ref.flash_tile_update(m, l_sum, acc, s_tile, v_tile)
