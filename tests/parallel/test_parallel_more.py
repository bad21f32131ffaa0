"""tinylearn.parallel: checkpoint interval tuner (Q207), layer/batch rebalancing (Q255, Q252), and the mapping of
(dp, tp, pp) onto a link hierarchy (Q176). Deterministic models, no processes."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import tinylearn.parallel as par

C, H, D = 60.0, 3600.0, 86400.0


def test_young_daly_minimises_waste_rate() -> None:
    lam = 1 / (6 * H)
    i_star = par.young_daly_interval(lam, C)
    assert i_star == pytest.approx(math.sqrt(2 * C / lam))
    w = par.waste_rate(i_star, lam, C)
    assert w == pytest.approx(math.sqrt(2 * C * lam))
    for f in (0.5, 0.9, 1.1, 2.0):
        assert par.waste_rate(f * i_star, lam, C) > w


def test_tuner_converges_with_known_rate_and_tracks_estimate() -> None:
    lam = 1 / H
    tu = par.CheckpointTuner(C, 60.0, initial_rate=1 / D, prior_s=D, half_life_s=D)
    for _ in range(40):
        tu.update(lam)
    assert tu.interval_s == pytest.approx(par.young_daly_interval(lam, C), rel=1e-6)
    # estimate: decayed failures / decayed exposure
    tu2 = par.CheckpointTuner(C, 600.0, initial_rate=1e-9, prior_s=1.0, half_life_s=1e12)
    for _ in range(100):
        tu2.observe(100.0, 1)
    assert tu2.failure_rate == pytest.approx(1 / 100.0, rel=1e-3)


def test_simulated_adaptive_checkpointing_close_to_oracle() -> None:
    trace = par.failure_trace([(15 * D, 1 / (6 * H)), (40 * D, 1 / H)], seed=0)
    assert trace == sorted(trace) and all(0 < t < 40 * D for t in trace)
    assert trace == par.failure_trace([(15 * D, 1 / (6 * H)), (40 * D, 1 / H)], seed=0)  # deterministic
    tu = par.CheckpointTuner(C, 600.0, initial_rate=1 / (24 * H), prior_s=D, half_life_s=D)
    ad = par.simulate_checkpointing(tu, trace, C, 20 * D)
    oracle = par.simulate_checkpointing(
        lambda t: par.young_daly_interval(1 / (6 * H) if t < 15 * D else 1 / H, C), trace, C, 20 * D
    )
    fixed = par.simulate_checkpointing(par.young_daly_interval(1 / (6 * H), C), trace, C, 20 * D)
    assert oracle["waste"] < ad["waste"] < fixed["waste"]
    assert ad["waste"] < 1.1 * oracle["waste"]
    i_star = par.young_daly_interval(1 / H, C)
    assert par.waste_rate(tu.interval_s, 1 / H, C) < 1.01 * par.waste_rate(i_star, 1 / H, C)
    no_fail = par.simulate_checkpointing(100.0, [], 10.0, 1000.0)
    assert no_fail["wall_s"] == pytest.approx(1100.0) and no_fail["n_failures"] == 0


@pytest.mark.parametrize(
    "call",
    [
        lambda: par.waste_rate(0.0, 1.0, 1.0),
        lambda: par.waste_rate(1.0, -1.0, 1.0),
        lambda: par.young_daly_interval(1.0, float("nan")),
        lambda: par.CheckpointTuner(C, 10.0, initial_rate=1.0, prior_s=1.0, half_life_s=1.0, lr=2.5),
        lambda: par.CheckpointTuner(C, 0.5, initial_rate=1.0, prior_s=1.0, half_life_s=1.0),
        lambda: par.CheckpointTuner(C, 10.0, initial_rate=1.0, prior_s=1.0, half_life_s=1.0).observe(1.0, -1),
        lambda: par.failure_trace([]),
        lambda: par.failure_trace([(10.0, 1.0), (5.0, 1.0)]),
        lambda: par.simulate_checkpointing(10.0, [], 1.0, 100.0, restart_s=-1.0),
    ],
)
def test_checkpoint_bad_input(call) -> None:
    with pytest.raises(ValueError, match=r"^\w+"):
        call()


def test_partition_layers_is_optimal_by_brute_force() -> None:
    costs = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
    speeds = [1.0, 2.0, 0.5]
    edges = [0.5, 3.0, 0.1, 2.0, 0.2, 1.0, 0.3]
    for e in (None, edges):
        b = par.partition_layers(costs, speeds, e)
        best = min(
            max(par.stage_times(costs, [0, i, j, 8], speeds, e)) for i, j in itertools.combinations(range(1, 8), 2)
        )
        assert max(par.stage_times(costs, b, speeds, e)) == pytest.approx(best)
    assert par.partition_layers([1.0] * 16, [1, 1, 1, 1]) == [0, 4, 8, 12, 16]
    assert par.pipeline_step_time([1.0, 2.0, 1.0], 4) == 4.0 + 3 * 2.0


def test_migration_seconds_counts_moved_layers() -> None:
    assert par.migration_seconds([0, 4, 8], [0, 4, 8], [1.0] * 8, 1.0, 1.0) == 0.0
    # layers 4 and 5 move to device 0 (which pulls them), nothing else moves
    assert par.migration_seconds([0, 4, 8], [0, 6, 8], [10.0] * 8, 1.0, 0.5) == 2 * (1.0 + 5.0)


def test_rebalancer_migrates_only_when_gain_beats_cost() -> None:
    c, lb, link = [0.01] * 16, [3.2e9] * 16, {"alpha_s": 1e-4, "beta_s_per_byte": 1 / 5e9}
    b0 = [0, 4, 8, 12, 16]

    def speeds(k: int) -> list[float]:
        return [1, 1, 1, 1] if k < 20 else [1, 1, 0.5, 1]

    static = par.simulate_rebalance(None, c, b0, speeds, 60, 8)
    long = par.LayerRebalancer(c, b0, lb, link, 8, horizon_steps=100)
    run = par.simulate_rebalance(long, c, b0, speeds, 60, 8)
    assert run["migrations"] and run["bottleneck_s"][-1] < static["bottleneck_s"][-1]
    assert sum(run["step_s"]) < sum(static["step_s"])
    short = par.LayerRebalancer(c, b0, lb, link, 8, horizon_steps=2)
    run2 = par.simulate_rebalance(short, c, b0, speeds, 60, 8)
    prop = short.propose()
    assert not run2["migrations"] and 0 < 2 * prop["gain_s"] < prop["migration_s"]
    assert long.speeds == pytest.approx([1, 1, 0.5, 1], rel=1e-6)


def test_split_batch_and_reslicing() -> None:
    n = par.split_batch(64, [1, 1, 0.5, 0.5])
    assert sum(n) == 64 and n == [22, 22, 10, 10]
    # optimal: no other split has a smaller max n_i / v_i (check all moves of one sample)
    t = max(x / v for x, v in zip(n, [1, 1, 0.5, 0.5], strict=True))
    assert t <= 64 / 3 + 1

    def sp(k: int) -> list[float]:
        return [1, 1, 0.5, 0.5] if k < 10 else [0.25, 1, 0.5, 0.5]

    ad = par.simulate_reslicing(64, sp, 30, 1e-3)
    eq = par.simulate_reslicing(64, sp, 30, 1e-3, adaptive=False)
    best = max(x * 1e-3 / v for x, v in zip(par.split_batch(64, sp(29)), sp(29), strict=True))
    assert ad["step_s"][-1] == pytest.approx(best) and eq["step_s"][-1] > 2 * best


@pytest.mark.parametrize(
    "call",
    [
        lambda: par.partition_layers([1.0, 2.0], [1.0, 1.0, 1.0]),
        lambda: par.partition_layers([1.0, -2.0], [1.0]),
        lambda: par.partition_layers([1.0, 2.0], [0.0]),
        lambda: par.stage_times([1.0, 2.0], [0, 3], [1.0]),
        lambda: par.pipeline_step_time([1.0], 0),
        lambda: par.migration_seconds([0, 1, 2], [0, 2], [1.0, 1.0], 0.0, 0.0),
        lambda: par.LayerRebalancer([1.0], [0, 1], [1.0], {"alpha_s": 0.0}, 2, 1),
        lambda: par.LayerRebalancer([1.0], [0, 1], [1.0], {"alpha_s": 0.0, "beta_s_per_byte": 0.0}, 2, 0),
        lambda: par.LayerRebalancer([1.0], [0, 1], [1.0], {"alpha_s": 0.0, "beta_s_per_byte": 0.0}, 2, 1).propose(),
        lambda: par.split_batch(-1, [1.0]),
        lambda: par.simulate_reslicing(8, lambda k: [1.0], 0, 1.0),
        lambda: par.simulate_rebalance(None, [1.0], [0, 1], lambda k: [1.0], 0, 1),
    ],
)
def test_rebalance_bad_input(call) -> None:
    with pytest.raises(ValueError, match=r"^\w+"):
        call()


LEVELS = [("nvlink", 4, 2e-6, 1 / 150e9), ("pcie", 2, 5e-6, 1 / 16e9), ("ethernet", 4, 20e-6, 1 / 12.5e9)]
JOB = {"n_params": 7_000_000_000, "n_layers": 32, "hidden": 4096, "seq_len": 2048, "global_batch": 1024}


def test_group_levels_by_rank_order() -> None:
    lv = [par.Level(*x) for x in LEVELS]
    sizes = {"tp": 4, "pp": 2, "dp": 4}
    assert par.group_levels(sizes, ("tp", "pp", "dp"), lv) == {"tp": 0, "pp": 1, "dp": 2}
    assert par.group_levels(sizes, ("dp", "tp", "pp"), lv) == {"dp": 0, "tp": 2, "pp": 2}


def test_map_3d_puts_tp_on_nvlink() -> None:
    best = par.map_3d(4, 4, 2, LEVELS, **JOB)
    assert len(best) == 6 and best[0].order == ("tp", "pp", "dp")
    assert best[0].levels == {"tp": "nvlink", "pp": "pcie", "dp": "ethernet"}
    assert all(b.total_s >= best[0].total_s for b in best)
    other = par.map_3d(2, 4, 4, LEVELS, **JOB)[0]
    assert other.order == ("tp", "dp", "pp") and other.levels["tp"] == "nvlink"


@pytest.mark.parametrize(
    "call",
    [
        lambda: par.map_3d(4, 4, 4, LEVELS, **JOB),  # 64 ranks on a 32-GPU hierarchy
        lambda: par.map_3d(0, 4, 8, LEVELS, **JOB),
        lambda: par.map_3d(4, 4, 2, [("nvlink", 0, 1e-6, 1e-9)], **JOB),
        lambda: par.map_3d(4, 4, 2, [], **JOB),
        lambda: par.group_levels({"tp": 2, "dp": 2}, ("tp", "tp"), [par.Level("x", 4, 0.0, 0.0)]),
        lambda: par.map_3d(4, 4, 2, LEVELS, **{**JOB, "global_batch": 6}),
        lambda: par.map_3d(4, 4, 2, LEVELS, **{**JOB, "dtype_bytes": 3}),
    ],
)
def test_topology_bad_input(call) -> None:
    with pytest.raises(ValueError, match=r"^\w+"):
        call()


def test_comm_per_step_matches_cost_model_terms() -> None:
    from tinylearn.dist import cost_model

    lv = par.Level("x", 8, 1e-5, 1e-10)
    links = {"tp": lv, "pp": lv, "dp": lv}
    job = {**JOB, "global_batch": 64}
    out = par.comm_per_step({"dp": 4, "tp": 1, "pp": 1}, links, **job)
    assert out["tp"] == 0.0 and out["pp"] == 0.0
    assert out["dp"] == pytest.approx(cost_model.predict("ring", 7e9 * 2, 4, 1e-5, 1e-10))
    out = par.comm_per_step({"dp": 1, "tp": 1, "pp": 4}, links, **job)
    act = 2048 * 4096 * 2
    assert out["pp"] == pytest.approx((64 + 3) * 2 * (1e-5 + 1e-10 * act)) and out["dp"] == 0.0
    with pytest.raises(ValueError, match="microbatch_size"):
        par.comm_per_step({"dp": 1, "tp": 1, "pp": 4}, links, **job, microbatch_size=0)


# ---------------------------------------------------------------- integer arguments (issue 38: the as_int rule)
def test_schedule_and_zero_helpers_take_numpy_ints_like_python_ints() -> None:
    assert par.bubble_fraction("1f1b", np.int8(4), np.uint16(8)) == par.bubble_fraction("1f1b", 4, 8)
    assert par.pipeline_schedule("gpipe", np.int64(2), np.int8(3)) == par.pipeline_schedule("gpipe", 2, 3)
    assert par.shard_bounds(np.int32(10), np.int8(4), np.int8(1)) == par.shard_bounds(10, 4, 1) == (3, 6)
    assert par.zero_memory_per_rank(np.int64(10**6), np.int8(2), np.int16(4), np.int8(2)) == par.zero_memory_per_rank(
        10**6, 2, 4, 2
    )
    assert type(par.shard_bounds(10, np.int8(4), np.int8(1))[0]) is int


@pytest.mark.parametrize(
    "call, arg, exc",
    [
        (lambda: par.shard_bounds(10, 4, False), "rank", TypeError),
        (lambda: par.shard_bounds(10, 4, 1.0), "rank", TypeError),
        (lambda: par.shard_bounds(10, 4, 4), "rank", ValueError),
        (lambda: par.shard_bounds(10, True, 0), "world_size", TypeError),
        (lambda: par.zero_memory_per_rank(10**6, 0.0, 4), "stage", TypeError),
        (lambda: par.zero_memory_per_rank(10**6, False, 4), "stage", TypeError),
        (lambda: par.zero_memory_per_rank(10**6, 4, 4), "stage", ValueError),
        (lambda: par.zero_memory_per_rank(10**6, 1, 4, dtype_bytes=2.0), "dtype_bytes", ValueError),
        (lambda: par.bubble_fraction("1f1b", 2.0, 8), "n_stages", TypeError),
        (lambda: par.pipeline_schedule("gpipe", 2, True), "n_microbatches", TypeError),
        (lambda: par.pipeline_schedule("gpipe", 2, 0), "n_microbatches", ValueError),
    ],
)
def test_schedule_and_zero_helpers_refuse_bool_float_and_out_of_range(call, arg, exc) -> None:
    with pytest.raises(exc, match=arg):
        call()
