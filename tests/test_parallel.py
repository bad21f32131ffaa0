"""tinylearn.parallel without processes: pipeline schedules and bubble formulas, ZeRO memory formulas, plan_3d,
bad inputs. (The real-process checks are tests/test_parallel_dist.py.)"""

from __future__ import annotations

import pytest
import torch

import tinylearn.parallel as par


@pytest.mark.parametrize("name,v", [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("interleaved_1f1b", 3)])
@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("m", [4, 6])
def test_schedule_valid_and_bubble_matches_simulation(name: str, v: int, p: int, m: int) -> None:
    if name == "interleaved_1f1b" and m % p:
        with pytest.raises(ValueError, match="n_microbatches"):
            par.pipeline_schedule(name, p, m, v)
        return
    sched = par.pipeline_schedule(name, p, m, v)
    assert len(sched) == p
    par.validate_schedule(sched, m, v)  # every F before its B, each exactly once
    for t_f, t_b in ((1.0, 2.0), (0.5, 1.7)):
        sim = par.simulate(sched, t_f, t_b, v)  # raises on a dependency deadlock
        assert sim["bubble"] == pytest.approx(par.bubble_fraction(name, p, m, v), abs=1e-12)
        # stage dependencies: F(mb) on stage s starts after F(mb) ended on s-1; B(mb) on s after B(mb) on s+1
        end = {(e[0], e[1], e[2], e[3]): e[5] for e in sim["events"]}
        start = {(e[0], e[1], e[2], e[3]): e[4] for e in sim["events"]}
        for (s, kind, mb, c), t0 in start.items():
            if kind == "F" and s > 0:
                assert t0 >= end[(s - 1, "F", mb, c)]
            if kind == "B" and s < p - 1:
                assert t0 >= end[(s + 1, "B", mb, c)]
    peaks = [par.peak_in_flight(ops) for ops in sched]
    if name == "1f1b":
        assert max(peaks) <= p and peaks == [min(p - s, m) for s in range(p)]
    if name == "gpipe":
        assert peaks == [m] * p


