"""Kill-and-resume under torchrun: rank 1 SIGKILLs itself mid-step, torchrun restarts the group, the resumed run ends
bitwise where an uninterrupted run (same world size) ends -- for DDP and ZeRO-1/2/3 in one drill (the modes train
in lock-step, so one kill covers all four). Shrink: both ranks killed, resumed on 1 rank, bitwise equal to the
same world-size sequence without a kill. [Q134] live resharding vs restart from a checkpoint. Every subprocess has a
timeout."""

from __future__ import annotations

from pathlib import Path

import pytest

from tinylearn.dist.launch import launch
from tinylearn.resilience import drills
from tinylearn.resilience.sharded import latest_checkpoint

ALL = "ddp,zero1,zero2,zero3"
STEPS, KILL, INTERVAL = 5, 3, 2  # checkpoints after steps 1 and 3: the kill at step 3 loses step 2 and half of 3


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    d = tmp_path_factory.mktemp("ref")
    argv = drills.drill_argv(d / "ckpt", d / "out.npz", STEPS, ALL, INTERVAL)
    rep = launch(drills.drill_job, 2, argv, timeout_s=60)[0]
    assert rep["resumed_from"] is None and rep["checkpoints"] == [1, 3, 4]
    return drills.load_params(d / "out.npz")


def test_kill_and_resume_is_bitwise(tmp_path: Path, reference: dict) -> None:
    argv = drills.drill_argv(tmp_path / "ckpt", tmp_path / "out.npz", STEPS, ALL, INTERVAL, kill=(1, KILL))
    res = drills.torchrun(argv, nproc=2, max_restarts=3, timeout_s=60)
    assert res.returncode == 0, res.stdout[-4000:]
    assert "rank 1: SIGKILL at step 3" in res.stdout and "attempt 1" in res.stdout
    final = drills.load_params(tmp_path / "out.npz")
    assert sorted({k.split(".")[0] for k in final}) == ["ddp", "zero1", "zero2", "zero3"]
    assert drills.bitwise_equal(final, reference)
    import json

    rep = json.loads((tmp_path / "out.npz.json").read_text())
    assert rep["restart_count"] == 1 and rep["resumed_from"] == 1 and rep["steps_run"] == STEPS - 2
    assert rep["kill_to_first_step_s"] > rep["recovery_s"] > 0  # the restart (new processes) is in the first only


def test_shrink_two_to_one(tmp_path: Path) -> None:
    killed = drills.drill_argv(tmp_path / "ckpt", tmp_path / "out.npz", STEPS, ALL, INTERVAL, kill=(-1, KILL))
    res = drills.torchrun(killed, nproc=2, max_restarts=0, timeout_s=60)
    assert res.returncode != 0 and "SIGKILL at step 3" in res.stdout
    assert latest_checkpoint(tmp_path / "ckpt").name == "step_00000001"
    res = drills.torchrun(killed, nproc=1, max_restarts=0, timeout_s=60)
    assert res.returncode == 0, res.stdout[-4000:]
    # the same world-size sequence without a kill: 2 ranks up to the checkpoint, 1 rank from there
    ref = tmp_path / "ref"
    launch(drills.drill_job, 2, drills.drill_argv(ref / "ckpt", ref / "a.npz", 2, ALL, INTERVAL), timeout_s=60)
    rep = launch(drills.drill_job, 1, drills.drill_argv(ref / "ckpt", ref / "b.npz", STEPS, ALL, INTERVAL))[0]
    assert rep["resumed_from"] == 1 and rep["world_size"] == 1
    assert drills.bitwise_equal(drills.load_params(tmp_path / "out.npz"), drills.load_params(ref / "b.npz"))


def test_q134_live_reshard_vs_restart(tmp_path: Path) -> None:
    r = drills.live_vs_restart(tmp_path, steps=2, timeout_s=60)
    assert r["bitwise_equal"]
    assert r["live_s"] > 0 and r["save_s"] > 0 and r["load_s"] > 0 and r["restart_s"] > r["load_s"]
    assert r["moved_bytes"] > 0


def test_bad_arguments() -> None:
    base = ["--ckpt", "c", "--out", "o", "--steps", "3"]
    with pytest.raises(ValueError, match="--mode"):
        drills.main([*base, "--mode", "zero4"])
    with pytest.raises(ValueError, match="--steps"):
        drills.main(["--ckpt", "c", "--out", "o", "--steps", "0"])
    with pytest.raises(ValueError, match="--kill-rank and --kill-step"):
        drills.main([*base, "--kill-rank", "1"])


@pytest.mark.slow
def test_node_lost_under_two_torchrun_agents(tmp_path: Path) -> None:
    """torchrun's own elastic agent: two agents (--nnodes=1:2 --nproc-per-node=1, c10d rendezvous on 127.0.0.1,
    --max-restarts=3), one per "node". At step 3 agent B and its worker are SIGKILLed (a lost node); agent A's
    worker fails its next collective, A restarts it, re-rendezvouses alone (world size 1) and the run resumes from
    the step-1 checkpoint -- ending bitwise where 2 ranks up to the checkpoint and 1 rank from there end. Bounded:
    both agents are killed after 120 s."""
    import json

    argv = drills.drill_argv(tmp_path / "ckpt", tmp_path / "out.npz", STEPS, ALL, INTERVAL)
    r = drills.torchrun_two_agents([*argv, "--lose-node-step", str(KILL)], drills.free_port(), timeout_s=120)
    assert r["rc_a"] == 0, r["out_a"][-4000:]
    assert r["rc_b"] == -9, r["out_b"][-2000:]  # agent B died by SIGKILL: nothing on that node restarted
    assert "node lost at step 3" in r["out_b"] and "rank 0/1 attempt 1" in r["out_a"]
    rep = json.loads((tmp_path / "out.npz.json").read_text())
    assert rep["restart_count"] == 1 and rep["world_size"] == 1 and rep["resumed_from"] == 1
    assert rep["kill_to_first_step_s"] > 0
    ref = tmp_path / "ref"
    launch(drills.drill_job, 2, drills.drill_argv(ref / "ckpt", ref / "a.npz", 2, ALL, INTERVAL), timeout_s=60)
    launch(drills.drill_job, 1, drills.drill_argv(ref / "ckpt", ref / "b.npz", STEPS, ALL, INTERVAL), timeout_s=60)
    assert drills.bitwise_equal(drills.load_params(tmp_path / "out.npz"), drills.load_params(ref / "b.npz"))
