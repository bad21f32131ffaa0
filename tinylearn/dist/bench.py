"""Benchmark: tinylearn's all-reduce algorithms vs ``dist.all_reduce`` (gloo) on 2 and 4 local processes, and the
contention-aware alpha-beta-gamma model calibrated on them.

Measurement (``measure_job``, one launched job per world size): every sample of every (size, implementation),
each timed between barriers as the slowest rank's time, implementations taking turns sample by sample so load
hits them alike; plus gamma, an fp32 add timed on all ranks at once. Samples are spent where the noise is: on a
loaded 2-core box a 64 KB all-reduce is cheap but its samples are two-mode (fast, or + a scheduler time slice:
CV ~ 1), a 16 MB one is 50x dearer and steadier (CV ~ 0.3), so each round samples a size ``sample_weights`` times
(8, 8, 4, 2, 1 for 64 KB .. 16 MB) and p = 2 gets 2x the rounds of p = 4 (``run``): the mean's relative
standard error (CV / sqrt(n), ``rel_se``) is then ~ 4-6% at every point instead of 10-35%. While measuring, one
``SCHED_IDLE`` spinner per core keeps the cores out of idle (``keep_awake``): on a VM the wake-up of a halted vCPU
can wait a host tick (~4 ms), a platform stall that busy-polling transports (MPI, NCCL) never see; on the 2-core VM
it was most of a 2-rank call's mean under 1 MB.

Model (``cost_model.predict_contended``): the ranks active in a step share c cores, so that step's byte costs are
scaled by s = max(1, a/c) and its messages pay o * sched more latency, o = max(0, a/c - 1). Per implementation
("family": gloo and the p2p ring floor use the ring formula, the floor with gamma = 0) alpha, sched and beta are
fitted by weighted least squares on relative error (weights 1 / the point's relative standard error) to the
means (``statistic="mean"``; or the medians) at the *calibration* sizes of both world sizes (every other size,
from the smallest); the other sizes are *validation* points, never fitted. Reported per (implementation, p,
size): median with IQR, mean with a bootstrap 90% interval, the slow fraction (samples > 2x the fastest: calls
that waited for the scheduler), samples and relative standard error, the prediction, and the relative error
(t - pred) / pred of the fitted statistic with its interval, and of the median.

tinygrad: no column — tinygrad has no multi-process collectives (no all-reduce across processes on CPU), and
torch.compile does not apply to communication.

Why one file (> 500 lines): the measurement job, the sampling plan and the model calibration are one experiment
whose steps depend on each other's data shapes.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._inputs import is_int
from .._threads import cores
from ..bench.table import Row, Table
from . import cost_model
from .keep_awake import keep_cores_awake
from .launch import launch

IMPLS = ["gloo", "ring", "tree", "recursive_doubling", "halving_doubling", "hierarchical", "p2p ring floor"]
MODEL_ALGORITHM = {"gloo": "ring", "p2p ring floor": "ring"}  # the formula each non-tinylearn impl is modelled by
TINYGRAD_NOTE = "tinygrad: n/a — tinygrad has no multi-process collectives (no all-reduce across processes on CPU)"


def _label(nb: int) -> str:
    return f"{nb >> 20} MB" if nb >= 1 << 20 else f"{nb >> 10} KB"


def cores_available() -> int:
    """Cores this process may run on (the affinity mask, else os.cpu_count()): ``tinylearn._threads.cores``."""
    return cores()


# ------------------------------------------------------------------------------------------ rank functions
def contended_gamma(nbytes: int = 1 << 22, repeats: int = 15) -> float:
    """gamma under contention: every rank runs ``a.add_(b)`` (fp32) at the same moment, as the ranks of a
    collective do when they reduce; seconds per byte, median over samples of the slowest rank."""
    import torch
    import torch.distributed as dist

    a, b = torch.zeros(nbytes // 4), torch.ones(nbytes // 4)
    a.add_(b)
    samples = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        a.add_(b)
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        samples.append(float(dt))
    return float(np.median(samples)) / nbytes


def sample_weights(sizes: Sequence[int], cap: int = 8) -> dict[int, int]:
    """Samples per round of each size: round(sqrt(largest / size)) clipped to [1, cap] (64 KB .. 16 MB: 8, 8, 4,
    2, 1). The standard error of a point's mean is CV / sqrt(n); a small all-reduce is cheap and the noisiest
    (one scheduler time slice is most of the call: CV ~ 1 at 64 KB on p = 2, ~ 0.3 at 16 MB), so it gets more
    samples for a fraction of the time a large one takes."""
    if not is_int(cap) or cap < 1:
        raise ValueError(f"cap: expected an int >= 1, got {cap!r}")
    sizes = list(sizes)
    if not sizes or not all(is_int(v) and v >= 1 for v in sizes):
        raise ValueError(f"sizes: expected int sizes >= 1 byte, got {sizes}")
    s, cap = sorted(set(int(v) for v in sizes)), int(cap)
    return {nb: int(min(cap, max(1, round(math.sqrt(s[-1] / nb))))) for nb in s}


def measure_job(
    sizes: list[int], impls: list[str], rounds: int = 9, seed: int = 0, weights: dict[int, int] | None = None
) -> dict[str, Any] | None:
    """Rank function: ``rounds`` x ``weights[size]`` (default 1) samples of each (size, impl) all-reduce, each the
    slowest rank's time between barriers (the max over ranks is taken once, at the end). Every round visits all
    (size, impl) pairs, each ``weights[size]`` times, in a fresh random order (the same on all ranks), so a burst
    of load from elsewhere on the box lands on random points instead of on one size or one algorithm. Plus the
    contended gamma. Only rank 0 returns the numbers."""
    import torch
    import torch.distributed as dist

    from .workers import all_reduce_by

    gamma = contended_gamma()
    xs = {nb: torch.ones(max(1, nb // 4), dtype=torch.float32) for nb in sizes}

    pairs = [(nb, impl) for nb in sizes for impl in impls]
    for nb, impl in pairs:
        all_reduce_by(xs[nb], impl)  # warm-up: connections, allocator, workspaces
    out: dict[tuple[int, str], list[float]] = {k: [] for k in pairs}
    visits = [k for k in pairs for _ in range((weights or {}).get(k[0], 1))]
    rng = np.random.default_rng(seed)
    order = [visits[i] for _ in range(rounds) for i in rng.permutation(len(visits))]
    local = torch.empty(len(order), dtype=torch.float64)
    for j, (nb, impl) in enumerate(order):
        dist.barrier()
        t0 = time.perf_counter()
        all_reduce_by(xs[nb], impl)
        local[j] = time.perf_counter() - t0
    # the slowest rank's time per sample, combined once at the end (an all-reduce per sample would add a
    # collective, and its scheduler waits, between every two samples)
    dist.all_reduce(local, op=dist.ReduceOp.MAX)
    for (nb, impl), dt in zip(order, local.tolist()):
        out[(nb, impl)].append(dt)
    if dist.get_rank() != 0:
        return None
    return {"gamma": gamma, "samples": out}


# ------------------------------------------------------------------------------------------------ analysis
def measure(
    world_sizes: Sequence[int],
    sizes: Sequence[int],
    impls: Sequence[str],
    rounds: int | dict[int, int] = 9,
    chunks: int = 3,
    progress: Callable[[str], None] | None = None,
    weights: dict[int, int] | None = None,
    keep_awake: bool = True,
) -> dict[int, dict[str, Any]]:
    """{p: {"gamma", "samples": {(nbytes, impl): [seconds, ...]}, "awake": bool}}: ``rounds`` (an int, or one per
    world size) x ``weights[size]`` (default 1; see ``sample_weights``) samples per point, taken in ``chunks``
    launches that alternate between the world sizes (load that comes and goes hits every p).

    ``keep_awake``: run one ``SCHED_IDLE`` spinner per core while measuring (``keep_awake.keep_cores_awake``), so a
    core whose rank waits does not go idle; on a VM an idle vCPU's wake-up can wait a host tick (~4 ms), which
    is not the algorithm's cost. "awake" says whether the spinners ran (they need Linux)."""
    if not all(is_int(p) and p >= 1 for p in world_sizes):
        raise ValueError(f"world_sizes: expected ints >= 1, got {list(world_sizes)}")
    world_sizes = [int(p) for p in world_sizes]
    rounds_p = {p: rounds.get(p) if isinstance(rounds, dict) else rounds for p in world_sizes}
    for p, r in rounds_p.items():
        if not is_int(r) or r < 1:
            raise ValueError(f"rounds: expected an int >= 1 per world size, got {r!r} for p={p}")
        rounds_p[p] = int(r)
    if not is_int(chunks) or chunks < 1:
        raise ValueError(f"chunks: expected an int >= 1, got {chunks!r}")
    chunks = int(chunks)
    if not all(is_int(nb) and nb >= 1 for nb in sizes):
        raise ValueError(f"sizes: expected int sizes >= 1 byte, got {list(sizes)}")
    sizes = [int(nb) for nb in sizes]
    w_raw = {nb: (weights or {}).get(nb, 1) for nb in sizes}
    if not all(is_int(v) and v >= 1 for v in w_raw.values()):
        raise ValueError(f"weights: expected ints >= 1 per size, got {weights!r}")
    w = {int(nb): int(v) for nb, v in w_raw.items()}
    out: dict[int, dict[str, Any]] = {}
    for c in range(chunks):
        for p in world_sizes:
            r = rounds_p[p] // chunks + (1 if c < rounds_p[p] % chunks else 0)
            if r == 0:
                continue
            if progress:
                progress(f"dist: measuring on {p} ranks ({c + 1}/{chunks})")
            with keep_cores_awake(enabled=keep_awake) as spinners:
                awake = spinners.active
                res = launch(measure_job, p, list(sizes), list(impls), r, c, w, timeout_s=900)[0]
            if p not in out:
                out[p] = {"gamma": [res["gamma"]], "samples": res["samples"], "awake": awake}
            else:
                out[p]["awake"] = out[p]["awake"] and awake
                out[p]["gamma"].append(res["gamma"])
                for k, v in res["samples"].items():
                    out[p]["samples"][k].extend(v)
    for p in out:
        out[p]["gamma"] = float(np.median(out[p]["gamma"]))
    return out


