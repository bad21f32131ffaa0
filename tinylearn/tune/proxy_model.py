"""A pre-silicon proxy: rank GEMM schedules on an accelerator described only by a few parameters [Q129]. MODEL.

Before a chip exists there is nothing to time, but the schedule search still has to start. The chip is described by
proxy parameters (``ProxyParams``: cycles per FMA per lane, vector lanes, micro-tile, memory latency as a
distribution (mean, stddev cycles), bandwidth in bytes/cycle, outstanding misses, on-chip buffer bytes, a fixed
overhead per block and per micro-kernel call) and each candidate schedule of a blocked (GotoBLAS) GEMM is costed
analytically, with the latency *sampled*:

    compute cycles  = FMAs padded to the micro-tile (MR x NR) x cycles_per_fma / lanes
    bytes moved     = B once (K N 4), A once per column block (M K 4 ceil(N / nc)), C read+written once per K slice
                      (2 M N 4 ceil(K / kc)); when the packed A block + B panel exceed the buffer, B is re-read per
                      row block (x ceil(M / mc))
    memory cycles   = bytes / bandwidth + (bytes / line) x latency / outstanding misses, latency ~ N(mean, std)
                      per sample (the sum over lines of one sample's draws), ``samples`` samples
    overhead        = blocks x block_overhead + micro-kernel calls x call_overhead
    total           = max(compute, memory) + (1 - overlap) min(compute, memory) + overhead

Every number this module returns is a MODEL estimate (``GemmEstimate.label``). ``cpu_params`` describes this CPU
for each micro-kernel ISA (lanes 16 / 8 / 1); ``validate_on_cpu`` ranks configurations of the ``gemm.matmul`` space
by the model and by measured time and reports Kendall's tau (positive: the proxy orders schedules usefully), which
is what justifies using the same model on a hypothetical accelerator (``HYPOTHETICAL``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

LABEL = "MODEL"


@dataclass(frozen=True)
class ProxyParams:
    """Proxy parameters of a (possibly not yet built) accelerator; see the module docstring."""

    name: str
    cycles_per_fma: float  # per lane: 0.5 = two vector FMA pipes
    lanes: int  # fp32 lanes per vector FMA
    mr: int  # micro-tile rows
    nr: int  # micro-tile columns
    mem_latency_mean: float  # cycles
    mem_latency_std: float  # cycles
    bytes_per_cycle: float  # sustained bandwidth to the next level
    buffer_bytes: int  # on-chip buffer (the cache level the blocks target)
    outstanding: float = 8.0  # misses in flight (memory-level parallelism)
    line_bytes: int = 64
    block_overhead: float = 400.0  # cycles per (jc, pc, ic) block: loop control, packing start-up
    call_overhead: float = 20.0  # cycles per micro-kernel call
    overlap: float = 0.8  # fraction of the smaller of compute/memory hidden under the larger
    freq_hz: float = 2.5e9

    def __post_init__(self) -> None:
        for k in ("cycles_per_fma", "mem_latency_mean", "bytes_per_cycle", "outstanding", "freq_hz"):
            v = getattr(self, k)
            if not isinstance(v, int | float) or not v > 0:
                raise ValueError(f"{k}: expected a positive number, got {v!r}")
        for k in ("lanes", "mr", "nr", "buffer_bytes", "line_bytes"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{k}: expected an int >= 1, got {v!r}")
        if self.mem_latency_std < 0:
            raise ValueError(f"mem_latency_std: expected >= 0, got {self.mem_latency_std!r}")
        if not 0.0 <= self.overlap <= 1.0:
            raise ValueError(f"overlap: expected a fraction in [0, 1], got {self.overlap!r}")


@dataclass
class GemmEstimate:
    """A MODEL estimate of one GEMM schedule: cycles (mean and stddev over latency samples) and their parts."""

    cycles: float
    cycles_std: float
    compute_cycles: float
    memory_cycles: float
    overhead_cycles: float
    bytes_moved: float
    seconds: float
    bound: str  # "compute" or "memory"
    label: str = LABEL


def _pos_int(v: Any, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
        raise ValueError(f"{name}: expected an int >= 1, got {v!r}")
    return int(v)


def gemm_cost(
    p: ProxyParams, M: int, N: int, K: int, mc: int, kc: int, nc: int, *, samples: int = 32, seed: int = 0
) -> GemmEstimate:
    """MODEL cost of C[M,N] = A[M,K] B[K,N] blocked by (mc, kc, nc) on ``p`` (fp32; see the module docstring)."""
    if not isinstance(p, ProxyParams):
        raise TypeError(f"p: expected ProxyParams, got {type(p).__name__}")
    M, N, K = _pos_int(M, "M"), _pos_int(N, "N"), _pos_int(K, "K")
    mc, kc, nc = min(_pos_int(mc, "mc"), M), min(_pos_int(kc, "kc"), K), min(_pos_int(nc, "nc"), N)
    samples = _pos_int(samples, "samples")
    fmas = math.ceil(M / p.mr) * p.mr * math.ceil(N / p.nr) * p.nr * K
    compute = fmas * p.cycles_per_fma / p.lanes
    jb, pb, ib = math.ceil(N / nc), math.ceil(K / kc), math.ceil(M / mc)
    b_bytes = 4.0 * K * N
    if 4.0 * (mc * kc + kc * nc) > p.buffer_bytes:
        b_bytes *= ib  # the B panel does not stay on chip across row blocks
    moved = b_bytes + 4.0 * M * K * jb + 8.0 * M * N * pb
    lines = moved / p.line_bytes
    rng = np.random.default_rng(seed)
    # the summed latency of `lines` independent draws ~ N(lines * mean, sqrt(lines) * std), one per sample
    lat = rng.normal(lines * p.mem_latency_mean, math.sqrt(lines) * p.mem_latency_std, samples).clip(min=0.0)
    memory = moved / p.bytes_per_cycle + lat / p.outstanding
    calls = jb * pb * ib * math.ceil(mc / p.mr) * math.ceil(nc / p.nr)
    overhead = jb * pb * ib * p.block_overhead + calls * p.call_overhead
    total = np.maximum(compute, memory) + (1.0 - p.overlap) * np.minimum(compute, memory) + overhead
    mean = float(total.mean())
    return GemmEstimate(mean, float(total.std()), compute, float(memory.mean()), overhead, moved, mean / p.freq_hz,
                        "compute" if compute >= memory.mean() else "memory")  # fmt: skip


# This CPU, per micro-kernel ISA (AVX-512 / AVX2 / scalar): two FMA pipes, L2-sized buffer, DRAM-ish latency.
_CPU = ProxyParams("this CPU (avx512)", cycles_per_fma=0.5, lanes=16, mr=6, nr=32, mem_latency_mean=250.0,
                   mem_latency_std=80.0, bytes_per_cycle=16.0, buffer_bytes=1 << 20, outstanding=12.0)  # fmt: skip
HYPOTHETICAL = ProxyParams("hypothetical NPU", cycles_per_fma=0.25, lanes=128, mr=16, nr=128, mem_latency_mean=600.0,
                           mem_latency_std=200.0, bytes_per_cycle=64.0, buffer_bytes=256 << 10, outstanding=32.0,
                           block_overhead=2000.0, call_overhead=50.0, overlap=0.9, freq_hz=1.0e9)  # fmt: skip


def cpu_params(isa: str = "avx512") -> ProxyParams:
    """Proxy parameters of this CPU running the ``isa`` micro-kernel (MR x NR from the C++ GEMM's kernel_shape)."""
    lanes = {"avx512": 16, "avx2": 8, "scalar": 1}
    if isa not in lanes:
        raise ValueError(f"isa: expected one of {list(lanes)}, got {isa!r}")
    mr, nr = 6, 32 if isa == "avx512" else 16
    return replace(_CPU, name=f"this CPU ({isa})", lanes=lanes[isa], nr=nr, mr=mr)


def rank_configs(
    configs: Sequence[Mapping[str, Any]], shape: Mapping[str, int], params: ProxyParams | None = None
) -> list[tuple[dict[str, Any], GemmEstimate]]:
    """Configurations (dicts with mc, kc, nc, optionally isa) sorted by MODEL cycles, fastest first. Without
    ``params`` each config is costed on ``cpu_params(config["isa"])``."""
    if not configs:
        raise ValueError("configs: expected at least one configuration")
    out = []
    for c in configs:
        p = params if params is not None else cpu_params(str(c.get("isa", "avx512")))
        est = gemm_cost(p, int(shape["M"]), int(shape["N"]), int(shape["K"]), int(c["mc"]), int(c["kc"]), int(c["nc"]))
        out.append((dict(c), est))
    return sorted(out, key=lambda t: t[1].cycles)


def validation_configs(shape: Mapping[str, int], n: int = 12, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` single-thread configurations of the ``gemm.matmul`` space valid for ``shape`` (every ISA present)."""
    from ..tunable import get

    space = get("gemm.matmul")
    cands = [c for c in space.configs(dict(shape)) if c["version"] == "simd" and c["threads"] == 1]
    if not cands:
        raise ValueError(f"shape: no single-thread gemm.matmul configuration is valid for {dict(shape)}")
    rng = np.random.default_rng(seed)
    by_isa: dict[str, list[dict[str, Any]]] = {}
    for c in cands:
        by_isa.setdefault(c["isa"], []).append(c)
    per = max(1, n // len(by_isa))
    out = []
    for _isa, cs in sorted(by_isa.items()):
        idx = rng.choice(len(cs), size=min(per, len(cs)), replace=False)
        out += [cs[int(i)] for i in sorted(idx)]
    return out


def validate_on_cpu(shape: Mapping[str, int] | None = None, n: int = 12, repeat: int = 3, seed: int = 0
                    ) -> dict[str, Any]:  # fmt: skip
    """Measure ``n`` configurations of the gemm.matmul space (``tinylearn.bench.measure``, min of ``repeat``) and
    rank them with the MODEL: {"tau", "p_value", "rows": [{config, measured_s, model_s}], "label": "MODEL"}."""
    from scipy.stats import kendalltau

    from ..bench import measure
    from ..tunable import get

    shape = dict(shape or {"M": 256, "N": 256, "K": 256})
    space = get("gemm.matmul")
    configs = validation_configs(shape, n, seed)
    args, kwargs = space.make_args(shape, np.random.default_rng(seed))
    rows = []
    for c in configs:
        fn = space.build(c)
        t = measure(lambda fn=fn: fn(*args, **kwargs), warmup=1, repeat=repeat)
        est = gemm_cost(cpu_params(c["isa"]), shape["M"], shape["N"], shape["K"], c["mc"], c["kc"], c["nc"])
        rows.append({"config": c, "measured_s": t.min, "model_s": est.seconds})
    res = kendalltau([r["measured_s"] for r in rows], [r["model_s"] for r in rows])
    return {"tau": float(res.statistic), "p_value": float(res.pvalue), "rows": rows, "label": LABEL}


FEATURE_NAMES = ("log2_M", "log2_N", "log2_K", "log2_mc", "log2_kc", "log2_nc", "intensity", "a_block_bytes",
                 "b_panel_bytes", "blocks")  # fmt: skip


def schedule_features(M: int, N: int, K: int, mc: int, kc: int, nc: int) -> dict[str, float]:
    """Features of a blocked GEMM schedule for a learned cost model (blocks clamped to the matrix: a block larger
    than its dimension is one block): log2 of the sizes and of the clamped blocks, arithmetic intensity
    2MNK / (4 (MK + KN + MN)) flop per byte (fp32, each matrix moved once), the bytes of the packed A block
    (4 mc kc) and B panel (4 kc nc), and the number of (mc, kc, nc) blocks."""
    M, N, K = _pos_int(M, "M"), _pos_int(N, "N"), _pos_int(K, "K")
    mc, kc, nc = min(_pos_int(mc, "mc"), M), min(_pos_int(kc, "kc"), K), min(_pos_int(nc, "nc"), N)
    return {
        "log2_M": math.log2(M), "log2_N": math.log2(N), "log2_K": math.log2(K),
        "log2_mc": math.log2(mc), "log2_kc": math.log2(kc), "log2_nc": math.log2(nc),
        "intensity": 2.0 * M * N * K / (4.0 * (M * K + K * N + M * N)),
        "a_block_bytes": 4.0 * mc * kc, "b_panel_bytes": 4.0 * kc * nc,
        "blocks": float(math.ceil(M / mc) * math.ceil(K / kc) * math.ceil(N / nc)),
    }  # fmt: skip
