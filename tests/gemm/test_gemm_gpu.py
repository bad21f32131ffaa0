"""GPU part of tl.gemm: cuda_src/gemm_*.cu compile to PTX (nvcc) and run vs numpy (CUDA device only), the Triton
matmul under the interpreter, the numba-CUDA tiled kernel under the simulator, and the coalescing / bank-conflict
models on addresses recorded by simulator kernels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tinylearn as tl
from tinylearn.gemm import gpu_model
from tinylearn.testing import assert_close, nvcc_available, nvcc_compile_ptx, triton_available

CUDA_SRC = Path(__file__).resolve().parents[2] / "cuda_src"
KERNELS = {n: n for n in ("gemm_naive", "gemm_smem", "gemm_regtile", "gemm_vec4")}  # source stem -> entry name


def _pair(m: int, k: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.uniform(-1, 1, (m, k)).astype(np.float32), rng.uniform(-1, 1, (k, n)).astype(np.float32)


def test_sources_match_versions() -> None:
    from tinylearn.gemm.cuda import LAUNCH

    assert sorted(p.stem for p in CUDA_SRC.glob("gemm_*.cu")) == sorted(KERNELS)
    assert [LAUNCH[v][0] for v in tl.gemm.CUDA_VERSIONS] == list(KERNELS)
    assert tl.gemm.versions("cuda") == list(tl.gemm.CUDA_VERSIONS)


@pytest.mark.skipif(not nvcc_available(), reason="nvcc not found on PATH")
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_ptx_has_the_kernel(name: str, tmp_path: Path) -> None:
    ptx = nvcc_compile_ptx(CUDA_SRC / f"{name}.cu", tmp_path, arch="sm_80").read_text()
    assert f".entry {KERNELS[name]}(" in ptx  # extern "C": unmangled entry name for cupy's get_function


@pytest.mark.gpu
@pytest.mark.parametrize("version", tl.gemm.CUDA_VERSIONS)
@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 33, 5), (65, 130, 97), (128, 64, 256)])
def test_cuda_versions(version: str, shape: tuple[int, int, int]) -> None:
    a, b = _pair(*shape)
    assert_close(tl.gemm.matmul(a, b, backend="cuda", version=version), a.astype(np.float64) @ b, dtype="float32")


@pytest.mark.skipif(not triton_available(), reason="triton not installed")
def test_triton_interpreter_small() -> None:
    for shape in [(1, 1, 1), (33, 20, 17)]:
        a, b = _pair(*shape)
        assert_close(tl.gemm.matmul(a, b, backend="triton"), a.astype(np.float64) @ b, dtype="float32")
    a, b = _pair(18, 9, 5, seed=1)
    assert_close(tl.gemm.matmul(np.asfortranarray(a), b, backend="triton"), a.astype(np.float64) @ b, dtype="float32")
    with pytest.raises(TypeError, match="float32 only"):
        tl.gemm.matmul(a.astype(np.float64), b.astype(np.float64), backend="triton")


def test_numba_simulator_tiled_matmul_and_recorded_addresses() -> None:
    pytest.importorskip("numba")
    from tinylearn.gemm.numba_sim import run_in_subprocess

    a, b = _pair(19, 13, 10)
    assert_close(run_in_subprocess("tiled_matmul", a, b), a.astype(np.float64) @ b, dtype="float32")
    g = run_in_subprocess("record_global", 64, 3)  # [layout, operand, thread]
    assert gpu_model.transactions(g[0, 1] * 4)["segments"] == 1  # B[k, tx]: coalesced
    assert gpu_model.transactions(g[1, 0] * 4)["segments"] == 32  # A[tx, k]: stride 64 floats
    assert gpu_model.transactions(g[0, 0] * 4)["sectors"] == 1  # broadcast
    s32 = run_in_subprocess("record_shared", 32)
    s33 = run_in_subprocess("record_shared", 33)
    assert gpu_model.bank_conflicts(s32[0])["degree"] == 1
    assert gpu_model.bank_conflicts(s32[1])["degree"] == 32
    assert gpu_model.bank_conflicts(s33[1])["degree"] == 1


def test_gpu_model_rules() -> None:
    t = np.arange(32)
    assert gpu_model.transactions(t * 4) == {"segments": 1, "sectors": 4, "bytes_moved": 128, "efficiency": 1.0}
    assert gpu_model.transactions(t * 4 + 4)["segments"] == 2  # misaligned by one word: straddles two lines
    assert gpu_model.transactions(t * 8)["sectors"] == 8  # stride 2: half of every sector wasted
    assert gpu_model.transactions(t * 16, itemsize=16)["bytes_moved"] == 512  # float4 per thread: 4 full lines
    assert gpu_model.bank_conflicts(t * 2)["degree"] == 2  # stride 2 words: 2-way
    assert gpu_model.bank_conflicts(np.zeros(32, int))["degree"] == 1  # one word to all: broadcast
    assert gpu_model.bank_conflicts(gpu_model.column_words(32, 0))["degree"] == 32
    assert gpu_model.bank_conflicts(gpu_model.column_words(32, 1))["degree"] == 1
    with pytest.raises(ValueError, match="word_indices"):
        gpu_model.bank_conflicts([])