def split_sizes(sizes: Sequence[int]) -> tuple[list[int], list[int]]:
    """(calibration, validation): sorted sizes alternate, the smallest is a calibration size, so most validation
    sizes lie between two calibration sizes (the largest may be an extrapolation)."""
    s = sorted(set(sizes))
    if len(s) < 3:
        raise ValueError(f"sizes: need >= 3 distinct sizes (2 to fit, 1 to validate), got {s}")
    return s[0::2], s[1::2]


STATISTICS = ("mean", "median")


def mean_ci(samples: Sequence[float], level: float = 0.9, resamples: int = 400) -> tuple[float, float]:
    """Bootstrap ``level`` confidence interval of the mean (fixed seed: the same samples give the same interval)."""
    x = np.asarray(samples, dtype=np.float64)
    rng = np.random.default_rng(0)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    lo, hi = np.percentile(means, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)


def rel_se(samples: Sequence[float], statistic: str = "mean", resamples: int = 200, floor: float = 0.01) -> float:
    """Relative standard error of a point's ``statistic`` ("mean" | "median"): bootstrap standard deviation /
    value, fixed seed, at least ``floor`` (identical samples would otherwise get an infinite weight in the fit)."""
    if statistic not in STATISTICS:
        raise ValueError(f"statistic: expected one of {STATISTICS}, got {statistic!r}")
    x = np.asarray(samples, dtype=np.float64)
    if x.ndim != 1 or x.size < 1 or not np.all(np.isfinite(x)) or np.any(x <= 0):
        raise ValueError(f"samples: expected >= 1 finite times > 0, got {x.tolist()}")
    f = np.mean if statistic == "mean" else np.median
    idx = np.random.default_rng(0).integers(0, x.size, size=(resamples, x.size))
    return float(max(floor, np.std(f(x[idx], axis=1)) / f(x)))


