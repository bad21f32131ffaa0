"""Run-time statistics choose the next batch's variant [Q212]: static statistics from the scheduled loop IR, a
UCB / epsilon-greedy bandit over compiled schedule variants, convergence to the fastest one."""

from __future__ import annotations

import pytest

from tinylearn import tunable
from tinylearn.tune.variants import VariantBandit, VariantStats, counters_status, loop_stats, run_batches

SHAPE = {"R": 16, "C": 512}
ROWS = {"tile": 1, "order": "rows", "parallel": 0, "vectorize": 1, "unroll": 1}
VARIANTS = [
    ROWS,
    dict(ROWS, vectorize=0, unroll=4),
    dict(ROWS, order="cols"),
    dict(ROWS, tile=64, order="cols", vectorize=0),
]


def test_loop_stats_read_the_scheduled_loop_ir():
    space = tunable.get("compiler.schedule")
    rows = loop_stats(space, ROWS, SHAPE)
    assert (rows["loads"], rows["stores"], rows["inner_stride"], rows["simd"]) == (2.0, 1.0, 1.0, 1.0)
    assert rows["load_store_ratio"] == 2.0 and rows["arith"] >= 5
    cols = loop_stats(space, VARIANTS[2], SHAPE)
    assert cols["inner_stride"] == SHAPE["C"]  # the column-order nest walks down the rows
    assert loop_stats(space, VARIANTS[1], SHAPE)["unroll"] == 4.0
    assert loop_stats(space, VARIANTS[3], SHAPE)["inner_stride"] == 1.0  # a column strip, each row contiguous
    g = tunable.get("gemm.matmul")
    shape = {"M": 64, "K": 64, "N": 64}
    assert "intensity" in loop_stats(g, g.default(shape), shape)


@pytest.mark.parametrize("policy", ["ucb", "epsilon"])
def test_bandit_converges_to_the_fastest_arm_with_known_costs(policy):
    cost = [3.0, 1.0, 2.0, 1.6]  # seconds per element of each arm (a fixed workload, no timing noise)
    arms = [VariantStats({"v": i}) for i in range(4)]
    bandit = VariantBandit(arms, policy, epsilon=0.1, seed=0)
    picks = []
    for _ in range(200):
        i = bandit.choose()
        bandit.update(i, cost[i])
        picks.append(i)
    assert sorted(picks[:4]) == [0, 1, 2, 3]  # every arm once first
    assert picks[100:].count(1) >= 0.8 * 100


def test_static_statistics_order_the_first_tries():
    space = tunable.get("compiler.schedule")
    arms = [VariantStats(c, loop_stats(space, c, SHAPE)) for c in VARIANTS]
    bandit = VariantBandit(arms, "ucb")
    first = bandit.choose()
    assert arms[first].static["inner_stride"] == 1.0  # a strided variant is never tried first


def test_run_batches_serves_every_variant_and_reports_convergence():
    space = tunable.get("compiler.schedule")
    run = run_batches(space, SHAPE, VARIANTS, 24, policy="ucb")
    assert len(run.picks) == len(run.seconds) == 24 and all(s > 0 for s in run.seconds)
    assert set(run.picks[: len(VARIANTS)]) == set(range(len(VARIANTS)))
    assert run.best == min(range(len(VARIANTS)), key=lambda i: run.variants[i].mean)
    assert 0.0 <= run.share_best_last_half <= 1.0
    ok, why = counters_status()
    assert run.counters.startswith("hardware counters" if ok else "times only") and why


def test_bad_arguments():
    arms = [VariantStats({"v": 0})]
    with pytest.raises(ValueError, match="policy"):
        VariantBandit(arms, "thompson")
    with pytest.raises(ValueError, match="variants"):
        VariantBandit([], "ucb")
    with pytest.raises(ValueError, match="epsilon"):
        VariantBandit(arms, "epsilon", epsilon=1.5)
    b = VariantBandit(arms)
    with pytest.raises(ValueError, match="seconds"):
        b.update(0, 0.0)
    with pytest.raises(ValueError, match="i: variant index"):
        b.update(3, 1.0)
    with pytest.raises(ValueError, match="batches"):
        run_batches(tunable.get("compiler.schedule"), SHAPE, VARIANTS, 0)
