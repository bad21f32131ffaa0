"""Hardening of tl.parallel (issue 38): cross-rank handshakes and fault drills on real processes, plan_3d over
divisors.

Fault drills (tinylearn.parallel.fault_drills, 2 ranks, gloo on 127.0.0.1): every feature (ZeRO 1/2/3, a
tensor-parallel layer, the pipeline runner) first meets rank-dependent arguments (each must raise ValueError on
every rank, naming the first difference and each rank's value, and leave the group usable), then takes one healthy
step; rank 1 then raises mid-run (one launch) or hangs (another), and rank 0 must fail on every feature, naming
rank 1 and the cause, within the bound: at once for a dead peer, after the group timeout for a hung one. Both
launches are bounded by tl.dist.launch's timeout (the job is stopped and the test fails instead of hanging).
"""

from __future__ import annotations

import itertools
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import tinylearn as tl
from tinylearn.parallel import fault_drills
from tinylearn.parallel.divisors import divisors, factorize

FEATURES = ("zero1", "zero2", "zero3", "tp", "pipeline")
GROUP_TIMEOUT_S = 4.0
LAUNCH_TIMEOUT_S = 90  # start-up on a loaded box (every rank imports torch._dynamo for torch.optim) included


def _drill(out: Path, action: str, with_mismatch: bool = False) -> dict[str, Any]:
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as ei:  # the victim (raise) or the survivor (hang) fails the job
        tl.dist.launch(
            fault_drills.fault,
            2,
            action,
            str(out),
            FEATURES,
            1,
            GROUP_TIMEOUT_S,
            3,
            with_mismatch,
            timeout_s=LAUNCH_TIMEOUT_S,
        )
    return {
        "error": str(ei.value),
        "wall_s": time.monotonic() - t0,
        "reports": {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob("rank*.json")},
        "mismatch": {int(p.stem[13:]): json.loads(p.read_text()) for p in out.glob("mismatch_rank*.json")},
    }


