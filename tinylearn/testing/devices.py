"""What this machine can run: CUDA device, nvcc, clang (tinygrad's CPU device), triton, numba, MPI.

Every probe is cheap, cached and never raises: it answers False when the thing is missing or broken.
"""

from __future__ import annotations

import functools
import importlib.util
import shutil
import subprocess
from pathlib import Path


@functools.cache
def cuda_available() -> bool:
    """True only when a CUDA device can run a kernel (cupy imports without a GPU, so ask the runtime)."""
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        import cupy

        return bool(cupy.cuda.is_available()) and cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


@functools.cache
def nvcc_available() -> bool:
    """True when ``nvcc`` is on PATH (it compiles CUDA sources; that does not mean a GPU exists)."""
    return shutil.which("nvcc") is not None


@functools.cache
def clang_available() -> bool:
    """True when ``clang`` is on PATH: tinygrad's CPU device compiles its kernels with it."""
    return shutil.which("clang") is not None


@functools.cache
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


@functools.cache
def numba_available() -> bool:
    return importlib.util.find_spec("numba") is not None


@functools.cache
def mpi_available() -> bool:
    return importlib.util.find_spec("mpi4py") is not None and shutil.which("mpirun") is not None


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
