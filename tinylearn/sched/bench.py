"""``tinylearn bench sched``: scheduling policies on real 2-core runs and on simulated 64/512-GPU traces (MODEL).

Two tables, baseline FIFO (the ratio column is mean JCT / FIFO's mean JCT on the same case; < 1 is better):

    real jobs       five jobs (matmul chains, a 2-core gang, a digits-CNN training job; notebook 18 §1) as worker
                    processes on this machine's 2 cores (``Cluster``, suspend preemption), under FIFO, SJF, SRPT, EASY
                    backfill: measured mean / p99 JCT, mean wait,
                    makespan, utilisation, Jain's index over 1/slowdown. Then the simulator, calibrated on each run
                    (``calibrate``: alone step time, interference, startup), re-simulates the run: ``sim mean JCT`` and
                    its relative error against the measured mean (the goal: within 15 %).
    simulated       (MODEL) ``synthetic_trace`` at offered load 1.5 on 64 GPUs (``seeds`` seeds, 300 jobs each) and
                    on 512 GPUs (one seed, 800 jobs, the large-cluster gang mix), FIFO / SJF / SRPT / backfill /
                    backfill+SJF: mean / p99 JCT, makespan, utilisation, Jain, energy (A100 power model); on 64
                    GPUs the paired difference FIFO - policy of mean JCT over seeds with 2 standard errors.

torch and tinygrad have no cluster scheduler (they are frameworks, not schedulers): one row each says so.
Sizes: about 15 s on 2 cores by default; ``full=True`` runs 10 seeds and 2 real repeats per policy.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from ..bench.table import Row, Table
from .calibrate import calibrate, validate
from .cluster import Cluster
from .jobs import Job
from .policies import FIFO, SJF, SRPT, Backfill, Policy
from .sim import Simulator
from .traces import LARGE_GPU_PROBS, synthetic_trace

NA_TORCH = "n/a: torch has no cluster scheduler (a framework; Slurm / Kubernetes schedule its jobs)"
NA_TINYGRAD = "n/a: tinygrad has no cluster scheduler"
REAL_CAP = {"cpu": 2, "mem_gb": 4.0}
REAL_POLICIES: dict[str, Callable[[], Policy]] = {"FIFO": FIFO, "SJF": SJF, "SRPT": SRPT, "Backfill": Backfill}
SIM_POLICIES: dict[str, Callable[[], Policy]] = {**REAL_POLICIES, "Backfill+SJF": lambda: Backfill(SJF())}


def real_jobs() -> list[tuple[float, Job]]:
    """(arrival s, job): the notebook's §1 set -- a long 1-core job, a 2-core gang job, a digits-CNN training job and
    two short jobs, all at t = 0 but the last (0.1 s): more work than cores, so the order matters."""
    # work well above a worker's start-up (~0.1-0.2 s of interpreter and imports), so the order decides the JCTs
    # even on a busy machine; est_step_s is each kind's measured step time on a Zen 5 (the gang: 2 threads), rounded;
    # the gang multiplies 192x192 matrices: at 96 its 2-thread BLAS barriers stalled for seconds next to other load
    return [
        (0.0, Job("long", 150, est_step_s=0.006, size=128)),
        (0.0, Job("gang2", 30, demand={"cpu": 2.0}, est_step_s=0.011, size=192)),
        (0.0, Job("cnn", 200, workload="cnn", est_step_s=0.001, size=32)),
        (0.0, Job("short1", 60, est_step_s=0.003, size=96)),
        (0.1, Job("short2", 60, est_step_s=0.003, size=96)),
    ]


def _na_rows(t: Table, case: str) -> None:
    t.add(Row(case, "torch", None, note=NA_TORCH))
    t.add(Row(case, "tinygrad", None, note=NA_TINYGRAD))


def real_table(repeat: int = 1, progress: Callable[[str], None] | None = None) -> Table:
    """The policies on real worker processes (measured), and the calibrated simulator's error on each run."""
    t = Table("sched: 5 jobs on this machine's 2 cores (measured wall-clock; sim rows MODEL)", baseline="FIFO")
    case = "2 cores, 5 jobs"
    for name, mk in REAL_POLICIES.items():
        reports = []
        for _ in range(repeat):
            if progress:
                progress(f"sched: real run, {name}")
            c = Cluster(devices=REAL_CAP, policy=mk(), preempt="suspend")
            for at, job in real_jobs():
                c.submit(job, at_s=at)
            reports.append(c.run(timeout_s=60))
        r = min(reports, key=lambda x: x.mean_jct_s)  # the least disturbed repeat
        done = sum(js.state == "done" for js in r.jobs)
        v = validate(r.jobs, mk(), REAL_CAP, calib=calibrate(r))
        t.add(
            Row(
                case,
                name,
                r.mean_jct_s * 1e3,
                extra={
                    "p99 JCT s": round(r.p99_jct_s, 3),
                    "mean wait s": round(r.mean_wait_s, 3),
                    "makespan s": round(r.makespan_s, 3),
                    "util": round(r.utilisation, 3),
                    "Jain": round(r.jain, 3),
                    "sim mean JCT s": round(v["mean_jct_sim"], 3),
                    "sim err": f"{v['mean_rel_err']:+.1%}",
                },
                note=f"{done}/{len(r.jobs)} done; mean JCT in ms",
            )
        )
    _na_rows(t, case)
    t.notes.append("median ms column = measured mean JCT (ms); sim = the simulator calibrated on that run (MODEL)")
    t.compute_ratios()
    return t


