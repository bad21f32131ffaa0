"""What this machine can run: CUDA device, nvcc, clang (tinygrad's CPU device), triton, numba, MPI.

The probes live in ``tinylearn.backends`` (library code asks there); this module re-exports them for tests and
adds ``nvcc_compile_ptx``. Every probe is cheap, cached and never raises.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from ..backends import (  # noqa: F401  (re-exported)
    clang_available,
    cuda_available,
    mpi_available,
    numba_available,
    nvcc_available,
    triton_available,
)


def nvcc_compile_ptx(source: str | Path, out_dir: str | Path, arch: str = "sm_80", timeout_s: float = 300) -> Path:
    """Compile one .cu file to PTX with ``nvcc -ptx -arch=ARCH``; returns the .ptx path.

    Raises RuntimeError with nvcc's stderr when compilation fails and FileNotFoundError when nvcc is missing.
    """
    source = Path(source)
    if not source.is_file():
        raise FileNotFoundError(f"source: no such CUDA file {source}")
    if not nvcc_available():
        raise FileNotFoundError("nvcc not found on PATH")
    out = Path(out_dir) / (source.stem + ".ptx")
    proc = subprocess.run(
        ["nvcc", "-ptx", f"-arch={arch}", "-o", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"nvcc failed on {source.name} (exit {proc.returncode}):\n{proc.stderr}")
    return out
