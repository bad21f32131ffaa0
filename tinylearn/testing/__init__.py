"""Op-test harness: the torch-oracle tolerance table, strided/broadcast input generators and device detection.

Tolerance rule (DESIGN.md):  |actual - expected| <= atol + rtol * |expected|, elementwise, after upcasting low
precision to float32.  Integers and bools are compared exactly.
"""

from ..tolerance import TOLERANCES, assert_close, to_numpy, tolerance
from .devices import (
    clang_available,
    cuda_available,
    mpi_available,
    numba_available,
    nvcc_available,
    nvcc_compile_ptx,
    triton_available,
)
from .inputs import LAYOUTS, broadcast_shape_pairs, make_array, make_layouts

__all__ = [
    "TOLERANCES",
    "LAYOUTS",
    "assert_close",
    "tolerance",
    "to_numpy",
    "make_array",
    "make_layouts",
    "broadcast_shape_pairs",
    "cuda_available",
    "nvcc_available",
    "nvcc_compile_ptx",
    "clang_available",
    "triton_available",
    "numba_available",
    "mpi_available",
]
