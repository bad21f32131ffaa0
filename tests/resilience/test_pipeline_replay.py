"""tinylearn.resilience.pipeline_replay (Q109): GPipe / 1F1B schedules as dependency DAGs, the minimal replay set after
a stage failure, executed on a real numpy pipeline: gradients bitwise equal to the no-failure run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tinylearn.resilience import pipeline_replay as pr
from tinylearn.resilience.pipeline_replay import Op


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("s", "m"), [(1, 1), (2, 5), (4, 8), (5, 3)])
def test_schedule_respects_the_dag(kind: str, s: int, m: int) -> None:
    sc = pr.build_schedule(s, m, kind)
    assert sorted(sc.ops) == sorted(Op(a, b, k) for a in range(s) for b in range(m) for k in "FB")
    pos = {op: i for i, op in enumerate(sc.ops)}
    for op in sc.ops:
        for d in pr.dependencies(op, s):
            assert sc.end[d] <= sc.start[op] and pos[d] < pos[op]
    for prog in pr.stage_programs(s, m, kind):  # a stage runs one op at a time, in program order
        assert all(sc.end[a] <= sc.start[b] for a, b in zip(prog, prog[1:], strict=False))


@pytest.mark.parametrize(("s", "m"), [(2, 4), (4, 8), (3, 12)])
def test_bubble_and_stash(s: int, m: int) -> None:
    for kind in ("gpipe", "1f1b"):
        sc = pr.build_schedule(s, m, kind, f_cost=1, b_cost=1)
        assert sc.makespan == 2 * (m + s - 1)  # (M + S − 1) forward slots + as many backward slots
        assert sc.bubble == pytest.approx((s - 1) / (m + s - 1))
    assert pr.build_schedule(s, m, "gpipe").peak_stash == [m] * s
    assert pr.build_schedule(s, m, "1f1b").peak_stash == [min(s - i, m) for i in range(s)]


def _data(n: int = 16, width: int = 8) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return rng.standard_normal((n, width)), rng.standard_normal((n, width))


def test_executor_matches_torch_autograd() -> None:
    ex = pr.PipelineExecutor(3, 8, seed=2)
    x, t = _data()
    out = ex.run(pr.build_schedule(3, 4, "1f1b"), x, t)
    ws = [(torch.tensor(w, requires_grad=True), torch.tensor(b, requires_grad=True)) for w, b in ex.params]
    h = torch.tensor(x)
    for w, b in ws:
        h = torch.tanh(h @ w + b)
    loss = 0.5 * ((h - torch.tensor(t)) ** 2).sum() / len(x)
    loss.backward()
    assert out["loss"] == pytest.approx(loss.item(), rel=1e-12)
    for (gw, gb), (w, b) in zip(out["grads"], ws, strict=True):
        np.testing.assert_allclose(gw, w.grad.numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(gb, b.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_failure_anywhere_replays_to_bitwise_equal_gradients(kind: str) -> None:
    s_n, m_n = 3, 4
    ex = pr.PipelineExecutor(s_n, 8, seed=0)
    x, t = _data()
    sc = pr.build_schedule(s_n, m_n, kind)
    ref = ex.run(sc, x, t)
    total_replayed = total_restart = 0
    for s in range(s_n):
        for k in range(len(sc.ops)):
            out = ex.run(sc, x, t, fail_stage=s, fail_after=k)
            for (a, b), (c, d) in zip(out["grads"], ref["grads"], strict=True):
                assert np.array_equal(a, c) and np.array_equal(b, d)
            assert out["loss"] == ref["loss"]
            assert out["replayed"] == sum(op.stage == s for op in sc.ops[:k]) <= k == out["restart_replayed"]
            total_replayed += out["replayed"]
            total_restart += out["restart_replayed"]
    assert total_replayed * s_n == pytest.approx(total_restart, rel=0.35)  # ~1/S of a restart's replay


def test_replay_set_contents() -> None:
    sc = pr.build_schedule(4, 8, "1f1b")
    k = len(sc.ops) // 2
    rs = pr.replay_set(sc, 1, k)
    done = set(sc.ops[:k])
    assert rs == [op for op in sc.ops if op in done and op.stage == 1]
    assert {op.micro for op in rs if op.kind == "B"} <= {op.micro for op in rs if op.kind == "F"}
    assert pr.replay_set(sc, 2, 0) == []


def test_too_little_replay_is_wrong() -> None:
    """The replay set is needed: without the backwards the gradients differ; without the forwards the stash is gone."""
    ex = pr.PipelineExecutor(3, 8)
    x, t = _data()
    sc = pr.build_schedule(3, 4, "gpipe")
    ref = ex.run(sc, x, t)
    k = next(i for i, op in enumerate(sc.ops) if op == Op(1, 1, "B")) + 1
    full = pr.replay_set(sc, 1, k)
    only_f = [op for op in full if op.kind == "F"]
    out = ex.run(sc, x, t, fail_stage=1, fail_after=k, replay=only_f)
    assert not np.array_equal(out["grads"][1][0], ref["grads"][1][0])
    with pytest.raises(KeyError):
        ex.run(sc, x, t, fail_stage=1, fail_after=k, replay=[])


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="kind"):
        pr.build_schedule(2, 2, "zero-bubble")
    with pytest.raises(ValueError, match="n_stages"):
        pr.build_schedule(0, 2)
    with pytest.raises(ValueError, match="b_cost"):
        pr.build_schedule(2, 2, b_cost=0)
    sc = pr.build_schedule(2, 2)
    with pytest.raises(ValueError, match="failed_stage"):
        pr.replay_set(sc, 2, 1)
    with pytest.raises(ValueError, match="n_done"):
        pr.replay_set(sc, 0, 99)
    ex = pr.PipelineExecutor(2, 4)
    x = np.zeros((3, 4))
    with pytest.raises(ValueError, match="x"):
        ex.run(sc, x, x)
    with pytest.raises(ValueError, match="fail_stage"):
        ex.run(sc, np.zeros((4, 4)), np.zeros((4, 4)), fail_stage=1)
    with pytest.raises(ValueError, match="fail_stage"):
        ex.run(sc, np.zeros((4, 4)), np.zeros((4, 4)), fail_stage=2, fail_after=1)
    with pytest.raises(ValueError, match="fail_after"):
        ex.run(sc, np.zeros((4, 4)), np.zeros((4, 4)), fail_stage=0, fail_after=len(sc.ops))
