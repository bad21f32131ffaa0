"""What CSR, ELL and BSR share: input checks and ``matmul`` dispatch through ``tinylearn.backends``.

Each format registers one op, ``sparse.<format>_matmul``, on three backends, with the signature
``fn(A, x, dtype) -> ndarray`` (``x`` already checked; C-contiguous in the compute dtype for compiled backends):

    numpy   reference (scatter-add); any numeric dtype
    numba   @njit kernels (sparse/numba_kernels.py); float32/float64
    cpp     tinylearn._C.sparse (OpenMP); float32/float64

``backend=None`` picks the fastest available backend for the input (cpp > numba > numpy; integer inputs go to
numpy). A named compiled backend with a non-float input is a TypeError that names the dtype.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from .. import backends
from .._inputs import as_array, is_int

_COMPILED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def as_2d(a: Any, name: str = "a") -> np.ndarray:
    """A 2-D numeric (or bool) matrix from any array-like; ValueError/TypeError naming ``name`` otherwise."""
    return as_array(a, name, ndim=2, dtypes=("b", "i", "u", "f"))


def compiled_dtype_ok(A: Any, x: np.ndarray, dtype: np.dtype) -> bool:
    """``when=`` predicate of the compiled backends: they have float32/float64 kernels only."""
    return dtype in _COMPILED_DTYPES


def index_array(a: Any, name: str, dtype: Any = np.int32) -> np.ndarray:
    """Integer index array checked BEFORE the cast to ``dtype`` (2**32+1 must not wrap to 1), copied and read-only:
    after validation nobody can corrupt it under a kernel that trusts it (``a.indices[0] = -5`` raises)."""
    arr = np.array(a)  # a copy: freezing must not touch the caller's array
    if arr.size == 0:
        arr = arr.astype(dtype)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected an integer array, got dtype {arr.dtype}")
    info = np.iinfo(dtype)
    if arr.size and (int(arr.min()) < info.min or int(arr.max()) > info.max):
        raise ValueError(f"{name}: values [{arr.min()}, {arr.max()}] do not fit {np.dtype(dtype).name}")
    out = np.ascontiguousarray(arr, dtype=dtype)
    out.setflags(write=False)
    return out


def check_compressed(
    indptr: np.ndarray, indices: np.ndarray, n_data: int, shape: tuple[int, int], *, columns: bool = True
) -> None:
    """What a kernel needs before it walks the rows of a compressed (CSR/BSR) matrix of ``shape`` (rows, columns; in
    blocks for BSR): ``indptr`` of shape (rows+1,) rising from 0 to nnz without a step down, nnz = ``len(indices)``
    = ``n_data`` (the entries in ``data``), and with ``columns`` every column in [0, columns).

    O(rows) for ``indptr`` plus one read-only O(nnz) pass for the columns: cheap next to the product. Every matmul
    backend runs it (or the same checks in C++ / inside the numba loop), so a matrix built with ``check=False`` is a
    ValueError there, never an out-of-bounds access."""
    M, K = shape
    if M < 0 or K < 0:
        raise ValueError(f"shape: negative dimension in {shape}")
    if indptr.shape != (M + 1,):
        raise ValueError(f"indptr: expected shape ({M + 1},) for {M} rows, got {indptr.shape}")
    if indices.ndim != 1 or indices.shape[0] != n_data:
        raise ValueError(f"indices/data: must be 1-D of equal length, got {indices.shape} and {n_data} entries")
    nnz = indices.shape[0]
    if indptr[0] != 0 or indptr[-1] != nnz:
        raise ValueError(f"indptr: must rise from 0 to nnz={nnz}, got {indptr[0]}..{indptr[-1]}")
    down = np.flatnonzero(indptr[1:] < indptr[:-1])
    if down.size:
        i = int(down[0])
        raise ValueError(f"indptr: must not decrease, got indptr[{i}]={indptr[i]} > indptr[{i + 1}]={indptr[i + 1]}")
    if columns and nnz and (indices.min() < 0 or indices.max() >= K):
        bad = indices[(indices < 0) | (indices >= K)][0]
        raise ValueError(f"indices: column {bad} out of range for {K} columns")


def check_shape(shape: Any) -> tuple[int, int]:
    """A pair of non-negative Python/numpy ints (TypeError for (1, 4.7), which used to truncate to (1, 4))."""
    if not isinstance(shape, tuple | list) or len(shape) != 2:
        raise TypeError(f"shape: expected a pair of ints, got {shape!r}")
    if not all(is_int(v) for v in shape):
        raise TypeError(f"shape: expected a pair of ints, got {shape!r}")
    if min(shape) < 0:
        raise ValueError(f"shape: negative dimension in {tuple(shape)}")
    return operator.index(shape[0]), operator.index(shape[1])


def register_matmul(op: str, numpy_fn: Any, cpp_fn: Any, numba_fn: Any = None, example: Any = None) -> None:
    """Register a format's three SpMV/SpMM implementations under ``op``; ``example`` (``rng -> (args, kwargs)``,
    args ``(A, x, dtype)``) is the conformance test's input (tests/common/test_conformance.py)."""
    backends.register(op, "numpy", numpy_fn, example=example)
    backends.register(op, "cpp", cpp_fn, when=compiled_dtype_ok, available=lambda: backends.C_available("sparse"))
    if numba_fn is not None:
        backends.register(op, "numba", numba_fn, when=compiled_dtype_ok)


def example_input(from_dense: Any, rng: Any, shape: tuple[int, int] = (12, 8), n: int = 3) -> tuple[tuple, dict]:
    """A conformance example ``((A, x, float32), {})``: a ~60%-sparse float32 matrix with an empty row, x (K, n)."""
    a = rng.standard_normal(shape).astype(np.float32)
    a[rng.random(shape) < 0.6] = 0
    a[1] = 0
    x = rng.standard_normal((shape[1], n)).astype(np.float32)
    return (from_dense(a), x, np.dtype(np.float32)), {}


class SparseMatrix:
    """Base of the formats: ``shape``, ``data``, ``dtype`` and ``A @ dense`` through the registry."""

    format = ""
    op = ""  # the registry op of this format's matmul
    shape: tuple[int, int]
    data: np.ndarray

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    def matmul(self, dense: Any, *, backend: str | None = None, version: str | None = None) -> np.ndarray:
        """A @ dense for 1-D ``dense`` (SpMV, shape (K,)) or 2-D (SpMM, shape (K, N)).

        backend: None (fastest available for this input), "numpy", "numba" (not BSR), "cpp" (alias "cpu")."""
        K = self.shape[1]
        x = as_array(dense, "dense", ndim=(1, 2))
        if x.shape[0] != K:
            raise ValueError(f"dense: first dimension must equal the sparse matrix's {K} columns, got shape {x.shape}")
        dt = np.result_type(self.data.dtype, x.dtype)
        b, _, fn = backends.resolve(self.op, backend, version, (self, x, dt))
        if b != "numpy":
            if dt not in _COMPILED_DTYPES:
                raise TypeError(
                    f"dense: backend={b!r} supports float32/float64 only, got dtype {dt} (the matrix is {self.dtype},"
                    f" dense {x.dtype}); use backend='numpy'"
                )
            x = np.ascontiguousarray(x, dtype=dt)
        return fn(self, x, dt)

    def __matmul__(self, dense: Any) -> np.ndarray:
        return self.matmul(dense)
