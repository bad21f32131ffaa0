"""Other launchers: the same code under torchrun, and the ring on mpi4py/Open MPI as a cross-check (both slow:
each starts fresh interpreters that import torch)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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
