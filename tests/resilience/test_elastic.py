"""elastic.run: resume from the newest committed checkpoint bitwise, deterministic data order independent of the
world size, the Young/Daly interval from the measured checkpoint cost, a dead peer named, bad input named."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tinylearn.dist.launch import launch
from tinylearn.parallel.checkpoint_interval import young_daly_interval
from tinylearn.resilience import elastic_workers as ew
from tinylearn.resilience.atomic import CheckpointError
from tinylearn.resilience.elastic import TensorState, global_batch, local_rows, run
from tinylearn.resilience.sharded import latest_checkpoint, list_checkpoints


def _model(seed: int = 0, d_in: int = 4) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Linear(d_in, 3)


def _step_fn(model: torch.nn.Module):
    def step(t: int, _state: object) -> float:
        x, y = global_batch(t, 6, model.in_features, 3)
        model.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
        return float(loss.detach())

    return step


def test_global_batch_depends_on_step_and_index_only() -> None:
    x8, y8 = global_batch(3, 8, 5, 2)
    x4, y4 = global_batch(3, 4, 5, 2)
    assert torch.equal(x8[:4], x4) and torch.equal(y8[:4], y4)
    assert not torch.equal(global_batch(4, 4, 5, 2)[0], x4)
    parts = [x8[local_rows(8, 3, r)] for r in range(3)]
    assert [len(p) for p in parts] == [3, 3, 2] and torch.equal(torch.cat(parts), x8)


def test_resume_is_bitwise(tmp_path: Path) -> None:
    ref = _model()
    rep = run(_step_fn(ref), TensorState(ref.state_dict()), ckpt_dir=tmp_path / "a", steps=7, interval=2)
    assert rep.resumed_from is None and rep.steps_run == 7 and rep.checkpoints == [1, 3, 5, 6]
    assert len(list_checkpoints(tmp_path / "a")) == 2  # keep=2 pruned the older ones

    m = _model()
    first = run(_step_fn(m), TensorState(m.state_dict()), ckpt_dir=tmp_path / "b", steps=4, interval=2)
    assert first.checkpoints == [1, 3]
    m2 = _model(seed=5)  # a fresh process: other initial values, overwritten by the load
    rep2 = run(_step_fn(m2), TensorState(m2.state_dict()), ckpt_dir=tmp_path / "b", steps=7, interval=2)
    assert rep2.resumed_from == 3 and rep2.start_step == 4 and rep2.steps_run == 3
    assert rep2.load_s is not None and rep2.recovery_s is not None and rep2.recovery_s >= rep2.load_s
    assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), m2.parameters(), strict=True))
    assert rep2.losses == rep.losses[4:]
    # nothing left to do: a rerun loads and returns
    again = run(_step_fn(m2), TensorState(m2.state_dict()), ckpt_dir=tmp_path / "b", steps=7, interval=2)
    assert again.resumed_from == 6 and again.steps_run == 0


def test_auto_interval_is_young_daly(tmp_path: Path) -> None:
    m = _model()
    rep = run(_step_fn(m), m, ckpt_dir=tmp_path / "a", steps=6, interval="auto", mtbf_s=1e-6)
    assert rep.checkpoint_s is not None and rep.checkpoint_s > 0 and rep.step_s is not None and rep.step_s > 0
    assert rep.interval_s == pytest.approx(young_daly_interval(1e6, rep.checkpoint_costs[0]))
    assert rep.interval_steps == max(1, round(rep.interval_s / rep.step_s))
    assert rep.interval_steps == 1 and rep.checkpoints == list(range(6))  # failures every microsecond: each step
    rep = run(_step_fn(m), m, ckpt_dir=tmp_path / "b", steps=6, interval="auto", mtbf_s=1e9)
    assert rep.interval_steps > 6 and rep.checkpoints == [0, 5]  # C measured after step 0, then only the last


def test_dead_peer_is_named(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="rank 1"):
        launch(ew.peer_death_job, 2, str(tmp_path), 2, timeout_s=60)
    msg = (tmp_path / "rank0_error.txt").read_text()
    assert "rank 0" in msg and "rank 1" in msg and "connection closed" in msg, msg
    assert latest_checkpoint(tmp_path) is not None


def test_another_model_and_bad_input(tmp_path: Path) -> None:
    m = _model()
    run(_step_fn(m), m, ckpt_dir=tmp_path / "a", steps=1, interval=1)
    other = _model(d_in=5)
    with pytest.raises(CheckpointError, match="weight"):
        run(_step_fn(other), other, ckpt_dir=tmp_path / "a", steps=3, interval=1)
    f = tmp_path / "file"
    f.write_text("x")
    for kw, match in [
        ({"steps": 0}, "steps: expected an int >= 1, got 0"),
        ({"steps": 2.5}, "steps"),
        ({"interval": 0}, "interval: expected 'auto' or an int >= 1, got 0"),
        ({"interval": "often"}, "interval"),
        ({"mtbf_s": -1.0}, "mtbf_s"),
        ({"ckpt_dir": f}, "ckpt_dir: .* is not a directory"),
    ]:
        args = {"ckpt_dir": tmp_path / "b", "steps": 2, "interval": 1, **kw}
        with pytest.raises(ValueError, match=match):
            run(_step_fn(m), m, **args)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="state: expected"):
        run(_step_fn(m), 3, ckpt_dir=tmp_path / "c", steps=1)
    with pytest.raises(TypeError, match="train_step"):
        run(None, m, ckpt_dir=tmp_path / "c", steps=1)  # type: ignore[arg-type]


def test_torn_and_unloadable_newer_dirs(tmp_path: Path) -> None:
    m = _model()
    run(_step_fn(m), m, ckpt_dir=tmp_path, steps=4, interval=2, keep=None)  # checkpoints 1, 3
    (tmp_path / "step_00000003" / "rank00000.bin").unlink()  # committed, then a file lost
    torn = tmp_path / "step_00000005"
    torn.mkdir()
    (torn / "rank00000.bin").write_bytes(b"partial")  # a save killed before its manifest
    rep = run(_step_fn(m), m, ckpt_dir=tmp_path, steps=6, interval=2, keep=None)
    assert rep.resumed_from == 1 and rep.checkpoints == [3, 5]
    assert [p.name.startswith("unloadable_step_00000003") for p in tmp_path.glob("unloadable_*")] == [True]
    assert latest_checkpoint(tmp_path).name == "step_00000005"


def test_memory_budget_of_run(tmp_path: Path) -> None:
    from tinylearn.resilience.elastic import available_memory, check_fits

    m = _model()
    run(_step_fn(m), m, ckpt_dir=tmp_path, steps=2, interval=1)
    need = check_fits(m.state_dict(), latest_checkpoint(tmp_path), 1, 0, None)
    assert need == sum(p.numel() * 4 for p in m.parameters())
    with pytest.raises(ValueError, match=rf"max_bytes_per_rank: rank 0 of world_size=1 needs {need} bytes"):
        run(_step_fn(m), m, ckpt_dir=tmp_path, steps=4, interval=1, max_bytes_per_rank=need - 1)
    assert latest_checkpoint(tmp_path).name == "step_00000001"  # nothing run, nothing written
    avail = available_memory()
    assert avail is None or avail > need  # "auto" (the default) uses it: this tiny state fits
    rep = run(_step_fn(m), m, ckpt_dir=tmp_path, steps=4, interval=1)
    assert rep.resumed_from == 1 and rep.steps_run == 2
    for bad in (-1, "lots", 2.5):
        with pytest.raises(ValueError, match="max_bytes_per_rank: expected 'auto', an int >= 0 or None"):
            run(_step_fn(m), m, ckpt_dir=tmp_path, steps=4, max_bytes_per_rank=bad)  # type: ignore[arg-type]


def test_auto_interval_agreed_by_two_ranks(tmp_path: Path) -> None:
    """Two processes (gloo on 127.0.0.1, bounded timeouts) with interval="auto": rank 1's checkpoint is slower by a
    sleep, yet both ranks hold the same measured C (the MAX all-reduce: at least the sleep), the same step time and
    Young/Daly interval, and checkpoint after the same steps."""
    delay = 0.05
    mtbf = 0.02  # I* = sqrt(2 C MTBF) of a few steps: checkpoints inside the run, not only the first and last
    r0, r1 = launch(ew.auto_interval_job, 2, str(tmp_path), 16, mtbf, delay, timeout_s=90)
    assert r0 == r1, (r0, r1)  # the same costs, step time, interval and checkpoint steps on both ranks
    assert all(c >= delay for c in r0["costs"])  # rank 0 holds rank 1's (larger) cost: the MAX
    assert r0["step_s"] >= delay / 10  # and rank 1's slower step time
    assert r0["interval_s"] == pytest.approx(young_daly_interval(1 / mtbf, r0["costs"][0]))
    assert r0["interval_steps"] == max(1, round(r0["interval_s"] / r0["step_s"]))
    assert r0["checkpoints"][0] == 0 and r0["checkpoints"][-1] == 15  # C measured after step 0; the last step
    assert [s for s, _, why in list_checkpoints(tmp_path) if why == "ok"] == r0["checkpoints"][-2:]  # keep=2
