"""tl.dist collectives and launch on real processes (gloo over 127.0.0.1), checked against dist.all_reduce.

Process start-up is the expensive part on a 2-core box, so each world size runs the whole correctness grid in
one launched job (tinylearn.dist.workers.check_grid) and the test asserts on the returned failure list.
"""

from __future__ import annotations

import os
import time

import pytest
import torch

import tinylearn as tl
from tinylearn.dist import ddp, workers
from tinylearn.dist.compression import Int8, TopK, compressed_all_reduce, error_feedback_step, topk_error_feedback


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_grid_matches_torch_all_reduce(world_size: int) -> None:
    results = tl.dist.launch(workers.check_grid, world_size, 0, timeout_s=240)
    assert len(results) == world_size
    for rank, res in enumerate(results):
        assert res["cases"] > 250
        assert res["failures"] == [], f"rank {rank}: {res['failures'][:10]}"


def test_launch_returns_rank_values_and_env() -> None:
    out = tl.dist.launch(workers.rank_info, 3, "a", 7, timeout_s=60)
    assert [o["rank"] for o in out] == [0, 1, 2]
    assert all(o["world_size"] == 3 and o["args"] == ("a", 7) for o in out)
    assert all(o["env"]["RANK"] == str(i) and o["env"]["MASTER_ADDR"] == "127.0.0.1" for i, o in enumerate(out))
    assert len({o["pid"] for o in out}) == 3 and os.getpid() not in {o["pid"] for o in out}


def _no_children_left() -> bool:
    import multiprocessing as mp

    return all(not p.name.startswith("tinylearn-rank") for p in mp.active_children())


def test_failing_rank_is_reraised_with_rank_and_traceback() -> None:
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="rank 1") as ei:
        tl.dist.launch(workers.raise_on, 3, 1, timeout_s=30)
    assert "deliberate failure on rank 1" in str(ei.value)
    assert "Traceback" in str(ei.value) and "raise_on" in str(ei.value)
    assert ei.value.rank == 1
    assert time.monotonic() - t0 < 25
    assert _no_children_left()


def test_rank_that_exits_is_reported_and_nobody_hangs() -> None:
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank 0 .*exited with code 3"):
        tl.dist.launch(workers.exit_on, 2, 0, 3, timeout_s=30)
    assert time.monotonic() - t0 < 25
    assert _no_children_left()


def test_stuck_rank_times_out() -> None:
    t0 = time.monotonic()
    with pytest.raises((TimeoutError, RuntimeError)):
        tl.dist.launch(workers.hang_on, 2, 1, timeout_s=4)
    assert time.monotonic() - t0 < 15
    assert _no_children_left()


def _local_fn() -> int:
    return 1


def test_launch_bad_arguments() -> None:
    with pytest.raises(ValueError, match="world_size"):
        tl.dist.launch(workers.rank_info, 0)
    with pytest.raises(ValueError, match="timeout_s"):
        tl.dist.launch(workers.rank_info, 2, timeout_s=0)
    with pytest.raises(TypeError, match="picklable"):
        tl.dist.launch(lambda: 1, 2)
    with pytest.raises(TypeError, match="fn"):
        tl.dist.launch(3, 2)


def test_bad_algorithm_and_op_raise_value_error_before_communicating() -> None:
    x = torch.ones(3)
    with pytest.raises(ValueError, match="algorithm"):
        tl.dist.all_reduce(x, algorithm="butterfly")
    with pytest.raises(ValueError, match="op"):
        tl.dist.all_reduce(x, op="prod")
    with pytest.raises(TypeError, match="avg"):
        tl.dist.all_reduce(torch.ones(3, dtype=torch.int32), op="avg")
    with pytest.raises(TypeError, match="torch.Tensor"):
        tl.dist.all_reduce([1.0, 2.0])
    with pytest.raises(RuntimeError, match="not initialized"):
        tl.dist.all_reduce(x)


def test_ring_schedule_invariants() -> None:
    for p in (2, 3, 5, 8):
        for r in range(p):
            for s in range(2 * (p - 1)):
                send, recv = tl.dist.ring_schedule(r, s, p)
                # what I receive is what my left neighbour sends
                assert recv == tl.dist.ring_schedule((r - 1) % p, s, p)[0]
                if s + 1 < 2 * (p - 1):  # forwarded next step
                    assert tl.dist.ring_schedule(r, s + 1, p)[0] == recv
        # after reduce-scatter rank r owns chunk r+1: it received it last
        assert all(tl.dist.ring_schedule(r, p - 2, p)[1] == (r + 1) % p for r in range(p))
    with pytest.raises(ValueError, match="step"):
        tl.dist.ring_schedule(0, 6, 4)


