"""The roofline model and this machine's two roofs.

``machine_peak()`` measures (once per process, then cached):
  gflops_fp32     register-only FMA loop on every core (tinylearn._C.gemm.fma_peak): the compute roof
  gflops_fp32_1t  the same on one thread
  bandwidth_gbs   STREAM triad a = b + s*c (tinylearn.bench.roofline.stream_bandwidth): the memory roof
  cores, isa      threads used; the FMA ISA (avx512 / avx2 / scalar)
``roofline(flops, nbytes)``: intensity = flops / nbytes; attainable = min(peak, intensity * bandwidth); the kernel
is memory-bound left of the ridge point peak / bandwidth and compute-bound right of it.
"""

from __future__ import annotations

import functools
import os
from numbers import Real

from .. import backends


@functools.cache
def machine_peak() -> dict:
    """Measured compute and memory roofs of this machine (cached for the process)."""
    from ..bench.roofline import peak_gflops, stream_bandwidth

    cores = len(os.sched_getaffinity(0))
    bw = stream_bandwidth(n=10_000_000, repeat=3)
    if backends.C_available("gemm"):
        g = backends.load_C("gemm")
        many = g.fma_peak(iters=4_000_000, threads=cores, repeat=5)
        one = g.fma_peak(iters=4_000_000, threads=1, repeat=5)
        return {
            "gflops_fp32": float(many["gflops"]),
            "gflops_fp32_1t": float(one["gflops"]),
            "bandwidth_gbs": float(bw),
            "cores": cores,
            "isa": str(many["isa"]),
            "source": "register FMA loop (tinylearn._C.gemm.fma_peak) + STREAM triad",
        }
    p = peak_gflops(n=1024, repeat=3)  # no C++ extension: the best BLAS SGEMM is the practical roof
    return {
        "gflops_fp32": float(p.gflops),
        "gflops_fp32_1t": float("nan"),
        "bandwidth_gbs": float(bw),
        "cores": cores,
        "isa": "unknown",
        "source": f"{p.source} (tinylearn._C missing) + STREAM triad",
    }


def _positive(name: str, v: object, allow_zero: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, Real):
        raise TypeError(f"{name}: must be a real number, got {type(v).__name__} {v!r}")
    f = float(v)
    if not (f >= 0 if allow_zero else f > 0) or f != f or f == float("inf"):
        raise ValueError(f"{name}: must be {'>= 0' if allow_zero else '> 0'} and finite, got {v!r}")
    return f


def roofline(flops: float, nbytes: float, peak_gflops: float | None = None, bandwidth_gbs: float | None = None) -> dict:
    """Attainable GFLOP/s of a kernel doing ``flops`` FLOPs over ``nbytes`` bytes of memory traffic.

    Roofs default to ``machine_peak()``. Returns dict(intensity [FLOP/byte], attainable_gflops,
    bound='memory'|'compute', ridge [FLOP/byte], time_s [lower bound on run time]).
    """
    f = _positive("flops", flops, allow_zero=True)
    b = _positive("nbytes", nbytes)
    if peak_gflops is None or bandwidth_gbs is None:
        mp = machine_peak()
        peak_gflops = mp["gflops_fp32"] if peak_gflops is None else peak_gflops
        bandwidth_gbs = mp["bandwidth_gbs"] if bandwidth_gbs is None else bandwidth_gbs
    p = _positive("peak_gflops", peak_gflops)
    w = _positive("bandwidth_gbs", bandwidth_gbs)
    intensity = f / b
    mem = intensity * w
    attainable = min(p, mem)
    return {
        "intensity": intensity,
        "attainable_gflops": attainable,
        "bound": "memory" if mem < p else "compute",
        "ridge": p / w,
        "time_s": max(f / (p * 1e9), b / (w * 1e9)),
    }


def matmul_traffic(m: int, n: int, k: int, itemsize: int = 4, write_allocate: bool = True) -> tuple[float, float]:
    """(FLOPs, compulsory DRAM bytes) of C = A @ B: 2mnk FLOPs; read A and B once and write C once.

    With ``write_allocate`` (the default: what a write-back cache does on a normal store) the first store to each
    line of C reads that line from memory before it is overwritten, so C costs a read and a write:
    itemsize * (mk + kn + 2mn) bytes — 16 n^2 for fp32 n x n x n, intensity n / 8 (n / 6 without the read of C,
    which only non-temporal / streaming stores avoid)."""
    c_bytes = 2 * m * n if write_allocate else m * n
    return 2.0 * m * n * k, float(itemsize * (m * k + k * n + c_bytes))


def tile_intensity(mr: int, nr: int, itemsize: int = 4, c_in_registers: bool = True) -> float:
    """FLOPs per byte an inner loop moves between registers and the L1 cache, from its register blocking.

    ``c_in_registers``: an mr x nr tile of C stays in registers for the whole k loop; per k the loop loads mr
    values of A and nr of B for 2*mr*nr FLOPs: intensity 2*mr*nr / (itemsize*(mr + nr)) (naive: 1 x 1 -> 1/4;
    a 6 x 16 micro-kernel -> 192/88 = 2.18 FLOP/byte for fp32). Otherwise (the ikj / blocked inner loop
    ``C[i, j] += a * B[k, j]``: only the scalar of A in a register) every FMA loads B, loads C and stores C:
    2 / (3*itemsize) = 1/6 for fp32, whatever mr and nr."""
    for name, v in (("mr", mr), ("nr", nr), ("itemsize", itemsize)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: must be a positive int, got {v!r}")
    if not c_in_registers:
        return 2.0 / (3 * itemsize)
    return 2.0 * mr * nr / (itemsize * (mr + nr))
