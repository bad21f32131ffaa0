"""The ``numba`` backend of gemm.matmul: the blocked i-k-j loop nest jitted by numba (fp32 or fp64).

Same blocking as the C++ ``blocked`` rung (MC x KC of A times KC x NC of B); numba vectorises the unit-stride
inner loop. Compiled on first call per dtype (about a second), cached in numba's in-memory cache afterwards.
"""

from __future__ import annotations

import functools

import numpy as np


@functools.cache
def _kernel():
    import numba

    @numba.njit(cache=False, fastmath=False)
    def blocked(a, b, c, mc, kc, nc):
        m, k = a.shape
        n = b.shape[1]
        for jc in range(0, n, nc):
            je = min(jc + nc, n)
            for pc in range(0, k, kc):
                pe = min(pc + kc, k)
                for ic in range(0, m, mc):
                    ie = min(ic + mc, m)
                    for i in range(ic, ie):
                        crow = c[i]
                        for p in range(pc, pe):
                            aip = a[i, p]
                            brow = b[p]
                            for j in range(jc, je):
                                crow[j] += aip * brow[j]

    return blocked


def matmul_numba(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    b = np.ascontiguousarray(b)
    c = np.zeros((a.shape[0], b.shape[1]), dtype=a.dtype)
    _kernel()(a, b, c, 64, 256, 512)
    return c
