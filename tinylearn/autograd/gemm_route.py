"""Which GEMM a Linear / 2-D matmul runs: numpy's OpenBLAS or the registered C++ packed GEMM (``gemm.matmul``).

The C++ ``parallel`` rung (cpp_src/gemm.cpp: packing, an AVX-512 FMA micro-kernel, OpenMP over the row blocks) is
faster than OpenBLAS where its micro-kernel is AVX-512 and the product is big enough to amortise the packing;
numpy's OpenBLAS (its Zen/Haswell AVX2 kernels on AMD) is faster for thin products. Measured on the 2-core Zen 5 EPYC
(best of 40; C++ / numpy time, Linear shapes N tokens x in -> out, forward x W^T, dX = G W, dW = G^T X):

    C [M, N] with M >= 128, N >= 128, K >= 64      0.58-0.89 (e.g. 512x512 -> 512: 0.60; 128x512 -> 128: 0.79)
    N = 32 (a thin output)                           1.1-1.6
    M <= 64 (a few tokens; decode's M = 1)           1.05-3.3 (the packing is not amortised)

so ``mm`` takes the C++ rung for float32 operands when the micro-kernel is AVX-512 (``gemm.isa()``, which follows
``TINYLEARN_CPU_FEATURES``) and M >= 128, N >= 128, K >= 64; numpy otherwise. On an AVX2-only CPU (or the forced
AVX2/scalar paths) every product stays on OpenBLAS: the C++ AVX2 kernel measured about equal or slower there. The
C++ GEMM threads with the same OpenMP pool as tinylearn's other kernels, so a GEMM next to them no longer competes
with OpenBLAS's separate worker threads. A ``backends.use("gemm.matmul", backend="numpy")`` pin keeps numpy.
Results differ from OpenBLAS's in the last bits (another summation order), within the fp32 tolerance.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import backends

OP = "gemm.matmul"
MIN_M, MIN_N, MIN_K = 128, 128, 64
_cpp: list[Any] = []  # [the C++ gemm module] or [None] when it is not built


def _module() -> Any:
    if not _cpp:
        _cpp.append(backends.load_C("gemm") if backends.C_available("gemm") else None)
    return _cpp[0]


def use_cpp(a: np.ndarray, b: np.ndarray) -> bool:
    """True when ``a @ b`` (2-D) runs on the C++ GEMM (see the module docstring)."""
    if a.dtype != np.float32 or b.dtype != np.float32 or a.ndim != 2 or b.ndim != 2:
        return False
    if a.shape[0] < MIN_M or b.shape[1] < MIN_N or a.shape[1] < MIN_K:
        return False
    mod = _module()
    if mod is None or mod.isa() != "avx512":
        return False
    pin = backends.pinned(OP)
    return pin is None or pin[0] in (None, "cpp")


def cpp_mm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` on the C++ GEMM, for a caller that has already asked ``use_cpp`` (C-contiguous result)."""
    return _module().matmul(a, b, "parallel")


def mm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` for 2-D arrays (any strides) on the GEMM ``use_cpp`` picks."""
    return cpp_mm(a, b) if use_cpp(a, b) else a @ b


def linear_grads(
    g: np.ndarray, x: np.ndarray, w: np.ndarray, need_x: bool, need_w: bool, transpose_w: bool = True
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(dX shaped like ``x``, dW shaped like ``w``) of z = x @ w.T (``transpose_w``, nn.Linear's weight [out, in])
    or x @ w (a matmul's [in, out]) from g = dL/dz [..., out] (x [..., in]; g may also be the [rows, out] rows), each
    product on the GEMM ``use_cpp`` picks, else numpy's matmul on the arrays as given (Linear.backward's products);
    None where not needed. The compiler's fused Linear nodes (LinearAct, LinearGroup) share it."""
    g2, x2 = g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1])
    wb = w if transpose_w else w.T  # [out, in]
    gx = gw = None
    if need_x:
        gx = (cpp_mm(g2, wb) if use_cpp(g2, wb) else g @ wb).reshape(x.shape)
    if need_w:
        gw = mm(g2.T, x2) if transpose_w else mm(x2.T, g2)
    return gx, gw