def slow_fraction(samples: Sequence[float], factor: float = 2.0) -> float:
    """Fraction of samples slower than ``factor`` x the fastest one: the share of calls that hit a scheduler wait
    (a rank that was not running when its message arrived). Near 0 or 1 the median is stable; near 0.5 it jumps
    between the fast and the slow mode from run to run."""
    x = np.asarray(samples, dtype=np.float64)
    return float(np.mean(x > factor * x.min()))


def calibrate(
    measured: dict[int, dict[str, Any]],
    impls: Sequence[str],
    sizes: Sequence[int],
    cores: int,
    statistic: str = "mean",
    background: float | str = "fit",
    weighted: bool = True,
) -> dict[str, Any]:
    """Fit each implementation's (alpha, sched, beta) on the calibration sizes, predict every point.

    ``statistic``: what is fitted and judged per point, "mean" (default) or "median" of the samples. The model's
    latency term L (alpha + o sched) is an *expected* wait, and under load the samples of one point are a mixture
    of a fast mode and a slow mode (+ a scheduler time slice): the mean moves smoothly with the mixture, the median
    jumps from one mode to the other when the slow share crosses 1/2.
    gamma is the contended add measured at the smallest world size, divided by its core share (single-rank).
    ``background``: runnable threads of other jobs sharing the cores (``cost_model.contended_coefficients``); "fit"
    picks the value in 0, 0.1, ..., 4 that minimises the summed relative residual of all implementations' fits at
    the calibration points (one number for the box, the validation points never enter).
    ``weighted``: each calibration point's relative residual is divided by its statistic's relative standard error
    (``rel_se``: weighted least squares; under load a 64 KB mean on 2 ranks has CV ~ 1, a 16 MB one ~ 0.3), so the
    fit follows the points it can trust; False: all points alike.
    Returns {"cal", "val", "gamma", "statistic", "background", "fits": {impl: ContendedParams}, "rows": [dict per
    (impl, p, size)]}; a row holds median / q25 / q75 / mean seconds, the mean's bootstrap 90% interval, the slow
    fraction, pred seconds, err = (statistic - pred) / pred, err_lo / err_hi (the statistic's spread: the mean's
    interval or the quartiles), err_median / err_mean, and err_q25 / err_q75 (quartiles vs pred).
    """
    if statistic not in STATISTICS:
        raise ValueError(f"statistic: expected one of {STATISTICS}, got {statistic!r}")
    cal, val = split_sizes(sizes)
    p0 = min(measured)
    gamma = measured[p0]["gamma"] / cost_model.core_share(p0, cores)
    stat = np.mean if statistic == "mean" else np.median
    pts = {
        impl: [
            (
                nb,
                p,
                float(stat(measured[p]["samples"][(nb, impl)])),
                rel_se(measured[p]["samples"][(nb, impl)], statistic) if weighted else 1.0,
            )
            for p in measured
            for nb in cal
        ]
        for impl in impls
    }

    def fit_all(bg: float) -> tuple[dict[str, cost_model.ContendedParams], float]:
        fits, resid = {}, 0.0
        for impl in impls:
            alg, x = MODEL_ALGORITHM.get(impl, impl), pts[impl]
            g = 0.0 if impl == "p2p ring floor" else gamma
            f = cost_model.fit_contended(
                alg,
                [v[0] for v in x],
                [v[1] for v in x],
                [v[2] for v in x],
                cores,
                gamma_s_per_byte=g,
                background=bg,
                rel_sigma=[v[3] for v in x],
            )
            fits[impl] = f
            pred = [cost_model.predict_contended(alg, nb, p, f, cores, background=bg) for nb, p, _, _ in x]
            resid += sum(((q / v[2] - 1) / v[3]) ** 2 for q, v in zip(pred, x))
        return fits, resid

    if background == "fit" and len(measured) < 2:
        background = 0.0  # one world size: the background cannot be told apart from alpha and beta
    if background == "fit":
        grid = [k / 10 for k in range(41)]
        background = grid[int(np.argmin([fit_all(b)[1] for b in grid]))]
    elif isinstance(background, str):
        raise ValueError(f"background: expected a number >= 0 or 'fit', got {background!r}")
    bg = cost_model.check_nonneg("background", background)
    fits, rows = fit_all(bg)[0], []
    for impl in impls:
        alg = MODEL_ALGORITHM.get(impl, impl)
        fit = fits[impl]
        for p in sorted(measured):
            for nb in sorted(set(sizes)):
                s = measured[p]["samples"][(nb, impl)]
                pred = cost_model.predict_contended(alg, nb, p, fit, cores, background=bg)
                q25, med, q75 = (float(v) for v in np.percentile(s, [25, 50, 75]))
                mean = float(np.mean(s))
                lo, hi = mean_ci(s)
                e = cost_model.relative_errors([pred], [s])[0]
                err_mean = (mean - pred) / pred
                rows.append(
                    {
                        "impl": impl,
                        "p": p,
                        "nbytes": nb,
                        "set": "cal" if nb in cal else "val",
                        "n": len(s),
                        "median_s": med,
                        "q25_s": q25,
                        "q75_s": q75,
                        "mean_s": mean,
                        "mean_lo_s": lo,
                        "mean_hi_s": hi,
                        "slow_frac": slow_fraction(s),
                        "cv": float(np.std(s) / mean),
                        "rel_se": rel_se(s, statistic),
                        "pred_s": pred,
                        "err": err_mean if statistic == "mean" else float(e[0]),
                        "err_lo": (lo - pred) / pred if statistic == "mean" else float(e[1]),
                        "err_hi": (hi - pred) / pred if statistic == "mean" else float(e[2]),
                        "err_mean": err_mean,
                        "err_median": float(e[0]),
                        "err_q25": float(e[1]),
                        "err_q75": float(e[2]),
                    }
                )
    return {
        "cal": cal,
        "val": val,
        "gamma": gamma,
        "statistic": statistic,
        "weighted": weighted,
        "background": bg,
        "fits": fits,
        "rows": rows,
    }