def test_schedule_examples() -> None:
    assert par.pipeline_schedule("1f1b", 2, 3) == [
        [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("B", 2)],
        [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)],
    ]
    assert par.pipeline_schedule("gpipe", 1, 2) == [[("F", 0), ("F", 1), ("B", 0), ("B", 1)]]
    inter = par.pipeline_schedule("interleaved_1f1b", 2, 4, 2)
    assert inter[0][:4] == [("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("F", 1, 1)]
    assert par.bubble_fraction("1f1b", 4, 8) == pytest.approx(3 / 11)
    assert par.bubble_fraction("interleaved_1f1b", 4, 8, 2) == pytest.approx(3 / 19)
    # interleaving shrinks the bubble by ~v at the price of v x more p2p messages
    assert par.bubble_fraction("interleaved_1f1b", 4, 8, 4) < par.bubble_fraction("1f1b", 4, 8)


def test_invalid_schedule_is_rejected() -> None:
    bad = [[("B", 0), ("F", 0)]]
    with pytest.raises(ValueError, match="before its forward"):
        par.validate_schedule(bad, 1)
    with pytest.raises(ValueError, match="deadlock"):  # stage 0 needs B(0) from stage 1 before it sends F(1),
        # but stage 1 wants F(1) first: each waits on the other
        par.simulate([[("F", 0), ("B", 0), ("F", 1), ("B", 1)], [("F", 1), ("B", 1), ("F", 0), ("B", 0)]])
    with pytest.raises(ValueError, match="name"):
        par.pipeline_schedule("zb", 2, 4)
    with pytest.raises(ValueError, match="n_chunks"):
        par.pipeline_schedule("1f1b", 2, 4, 2)
    with pytest.raises(ValueError, match="n_stages"):
        par.bubble_fraction("1f1b", 0, 4)


def test_zero_memory_formulas() -> None:
    psi, n = 7_500_000_000, 64  # the ZeRO paper's Figure 1 example: 7.5B parameters, N_d = 64, K = 12
    gb = 1e9
    base = par.zero_memory_per_rank(psi, 0, n)
    assert base["total"] == 16 * psi and base["total"] / gb == pytest.approx(120)
    s1, s2, s3 = (par.zero_memory_per_rank(psi, s, n) for s in (1, 2, 3))
    assert s1["total"] == pytest.approx((2 + 2) * psi + 12 * psi / n)  # 31.4 GB
    assert s2["total"] == pytest.approx(2 * psi + (2 + 12) * psi / n)  # 16.6 GB
    assert s3["total"] == pytest.approx((2 + 2 + 12) * psi / n)  # 1.9 GB
    assert [round(x["total"] / gb, 1) for x in (s1, s2, s3)] == [31.4, 16.6, 1.9]
    for d in (s1, s2, s3):
        assert d["total"] == d["params"] + d["grads"] + d["optimizer_state"]
    fp32 = par.zero_memory_per_rank(1000, 1, 4, dtype_bytes=4)  # no master copy: K = 8
    assert fp32 == {"params": 4000, "grads": 4000, "optimizer_state": 2000, "total": 10000}
    assert par.zero_memory_per_rank(1000, 3, 1)["total"] == 16000  # one rank: nothing to shard
    assert par.zero_memory_per_rank(800, 1, 4, dtype_bytes=4, optimizer="sgd")["optimizer_state"] == 800
    for kwargs, match in (
        ({"stage": 4}, "stage"),
        ({"world_size": 0}, "world_size"),
        ({"optimizer": "lion"}, "optimizer"),
        ({"dtype_bytes": 3}, "dtype_bytes"),
    ):
        args = {"n_params": 10, "stage": 1, "world_size": 2, **kwargs}
        with pytest.raises(ValueError, match=match):
            par.zero_memory_per_rank(**args)


def test_plan_3d() -> None:
    link = {"alpha_s": 5e-6, "beta_s_per_byte": 1 / 50e9}
    # 7B model on 64 ranks: pure DP (ZeRO-1) needs (4 + 12/64) * 7e9 = 29.3 GB of model states plus
    # 34 * s * h * L = 9.1 GB of activations (b = 1) = 38.4 GB: fits in 80 GB, not in 32 GB
    t, mem = par.estimate_3d(64, 1, 1, 7_000_000_000, 32, 4096, 2048, 256, link)
    assert mem == pytest.approx(7e9 * (4 + 12 / 64) + 34 * 2048 * 4096 * 32)
    plans = par.plan_3d(64, 7_000_000_000, 32, 4096, 2048, 256, 80e9, link)
    assert (64, 1, 1) in [(p.dp, p.tp, p.pp) for p in plans]
    plans = par.plan_3d(64, 7_000_000_000, 32, 4096, 2048, 256, 32e9, link)
    assert plans and all(p.dp * p.tp * p.pp == 64 for p in plans)
    assert [p.est_step_s for p in plans] == sorted(p.est_step_s for p in plans)
    assert all(p.est_bytes <= 32e9 for p in plans)
    assert all(p.tp * p.pp > 1 for p in plans)
    t2, mem2 = par.estimate_3d(8, 8, 1, 7_000_000_000, 32, 4096, 2048, 256, link)
    assert mem2 < mem  # tensor parallelism divides model states and activations by tp
    # a slow link pushes the optimum towards fewer TP all-reduces (less tp)
    fast = par.plan_3d(16, 1_000_000_000, 24, 2048, 1024, 64, 80e9, {"alpha_s": 1e-6, "beta_s_per_byte": 1e-12})
    slow = par.plan_3d(16, 1_000_000_000, 24, 2048, 1024, 64, 80e9, {"alpha_s": 1e-4, "beta_s_per_byte": 1e-9})
    assert slow[0].tp <= fast[0].tp
    assert par.plan_3d(8, 10**12, 8, 1024, 1024, 8, 1e9, link) == []  # nothing fits
    with pytest.raises(ValueError, match="world_size"):
        par.plan_3d(0, 10, 1, 8, 8, 8, 1e9, link)
    with pytest.raises(ValueError, match="link"):
        par.plan_3d(2, 10, 1, 8, 8, 8, 1e9, {"alpha": 1})


def test_needs_a_process_group() -> None:
    with pytest.raises(RuntimeError, match="torch.distributed"):
        par.ZeroOptimizer([torch.nn.Parameter(torch.zeros(3))])
    with pytest.raises(ValueError, match="stage"):
        par.ZeroOptimizer([torch.nn.Parameter(torch.zeros(3))], stage=4)
    with pytest.raises(TypeError, match="optimizer_cls"):
        par.ZeroOptimizer([torch.nn.Parameter(torch.zeros(3))], optimizer_cls=dict)
    with pytest.raises(RuntimeError, match="torch.distributed"):
        par.ColumnParallelLinear(4, 4)
    with pytest.raises(ValueError, match="schedule"):
        par.PipelineParallel(torch.nn.Linear(2, 2), schedule="interleaved_1f1b")
