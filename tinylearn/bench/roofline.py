"""Machine limits for the roofline model: attainable GFLOP/s = min(peak, intensity * bandwidth).

- ``peak_gflops()``: measured fp32 SGEMM throughput (numpy BLAS and torch, 2*n^3 flops per n x n matmul; the
  better of the two is the practical peak).
- ``theoretical_peak_gflops()``: cores x GHz x FMA-units x SIMD-lanes x 2 from /proc/cpuinfo flags — an upper
  bound the measured figure should stay below. GHz is max(nominal clock from /proc/cpuinfo, measured clock):
  cloud CPUs turbo well above the nominal clock, so the nominal figure alone is not an upper bound. The number of
  FMA ports is a guess (2); the function says what it assumed.
- ``measured_ghz()``: the core clock measured by timing a chain of dependent integer adds (one cycle each) in
  C++ (``_C.machine.add_chain``); best of ~25 runs of ~1 ms, so it is the turbo clock of an unloaded core.
- ``mac_ceilings()``: multiply-accumulates per ns of one core issuing only one instruction mix (fp32 FMA, the
  exact int8 steps vpmaddwd / vpmaddubsw / vpdpbusd, an int + fp32 mix), ``_C.machine.mac_rate``: what an int8
  GEMM can gain over fp32 *on this core* before any kernel is written (on a Zen 2 EPYC: nothing, 1.0x).
- ``stream_bandwidth()``: STREAM triad a = b + s*c on float64 in C++/OpenMP (24 bytes per element counted), with
  arrays far larger than the last-level cache.
- ``roofline_plot(ax, peak_gflops, bandwidth_gbs, points)``: the two roofs and measured kernels as points
  (arithmetic intensity in FLOP/byte, achieved GFLOP/s).

The model and this machine's roofs, in one place for every topic (``tl.gemm`` and ``kernels.bench`` re-export them):

- ``attainable_gflops(intensity, peak, bw)`` = min(peak, intensity * bw); ``ridge_point(peak, bw)`` = peak / bw
  (FLOP/byte where the roofs meet); ``roofline_time(bytes, flops, peak, bw)`` = max(bytes / bw, flops / peak) seconds;
  ``roofline(flops, nbytes)``: all of it for one kernel (intensity, attainable, bound, ridge, time), roofs defaulting
  to ``machine_peak()``.
- ``machine_peak()``: the register FMA loop (``_C.gemm.fma_peak``, which runs ``_C.machine``'s probe on every
  thread) on all cores and on one, plus STREAM triad; cached per process. ``machine_roofs(threads)``: (best BLAS
  SGEMM GFLOP/s, STREAM GB/s) with ``threads`` threads, the practical roofs a fused kernel is compared with; cached.
"""

from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass
from numbers import Real
from typing import Any

import numpy as np

from .. import backends
from .._threads import cores as _n_cores
from .._threads import limited_threads


@dataclass
class Peak:
    gflops: float
    source: str
    details: dict[str, float]