def error_summary(result: dict[str, Any], subset: str = "val") -> dict[tuple[str, int], dict[str, float]]:
    """Per (impl, p): how many ``subset`` points are within +-25%, the median and worst |err| (the statistic's)."""
    out: dict[tuple[str, int], dict[str, float]] = {}
    for r in result["rows"]:
        if r["set"] != subset:
            continue
        out.setdefault((r["impl"], r["p"]), {"errs": []})["errs"].append(r["err"])  # type: ignore[arg-type]
    for v in out.values():
        e = np.abs(np.asarray(v.pop("errs")))
        v.update(n=float(e.size), within=float(np.sum(e <= 0.25)), median_abs=float(np.median(e)), worst=float(e.max()))
    return out


def error_table(result: dict[str, Any], subset: str | None = None) -> str:
    """Text table: one line per (impl, p, size): set, median [IQR] and mean [90% CI] measured, slow fraction,
    samples, the statistic's relative standard error, predicted, relative error of the fitted statistic with its
    spread, and the median's error."""
    stat = result.get("statistic", "median")
    lines = [
        f"{'impl':18s} {'p':>2s} {'size':>6s} {'set':4s} {'median ms [IQR]':>22s} {'mean ms [90% CI]':>22s} "
        f"{'slow':>4s} {'n':>4s} {'se':>4s} {'pred ms':>8s}  err({stat}) [spread]   err(median)"
    ]
    for r in result["rows"]:
        if subset is not None and r["set"] != subset:
            continue
        med = f"{r['median_s'] * 1e3:.3g} [{r['q25_s'] * 1e3:.3g}, {r['q75_s'] * 1e3:.3g}]"
        mean = f"{r['mean_s'] * 1e3:.3g} [{r['mean_lo_s'] * 1e3:.3g}, {r['mean_hi_s'] * 1e3:.3g}]"
        err = f"{r['err']:+.0%} [{r['err_lo']:+.0%}, {r['err_hi']:+.0%}]"
        lines.append(
            f"{r['impl']:18s} {r['p']:2d} {_label(r['nbytes']):>6s} {r['set']:4s} {med:>22s} {mean:>22s} "
            f"{r['slow_frac']:4.0%} {r['n']:4d} {r['rel_se']:4.0%} {r['pred_s'] * 1e3:8.3g}  {err:22s} "
            f"{r['err_median']:+.0%}"
        )
    return "\n".join(lines)


