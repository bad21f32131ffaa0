"""Exercises for notebook 05 (fused kernels). Replace each ``raise NotImplementedError`` with your code, then run

    pytest exercises/05_fused_kernels            # your answers
    pytest exercises/05_fused_kernels --impl=reference

Shapes: softmax / LayerNorm work on 2-D [rows, cols] float arrays along the last axis.

Each stub's NotImplementedError names the library function its reference answer (reference.py) calls.
"""

from __future__ import annotations

import os

import numpy as np

# Triton reads this when a kernel is decorated: set it before defining @triton.jit kernels so they run on the CPU.
os.environ.setdefault("TRITON_INTERPRET", "1")


def online_softmax_update(m: np.ndarray, d: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One step of the online softmax normaliser, elementwise over rows.

    State: running max ``m`` and running sum ``d`` of exp(x_seen - m). New element(s) ``x`` (same shape as m).
    Return (m', d') with m' = max(m, x) and d' the sum rescaled to m'. m = -inf means "nothing seen yet"
    (then d = 0); make sure -inf - -inf never produces NaN.
    """
    raise NotImplementedError("reference solution: tinylearn/kernels/reference.py:online_softmax_update")


def online_softmax(x: np.ndarray) -> np.ndarray:
    """Row softmax of a 2-D array with ONE pass over the columns for the normaliser (use online_softmax_update
    column by column), then one pass to write exp(x - m) / d."""
    raise NotImplementedError("reference solution: tinylearn/kernels/reference.py:softmax_online")


def layer_norm_backward(
    dy: np.ndarray, x: np.ndarray, w: np.ndarray, mean: np.ndarray, rstd: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dx, dw, db) of y = (x - mean) * rstd * w + b over the last axis of 2-D x, given the saved per-row
    mean and rstd = 1 / sqrt(var + eps). Derive dx yourself: it has three terms."""
    raise NotImplementedError("reference solution: tinylearn/kernels/reference.py:layer_norm_backward")


def gelu_grad(u: np.ndarray, approximate: str = "none") -> np.ndarray:
    """d/du of gelu(u). 'none': gelu(u) = u * Phi(u) (Phi the standard normal CDF);
    'tanh': gelu(u) = u/2 * (1 + tanh(sqrt(2/pi) * (u + 0.044715 u^3)))."""
    raise NotImplementedError("reference solution: tinylearn/kernels/reference.py:gelu_grad")


def triton_softmax(x: np.ndarray) -> np.ndarray:
    """Row softmax of a 2-D float32 array with your own @triton.jit kernel: one program per row, the row in one
    block of BLOCK = triton.next_power_of_2(cols) lanes (mask the tail with other=-inf). Pass torch tensors
    (torch.from_numpy) to the kernel; return a numpy array."""
    raise NotImplementedError("reference solution: tinylearn/kernels/triton_kernels.py:softmax")


def block_reduce_sum(x: np.ndarray) -> float:
    """Sum a 1-D float32 array with a numba.cuda kernel (it is run with NUMBA_ENABLE_CUDASIM=1): each block of
    T threads loads 2T elements, reduces them in a cuda.shared.array with a tree of cuda.syncthreads() steps and
    writes one partial sum; launch again on the partials until one value is left. No warp shuffles."""
    raise NotImplementedError("reference solution: tinylearn/kernels/numba_sim.py:block_reduce_sum")


def flash_tile_update(
    m: np.ndarray, l_sum: np.ndarray, acc: np.ndarray, s_tile: np.ndarray, v_tile: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fold one key/value tile into flash attention's running state for a block of query rows.

    m [..., Br] running row max, l_sum [..., Br] running sum of exp(S - m), acc [..., Br, Dv] running
    sum of exp(S - m) @ V; s_tile [..., Br, Bc] scaled scores of this tile (masked entries are -inf),
    v_tile [..., Bc, Dv]. Return (m', l', acc'). After the last tile O = acc / l.
    """
    raise NotImplementedError("reference solution: tinylearn/kernels/reference.py:flash_tile_update")
