"""``tl.gemm.matmul``: one op, six backends, the C++ ladder as versions of the ``cpp`` backend.

    backend  versions                                          dtype
    numpy    default (a @ b: OpenBLAS sgemm/dgemm)             fp32, fp64
    cpp      naive, ikj, blocked, packed, simd, parallel*      fp32, fp64   (* default: fastest)
    numba    blocked                                           fp32, fp64
    triton   tiled (interpreter on a CPU box: small sizes)    fp32
    cuda     naive, smem, regtile, vec4 (cuda_src/gemm_*.cu)  fp32, GPU only
``backend=None`` picks cpp when tinylearn._C is built, else numpy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import backends

OP = "gemm.matmul"
CPP_VERSIONS: tuple[str, ...] = ("naive", "ikj", "blocked", "packed", "simd", "parallel")
CUDA_VERSIONS: tuple[str, ...] = ("naive", "smem", "regtile", "vec4")
_DTYPES = (np.float32, np.float64)


def _check(a: Any, b: Any) -> None:
    for name, x in (("a", a), ("b", b)):
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{name}: must be a numpy.ndarray, got {type(x).__name__}")
        if x.dtype not in _DTYPES:
            raise TypeError(f"{name}: dtype must be float32 or float64, got {x.dtype}")
        if x.ndim != 2:
            raise ValueError(f"{name}: must be 2-D, got shape {x.shape}")
    if a.dtype != b.dtype:
        raise TypeError(f"b: dtype {b.dtype} differs from a's dtype {a.dtype} (cast one of them)")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"b: inner dimensions differ: a is {a.shape}, b is {b.shape} (need a.shape[1] == b.shape[0])")


def matmul(a: np.ndarray, b: np.ndarray, *, backend: str | None = None, version: str | None = None) -> np.ndarray:
    """C = a @ b for 2-D float32/float64 arrays of any shape and strides; result dtype = input dtype.

    backend: None (the registry picks: cpp when built, else numpy) | "numpy" | "cpp" | "numba" | "triton" | "cuda";
    version: a rung of that backend (``versions(backend)``), None = its default."""
    _check(a, b)
    return backends.dispatch(OP, a, b, backend=backend, version=version)


def versions(backend: str = "cpp") -> list[str]:
    """Alias of ``backends.versions("gemm.matmul", backend)``: the versions (ladder rungs) of ``backend``, slowest
    idea first."""
    return backends.versions(OP, backend)


def _fp32_only(name: str, a: np.ndarray) -> None:
    if a.dtype != np.float32:
        raise TypeError(f"a: backend {name!r} supports float32 only, got {a.dtype}")


# ------------------------------------------------------------------------------------------------ registration
def _example(rng: Any) -> tuple[tuple, dict]:
    """Conformance input: float32, edges no tile size divides (17 x 33 @ 33 x 9)."""
    return (rng.standard_normal((17, 33)).astype(np.float32), rng.standard_normal((33, 9)).astype(np.float32)), {}


backends.register(OP, "numpy", lambda a, b: np.matmul(a, b), example=_example)


def _cpp(version: str) -> Any:
    def fn(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return backends.load_C("gemm").matmul(a, b, version)

    fn.__name__ = f"matmul_cpp_{version}"
    return fn


for _v in CPP_VERSIONS:
    backends.register(
        OP, "cpp", _cpp(_v), version=_v, default=_v == "parallel", available=lambda: backends.C_available("gemm")
    )


def _numba(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    from .numba_cpu import matmul_numba

    return matmul_numba(a, b)


backends.register(OP, "numba", _numba, version="blocked", priority=5)


def _triton(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    _fp32_only("triton", a)
    from .triton_kernels import matmul_triton

    return matmul_triton(a, b)


backends.register(OP, "triton", _triton, version="tiled", priority=1)


def _cuda(version: str) -> Any:
    def fn(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        _fp32_only("cuda", a)
        from .cuda import matmul_cuda

        return matmul_cuda(a, b, version=version)

    fn.__name__ = f"matmul_cuda_{version}"
    return fn


for _v in CUDA_VERSIONS:
    backends.register(OP, "cuda", _cuda(_v), version=_v, default=_v == "vec4", priority=1)
