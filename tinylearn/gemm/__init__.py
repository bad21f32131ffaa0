"""GEMM from the textbook loop to near-BLAS, the roofline, and the CUDA programming model.

    import tinylearn as tl
    c = tl.gemm.matmul(a, b)                                   # fastest available (C++ packed SIMD + OpenMP)
    c = tl.gemm.matmul(a, b, backend="cpp", version="naive")   # one rung of the ladder
    tl.gemm.versions("cpp")        # ['naive', 'ikj', 'blocked', 'packed', 'simd', 'parallel']
    tl.gemm.machine_peak()         # measured FMA peak + STREAM bandwidth (cached)
    tl.gemm.roofline(flops, nbytes)
    tl.gemm.occupancy(256, 64, 16384, arch="sm_80")

Modules: ops (matmul + backend registration), packing (numpy blocking/packing references), roofline, occupancy,
gpu_model (warps, coalescing, bank conflicts), cuda_trace (the CUDA ladder's shared/global accesses replayed),
numba_cpu, numba_sim (numba.cuda simulator), triton_kernels, cuda (cupy RawModule for cuda_src/gemm_*.cu),
bench (``tinylearn bench gemm``).
"""

from .occupancy import ARCHS, occupancy
from .ops import CPP_VERSIONS, CUDA_VERSIONS, matmul, versions
from .packing import blocked_matmul, pack_a, pack_b, packed_matmul
from .roofline import machine_peak, matmul_traffic, roofline, tile_intensity

__all__ = [
    "matmul",
    "versions",
    "machine_peak",
    "roofline",
    "matmul_traffic",
    "tile_intensity",
    "occupancy",
    "ARCHS",
    "CPP_VERSIONS",
    "CUDA_VERSIONS",
    "pack_a",
    "pack_b",
    "blocked_matmul",
    "packed_matmul",
]
