"""Elastic resize without a restart (tinylearn.parallel.reshard): the pure plan, and live drills on 4 processes.

Plan (hypothesis, random sizes): every element is covered exactly once, transfers are contiguous and at most
N + N' - 1, nothing moves when N == N', and exactly the elements whose owner process changes move.

Drills (tinylearn.parallel.workers_elastic, gloo, 4 ranks: dp 4 -> 2 -> 4 with 3 Adam steps each; two launches,
each bounded by tl.dist.launch's timeout):
* after each resize the consolidated optimizer state (and the fp32 master copies of bf16 parameters) equals the
  state before, bitwise — resharding only copies;
* the whole run equals the restart path (state_dict -> new world -> load_state_dict) with the same world sizes,
  bitwise: each world sums the gradients in the same order on both paths;
* it equals one process that never resized (plain Adam, same global batch) within FP32_TOL: dp=4 and dp=2 average
  the per-rank gradients in different orders (measured ~6e-8 on parameters of size ~0.3);
* a mis-routed plan (two pieces swapped inside one new shard, same sizes) makes all three checks fail.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tinylearn as tl
from tinylearn.parallel import shard_bounds, workers_elastic
from tinylearn.parallel.reshard import Transfer, apply_plan, consolidate_bytes, plan_traffic, reshard_plan

FP32_TOL = 1e-5  # absolute, on parameters of size ~0.3 after 9 Adam steps (lr 1e-2); a mis-routed shard: ~1e-2
LAUNCH_TIMEOUT_S = 120  # per launch, after start-up (tl.dist.launch adds up to 60 s for process start)


def _owners(numel: int, world: int) -> np.ndarray:
    out = np.empty(numel, dtype=np.int64)
    for r in range(world):
        lo, hi = shard_bounds(numel, world, r)
        out[lo:hi] = r
    return out


sizes = st.tuples(st.integers(0, 3000), st.integers(1, 40), st.integers(1, 40))


@settings(max_examples=200, deadline=None)
@given(sizes)
def test_plan_covers_every_element_once_and_is_minimal(case: tuple[int, int, int]) -> None:
    numel, old, new = case
    plan = reshard_plan(numel, old, new)
    covered_src = np.zeros(numel, dtype=np.int64)
    covered_dst = np.zeros(numel, dtype=np.int64)
    pos = 0
    for t in plan:
        assert t.length > 0
        a0, a1 = shard_bounds(numel, old, t.src_rank)
        b0, b1 = shard_bounds(numel, new, t.dst_rank)
        g_src, g_dst = a0 + t.src_offset, b0 + t.dst_offset
        assert g_src == g_dst == pos  # in element order, contiguous, no gap
        assert g_src + t.length <= a1 and g_dst + t.length <= b1  # inside both shards
        covered_src[g_src : g_src + t.length] += 1
        covered_dst[g_dst : g_dst + t.length] += 1
        pos += t.length
    assert pos == numel and (covered_src == 1).all() and (covered_dst == 1).all()
    assert len(plan) <= old + new - 1
    assert len({(t.src_rank, t.dst_rank) for t in plan}) == len(plan)  # one piece per (old, new) shard pair
    traffic = plan_traffic(plan, itemsize=4)
    changed = int((_owners(numel, old) != _owners(numel, new)).sum())  # same process number = same process
    assert traffic["moved_elements"] == changed and traffic["moved_bytes"] == 4 * changed
    assert traffic["local_elements"] + changed == numel
    if old == new:
        assert traffic["moved_elements"] == 0 and traffic["messages"] == 0
        assert all(t.src_rank == t.dst_rank and t.src_offset == t.dst_offset for t in plan)
    if old >= 2:  # any consolidate-first path moves at least as much; state_dict's all-gather moves (N-1)·numel
        assert traffic["moved_bytes"] <= 4 * numel <= consolidate_bytes(numel, old, 4) or numel == 0


@settings(max_examples=100, deadline=None)
@given(sizes, st.randoms(use_true_random=False))
def test_apply_plan_equals_sharding_at_the_new_size(case: tuple[int, int, int], rnd) -> None:
    numel, old, new = case
    x = torch.arange(numel, dtype=torch.float64)
    shards = [x[slice(*shard_bounds(numel, old, r))].clone() for r in range(old)]
    got = apply_plan(shards, reshard_plan(numel, old, new), new)
    want = [x[slice(*shard_bounds(numel, new, r))] for r in range(new)]
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    # survivors chosen at random (new rank j = process news[j]): moved = elements whose owner process changes
    procs = rnd.sample(range(max(old, new) + 3), old)
    news = rnd.sample(range(max(old, new) + 3), new)
    traffic = plan_traffic(reshard_plan(numel, old, new), 1, procs, news)
    owner_old = np.array(procs)[_owners(numel, old)] if numel else np.empty(0)
    owner_new = np.array(news)[_owners(numel, new)] if numel else np.empty(0)
    assert traffic["moved_bytes"] == int((owner_old != owner_new).sum())


def test_misrouted_plan_is_caught() -> None:
    x = torch.arange(16.0)
    shards = [x[slice(*shard_bounds(16, 4, r))].clone() for r in range(4)]
    bad = workers_elastic.misrouted_plan(16, 4, 2)
    assert bad != reshard_plan(16, 4, 2) and sorted(t.length for t in bad) == [4, 4, 4, 4]
    got = apply_plan(shards, bad, 2)
    assert [g.numel() for g in got] == [8, 8] and not torch.equal(torch.cat(got), x)  # same sizes, wrong places


def test_survivor_choice_changes_the_bytes() -> None:
    # 4 -> 2 over 16 elements: keeping processes 0 and 2 keeps their own quarters, keeping 0 and 1 only one quarter
    plan = reshard_plan(16, 4, 2)
    assert plan_traffic(plan, 4, [0, 1, 2, 3], [0, 2])["moved_elements"] == 8
    assert plan_traffic(plan, 4, [0, 1, 2, 3], [0, 1])["moved_elements"] == 12


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="numel: must be >= 0, got -1"):
        reshard_plan(-1, 4, 2)
    with pytest.raises(ValueError, match="old_world: must be >= 1, got 0"):
        reshard_plan(8, 0, 2)
    with pytest.raises(TypeError, match="new_world: expected an int, got float 2.0"):
        reshard_plan(8, 4, 2.0)
    with pytest.raises(TypeError, match="numel: expected an int, got bool"):
        reshard_plan(True, 4, 2)
    with pytest.raises(TypeError, match=r"plan\[0\]: expected a Transfer"):
        plan_traffic([(0, 0, 0, 0, 4)])
    with pytest.raises(ValueError, match="old_ranks: process ids must be distinct"):
        plan_traffic(reshard_plan(8, 2, 2), 4, [1, 1], [0, 1])
    with pytest.raises(ValueError, match="old_ranks/new_ranks: the plan uses 2 old"):
        plan_traffic(reshard_plan(8, 2, 2), 4, [0], [0, 1])
    with pytest.raises(TypeError, match="new_ranks: expected a sequence"):
        plan_traffic(reshard_plan(8, 2, 2), 4, [0, 1], "01")
    with pytest.raises(ValueError, match="itemsize: must be >= 1"):
        plan_traffic([], 0)
    with pytest.raises(TypeError, match=r"shards\[1\]: expected a 1-D"):
        apply_plan([torch.zeros(2), torch.zeros(2, 2)], [], 2)
    with pytest.raises(ValueError, match=r"plan\[0\]: ranks out of range"):
        apply_plan([torch.zeros(4)], [Transfer(0, 3, 0, 0, 4)], 2)
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        from tinylearn.parallel.reshard import reshard_zero

        reshard_zero(None, lambda g: None, [0], [0])


# ------------------------------------------------------------------------------------------- live drills
@pytest.fixture(scope="module")
def drill() -> dict:
    res = tl.dist.launch(workers_elastic.elastic_checks, 4, timeout_s=LAUNCH_TIMEOUT_S)
    assert all(r == res[0] for r in res)  # one summary, the same on every rank
    return res[0]


@pytest.fixture(scope="module")
def variants() -> dict:
    return tl.dist.launch(workers_elastic.elastic_variants, 4, timeout_s=LAUNCH_TIMEOUT_S)[0]


def _check_live(out: dict, joiner_bytes: int) -> None:
    assert out["steps_per_world"] == [(4, 3), (2, 3), (4, 3)]
    shrink, grow = out["resizes"]
    assert (shrink["from"], shrink["to"], grow["to"]) == ([0, 1, 2, 3], [0, 2], [0, 1, 2, 3])
    for rz in (shrink, grow):
        assert rz["state_equal"]  # consolidated state after == before, bitwise
        assert rz["sent_bytes"] == rz["received_bytes"] == rz["plan_state_bytes"] + rz["plan_param_bytes"]
        assert rz["messages_sent"] == rz["plan_messages"]  # one message per (sender, receiver) pair
        assert rz["plan_state_bytes"] < rz["consolidate_state_bytes"]
        assert rz["plan_state_bytes"] <= rz["state_bytes"]  # every element moves at most once
    # keeping processes 0 and 2 (not 0 and 1) keeps more state in place; only joiners receive parameters
    assert shrink["plan_state_bytes"] < shrink["first_ranks_plan_state_bytes"]
    assert grow["plan_param_bytes"] == joiner_bytes and shrink["plan_param_bytes"] == 0
    assert out["restart_params_bitwise"] and out["restart_state_bitwise"]


def test_live_shrink_and_grow_fp32_stage1(drill: dict) -> None:
    numel = sum(a * b + b for a, b in [(8, 32), (32, 32), (32, 4)])
    _check_live(drill, joiner_bytes=2 * numel * 4)
    assert drill["stage"] == 1 and drill["fp32_maxdiff"] < FP32_TOL
    shrink, grow = drill["resizes"]
    # sizes divide by 4: 4 -> 2 keeping processes 0, 2 moves half the state (0, 1 would move 3/4); 2 -> 4 half
    assert shrink["plan_state_bytes"] * 2 == shrink["state_bytes"] == shrink["first_ranks_plan_state_bytes"] * 4 // 3
    assert grow["plan_state_bytes"] * 2 == grow["state_bytes"]
    assert shrink["grad_shard_elems"] == sum(-(-n // 2) for n in (256, 32, 1024, 32, 128, 4))  # new per-rank layout
    assert grow["grad_shard_elems"] == sum(-(-n // 4) for n in (256, 32, 1024, 32, 128, 4))


def test_live_shrink_and_grow_bf16_stage2_padded(variants: dict) -> None:
    out = variants["bf16_stage2"]
    numel = sum(a * b + b for a, b in [(6, 30), (30, 30), (30, 3)])
    assert out["stage"] == 2 and out["dtype"] == "bfloat16"
    _check_live(out, joiner_bytes=2 * numel * 2)


def test_misrouted_plan_fails_every_check(variants: dict) -> None:
    out = variants["misrouted"]
    (rz,) = out["resizes"]
    assert rz["sent_bytes"] == rz["plan_state_bytes"]  # same traffic as the right plan ...
    assert not rz["state_equal"] and not out["restart_params_bitwise"] and not out["restart_state_bitwise"]
    assert out["fp32_maxdiff"] > 100 * FP32_TOL  # ... and training drifts far beyond rounding


def test_reshard_zero_bad_inputs(drill: dict) -> None:
    msgs = drill["bad_inputs"]
    assert msgs["stage3"].startswith("ValueError: opt: live resharding supports ZeRO stages 1 and 2, got stage 3")
    assert msgs["joiner_with_opt"].startswith("TypeError: opt: process 0 joins")
    assert msgs["old_ranks_mismatch"].startswith("ValueError: old_ranks: [3, 2, 1, 0] differs")
    assert msgs["not_a_member"].startswith("ValueError: old_ranks/new_ranks: this process (rank 0) is in neither")
    assert msgs["duplicate_ranks"] == "ValueError: new_ranks: process ids must be distinct, got [0, 0]"
    assert msgs["timeout"].startswith("ValueError: timeout_s: expected a positive number of seconds, got -1")
    assert msgs["build"].startswith("TypeError: build: expected a callable")
    assert msgs["plan_float"] == "TypeError: new_world: expected an int, got float 2.0"


def test_hung_peer_fails_within_the_timeout() -> None:
    # rank 1 hangs instead of resizing: rank 0 must fail after ~timeout_s naming rank 1, not wait for the launcher
    with pytest.raises(RuntimeError) as ei:
        tl.dist.launch(workers_elastic.hang_drill, 2, 3.0, timeout_s=LAUNCH_TIMEOUT_S)
    msg = str(ei.value)
    assert msg.startswith("rank 0 raised RuntimeError: after ") and "rank 1" in msg and "timed out" in msg, msg
    waited = float(msg.split("after ", 1)[1].split(" s:", 1)[0])
    assert 2.5 <= waited < 30.0, msg  # the 3 s bound, with room for a loaded machine


def test_bf16_checkpoint_keeps_the_fp32_master_copies() -> None:
    """ZeroOptimizer.state_dict() carries the fp32 masters of 16-bit parameters (``master_params``): a resume is
    bitwise, next step included, at every stage; a plain state without masters takes them from the loaded weights."""
    for r in tl.dist.launch(workers_elastic.mixed_checkpoint_check, 2, timeout_s=120):
        for stage in (1, 2, 3):
            assert r[f"stage{stage}_has_masters"], r
            assert r[f"stage{stage}_plain_masters_from_weights"], r
            assert r[f"stage{stage}_masters_bitwise"], r
            assert r[f"stage{stage}_next_step_bitwise"], r
