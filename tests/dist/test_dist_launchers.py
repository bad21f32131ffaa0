"""Other launchers: the same code under torchrun, and the ring on mpi4py/Open MPI as a cross-check (both slow:
each starts fresh interpreters that import torch). Fault drills of DataParallel under tl.dist.launch (issue 38):
mismatched ranks, a rank that dies and a rank that hangs mid-run, each bounded in time (a 4 s process group)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import tinylearn as tl
from tinylearn.parallel import fault_drills
from tinylearn.testing import mpi_available

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_launch_under_torchrun(tmp_path: Path) -> None:
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists() and shutil.which("torchrun") is None:
        pytest.skip("torchrun not found")
    script = tmp_path / "job.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, sys, tinylearn as tl
            from tinylearn.dist import workers
            out = tl.dist.launch(workers.compare_algorithms, 2, 101)
            info = tl.dist.launch(workers.rank_info, 2)
            ok = all(r["int_err"] == 0 for res in out for r in res.values())
            with open(os.path.join(sys.argv[1], "rank" + os.environ["RANK"] + ".txt"), "w") as f:
                f.write(f"TORCHRUN {[i['rank'] for i in info]} {ok}")
            """
        )
    )
    cmd = [
        str(torchrun if torchrun.exists() else shutil.which("torchrun")),
        "--standalone",
        "--nproc_per_node=2",
        str(script),
        str(tmp_path),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        assert (tmp_path / f"rank{rank}.txt").read_text() == "TORCHRUN [0, 1] True"


@pytest.mark.slow
@pytest.mark.skipif(not mpi_available(), reason="mpi4py or mpirun not installed")
def test_mpi4py_ring_cross_check() -> None:
    cmd = [
        "mpirun",
        "--allow-run-as-root",
        "--oversubscribe",
        "-np",
        "3",
        sys.executable,
        "-m",
        "tinylearn.dist.mpi_ring",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "mpi ring OK" in proc.stdout


GROUP_TIMEOUT_S = 4.0


def _ddp_drill(out: Path, action: str, match: str, with_mismatch: bool = False) -> float:
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=match):
        tl.dist.launch(
            fault_drills.fault, 2, action, str(out), ("ddp",), 1, GROUP_TIMEOUT_S, 3, with_mismatch, timeout_s=60
        )
    return time.monotonic() - t0


def test_ddp_mismatched_ranks_and_a_rank_that_dies(tmp_path: Path) -> None:
    wall = _ddp_drill(tmp_path, "exit", r"rank 1 raised RuntimeError: process exited with code 7", with_mismatch=True)
    for rank in (0, 1):  # rank-dependent hidden size / algorithm: ValueError on both ranks, group still usable
        msgs = json.loads((tmp_path / f"mismatch_rank{rank}.json").read_text())
        assert msgs["group_usable"] is True
        shape, alg = msgs["ddp_shape"], msgs["ddp_algorithm"]
        assert shape.startswith("ValueError: params[0].shape[0]: mismatch across ranks"), shape
        assert "rank 0 (group rank 0) has 8, rank 1 (group rank 1) has 9" in shape, shape
        assert alg.startswith("ValueError: algorithm: mismatch across ranks") and "DataParallel setup" in alg, alg
    assert not (tmp_path / "rank1.json").exists()  # the victim died mid-run
    rep = json.loads((tmp_path / "rank0.json").read_text())["ddp"]
    assert rep["error"] and "rank 1" in rep["error"] and "connection closed (the peer died" in rep["error"], rep
    assert rep["elapsed_s"] < GROUP_TIMEOUT_S  # detected at once, not by the timeout
    assert wall < 60


def test_ddp_rank_that_hangs_times_out_within_the_group_timeout(tmp_path: Path) -> None:
    wall = _ddp_drill(
        tmp_path, "hang", r"rank 0 raised RuntimeError: rank 0: features \['ddp'\] failed after peer rank 1 did 'hang'"
    )
    rep = json.loads((tmp_path / "rank0.json").read_text())["ddp"]
    assert rep["error"] and "rank 1" in rep["error"] and "timed out (the peer is hung" in rep["error"], rep
    assert GROUP_TIMEOUT_S - 0.5 <= rep["elapsed_s"] <= GROUP_TIMEOUT_S + 10, rep
    assert wall < 60
