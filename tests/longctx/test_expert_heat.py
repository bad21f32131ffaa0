"""Expert heat (Q142b): the EMA heat and the threshold + hysteresis controller (single process, exact numbers), and on
real processes (tl.dist.launch, gloo, 2 ranks): the expert-parallel forward's bytes equal ``ep_forward_bytes``
exactly (forward and backward), ``swap_experts`` (migration) keeps outputs and accumulated gradients equal to the
dense layer, and on a skewed drifting stream the controller lowers the max rank load with fewer weight moves than a
per-step (no EMA, no hysteresis) controller."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import tinylearn as tl
from tinylearn.parallel import expert_heat_workers as W
from tinylearn.parallel.expert_heat import ExpertHeat, ep_forward_bytes, expert_bytes, stream_imbalance
from tinylearn.parallel.moe_parallel import plan_replication

WORLD, E = 2, 8
RTOL, ATOL = 1e-5, 1e-5
SCHEDULE = [1] * 12 + [6] * 12 + [int(v) for v in np.random.default_rng(5).choice([1, 6], 16)]
POLICIES: dict[str, Any] = {
    "static": None,
    "per-step": {"alpha": 1.0, "high": 1.2, "low": 1.19, "cooldown": 0, "min_gain": 0.0},
    "heat": {"alpha": 0.3, "high": 1.3, "low": 1.1, "cooldown": 3},
}
CALLS = [
    ("ep_traffic", {"seed": 0, "experts": E, "tokens_per_rank": 64}),
    ("ep_traffic", {"seed": 1, "experts": 4, "tokens_per_rank": 40, "top_k": 2, "dropless": False, "cf": 1.0}),
    ("swap_check", {"seed": 3, "experts": E, "tokens_per_rank": 48, "slot_a": 1, "slot_b": 6}),
    ("heat_stream", {"seed": 2, "experts": E, "tokens_per_rank": 128, "schedule": SCHEDULE, "skew": 1.5,
                     "policies": POLICIES}),
]  # fmt: skip


# ------------------------------------------------------------------------------------------- the controller alone
def test_heat_is_an_ema_of_hits_mapped_to_logical_experts() -> None:
    c = ExpertHeat(4, 2, alpha=0.25)
    np.testing.assert_array_equal(c.update([4, 0, 8, 0]), [4, 0, 8, 0])  # first step: the hits themselves
    np.testing.assert_allclose(c.update([0, 4, 0, 0]), [3, 1, 6, 0])
    c.placement[[0, 2]] = c.placement[[2, 0]]  # logical 0 now lives in slot 2, logical 2 in slot 0
    np.testing.assert_allclose(c.update([8, 0, 0, 0]), [0.75 * 3, 0.75, 0.75 * 6 + 2, 0])
    np.testing.assert_array_equal(c.slot_expert(), [2, 1, 0, 3])


def test_a_one_step_spike_moves_nothing_but_a_per_step_controller_reacts() -> None:
    calm, spike = [10] * 8, [60, 10, 10, 10, 10, 10, 10, 10]
    ema = ExpertHeat(E, WORLD, alpha=0.3, high=1.3, low=1.1)
    naive = ExpertHeat(E, WORLD, alpha=1.0, high=1.2, low=1.19, cooldown=0, min_gain=0.0)
    for c in (ema, naive):
        for _ in range(5):
            c.update(calm)
            assert c.decide().action == "none"
        c.update(spike)
    d_ema, d_naive = ema.decide(), naive.decide()
    assert d_ema.action == "none" and d_ema.imbalance == pytest.approx(55 / 47.5)  # heat of expert 0: 10 + 0.3 * 50
    assert d_naive.action == "replicate" and d_naive.imbalance == pytest.approx(90 / 65)
    assert (d_naive.expert, d_naive.host) == (0, 1) and d_naive.predicted == pytest.approx(70 / 65)


def test_persistent_hot_expert_is_replicated_as_plan_replication_says_then_released_with_hysteresis() -> None:
    c = ExpertHeat(E, WORLD, alpha=0.5, high=1.3, low=1.1, cooldown=2)
    hot = [10, 10, 90, 10, 10, 10, 10, 10]
    c.update(hot)
    d = c.decide()
    assert d.action == "replicate" and (d.expert, d.host) == plan_replication(hot, WORLD)
    assert d.imbalance == pytest.approx(120 / 80) and d.predicted == pytest.approx(1 + 5 / 80)
    assert c.replica == (2, 1) and c.history == [d]
    # the load cools to inside the band (1.1 < I_without_replica <= 1.3): the replica stays
    for _ in range(3):
        c.update([10, 10, 26, 10, 10, 10, 10, 10])
    band = c.imbalance(replica=None)
    assert 1.1 < band <= 1.3 and c.decide().action == "none"
    for _ in range(8):
        c.update([10] * 8)
    d = c.decide()
    assert d.action == "release" and c.replica is None and d.predicted <= 1.1


def test_two_hot_experts_on_one_rank_are_split_by_a_migration_and_cooldown_holds() -> None:
    c = ExpertHeat(E, WORLD, alpha=1.0, high=1.3, low=1.1, cooldown=3)
    hits = [100, 100, 10, 10, 10, 10, 10, 10]
    c.update(hits)
    d = c.decide()
    assert d.action == "migrate" and d.moved_experts == 2  # one replica could only halve one of them
    assert d.imbalance == pytest.approx(220 / 130) and d.predicted == pytest.approx(1.0)
    assert d.expert in (0, 1) and d.slots == (d.expert, int(c.placement[d.expert])) and d.slots[1] >= 4
    assert sorted(c.placement.tolist()) == list(range(E)) and c.placement[d.expert] >= 4
    assert c.rank_load().tolist() == [130.0, 130.0]
    c.update([100, 10, 100, 10, 10, 10, 10, 10])  # a new hot expert right away: inside the cooldown
    d2 = c.decide()
    assert d2.action == "none" and "cooldown" in d2.reason


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="world_size"):
        ExpertHeat(6, 4)
    with pytest.raises(ValueError, match="high"):
        ExpertHeat(4, 2, high=1.1, low=1.2)
    with pytest.raises(ValueError, match="alpha"):
        ExpertHeat(4, 2, alpha=0.0)
    with pytest.raises(ValueError, match="actions"):
        ExpertHeat(4, 2, actions=("shard",))
    with pytest.raises(ValueError, match="hits_per_slot"):
        ExpertHeat(4, 2).update([1, 2, -3, 4])
    with pytest.raises(ValueError, match="rows"):
        ep_forward_bytes([[1, 2, 3]], 8, 4)
    with pytest.raises(ValueError, match="num_experts"):
        ep_forward_bytes([[1, 2], [3, 4]], 8, 3)


# --------------------------------------------------------------------------------------------- real processes
@pytest.fixture(scope="module")
def results() -> list[list[Any]]:
    per_rank = tl.dist.launch(W.run_many, WORLD, CALLS, timeout_s=90)
    return [[per_rank[r][i] for r in range(WORLD)] for i in range(len(CALLS))]


@pytest.mark.parametrize("i", [0, 1])
def test_ep_bytes_formula_equals_measured_and_outputs_equal_dense(results: list, i: int) -> None:
    kw, ranks = CALLS[i][1], results[i]
    top_k, dropless, cf = kw.get("top_k", 1), kw.get("dropless", True), kw.get("cf", 1.25)
    rows = np.array([rk["rows"] for rk in ranks])
    assert rows[0, 1] > 0 and rows[1, 0] > 0
    np.testing.assert_array_equal([rk["fwd_bytes"] for rk in ranks], ep_forward_bytes(rows, W.D_MODEL, kw["experts"]))
    bwd = ep_forward_bytes(rows, W.D_MODEL, kw["experts"], backward=True) - ep_forward_bytes(
        rows, W.D_MODEL, kw["experts"]
    )
    np.testing.assert_array_equal([rk["bwd_bytes"] for rk in ranks], bwd)
    # the same layer in one process (capacity: routed per rank's batch, as the EP layer does)
    dense = W.build_dense(kw["seed"], kw["experts"], top_k, dropless, cf)
    n = kw["tokens_per_rank"]
    x = W.make_x(kw["seed"] + 1, n * WORLD, dense, hot=0, skew=1.0)
    r = W.make_x(kw["seed"] + 2, n * WORLD, dense)
    parts = [slice(0, n * WORLD)] if dropless else [slice(k * n, (k + 1) * n) for k in range(WORLD)]
    ys = []
    for sl in parts:
        y = dense(x[sl])
        (y * r[sl]).sum().backward()
        ys.append(y.detach())
    np.testing.assert_allclose(np.concatenate([rk["y"] for rk in ranks]), torch.cat(ys).numpy(), rtol=RTOL, atol=ATOL)
    per = kw["experts"] // WORLD
    for k, rk in enumerate(ranks):
        for name in ("w1", "b1", "w2", "b2"):
            want = getattr(dense, name).grad[k * per : (k + 1) * per].numpy()
            np.testing.assert_allclose(rk["grads"][name], want, rtol=RTOL, atol=ATOL)


def test_swap_experts_keeps_outputs_and_accumulated_gradients(results: list) -> None:
    kw, ranks = CALLS[2][1], results[2]
    a, b, n = kw["slot_a"], kw["slot_b"], kw["tokens_per_rank"]
    dense = W.build_dense(kw["seed"], E, top_k=2)
    xs = [W.make_x(kw["seed"] + 10 + i, n * WORLD, dense, hot=i, skew=1.5) for i in range(3)]
    rs = [W.make_x(kw["seed"] + 20 + i, n * WORLD, dense) for i in range(2)]
    (dense(xs[0]) * rs[0]).sum().backward()
    y1 = dense(xs[1])
    (y1 * rs[1]).sum().backward()
    with torch.no_grad():
        y2 = dense(xs[2])
    np.testing.assert_allclose(np.concatenate([rk["y1"] for rk in ranks]), y1.detach().numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(np.concatenate([rk["y2"] for rk in ranks]), y2.numpy(), rtol=RTOL, atol=ATOL)
    logical = list(range(E))
    logical[a], logical[b] = b, a  # slot -> logical expert after the swap
    per = E // WORLD
    router = sum(rk["grads"]["router_weight"] for rk in ranks)
    np.testing.assert_allclose(router, dense.router_weight.grad[logical].numpy(), rtol=RTOL, atol=ATOL)
    for k, rk in enumerate(ranks):
        for name in ("w1", "b1", "w2", "b2"):
            want = getattr(dense, name).grad[logical[k * per : (k + 1) * per]].numpy()
            np.testing.assert_allclose(rk["grads"][name], want, rtol=RTOL, atol=ATOL, err_msg=f"rank {k} {name}")
    # weights and accumulated gradients of one expert each way (the config check is an all-reduce: not metered)
    eb = expert_bytes(W.D_MODEL, W.D_FF)
    assert [rk["swap_bytes"] for rk in ranks] == [2 * eb, 2 * eb]
    before, after = ranks[0]["before"], ranks[0]["after"]
    assert max(after["rank_load"]) < max(before["rank_load"])  # the replica through ExpertHeat.apply
    for rk in ranks:  # release_replica through ExpertHeat.apply: no replica, same outputs
        assert rk["released"][0]
        np.testing.assert_allclose(rk["released"][1], rk["y2"], rtol=RTOL, atol=ATOL)
        assert "slot_b" in rk["same_rank_error"] and "both on rank 0" in rk["same_rank_error"]


def test_heat_controller_lowers_the_max_rank_load_with_few_moves(results: list) -> None:
    st = results[3][0]
    for name in POLICIES:  # gathered stats and decisions are the same on both ranks
        assert st[name]["rank_load"] == results[3][1][name]["rank_load"]
        assert st[name]["decisions"] == results[3][1][name]["decisions"]
    tokens = WORLD * CALLS[3][1]["tokens_per_rank"]
    summary = {}
    for name, rec in st.items():
        assert all(sum(load) == tokens for load in rec["rank_load"])  # top-1 dropless: every token processed
        assert sorted(rec["placement"]) == list(range(E))
        summary[name] = {
            "mean_max_load": float(np.mean([max(lo) for lo in rec["rank_load"]])),
            "mean_imbalance": float(np.mean(stream_imbalance(rec["rank_load"]))),
            "changes": len(rec["decisions"]),
            "moved_bytes": sum(rec["moved_bytes"]),
            "a2a_bytes": sum(rec["a2a_bytes"]),
        }
    print(summary)
    static, naive, heat = summary["static"], summary["per-step"], summary["heat"]
    assert static["mean_imbalance"] > 1.35  # the stream really is skewed
    assert heat["mean_max_load"] < 0.93 * static["mean_max_load"]
    assert heat["changes"] < naive["changes"]
    # bytes moved by the decisions, both ranks: at least one expert per replica, two per migration
    eb = expert_bytes(W.D_MODEL, W.D_FF)
    moved = {n: sum(sum(results[3][r][n]["moved_bytes"]) for r in range(WORLD)) for n in ("per-step", "heat")}
    for n in moved:
        acts = [d[1] for d in st[n]["decisions"]]
        assert moved[n] >= eb * (acts.count("replicate") + 2 * acts.count("migrate")), (n, moved[n], acts)
    assert moved["heat"] < moved["per-step"], moved