@pytest.fixture(scope="module")
def died(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _drill(tmp_path_factory.mktemp("raise"), "raise", with_mismatch=True)


@pytest.fixture(scope="module")
def hung(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _drill(tmp_path_factory.mktemp("hang"), "hang")


# case -> fragments the message must hold on every rank (besides "ValueError: " and, where the ranks
# communicated, both ranks' names)
MISMATCH = {
    "zero1_shape": ("params[0].shape[0]", "has 8", "has 9"),
    "zero2_frozen": ("params[3].requires_grad", "has True", "has False"),
    "zero3_count": ("number of parameters", "has 4", "has 6"),
    "zero1_dtype": ("params[0].dtype", "torch.float32", "torch.float64"),
    "zero2_bucket_cap": ("bucket_cap_bytes", "has 1024", "has 2048"),
    "tp_column_batch": ("input.shape[0] (the batch)", "has 2", "has 3", "ColumnParallelLinear"),
    "tp_row_batch": ("input.shape[0] (the batch)", "has 2", "has 3", "RowParallelLinear"),
    "tp_mlp_seq": ("input.shape[1]", "has 3", "has 4", "ParallelMLP"),
    "pipeline_schedule": ("schedule", "has '1f1b'", "has 'gpipe'"),
    "pipeline_microbatches": ("n_microbatches", "has 2", "has 4"),
}


def test_mismatched_ranks_raise_value_error_on_every_rank(died: dict[str, Any]) -> None:
    assert sorted(died["mismatch"]) == [0, 1]  # both ranks got through every case
    for rank, msgs in died["mismatch"].items():
        assert msgs.pop("group_usable") is True, rank  # same number of collectives on both ranks
        assert set(msgs) == set(MISMATCH) | {"zero3_duplicate"}
        for case, frags in MISMATCH.items():
            msg = msgs[case]
            assert msg.startswith("ValueError: ") and "mismatch across ranks" in msg, (rank, case, msg)
            for frag in (*frags, "rank 0 (group rank 0) has", "rank 1 (group rank 1) has", f"raised on rank {rank}"):
                assert frag in msg, (rank, case, frag, msg)
        dup = msgs["zero3_duplicate"]  # refused locally, before any collective
        assert dup.startswith("ValueError: params[1]: the same tensor as params[0]"), dup


def test_rank_that_dies_mid_run_fails_its_peers_at_once(died: dict[str, Any]) -> None:
    assert died["error"].startswith("rank 1 raised RuntimeError: deliberate failure of rank 1"), died["error"][:300]
    assert sorted(died["reports"]) == [0]  # the victim died before writing a report
    survivor = died["reports"][0]
    assert set(survivor) == set(FEATURES)
    for feature, rep in survivor.items():
        err = rep["error"]
        assert err is not None and err.startswith("RuntimeError: "), (feature, err)
        assert "rank 1" in err and "connection closed (the peer died or raised)" in err, (feature, err)
        assert rep["elapsed_s"] < GROUP_TIMEOUT_S, (feature, rep)  # detected, not timed out
    assert died["wall_s"] < LAUNCH_TIMEOUT_S


def test_rank_that_hangs_times_out_its_peers_within_the_group_timeout(hung: dict[str, Any]) -> None:
    head = hung["error"].splitlines()[0]
    assert head.startswith("rank 0 raised RuntimeError: rank 0: features") and "peer rank 1 did 'hang'" in head, head
    assert sorted(hung["reports"]) == [0]
    for feature, rep in hung["reports"][0].items():
        err = rep["error"]
        assert err is not None and "rank 1" in err and "timed out (the peer is hung" in err, (feature, err)
        assert GROUP_TIMEOUT_S - 0.5 <= rep["elapsed_s"] <= GROUP_TIMEOUT_S + 10, (feature, rep)
    assert hung["wall_s"] < LAUNCH_TIMEOUT_S


def test_zero_refuses_a_parameter_listed_twice_before_communicating() -> None:
    w, b = torch.nn.Parameter(torch.ones(3, 2)), torch.nn.Parameter(torch.ones(3))
    for stage in (1, 2, 3):  # no process group needed: refused before any collective
        with pytest.raises(ValueError, match=r"params\[2\]: the same tensor as params\[0\] \(shape \(3, 2\)\)"):
            tl.parallel.ZeroOptimizer([w, b, w], torch.optim.SGD, stage=stage, lr=0.1)
    with pytest.raises(ValueError, match="bucket_cap_bytes"):
        tl.parallel.ZeroOptimizer([w], torch.optim.SGD, stage=2, bucket_cap_bytes=0, lr=0.1)


# ------------------------------------------------------------------------------------------- plan_3d / divisors
def test_factorize_and_divisors_match_brute_force() -> None:
    for n in range(1, 400):
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0], n
    rng = np.random.default_rng(0)
    for n in [int(x) for x in rng.integers(1, 10**12, 50)] + [2**61 - 1, (2**31 - 1) * 999_983, 10**18 + 9]:
        f = factorize(n)
        assert math.prod(p**e for p, e in f.items()) == n
        assert all(len(divisors(p)) == 2 for p in f if p < 10**7)  # the factors found are primes
    assert divisors(10**9) == sorted(2**a * 5**b for a in range(10) for b in range(10))
    with pytest.raises(ValueError, match="n"):
        factorize(0)
    with pytest.raises(TypeError, match="n"):
        factorize(2.0)


def _plan_brute_force(world: int, hidden: int, n_layers: int, global_batch: int) -> set[tuple[int, int, int]]:
    return {
        (world // (tp * pp), tp, pp)
        for tp, pp in itertools.product(range(1, world + 1), repeat=2)
        if world % (tp * pp) == 0 and hidden % tp == 0 and pp <= n_layers and global_batch % (world // (tp * pp)) == 0
    }


def test_plan_3d_enumerates_every_divisor_configuration() -> None:
    for world in (1, 2, 6, 12, 16, 30, 36, 48):
        got = tl.parallel.plan_3d(world, 10**6, 6, 12, 16, 48, 1e30)
        assert {(p.dp, p.tp, p.pp) for p in got} == _plan_brute_force(world, 12, 6, 48), world


def test_plan_3d_huge_world_sizes_are_fast() -> None:
    t0 = time.perf_counter()
    big = tl.parallel.plan_3d(10**9, 7 * 10**12, 64, 2**14, 2048, 5 * 10**8, 1e30)
    prime = tl.parallel.plan_3d(2**61 - 1, 7 * 10**12, 64, 4096, 2048, 2**61 - 1, 1e30)
    assert time.perf_counter() - t0 < 5  # the integer loop ran for minutes
    assert {(p.dp, p.tp, p.pp) for p in big} == _plan_divisor_reference(10**9, 2**14, 64, 5 * 10**8)
    assert [(p.dp, p.tp, p.pp) for p in prime] == [(2**61 - 1, 1, 1)]  # a prime world: pure data parallel


def _plan_divisor_reference(world: int, hidden: int, n_layers: int, global_batch: int) -> set[tuple[int, int, int]]:
    ds = [d for d in range(1, 10**5) if world % d == 0] + [world // d for d in range(1, 10**5) if world % d == 0]
    ds = sorted(set(ds))  # complete for world <= 10**10
    return {
        (world // (tp * pp), tp, pp)
        for tp in ds
        for pp in ds
        if world % (tp * pp) == 0 and hidden % tp == 0 and pp <= n_layers and global_batch % (world // (tp * pp)) == 0
    }


@pytest.mark.parametrize("bad", [0, -8, 2**64])
def test_plan_3d_world_size_out_of_range(bad: int) -> None:
    with pytest.raises(ValueError, match=f"world_size: expected an int .*got {bad}"):
        tl.parallel.plan_3d(bad, 10**9, 24, 2048, 1024, 64, 80e9)


@pytest.mark.parametrize("bad", [8.0, True, "8", None])
def test_plan_3d_world_size_not_an_int(bad: Any) -> None:
    with pytest.raises(TypeError, match="world_size: expected an int"):
        tl.parallel.plan_3d(bad, 10**9, 24, 2048, 1024, 64, 80e9)


def test_plan_3d_accepts_numpy_integers() -> None:
    ref = tl.parallel.plan_3d(64, 7 * 10**9, 32, 4096, 2048, 512, 80e9)
    assert tl.parallel.plan_3d(np.int64(64), np.int64(7 * 10**9), 32, np.int32(4096), 2048, 512, 80e9) == ref


def test_zero_check_order_off_gives_the_same_result_and_must_agree_across_ranks() -> None:
    """check_order=False drops ZeRO-2/3's per-bucket order all-reduce: the same parameters bitwise; ranks that
    disagree on it are refused at construction on every rank."""
    for r in tl.dist.launch(fault_drills.check_order_drill, 2, timeout_s=90):
        assert r["stage2_same"] and r["stage3_same"], r
        assert "check_order" in r["mismatch"] and "rank 0" in r["mismatch"], r["mismatch"]
