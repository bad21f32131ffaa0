"""Benchmark: tinylearn's all-reduce algorithms vs ``dist.all_reduce`` (gloo) on 2 and 4 local processes, and the
contention-aware alpha-beta-gamma model calibrated on them.

Measurement (``measure_job``, one launched job per world size): every sample of every (size, implementation),
each timed between barriers as the slowest rank's time, implementations taking turns sample by sample so load
hits them alike; plus gamma, an fp32 add timed on all ranks at once.

Model (``cost_model.predict_contended``): p ranks share c cores, so byte costs are scaled by s = max(1, p/c) and
every message pays o * sched more latency, o = max(0, p/c - 1). Per implementation ("family": gloo and the p2p
ring floor use the ring formula, the floor with gamma = 0) alpha, sched and beta are fitted by least squares on
relative error to the medians at the *calibration* sizes of both world sizes (every other size, from the
smallest); the other sizes are *validation* points, never fitted. Reported per (implementation, p, size): median
measured time, its IQR, the prediction, and the relative error (t - pred) / pred at the median and quartiles.

tinygrad: no column — tinygrad has no multi-process collectives (no all-reduce across processes on CPU), and
torch.compile does not apply to communication.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..bench.table import Row, Table
from . import cost_model
from .launch import launch

IMPLS = ["gloo", "ring", "tree", "recursive_doubling", "halving_doubling", "hierarchical", "p2p ring floor"]
MODEL_ALGORITHM = {"gloo": "ring", "p2p ring floor": "ring"}  # the formula each non-tinylearn impl is modelled by
TINYGRAD_NOTE = "tinygrad: n/a — tinygrad has no multi-process collectives (no all-reduce across processes on CPU)"


def _label(nb: int) -> str:
    return f"{nb >> 20} MB" if nb >= 1 << 20 else f"{nb >> 10} KB"


def cores_available() -> int:
    """Cores this process may run on (the affinity mask, else os.cpu_count())."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


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


