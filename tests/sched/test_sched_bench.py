"""``tinylearn bench sched``: the tables' shape, the MODEL labels, and that the numbers are the runs' own."""

from __future__ import annotations

import math

from tinylearn.sched import bench
from tinylearn.sched.sim import Simulator
from tinylearn.sched.traces import synthetic_trace


def test_sim_table_rows_are_the_simulator_runs() -> None:
    t = bench.sim_table(seeds=2)
    assert "MODEL" in t.title and t.baseline == "FIFO"
    case64 = "64 GPUs, 2 seeds (MODEL)"
    assert set(t.impls()) == {*bench.SIM_POLICIES, "torch", "tinygrad"}
    # the FIFO row is the mean over the seeds of the simulator's own mean JCT
    want = sum(Simulator({"gpu": 64}, bench.FIFO()).simulate(synthetic_trace(300, 64, 1.5, s, steps=10)).mean_jct_s
               for s in range(2)) / 2  # fmt: skip
    assert math.isclose(t.get(case64, "FIFO").median_ms, want * 1e3, rel_tol=1e-9)
    assert t.get(case64, "FIFO").ratio == 1.0
    for r in t.rows:
        if r.impl in ("torch", "tinygrad"):
            assert r.median_ms is None and "n/a" in r.note
        else:
            assert r.median_ms > 0 and 0 < r.extra["util"] <= 1 and 0 < r.extra["Jain"] <= 1


def test_real_table_runs_real_jobs_and_reports_the_simulator_error() -> None:
    t = bench.real_table(repeat=1)
    assert t.baseline == "FIFO" and "measured" in t.title
    rows = [r for r in t.rows if r.impl in bench.REAL_POLICIES]
    assert len(rows) == len(bench.REAL_POLICIES)
    for r in rows:
        assert r.note.startswith("5/5 done")
        assert r.median_ms > 0 and r.extra["makespan s"] > 0
        assert r.extra["sim err"].endswith("%") and r.extra["sim mean JCT s"] > 0
