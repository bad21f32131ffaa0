"""codegen_cuda: the emitted CUDA C has the documented thread mapping and compiles to PTX with ``nvcc -ptx
-arch=sm_80`` (skipped with a reason without nvcc). Nothing here runs on a GPU: the numbers are checked by the C++
backend, which shares the arithmetic (codegen_cpp.c_expr)."""

from __future__ import annotations

import pytest
from codegen_cases import all_ops, gelu_residual, group_norm, layer_norm, row_max, softmax, transposed_add

from tinylearn.compiler.codegen_cuda import emit_cuda, launch_config
from tinylearn.testing import nvcc_available, nvcc_compile_ptx

CASES = [
    gelu_residual(33, 70),
    softmax(5, 1000),
    layer_norm(7, 300),
    layer_norm(7, 300, "float64"),
    group_norm(2, 4, 3, 10),
    transposed_add(17, 33),
    row_max(6, 37),
    all_ops(101),
]


def test_pointwise_is_one_thread_per_element():
    k = gelu_residual(33, 70)
    src = emit_cuda(k)
    assert 'extern "C" __global__ void tl_gelu_residual(const float* __restrict__ in0' in src
    assert "const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;\n  if (e >= 2310) return;" in src
    assert "const int64_t i0 = (e / 70);" in src and "const int64_t i1 = e % 70;" in src
    assert "erff(" in src and "__shared__" not in src
    assert launch_config(k) == (10, 256) and launch_config(k, 1024) == (3, 1024)


def test_row_reduction_is_one_block_per_row_with_a_shared_memory_tree():
    k = layer_norm(7, 300, "float64")
    src = emit_cuda(k, block=128)
    assert "__shared__ double smem[128];" in src and "const int64_t row = blockIdx.x;" in src
    assert "for (int64_t c = threadIdx.x; c < 300; c += 128) {" in src
    assert src.count("for (int s = 64; s > 0; s >>= 1) {") == 2  # mean, then variance
    assert src.count("__syncthreads();") == 6 and "if (tid == 0) out1[i0] = r3;" in src
    assert "sqrt(" in src and "sqrtf(" not in src
    assert "tl_max(smem[tid], smem[tid + s])" in emit_cuda(softmax(2, 8))
    assert launch_config(k) == (7, 256)
    with pytest.raises(ValueError, match="block: must be a power of two in \\[1, 1024\\], got 100"):
        emit_cuda(k, block=100)


@pytest.mark.skipif(not nvcc_available(), reason="nvcc not found on PATH")
def test_every_case_compiles_to_ptx(tmp_path):
    for k in CASES:
        path = tmp_path / f"{k.name}_{k.dtype}.cu"
        path.write_text(emit_cuda(k))
        ptx = nvcc_compile_ptx(path, tmp_path, arch="sm_80").read_text()
        assert f".visible .entry tl_{k.name}(" in ptx, k.name
        if k.reduce_dims:
            assert "bar.sync" in ptx and ".shared" in ptx, k.name
