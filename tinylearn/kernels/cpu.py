"""The ``cpu`` backend: fused C++ kernels from ``cpp_src/kernels_*.cpp`` (tinylearn._C.kernels), OpenMP over rows.

Why C++ and not numba for every op (measured on the 2-core dev box, 4096 x 768 fp32, one thread): the fused
C++ three-pass softmax runs in ~1.9 ms vs ~4.3 ms for the online variant (the online recurrence needs two
exps per element and the row is L1/L2-resident, so re-reading it is cheaper than the extra exp); C++ two-pass
LayerNorm ~0.60 ms vs Welford ~0.68 ms (Welford's per-chunk division costs more than a cache-hot re-read).
The defaults below follow those numbers; the other versions stay selectable and tested. numba would need a JIT
warm-up on first call and cannot use OpenMP ``simd`` reductions, so the C++ path is the only cpu path.

float32 and float64 run natively (float64 exists for gradcheck); float16 is computed in float32 by the dispatcher.
"""

from __future__ import annotations

import numpy as np

from .. import backends

NATIVE_DTYPES = (np.float32, np.float64)

SOFTMAX_VERSION = "three_pass"
LAYER_NORM_VERSION = "two_pass"


def _k():
    return backends.load_C("kernels")


def available() -> tuple[bool, str]:
    try:
        _k()
    except RuntimeError as e:
        return False, str(e)
    return True, ""


def softmax(x: np.ndarray, version: str | None = None) -> np.ndarray:
    return _k().softmax_forward(x, version or SOFTMAX_VERSION)


def softmax_backward(y: np.ndarray, dy: np.ndarray) -> np.ndarray:
    return _k().softmax_backward(y, dy)


def layer_norm(
    x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float, version: str | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return tuple(_k().layer_norm_forward(x, w, b, float(eps), version or LAYER_NORM_VERSION))


def layer_norm_backward(
    dy: np.ndarray, x: np.ndarray, w: np.ndarray, mean: np.ndarray, rstd: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return tuple(_k().layer_norm_backward(dy, x, w, mean, rstd))


def bias_gelu(x: np.ndarray, b: np.ndarray, approximate: str = "none") -> np.ndarray:
    return _k().bias_gelu_forward(x, b, approximate == "tanh")


def bias_gelu_backward(
    dy: np.ndarray, x: np.ndarray, b: np.ndarray, approximate: str = "none"
) -> tuple[np.ndarray, np.ndarray]:
    return tuple(_k().bias_gelu_backward(dy, x, b, approximate == "tanh"))


def attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, block_size: int = 64
) -> tuple[np.ndarray, np.ndarray]:
    return tuple(_k().flash_attention_forward(q, k, v, bool(causal), int(block_size)))


def attention_backward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    o: np.ndarray,
    lse: np.ndarray,
    do: np.ndarray,
    causal: bool,
    block_size: int = 64,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return tuple(_k().flash_attention_backward(q, k, v, o, lse, do, bool(causal), int(block_size)))
