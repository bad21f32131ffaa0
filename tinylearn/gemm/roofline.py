"""The roofline model and this machine's two roofs, for the GEMM topic.

``machine_peak()`` (measured once per process: the register FMA loop on every core and on one, STREAM triad) and
``roofline(flops, nbytes)`` (intensity = flops / nbytes; attainable = min(peak, intensity * bandwidth); memory-bound
left of the ridge point peak / bandwidth, compute-bound right of it) live in ``tinylearn.bench.roofline``, the one
roofline module; they are re-exported here as ``tl.gemm.machine_peak`` / ``tl.gemm.roofline``. This module adds what
is GEMM's own: the compulsory traffic of C = A @ B (``matmul_traffic``) and the register-to-L1 intensity of a
micro-kernel's blocking (``tile_intensity``).
"""

from __future__ import annotations

from .._inputs import is_int
from ..bench.roofline import machine_peak, roofline

__all__ = ["machine_peak", "matmul_traffic", "roofline", "tile_intensity"]


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
