"""tinylearn.parallel without processes: pipeline schedules and bubble formulas, ZeRO memory formulas, plan_3d,
bad inputs. (The real-process checks are tests/parallel/test_parallel_dist.py.)"""

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


def test_plan_3d_cost_model_terms() -> None:
    """The step-time model term by term (issue 36): compute is 6·Ψ·b·s (forward + backward) with nothing divided,
    TP pays ``tp_allreduces_per_layer`` ring all-reduces per layer, DP all-reduces Ψ/(tp·pp) elements of
    ``dtype_bytes`` bytes, and the optimizer step is charged per parameter this rank updates."""
    from tinylearn.dist import cost_model

    psi, layers, h, s, gb = 1_000_000, 4, 256, 32, 4
    free = {"alpha_s": 0.0, "beta_s_per_byte": 0.0}
    link = {"alpha_s": 1e-4, "beta_s_per_byte": 1e-9}
    # compute only: m microbatches of 6·Ψ·b·s FLOPs each, not divided by 3 (6 already counts fwd + bwd)
    t, _ = par.estimate_3d(1, 1, 1, psi, layers, h, s, gb, free, flops_per_s=1e9)
    assert t == pytest.approx(gb * 6 * psi * s / 1e9)
    # TP: k all-reduces of b·s·h elements per layer and microbatch, k a parameter (Megatron layer 4, ParallelMLP 2)
    ring_act = cost_model.predict("ring", s * h * 4, 2, 1e-4, 1e-9)
    base, _ = par.estimate_3d(1, 2, 1, psi, layers, h, s, gb, link, 1e9, dtype_bytes=4, tp_allreduces_per_layer=0)
    for k in (2, 4):
        tk, _ = par.estimate_3d(1, 2, 1, psi, layers, h, s, gb, link, 1e9, dtype_bytes=4, tp_allreduces_per_layer=k)
        assert tk - base == pytest.approx(gb * k * layers * ring_act)
    t_default, _ = par.estimate_3d(1, 2, 1, psi, layers, h, s, gb, link, 1e9, dtype_bytes=4)
    assert t_default - base == pytest.approx(gb * 4 * layers * ring_act)  # Megatron default: 2 fwd + 2 bwd
    # DP: one ring all-reduce of Ψ elements of dtype_bytes bytes (fp32 job: 4 bytes, twice the bf16 price)
    for nbytes in (2, 4):
        t_dp, _ = par.estimate_3d(2, 1, 1, psi, layers, h, s, gb, link, 1e9, dtype_bytes=nbytes)
        t_1, _ = par.estimate_3d(1, 1, 1, psi, layers, h, s, gb // 2, link, 1e9, dtype_bytes=nbytes)
        assert t_dp - t_1 == pytest.approx(cost_model.predict("ring", psi * nbytes, 2, 1e-4, 1e-9))
    # optimizer: per parameter this rank updates (ZeRO >= 1 shards the update over dp)
    for stage, updated in ((0, psi), (1, psi / 2)):
        t0, _ = par.estimate_3d(2, 1, 1, psi, layers, h, s, gb, free, 1e9, zero_stage=stage)
        t1, _ = par.estimate_3d(2, 1, 1, psi, layers, h, s, gb, free, 1e9, zero_stage=stage, optimizer_s_per_param=1e-8)
        assert t1 - t0 == pytest.approx(updated * 1e-8)
    # memory follows the dtype: fp32 activations are twice the bf16 ones, fp32 model states have no master copy
    _, m2 = par.estimate_3d(1, 1, 1, psi, layers, h, s, gb, free, 1e9, zero_stage=0, dtype_bytes=2)
    _, m4 = par.estimate_3d(1, 1, 1, psi, layers, h, s, gb, free, 1e9, zero_stage=0, dtype_bytes=4)
    assert m2 == pytest.approx(16 * psi + 34 * s * h * layers) and m4 == pytest.approx(16 * psi + 68 * s * h * layers)
    # the planner ranks with the same parameters
    kw = {"tp_allreduces_per_layer": 2, "dtype_bytes": 4, "zero_stage": 0, "optimizer_s_per_param": 1e-8}
    plans = par.plan_3d(2, psi, layers, h, s, gb, 1e12, link, flops_per_s=1e9, **kw)
    for pl in plans:
        t, mem = par.estimate_3d(pl.dp, pl.tp, pl.pp, psi, layers, h, s, gb, link, 1e9, **kw)
        assert (pl.est_step_s, pl.est_bytes) == (t, mem)
    for kwargs, match in (
        ({"tp_allreduces_per_layer": -1}, "tp_allreduces_per_layer"),
        ({"tp_allreduces_per_layer": 2.0}, "tp_allreduces_per_layer"),
        ({"dtype_bytes": 8}, "dtype_bytes"),
        ({"optimizer_s_per_param": -1.0}, "optimizer_s_per_param"),
    ):
        with pytest.raises(ValueError, match=match):
            par.plan_3d(2, psi, layers, h, s, gb, 1e12, link, **kwargs)
        with pytest.raises(ValueError, match=match):
            par.estimate_3d(1, 1, 1, psi, layers, h, s, gb, link, **kwargs)


def test_map_reduce_in_one_process() -> None:
    from collections import Counter

    from tinylearn.parallel.workers import CORPUS

    stats: dict[str, int] = {}
    got = par.map_reduce(CORPUS, lambda line: [(w, 1) for w in line.split()], lambda k, vs: sum(vs), stats=stats)
    assert got == dict(Counter(w for line in CORPUS for w in line.split()))
    assert stats["pairs_shuffled"] == 0 and stats["keys_reduced"] == len(got)  # one rank owns every key
    assert stats["pairs_mapped"] == sum(len(line.split()) for line in CORPUS)
    # the combiner must not change the result (partial sums of a sum); a max-reduce with a max-combiner neither
    data = [("a", 3), ("b", 1), ("a", 7), ("c", 2)]
    assert par.map_reduce(data, lambda kv: [kv], lambda k, vs: max(vs), combiner=lambda k, vs: [max(vs)]) == {
        "a": 7,
        "b": 1,
        "c": 2,
    }
    # partition: stable across processes (CRC32, not Python's salted str hash), in range
    assert par.partition("the", 4) == 0xAADA83D3 % 4  # zlib.crc32(b"'the'")
    assert {par.partition(w, 3) for w in "abcdefghij"} <= {0, 1, 2}
    with pytest.raises(ValueError, match="n_parts"):
        par.partition("x", 0)
    with pytest.raises(TypeError, match="records"):
        par.map_reduce("not a list", lambda r: [], lambda k, vs: 0)
    with pytest.raises(TypeError, match="mapper"):
        par.map_reduce([1], None, lambda k, vs: 0)
    with pytest.raises(TypeError, match="mapper: must yield"):
        par.map_reduce([1], lambda r: [r], lambda k, vs: 0)
    with pytest.raises(TypeError, match="combiner"):
        par.map_reduce([1], lambda r: [(r, 1)], lambda k, vs: 0, combiner=3)


def test_buffer_depths_littles_law() -> None:
    import random

    t, d, a = [1.0, 1.2, 0.8, 1.0], [0.3, 2.5, 0.4], [0.1, 0.6, 0.1]
    depths = par.buffer_depths(t, d, a)
    assert depths == [2, 4, 2]  # ceil((t_i + d_i + a_i) / max t): ceil(1.4/1.2), ceil(4.3/1.2), ceil(1.3/1.2)
    assert par.simulate_stream(t, d, depths, 400, a)["period"] == pytest.approx(max(t))
    for i in range(3):  # one slot fewer on any edge slows the whole pipeline below the bottleneck's rate
        fewer = [b - (j == i) for j, b in enumerate(depths)]
        if min(fewer) >= 1:
            assert par.simulate_stream(t, d, fewer, 400, a)["period"] > max(t) * 1.05
    rng = random.Random(0)  # the simulated steady state is the max-plus cycle bound, for random instances
    for _ in range(50):
        s = rng.randint(2, 5)
        t = [rng.choice([0.5, 1.0, 1.5, 2.0]) for _ in range(s)]
        d = [rng.choice([0.1, 0.5, 1.0, 3.0, 7.25]) for _ in range(s - 1)]
        a = [rng.choice([0.0, 0.25, 1.0]) for _ in range(s - 1)]
        b = [rng.randint(1, 6) for _ in range(s - 1)]
        assert par.simulate_stream(t, d, b, 1200, a)["period"] == pytest.approx(par.stream_period(t, d, b, a))
        assert par.stream_period(t, d, par.buffer_depths(t, d, a), a) == pytest.approx(max(t))
    # the online controller: a link slows down at microbatch 200; re-deriving B from observed times recovers
    t, a = [1.0, 1.2, 0.8, 1.0], [0.1, 0.6, 0.1]
    link = lambda k: [0.3, 2.5 if k < 200 else 6.0, 0.4]  # noqa: E731
    fixed = par.simulate_stream(t, link, [2, 4, 2], 600, a)
    adaptive = par.simulate_stream(t, link, [2, 4, 2], 600, a, adapt_every=20)
    assert fixed["period"] > 1.5 * max(t) and adaptive["period"] == pytest.approx(max(t))
    assert adaptive["depths"][-1] == par.buffer_depths(t, [0.3, 6.0, 0.4], a) == [2, 7, 2]
    for call, match in (
        (lambda: par.buffer_depths([1.0, 1.0], [0.5, 0.5]), "edge_s"),
        (lambda: par.buffer_depths([0.0, 0.0], [0.5]), "stage_s"),
        (lambda: par.buffer_depths([1.0, 1.0], [-1.0]), "edge_s"),
        (lambda: par.stream_period([1.0, 1.0], [0.5], [0]), "depths"),
        (lambda: par.simulate_stream([1.0, 1.0], [0.5], [1], 2), "n_microbatches"),
        (lambda: par.simulate_stream([1.0, 1.0], [0.5], [1], 8, adapt_every=0), "adapt_every"),
    ):
        with pytest.raises(ValueError, match=match):
            call()


def test_tune_microbatch_bandit() -> None:
    g, p = 64, 4
    assert par.microbatch_step_time(g, 8, p, 2e-3, 1e-3) == pytest.approx((8 + 3) * (2e-3 + 8e-3))
    kw = {"act_bytes_per_sample": 50e6, "memory_budget": 2e9, "steps": 300}
    for weight, best in ((0.0, 8), (3e4, 2)):  # throughput alone: b = 8; a heavy latency weight: smaller b
        res = par.tune_microbatch(g, [1, 2, 4, 8, 16, 32], p, 2e-3, 1e-3, latency_weight=weight, **kw)
        assert res["best"] == best == max(res["expected"], key=res["expected"].get)
        assert res["choice"] == best and max(res["counts"], key=res["counts"].get) == best  # exploits the best
        assert res["infeasible"] == [16, 32]  # min(p, m)·b·50 MB > 2 GB
    for seed in range(5):  # the choice survives other noise draws
        assert par.tune_microbatch(g, [1, 2, 4, 8], p, 2e-3, 1e-3, seed=seed)["choice"] == 8
    for call, match in (
        (lambda: par.microbatch_step_time(64, 3, 4, 1e-3, 1e-3), "b: 3 does not divide"),
        (lambda: par.microbatch_step_time(64, 4, 0, 1e-3, 1e-3), "n_stages"),
        (lambda: par.tune_microbatch(64, [], 4, 1e-3, 1e-3), "candidates"),
        (lambda: par.tune_microbatch(64, [8], 4, 1e-3, 1e-3, memory_budget=1.0, act_bytes_per_sample=1.0), "memory"),
        (lambda: par.tune_microbatch(64, [8], 4, 1e-3, 1e-3, noise=1.5), "noise"),
    ):
        with pytest.raises(ValueError, match=match):
            call()


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
