"""Bytes moved and FLOPs of unfused vs fused op chains, and the roofline time they predict.

Model. An op chain runs over tensors of ``elems`` elements of ``itemsize`` bytes. Unfused, every step is its own
kernel (one numpy call): it reads each full-size input from main memory and writes its full-size output back, so
bytes_unfused = sum_steps (reads + writes) * elems * itemsize (a reduction writes one value per row, counted as
``rows``). Fused, the chain is one kernel that reads the external inputs once and writes the final outputs once;
intermediates live in registers / L1 (the row fits in cache): bytes_fused = (inputs + outputs) * elems * itemsize.
FLOPs are the same for both (exp, erf, tanh, rsqrt each count as one FLOP — a convention; on CPUs they cost ~10-20
instructions, which is why GELU can become compute-bound once fused).

Roofline: t = max(bytes / bandwidth, flops / peak). Attainable GFLOP/s = min(peak, intensity * bandwidth) with
intensity = flops / bytes. Use ``tinylearn.bench.roofline.stream_bandwidth()`` and ``peak_gflops()`` for the
machine numbers. Attention: naive materialises S and P ([N, N] per head) through ~10 N^2-sized passes; flash
attention reads Q once and K, V once per query block (Nq / block_size times) and writes only O (+ lse).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..bench.roofline import roofline_time  # noqa: F401  (re-exported: the one roofline module)


@dataclass(frozen=True)
class Step:
    """One unfused kernel: ``reads`` full-size arrays in, ``writes`` full-size arrays out (``reduce``: the output is
    one value per row), ``flops`` per element."""

    name: str
    reads: int
    writes: int
    flops: float
    reduce: bool = False


@dataclass(frozen=True)
class Traffic:
    name: str
    bytes_unfused: float
    bytes_fused: float
    flops: float

    @property
    def intensity_unfused(self) -> float:
        return self.flops / self.bytes_unfused

    @property
    def intensity_fused(self) -> float:
        return self.flops / self.bytes_fused

    @property
    def byte_ratio(self) -> float:
        """How many times more bytes the unfused chain moves: the ideal speedup of fusing a memory-bound chain."""
        return self.bytes_unfused / self.bytes_fused


SOFTMAX_STEPS = (
    Step("max", 1, 0, 1, reduce=True),
    Step("x - max", 1, 1, 1),
    Step("exp", 1, 1, 1),
    Step("sum", 1, 0, 1, reduce=True),
    Step("divide", 1, 1, 1),
)
LAYER_NORM_STEPS = (
    Step("mean", 1, 0, 1, reduce=True),
    Step("x - mean", 1, 1, 1),
    Step("square", 1, 1, 1),
    Step("mean of squares", 1, 0, 1, reduce=True),
    Step("* rstd", 1, 1, 1),
    Step("* weight", 1, 1, 1),
    Step("+ bias", 1, 1, 1),
)
BIAS_GELU_STEPS = (
    Step("x + bias", 1, 1, 1),
    Step("0.5 * u", 1, 1, 1),
    Step("u / sqrt(2)", 1, 1, 1),
    Step("erf", 1, 1, 1),
    Step("1 + erf", 1, 1, 1),
    Step("product", 2, 1, 1),
)


def chain_traffic(
    name: str,
    steps: tuple[Step, ...],
    rows: int,
    cols: int,
    itemsize: int = 4,
    inputs: int = 1,
    outputs: int = 1,
    extra_bytes: float = 0.0,
) -> Traffic:
    """Unfused vs fused bytes of ``steps`` over a [rows, cols] tensor; ``extra_bytes`` (weights, stats) is added to
    both. ``inputs``/``outputs``: full-size arrays the fused kernel must read/write."""
    if rows < 1 or cols < 1 or itemsize < 1:
        raise ValueError(f"rows/cols/itemsize: must be >= 1, got {rows}, {cols}, {itemsize}")
    n = rows * cols
    unfused = sum((s.reads * n + (rows if s.reduce else s.writes * n)) * itemsize for s in steps)
    fused = (inputs + outputs) * n * itemsize
    flops = sum(s.flops for s in steps) * n
    return Traffic(name, unfused + extra_bytes, fused + extra_bytes, flops)


def softmax_traffic(rows: int, cols: int, itemsize: int = 4) -> Traffic:
    return chain_traffic("softmax", SOFTMAX_STEPS, rows, cols, itemsize)


def layer_norm_traffic(rows: int, cols: int, itemsize: int = 4) -> Traffic:
    # weight + bias read once, mean + rstd written once per row
    return chain_traffic(
        "layer_norm", LAYER_NORM_STEPS, rows, cols, itemsize, extra_bytes=(2 * cols + 2 * rows) * itemsize
    )


def bias_gelu_traffic(rows: int, cols: int, itemsize: int = 4) -> Traffic:
    return chain_traffic("bias_gelu", BIAS_GELU_STEPS, rows, cols, itemsize, extra_bytes=cols * itemsize)


def attention_traffic(
    batch_heads: int, n: int, d: int, itemsize: int = 4, block_size: int = 64, causal: bool = False
) -> Traffic:
    """Naive (S, P materialised) vs flash attention for [batch_heads, n, d] q, k, v.

    Naive: S = QK^T writes N^2; scale r+w; softmax chain (5 steps, ~8 N^2 passes); P @ V reads N^2. Flash: read Q and
    write O once, read K and V once per query block. FLOPs: 4 N^2 D (two matmuls) + 6 N^2 (scale + softmax);
    causal halves both the N^2 terms (approximately).
    """
    if n < 1 or d < 1 or batch_heads < 1 or block_size < 1:
        raise ValueError(f"batch_heads/n/d/block_size: must be >= 1, got {batch_heads}, {n}, {d}, {block_size}")
    frac = 0.5 if causal else 1.0
    nn = n * n * frac
    nd = n * d
    sm = sum(s.reads * nn + (n if s.reduce else s.writes * nn) for s in SOFTMAX_STEPS)
    naive = (
        2 * nd + nn + 2 * nn + sm + nn + nd + nd
    )  # QK^T (read Q, K; write S), scale, softmax, PV (read P, V; write O)
    blocks = -(-n // block_size)
    kv_reads = 2 * nd * blocks * (0.5 + 0.5 / blocks if causal else 1.0)
    flash = nd + kv_reads + nd + n  # read Q, stream K/V per query block, write O and lse
    flops = 4 * nn * d + 6 * nn
    return Traffic("attention", batch_heads * naive * itemsize, batch_heads * flash * itemsize, batch_heads * flops)


def predict(t: Traffic, peak_gflops: float, bandwidth_gbs: float) -> dict[str, float]:
    """Roofline-predicted seconds for the unfused and fused versions of ``t``."""
    return {
        "unfused_s": roofline_time(t.bytes_unfused, t.flops, peak_gflops, bandwidth_gbs),
        "fused_s": roofline_time(t.bytes_fused, t.flops, peak_gflops, bandwidth_gbs),
    }