def test_ddp_matches_single_process_and_compression() -> None:
    data = ddp.digits_data()
    ref = ddp.train_digits(steps=25, data=data)
    for world, alg, overlap in ((2, "ring", True), (3, "hierarchical", False)):
        res = tl.dist.launch(
            ddp.train_digits, world, 25, 96, 0.05, alg, 16 << 10, overlap, None, 0.05, 0, 128, data, timeout_s=120
        )
        for r in res:
            diff = max(abs(a - b) for a, b in zip(r["losses"], ref["losses"]))
            assert diff < 1e-4, (world, alg, diff)
        assert len(res[0]["buckets"]) > 1  # the small cap really produced several buckets
    # compressed: converges (loss falls) and sends fewer bytes than the dense ring
    res = tl.dist.launch(
        ddp.train_digits, 2, 25, 96, 0.05, "ring", 16 << 10, True, "topk", 0.05, 0, 128, data, timeout_s=120
    )
    n_params = sum(p.numel() for p in ddp.digits_model().parameters())
    dense_bytes = 25 * tl.dist.compression.dense_ring_bytes(n_params, 2)
    assert res[0]["bytes_sent"] < 0.2 * dense_bytes
    assert res[0]["losses"][-1] < res[0]["losses"][0] - 0.1


def test_assign_buckets() -> None:
    assert ddp.assign_buckets([10, 20, 30, 40], 50) == [[3], [2, 1], [0]]
    assert ddp.assign_buckets([100, 1, 1], 50) == [[2, 1], [0]]
    assert ddp.assign_buckets([], 10) == []
    with pytest.raises(ValueError, match="cap_bytes"):
        ddp.assign_buckets([1], 0)


def test_compressors_and_error_feedback() -> None:
    g = torch.tensor([0.1, -3.0, 0.5, 2.0, -0.2])
    res = torch.zeros(5)
    idx, vals, new = topk_error_feedback(g, res, 2)
    assert sorted(idx.tolist()) == [1, 3] and sorted(vals.tolist()) == [-3.0, 2.0]
    assert torch.equal(new, torch.tensor([0.1, 0.0, 0.5, 0.0, -0.2]))
    # error feedback: what was dropped comes back next step
    idx2, vals2, _ = topk_error_feedback(torch.zeros(5), new, 1)
    assert idx2.tolist() == [2] and vals2.tolist() == [0.5]
    # D(C(v)) + residual == v exactly for top-k
    torch.manual_seed(0)
    v = torch.randn(1000)
    for comp in (TopK(0.1), Int8(stochastic=True), Int8(stochastic=False)):
        payload, local, r = error_feedback_step(comp, v, torch.zeros(1000))
        torch.testing.assert_close(local + r, v, rtol=0, atol=1e-6)
    q, scale = Int8(stochastic=False).compress(v)
    assert q.dtype == torch.int8 and (v - q.float() * scale).abs().max() <= float(scale) / 2 + 1e-7
    # stochastic rounding is unbiased
    comp = Int8(stochastic=True, seed=1)
    x = torch.full((20000,), 0.3)
    x[0] = 1.0
    mean = torch.stack([comp.decompress(comp.compress(x), x.numel(), x.dtype) for _ in range(20)]).mean()
    assert abs(float(mean) - float(x.mean())) < 2e-3
    # single process: compressed_all_reduce is the decompressed local payload
    t = v.clone()
    assert compressed_all_reduce(t, TopK(0.5)) == 0
    assert int((t != 0).sum()) == 500


def test_dist_module_exports() -> None:
    for name in ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "launch", "simulate", "cost_model"):
        assert hasattr(tl.dist, name)
    assert callable(tl.dist.cost_model.predict)


def _rank_times(k: int) -> int:
    import torch.distributed as dist

    x = torch.tensor([float(dist.get_rank() * k)])
    tl.dist.all_reduce(x, op=dist.ReduceOp.MAX, algorithm="tree")
    return int(x.item())


def test_launch_a_function_defined_in_a_test_module() -> None:
    # functions in an importable test module pickle by reference and are found by the children
    assert tl.dist.launch(_rank_times, 3, 5, timeout_s=60) == [10, 10, 10]
