"""cuda_src/memory_stream_ordered_alloc.cu: compiles to PTX (nvcc) here; runs only on a GPU (cudaMallocAsync pool)."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import pytest

from tinylearn.testing import cuda_available, nvcc_available

CU = Path(__file__).resolve().parents[2] / "cuda_src" / "memory_stream_ordered_alloc.cu"


@pytest.mark.skipif(not nvcc_available(), reason="nvcc not found")
def test_stream_ordered_alloc_compiles_to_ptx(tmp_path: Path) -> None:
    out = tmp_path / "mem.ptx"
    subprocess.run(["nvcc", "-ptx", "-arch=sm_80", "-o", str(out), str(CU)], check=True, timeout=300)
    ptx = out.read_text()
    assert ".entry fill_iota" in ptx and ".entry scale_add" in ptx


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="no CUDA device")
def test_stream_ordered_alloc_runs_on_gpu(tmp_path: Path) -> None:
    lib = tmp_path / "libmem.so"
    subprocess.run(["nvcc", "-shared", "-Xcompiler", "-fPIC", "-o", str(lib), str(CU)], check=True, timeout=300)
    so = ctypes.CDLL(str(lib))
    out = ctypes.c_float()
    n, iters = 1000, 5
    assert so.tl_stream_ordered_demo(n, iters, ctypes.byref(out)) == 0
    assert out.value == pytest.approx(iters * n * (n - 1) / 2, rel=1e-5)
