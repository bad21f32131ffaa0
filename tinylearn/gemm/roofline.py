"""The roofline model and this machine's two roofs, for the GEMM topic.

``machine_peak()`` (measured once per process: the register FMA loop on every core and on one, STREAM triad) and
``roofline(flops, nbytes)`` (intensity = flops / nbytes; attainable = min(peak, intensity * bandwidth); memory-bound
left of the ridge point peak / bandwidth, compute-bound right of it) live in ``tinylearn.bench.roofline``, the one
roofline module; ``tl.gemm.machine_peak`` is re-exported and ``tl.gemm.roofline`` wraps the shared one, adding an
``advice`` field: what to optimise next for the kernel the numbers describe (``roofline_advice``). This module also
adds what is GEMM's own: the compulsory traffic of C = A @ B (``matmul_traffic``) and the register-to-L1 intensity of
a micro-kernel's blocking (``tile_intensity``).
"""

from __future__ import annotations

from .._inputs import is_int
from ..bench.roofline import _positive, machine_peak
from ..bench.roofline import roofline as _roofline

__all__ = ["ADVICE", "NEAR_PEAK", "machine_peak", "matmul_traffic", "roofline", "roofline_advice", "tile_intensity"]

NEAR_PEAK = 0.5  # a compute-bound kernel at >= this fraction of the compute roof is "at the roof"
ADVICE = {
    "memory": "raise arithmetic intensity (cache blocking / fusion)",
    "compute": "vectorise / add ILP (register blocking)",
    "roof": "at the roof",
}


def roofline_advice(bound: str, achieved_gflops: float, peak_gflops: float) -> str:
    """What to optimise next: ``ADVICE["memory"]`` for a memory-bound kernel (more FLOPs per byte moved: cache
    blocking, fusion); for a compute-bound one ``ADVICE["compute"]`` below ``NEAR_PEAK`` of the compute roof (the FMA
    units idle: SIMD, independent accumulators, register blocking), else ``ADVICE["roof"]``."""
    if bound not in ("memory", "compute"):
        raise ValueError(f"bound: expected 'memory' or 'compute', got {bound!r}")
    achieved = _positive("achieved_gflops", achieved_gflops, allow_zero=True)
    peak = _positive("peak_gflops", peak_gflops)
    if bound == "memory":
        return ADVICE["memory"]
    return ADVICE["roof"] if achieved >= NEAR_PEAK * peak else ADVICE["compute"]


def roofline(
    flops: float,
    nbytes: float,
    peak_gflops: float | None = None,
    bandwidth_gbs: float | None = None,
    achieved_gflops: float | None = None,
) -> dict:
    """``tinylearn.bench.roofline.roofline`` (intensity, attainable_gflops, bound, ridge, time_s; roofs default to
    ``machine_peak()``) plus ``advice``: ``roofline_advice(bound, achieved, peak)``. ``achieved_gflops`` is the
    kernel's measured rate; without it the kernel is assumed to run at its attainable rate (a compute-bound one is
    then "at the roof")."""
    r = _roofline(flops, nbytes, peak_gflops, bandwidth_gbs)
    peak = machine_peak()["gflops_fp32"] if peak_gflops is None else peak_gflops  # cached: measured once
    achieved = r["attainable_gflops"] if achieved_gflops is None else achieved_gflops
    r["advice"] = roofline_advice(r["bound"], achieved, peak)
    return r


def _int(name: str, v: int, low: int) -> int:
    """``v`` as a Python int >= ``low`` (numpy ints accepted: no int32 overflow in m * n * k); ValueError else."""
    if not is_int(v) or v < low:
        raise ValueError(f"{name}: must be {'a positive' if low == 1 else 'a non-negative'} int, got {v!r}")
    return int(v)


def matmul_traffic(m: int, n: int, k: int, itemsize: int = 4, write_allocate: bool = True) -> tuple[float, float]:
    """(FLOPs, compulsory DRAM bytes) of C = A @ B: 2mnk FLOPs; read A and B once and write C once.

    With ``write_allocate`` (the default: what a write-back cache does on a normal store) the first store to each
    line of C reads that line from memory before it is overwritten, so C costs a read and a write:
    itemsize * (mk + kn + 2mn) bytes — 16 n^2 for fp32 n x n x n, intensity n / 8 (n / 6 without the read of C,
    which only non-temporal / streaming stores avoid)."""
    m, n, k = (_int(name, v, 0) for name, v in (("m", m), ("n", n), ("k", k)))
    itemsize = _int("itemsize", itemsize, 1)
    c_bytes = 2 * m * n if write_allocate else m * n
    return 2.0 * m * n * k, float(itemsize * (m * k + k * n + c_bytes))


def tile_intensity(mr: int, nr: int, itemsize: int = 4, c_in_registers: bool = True) -> float:
    """FLOPs per byte an inner loop moves between registers and the L1 cache, from its register blocking.

    ``c_in_registers``: an mr x nr tile of C stays in registers for the whole k loop; per k the loop loads mr
    values of A and nr of B for 2*mr*nr FLOPs: intensity 2*mr*nr / (itemsize*(mr + nr)) (naive: 1 x 1 -> 1/4;
    a 6 x 16 micro-kernel -> 192/88 = 2.18 FLOP/byte for fp32). Otherwise (the ikj / blocked inner loop
    ``C[i, j] += a * B[k, j]``: only the scalar of A in a register) every FMA loads B, loads C and stores C:
    2 / (3*itemsize) = 1/6 for fp32, whatever mr and nr."""
    mr, nr, itemsize = (_int(name, v, 1) for name, v in (("mr", mr), ("nr", nr), ("itemsize", itemsize)))
    if not c_in_registers:
        return 2.0 / (3 * itemsize)
    return 2.0 * mr * nr / (itemsize * (mr + nr))