def _time_best(fn: Any, repeat: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def peak_gflops(n: int = 2048, repeat: int = 5) -> Peak:
    """Measured fp32 peak: best of numpy and torch n x n SGEMM (2 n^3 FLOPs)."""
    if n < 16:
        raise ValueError(f"n: matrix size must be >= 16, got {n}")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    flops = 2.0 * n**3
    details = {"numpy": flops / _time_best(lambda: a @ b, repeat) / 1e9}
    try:
        import torch

        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        details["torch"] = flops / _time_best(lambda: ta @ tb, repeat) / 1e9
    except ImportError:
        pass
    src = max(details, key=details.get)
    return Peak(details[src], f"{src} sgemm {n}x{n}", details)


def cpu_flags() -> set[str]:
    """Every flag /proc/cpuinfo reports for the first CPU (e.g. 'avx512_bf16', 'amx_bf16'), whatever
    TINYLEARN_CPU_FEATURES says; empty where the file does not exist (not Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_ghz() -> float | None:
    """Nominal/current clock from /proc/cpuinfo ("cpu MHz", else the GHz in the model name)."""
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return None
    m = re.search(r"@\s*([\d.]+)\s*GHz", text)
    if m:
        return float(m.group(1))
    mhz = re.findall(r"cpu MHz\s*:\s*([\d.]+)", text)
    return float(mhz[0]) / 1000 if mhz else None


def measured_ghz(runs: int = 25, n: int = 3_000_000) -> float | None:
    """Core clock in GHz from ``runs`` timings of ``n`` dependent adds (1 cycle each): n / best seconds / 1e9.

    The best (shortest) run is the one least disturbed by pre-emption, so it is the clock the core actually ran
    at, turbo included. None when the C++ extension is not built.
    """
    if runs < 1:
        raise ValueError(f"runs: must be >= 1, got {runs}")
    if n < 1000:
        raise ValueError(f"n: chain length must be >= 1000, got {n}")
    if not backends.C_available("machine"):
        return None
    chain = backends.load_C("machine").add_chain
    n -= n % 8  # the kernel runs the chain in blocks of 8 adds
    chain(n)  # warm-up: lets the core leave its idle clock
    best = min(chain(n) for _ in range(runs))
    return n / best / 1e9


def mac_ceilings(trips: int = 20_000, runs: int = 7) -> dict[str, float] | None:
    """Best-of-``runs`` multiply-accumulates per nanosecond, one core, for every ``_C.machine.mac_kinds()`` kind
    this CPU has (kinds needing missing features are left out). None when the C++ extension is not built.

    Each kind is a loop of one instruction mix over 10 independent accumulators, so it runs at the issue rate of
    the ports that execute it: fp32_fma_ymm = 2 x 8 MACs per cycle where a core has two FMA pipes, int8_madd16_ymm
    = 16 per vpmaddwd, int8_u7_ymm = 32 per vpmaddubsw + vpmaddwd pair, int8_vnni_zmm = 64 per vpdpbusd. The ratio
    of the best int8 kind to fp32_fma_ymm (or _zmm) is the most an exact int8 GEMM can beat an fp32 one by here.
    """
    if trips < 1 or runs < 1:
        raise ValueError(f"trips/runs: must be >= 1, got trips={trips}, runs={runs}")
    if not backends.C_available("machine"):
        return None
    m = backends.load_C("machine")
    out: dict[str, float] = {}
    for kind in m.mac_kinds():
        try:
            m.mac_rate(kind, trips)  # warm-up: the core leaves its idle clock; AVX-512 units power up
        except ValueError:
            continue  # a feature this CPU lacks
        out[kind] = max(m.mac_rate(kind, trips) for _ in range(runs)) / 1e9
    return out


def _ratio_to_fp32(ceilings: dict[str, float], mixed: bool, what: str) -> tuple[float, str, str]:
    """(best int8 kind's MAC rate / best fp32_* kind's, that int8 kind, that fp32 kind); int8 kinds are the mixed
    int + fp32 ones (``mixed``) or the others."""
    fp = {k: v for k, v in ceilings.items() if k.startswith("fp32_")}
    i8 = {k: v for k, v in ceilings.items() if k.startswith("int8_") and ("fp32" in k) == mixed}
    if not fp or not i8:
        raise ValueError(f"ceilings: need an fp32_* and {what} kind, got {sorted(ceilings)}")
    kf, ki = max(fp, key=fp.__getitem__), max(i8, key=i8.__getitem__)
    return i8[ki] / fp[kf], ki, kf


def int8_ceiling_ratio(ceilings: dict[str, float]) -> tuple[float, str, str]:
    """(best exact int8 MAC rate / best fp32 FMA MAC rate, int8 kind, fp32 kind) from ``mac_ceilings()``; the
    mixed int + fp32 kinds are left out (``mix_ceiling_ratio``)."""
    return _ratio_to_fp32(ceilings, False, "an int8_*")


def mix_ceiling_ratio(ceilings: dict[str, float]) -> tuple[float, str, str]:
    """(best mixed int + fp32 MAC rate / best fp32 FMA MAC rate, mixed kind, fp32 kind) from ``mac_ceilings()``:
    the most a hybrid int8 kernel (part of the work on the integer-multiply pipe, part as exact fp32 FMAs on
    int8 values, sums below 2**24) could beat an fp32 GEMM by on this core, measured in a loop without loads."""
    return _ratio_to_fp32(ceilings, True, "a mixed int8_*+fp32_*")


def theoretical_peak_gflops(cores: int | None = None, ghz: float | None = None) -> Peak:
    """cores x GHz x 2 FMA units x lanes x 2 FLOP/FMA; lanes = 16 with AVX-512F, 8 with AVX2+FMA, 4 otherwise.

    Without an explicit ``ghz``, the clock is max(nominal /proc/cpuinfo clock, ``measured_ghz()``): turbo raises
    the bound above the nominal figure, and a slow (pre-empted) measurement never lowers it below nominal.
    """
    flags = cpu_flags()
    cores = cores or _n_cores()
    nominal = cpu_ghz()
    measured = measured_ghz()
    if ghz is None:
        ghz = max((g for g in (nominal, measured) if g), default=2.0)
    elif ghz <= 0:
        raise ValueError(f"ghz: must be > 0, got {ghz}")
    lanes = 16 if "avx512f" in flags else 8 if {"avx2", "fma"} <= flags else 4
    fma_units = 2
    g = cores * ghz * fma_units * lanes * 2
    return Peak(
        g,
        f"{cores} cores x {ghz:.2f} GHz x {fma_units} FMA x {lanes} lanes x 2",
        {
            "cores": cores,
            "ghz": ghz,
            "nominal_ghz": nominal or float("nan"),
            "measured_ghz": measured or float("nan"),
            "lanes": lanes,
            "fma_units": fma_units,
        },
    )


def stream_bandwidth(n: int = 20_000_000, repeat: int = 5) -> float:
    """STREAM triad bandwidth in GB/s (C++/OpenMP kernel from tinylearn._C; numpy fallback counts 40 B/elem)."""
    if n < 1000:
        raise ValueError(f"n: array length must be >= 1000, got {n}")
    a = np.zeros(n)
    b = np.ones(n)
    c = np.full(n, 2.0)
    if backends.C_available("machine"):
        machine = backends.load_C("machine")
        t = _time_best(lambda: machine.triad(a, b, c, 3.0), repeat)
        return 24.0 * n / t / 1e9
    tmp = np.empty(n)

    def triad() -> None:
        np.multiply(c, 3.0, out=tmp)
        np.add(b, tmp, out=a)

    t = _time_best(triad, repeat)
    return 40.0 * n / t / 1e9


def attainable_gflops(intensity: float | np.ndarray, peak: float, bandwidth_gbs: float) -> Any:
    """Roofline: min(peak, intensity * bandwidth)."""
    return np.minimum(peak, np.asarray(intensity) * bandwidth_gbs)


def ridge_point(peak_gflops: float, bandwidth_gbs: float) -> float:
    """FLOP/byte where the two roofs meet: kernels below it are memory-bound, above it compute-bound."""
    if peak_gflops <= 0 or bandwidth_gbs <= 0:
        raise ValueError(f"peak_gflops/bandwidth_gbs: must be > 0, got {peak_gflops}, {bandwidth_gbs}")
    return peak_gflops / bandwidth_gbs


def roofline_time(bytes_moved: float, flops: float, peak_gflops: float, bandwidth_gbs: float) -> float:
    """Seconds: max(bytes / bandwidth, flops / peak) — the slower of the two roofs."""
    if peak_gflops <= 0 or bandwidth_gbs <= 0:
        raise ValueError(f"peak_gflops/bandwidth_gbs: must be > 0, got {peak_gflops}, {bandwidth_gbs}")
    return max(bytes_moved / (bandwidth_gbs * 1e9), flops / (peak_gflops * 1e9))


@functools.cache
def machine_peak() -> dict:
    """Measured compute and memory roofs of this machine (cached for the process).

    gflops_fp32 / gflops_fp32_1t: the register-only FMA loop (``_C.gemm.fma_peak``) on every core / on one;
    bandwidth_gbs: STREAM triad; cores, isa (avx512 / avx2 / scalar), source. Without tinylearn._C the best BLAS
    SGEMM is the practical compute roof (1-thread figure NaN, isa "unknown")."""
    n_cores = _n_cores()
    bw = stream_bandwidth(n=10_000_000, repeat=3)
    if backends.C_available("gemm"):
        g = backends.load_C("gemm")
        many = g.fma_peak(iters=4_000_000, threads=n_cores, repeat=5)
        one = g.fma_peak(iters=4_000_000, threads=1, repeat=5)
        return {
            "gflops_fp32": float(many["gflops"]),
            "gflops_fp32_1t": float(one["gflops"]),
            "bandwidth_gbs": float(bw),
            "cores": n_cores,
            "isa": str(many["isa"]),
            "source": "register FMA loop (tinylearn._C.gemm.fma_peak) + STREAM triad",
        }
    p = peak_gflops(n=1024, repeat=3)  # no C++ extension: the best BLAS SGEMM is the practical roof
    return {
        "gflops_fp32": float(p.gflops),
        "gflops_fp32_1t": float("nan"),
        "bandwidth_gbs": float(bw),
        "cores": n_cores,
        "isa": "unknown",
        "source": f"{p.source} (tinylearn._C missing) + STREAM triad",
    }


@functools.cache
def machine_roofs(threads: int | None = None) -> tuple[float, float]:
    """(peak GFLOP/s, STREAM GB/s) of this machine with ``threads`` threads (None: all), measured once per process:
    the best BLAS SGEMM (``peak_gflops``) and STREAM triad, each with BLAS / OpenMP / torch capped at ``threads``.
    The triad is the best of 7 (~0.1 s): a bandwidth read low makes every roofline prediction from it too slow, and
    notebook 05 asserts that unfused numpy ops run slower than predicted (a CI run once failed that on a best of 3)."""
    with limited_threads(threads, torch=True):
        return peak_gflops(n=1024, repeat=3).gflops, stream_bandwidth(n=10_000_000, repeat=7)


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
    return {
        "intensity": intensity,
        "attainable_gflops": min(p, mem),
        "bound": "memory" if mem < p else "compute",
        "ridge": ridge_point(p, w),
        "time_s": roofline_time(b, f, p, w),
    }


def roofline_plot(
    ax: Any,
    peak_gflops: float,
    bandwidth_gbs: float,
    points: list[tuple[str, float, float]] | None = None,
    labels: str = "annotate",
) -> Any:
    """Draw the roofline on ``ax``; ``points`` are (label, FLOP/byte, measured GFLOP/s).

    labels: "annotate" writes each label next to its point (staggered); "legend" lists them in a legend instead,
    which stays readable when many points share an intensity."""
    if labels not in ("annotate", "legend"):
        raise ValueError(f"labels: expected 'annotate' or 'legend', got {labels!r}")
    if peak_gflops <= 0 or bandwidth_gbs <= 0:
        raise ValueError(f"peak_gflops/bandwidth_gbs must be > 0, got {peak_gflops}, {bandwidth_gbs}")
    xs = np.logspace(-2, 3, 200)
    ax.loglog(xs, attainable_gflops(xs, peak_gflops, bandwidth_gbs), "k-", lw=2, label="roofline")
    ridge = ridge_point(peak_gflops, bandwidth_gbs)
    ax.axvline(ridge, color="gray", ls=":", lw=1)
    ax.text(ridge, peak_gflops * 0.5, f" ridge {ridge:.1f} FLOP/B", fontsize=8, color="gray")
    offsets = [(4, 4), (4, -11), (-4, 4), (-4, -11)]  # staggered so labels of nearby points do not overlap
    for i, (label, ai, g) in enumerate(points or []):
        if labels == "legend":
            ax.loglog([ai], [g], "os^Dv<>p"[i // 10 % 8], label=label)
            continue
        ax.loglog([ai], [g], "o")
        dx, dy = offsets[i % len(offsets)]
        ax.annotate(
            label, (ai, g), fontsize=7, xytext=(dx, dy), textcoords="offset points", ha="left" if dx > 0 else "right"
        )
    if labels == "legend" and points:
        ax.legend(fontsize=7, loc="lower right", ncol=2)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title(f"roofline: {peak_gflops:.0f} GFLOP/s, {bandwidth_gbs:.1f} GB/s")
    return ax
