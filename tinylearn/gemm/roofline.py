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


def matmul_traffic(m: int, n: int, k: int, itemsize: int = 4) -> tuple[float, float]:
    """(FLOPs, compulsory bytes) of C = A @ B: 2mnk FLOPs; read A and B once, write C once."""
    return 2.0 * m * n * k, float(itemsize * (m * k + k * n + m * n))