def paired_gain(fifo: list[float], other: list[float]) -> tuple[float, float]:
    """Mean and standard error of the paired differences FIFO - policy over seeds."""
    d = np.asarray(fifo, float) - np.asarray(other, float)
    se = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else math.inf
    return float(d.mean()), se


def sim_table(seeds: int = 5, progress: Callable[[str], None] | None = None) -> Table:
    """The policies on synthetic 64- and 512-GPU traces (MODEL)."""
    t = Table("sched: simulated GPU clusters, synthetic traces at load 1.5 (MODEL)", baseline="FIFO")
    res: dict[str, list] = {n: [] for n in SIM_POLICIES}
    t0 = time.perf_counter()
    for seed in range(seeds):
        if progress:
            progress(f"sched: 64-GPU trace, seed {seed}")
        trace = synthetic_trace(300, 64, 1.5, seed, steps=10)
        for name, mk in SIM_POLICIES.items():
            res[name].append(Simulator({"gpu": 64}, mk()).simulate(trace))
    big_trace = synthetic_trace(800, 512, 1.5, 0, steps=10, gpu_probs=LARGE_GPU_PROBS)
    if progress:
        progress("sched: 512-GPU trace")
    big = {name: Simulator({"gpu": 512}, mk()).simulate(big_trace) for name, mk in SIM_POLICIES.items()}
    fifo = [r.mean_jct_s for r in res["FIFO"]]
    case64 = f"64 GPUs, {seeds} seeds (MODEL)"
    for name, runs in res.items():
        gain, se = paired_gain(fifo, [r.mean_jct_s for r in runs])
        t.add(
            Row(
                case64,
                name,
                float(np.mean([r.mean_jct_s for r in runs])) * 1e3,
                extra={
                    "p99 JCT s": round(float(np.mean([r.p99_jct_s for r in runs]))),
                    "makespan h": round(float(np.mean([r.makespan_s for r in runs])) / 3600, 2),
                    "util": round(float(np.mean([r.utilisation for r in runs])), 3),
                    "Jain": round(float(np.mean([r.jain for r in runs])), 3),
                    "energy MWh": round(float(np.mean([r.energy_j for r in runs])) / 3.6e9, 3),
                    "FIFO - policy s": "-" if name == "FIFO" else f"{gain:.0f} +- {2 * se:.0f} (2 SE)",
                },
                note="mean over seeds; mean JCT in ms of simulated time",
            )
        )
    _na_rows(t, case64)
    case512 = "512 GPUs, seed 0 (MODEL)"
    for name, r in big.items():
        t.add(
            Row(
                case512,
                name,
                r.mean_jct_s * 1e3,
                extra={
                    "p99 JCT s": round(r.p99_jct_s),
                    "makespan h": round(r.makespan_s / 3600, 2),
                    "util": round(r.utilisation, 3),
                    "Jain": round(r.jain, 3),
                    "energy MWh": round(r.energy_j / 3.6e9, 3),
                },
                note="mean JCT in ms of simulated time",
            )
        )
    _na_rows(t, case512)
    t.notes.append(
        f"MODEL: every number in this table is simulated ({time.perf_counter() - t0:.1f} s of simulation); traces from "
        "tinylearn.sched.traces.synthetic_trace (Poisson arrivals, log-normal durations, stated GPU-count mix)"
    )
    t.compute_ratios()
    return t


def run(full: bool = False, progress: Callable[[str], None] | None = None) -> list[Table]:
    """Both tables (see the module docstring)."""
    return [real_table(2 if full else 1, progress), sim_table(10 if full else 5, progress)]