def measure_job(sizes: list[int], impls: list[str], rounds: int = 9, seed: int = 0) -> dict[str, Any] | None:
    """Rank function: ``rounds`` samples of each (size, impl) all-reduce, each the slowest rank's time between
    barriers. Every round visits all (size, impl) pairs in a fresh random order (the same on all ranks), so a
    burst of load from elsewhere on the box lands on random points instead of on one size or one algorithm.
    Plus the contended gamma. Only rank 0 returns the numbers."""
    import torch
    import torch.distributed as dist

    from .collectives import all_reduce
    from .workers import p2p_ring_floor

    gamma = contended_gamma()
    xs = {nb: torch.ones(max(1, nb // 4), dtype=torch.float32) for nb in sizes}

    def call(nb: int, impl: str) -> None:
        x = xs[nb]
        if impl == "gloo":
            dist.all_reduce(x)
        elif impl == "p2p ring floor":
            p2p_ring_floor(x)
        else:
            all_reduce(x, algorithm=impl, check=False)

    pairs = [(nb, impl) for nb in sizes for impl in impls]
    for nb, impl in pairs:
        call(nb, impl)  # warm-up: connections, allocator, workspaces
    out: dict[tuple[int, str], list[float]] = {k: [] for k in pairs}
    rng = np.random.default_rng(seed)
    for _ in range(rounds):
        for i in rng.permutation(len(pairs)):
            nb, impl = pairs[i]
            dist.barrier()
            t0 = time.perf_counter()
            call(nb, impl)
            dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            out[(nb, impl)].append(float(dt))
    if dist.get_rank() != 0:
        return None
    return {"gamma": gamma, "samples": out}


# ------------------------------------------------------------------------------------------------ analysis
def measure(
    world_sizes: Sequence[int],
    sizes: Sequence[int],
    impls: Sequence[str],
    rounds: int = 9,
    chunks: int = 3,
    progress: Callable[[str], None] | None = None,
) -> dict[int, dict[str, Any]]:
    """{p: {"gamma", "samples": {(nbytes, impl): [seconds, ...]}}}: ``rounds`` samples per point, taken in
    ``chunks`` launches that alternate between the world sizes (load that comes and goes hits every p)."""
    out: dict[int, dict[str, Any]] = {}
    per = [rounds // chunks + (1 if i < rounds % chunks else 0) for i in range(chunks)]
    for c, r in enumerate(x for x in per if x > 0):
        for p in world_sizes:
            if progress:
                progress(f"dist: measuring on {p} ranks ({c + 1}/{chunks})")
            res = launch(measure_job, p, list(sizes), list(impls), r, c, timeout_s=900)[0]
            if p not in out:
                out[p] = {"gamma": [res["gamma"]], "samples": res["samples"]}
            else:
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


def calibrate(
    measured: dict[int, dict[str, Any]], impls: Sequence[str], sizes: Sequence[int], cores: int
) -> dict[str, Any]:
    """Fit each implementation's (alpha, sched, beta) on the calibration sizes, predict every point.

    gamma is the contended add measured at the smallest world size, divided by its core share (single-rank).
    Returns {"cal", "val", "gamma", "fits": {impl: ContendedParams}, "rows": [dict per (impl, p, size)]};
    a row holds median / q25 / q75 seconds, pred seconds and err / err_q25 / err_q75 = (t - pred) / pred.
    """
    cal, val = split_sizes(sizes)
    p0 = min(measured)
    gamma = measured[p0]["gamma"] / cost_model.core_share(p0, cores)
    fits, rows = {}, []
    for impl in impls:
        alg = MODEL_ALGORITHM.get(impl, impl)
        g = 0.0 if impl == "p2p ring floor" else gamma
        pts = [(nb, p, float(np.median(measured[p]["samples"][(nb, impl)]))) for p in measured for nb in cal]
        fit = cost_model.fit_contended(
            alg, [x[0] for x in pts], [x[1] for x in pts], [x[2] for x in pts], cores, gamma_s_per_byte=g
        )
        fits[impl] = fit
        for p in sorted(measured):
            for nb in sorted(set(sizes)):
                s = measured[p]["samples"][(nb, impl)]
                pred = cost_model.predict_contended(alg, nb, p, fit, cores)
                q25, med, q75 = (float(v) for v in np.percentile(s, [25, 50, 75]))
                e = cost_model.relative_errors([pred], [s])[0]
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
                        "pred_s": pred,
                        "err": float(e[0]),
                        "err_q25": float(e[1]),
                        "err_q75": float(e[2]),
                    }
                )
    return {"cal": cal, "val": val, "gamma": gamma, "fits": fits, "rows": rows}


def error_table(result: dict[str, Any], subset: str | None = None) -> str:
    """Text table: one line per (impl, p, size): set, median / IQR measured, predicted, relative error [IQR]."""
    lines = [f"{'impl':18s} {'p':>2s} {'size':>6s} {'set':4s} {'measured ms [IQR]':>24s} {'pred ms':>8s}  err [IQR]"]
    for r in result["rows"]:
        if subset is not None and r["set"] != subset:
            continue
        meas = f"{r['median_s'] * 1e3:.3g} [{r['q25_s'] * 1e3:.3g}, {r['q75_s'] * 1e3:.3g}]"
        err = f"{r['err']:+.0%} [{r['err_q25']:+.0%}, {r['err_q75']:+.0%}]"
        lines.append(
            f"{r['impl']:18s} {r['p']:2d} {_label(r['nbytes']):>6s} {r['set']:4s} {meas:>24s} "
            f"{r['pred_s'] * 1e3:8.3g}  {err}"
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
    if repeats is None:
        repeats = 21 if full else 12
    cores = cores_available()
    measured = measure(world_sizes, sizes, IMPLS, repeats, 3, progress)
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
                            "model err": f"{r['err']:+.0%}",
                            "err IQR": f"{r['err_q25']:+.0%}..{r['err_q75']:+.0%}",
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
            f"model = cost_model.predict_contended (= simulate(topology=None, cores={cores})): byte terms x "
            f"s = max(1, p/c) = {cost_model.core_share(p, cores):g}, latency + o*sched with o = "
            f"{cost_model.oversubscription(p, cores):g}; alpha, sched, beta fitted per impl on the calibration "
            f"sizes {[_label(n) for n in res['cal']]} of p={list(world_sizes)} (relative least squares), "
            f"gamma = contended fp32 add {1 / res['gamma'] / 1e9:.2f} GB/s; validation sizes "
            f"{[_label(n) for n in res['val']]} are never fitted"
        )
        t.notes.append(f"p={p}: {within} of {len(val)} validation points within +-25% at the median")
        for impl, f in res["fits"].items():
            t.notes.append(
                f"fit {impl}: alpha={f.alpha_s * 1e6:.0f} us, sched={f.sched_s * 1e6:.0f} us, "
                f"1/beta={1 / f.beta_s_per_byte / 1e9 if f.beta_s_per_byte else float('inf'):.2f} GB/s"
            )
        t.notes.append(
            "p2p ring floor = the ring's 2(p-1) isend/irecv exchanges with no reduction (modelled as ring, gamma=0); "
            "gloo modelled by the ring formula"
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