def run(
    full: bool = False,
    progress: Callable[[str], None] | None = None,
    world_sizes: tuple[int, ...] = (2, 4),
    sizes: list[int] | None = None,
    repeats: int | None = None,
) -> list[Table]:
    if sizes is None:
        sizes = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20] + ([64 << 20] if full else [])
    if len(set(sizes)) < 3:  # e.g. `--size N`: calibrate on N/4 and 4N as well, so N is a validation point
        s0 = sorted(set(sizes))
        sizes = sorted({max(4, s0[0] // 4), *s0, s0[-1] * 4})
    if repeats is None:  # rounds; each round samples a size sample_weights(sizes)[size] times (64 KB: 8, 16 MB: 1)
        repeats = 30 if full else 20
    # p = 2 is ~3x cheaper per call and ~1.5x noisier (CV) than p = 4: it gets 2x the rounds. With 20 / 10 rounds
    # (2026-11-24) the means' SE was 5-13% and 1-3 of 28 validation means missed +-25% per run; with 60 / 20, 0-1
    # (2026-11-25; the misses at p = 4, where a rare 20-40 ms preemption moves a mean of 20-40 samples): 60 / 30,
    # about 80 s in all on 2 cores. Two launches per world size (not three): a launch costs seconds on a loaded
    # box, better spent on samples.
    rounds = {p: 3 * repeats if p <= 2 else 3 * repeats // 2 for p in world_sizes}
    cores = cores_available()
    measured = measure(world_sizes, sizes, IMPLS, rounds, 2, progress, weights=sample_weights(sizes), keep_awake=True)
    awake = all(m.get("awake", False) for m in measured.values())
    res = calibrate(measured, IMPLS, sizes, cores)
    tables = []
    for p in world_sizes:
        t = Table(f"all-reduce fp32, p={p} processes on {cores} cores (gloo transport, 127.0.0.1)", baseline="gloo")
        for nb in sorted(set(sizes)):
            for impl in IMPLS:
                r = next(x for x in res["rows"] if x["impl"] == impl and x["p"] == p and x["nbytes"] == nb)
                sec = r["median_s"]
                t.add(
                    Row(
                        _label(nb),
                        impl,
                        sec * 1e3,
                        min_ms=min(measured[p]["samples"][(nb, impl)]) * 1e3,
                        gbps=nb / sec / 1e9,
                        extra={
                            "busbw GB/s": round(cost_model.bus_bandwidth(nb, sec, p) / 1e9, 3),
                            "IQR ms": f"{r['q25_s'] * 1e3:.3g}-{r['q75_s'] * 1e3:.3g}",
                            "pred ms": round(r["pred_s"] * 1e3, 3),
                            "mean ms": round(r["mean_s"] * 1e3, 3),
                            "model err": f"{r['err']:+.0%}",
                            "err 90% CI": f"{r['err_lo']:+.0%}..{r['err_hi']:+.0%}",
                            "median err": f"{r['err_median']:+.0%}",
                            "slow": f"{r['slow_frac']:.0%}",
                            "n": r["n"],
                            "SE": f"{r['rel_se']:.0%}",
                            "set": "calibration" if r["set"] == "cal" else "validation",
                        },
                    )
                )
                if progress:
                    progress(f"p={p} {_label(nb)} {impl}")
        t.compute_ratios()
        big = max(sizes)
        ring, gloo = t.get(_label(big), "ring"), t.get(_label(big), "gloo")
        if ring and gloo and ring.median_ms and gloo.median_ms:
            t.notes.append(
                f"ring / gloo bandwidth at {_label(big)}: {gloo.median_ms / ring.median_ms:.2f}x (goal >= 0.8x)"
            )
        val = [r for r in res["rows"] if r["p"] == p and r["set"] == "val"]
        within = sum(abs(r["err"]) <= 0.25 for r in val)
        t.notes.append(
            f"model = cost_model.predict_contended (= simulate(topology=None, cores={cores})): per step, byte terms "
            f"x s = max(1, a/c), latency + o*sched with o = max(0, a/c - 1), a = ranks active in the step (all p "
            f"but in the tree) + {res['background']:g} background threads of other jobs (fitted); alpha, sched, "
            f"beta fitted per impl to the {res['statistic']}s at the calibration sizes "
            f"{[_label(n) for n in res['cal']]} of p={list(world_sizes)} (relative least squares weighted by 1/SE), "
            f"gamma = contended fp32 add {1 / res['gamma'] / 1e9:.2f} GB/s; validation sizes "
            f"{[_label(n) for n in res['val']]} are never fitted"
        )
        within_med = sum(abs(r["err_median"]) <= 0.25 for r in val)
        t.notes.append(
            f"p={p}: {within} of {len(val)} validation {res['statistic']}s within +-25% ({within_med} medians); "
            f"median slow fraction {np.median([r['slow_frac'] for r in val]):.0%}; relative standard error of "
            f"the {res['statistic']}s {min(r['rel_se'] for r in val):.0%}..{max(r['rel_se'] for r in val):.0%} "
            f"(a point cannot be predicted more closely than its own SE; fit weighted by 1/SE)"
        )
        for impl, f in res["fits"].items():
            t.notes.append(
                f"fit {impl}: alpha={f.alpha_s * 1e6:.0f} us, sched={f.sched_s * 1e6:.0f} us, "
                f"1/beta={1 / f.beta_s_per_byte / 1e9 if f.beta_s_per_byte else float('inf'):.2f} GB/s"
            )
        t.notes.append(
            "p2p ring floor = the ring's 2(p-1) isend/irecv exchanges with no reduction (modelled as ring, gamma=0); "
            "gloo modelled by the ring formula"
        )
        t.notes.append(
            "cores kept awake while measuring (one SCHED_IDLE spinner per core, dist.keep_awake): a waiting rank's "
            "core does not halt, so a message is not delayed by a vCPU wake-up (up to a host tick on a VM)"
            if awake
            else "cores NOT kept awake (SCHED_IDLE spinners unavailable): times include idle-core wake-ups"
        )
        t.notes.append(TINYGRAD_NOTE + "; torch.compile does not apply")
        t.notes.append(
            f"{cores} cores shared by {p} ranks (1 thread each) and by whatever else runs on the box: loopback TCP "
            "latency is scheduler wake-ups, so medians jump between a fast and a slow mode when the box is loaded"
        )
        tables.append(t)
    return tables


if __name__ == "__main__":  # pragma: no cover
    tabs = run(full=bool(os.environ.get("TINYLEARN_FULL")))
    for tab in tabs:
        print(tab)
