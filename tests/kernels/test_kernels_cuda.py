"""The cuda backend on a real GPU (cupy.RawModule over cuda_src/): every kernel version vs torch. Marked ``gpu``:
skipped with a reason when no CUDA device exists. The loader's no-GPU error is tested everywhere."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tinylearn as tl
from tinylearn.kernels import cuda as kc
from tinylearn.testing import assert_close, cuda_available, make_array


@pytest.mark.skipif(cuda_available(), reason="checks the error raised without a GPU")
def test_load_without_gpu_raises() -> None:
    with pytest.raises(RuntimeError, match="no CUDA device"):
        kc.load("kernels_softmax")
    with pytest.raises(ValueError, match="known"):
        kc.source_path("does_not_exist")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 1), (7, 33), (64, 1024), (3, 4099)])
def test_cuda_softmax_versions(shape: tuple[int, int]) -> None:
    import cupy

    x = make_array(shape, seed=0, low=-20, high=20)
    want = torch.softmax(torch.from_numpy(x), -1)
    mod = kc.load("kernels_softmax")
    rows, cols = shape
    for name, grid, block, smem in (
        ("softmax_v1_naive", ((rows + 127) // 128,), (128,), 0),
        ("softmax_v2_shared", (rows,), (256,), 256 * 4),
        ("softmax_v3_warp_online", ((rows + 3) // 4,), (128,), 0),
    ):
        gx = cupy.asarray(x)
        gy = cupy.empty_like(gx)
        mod.get_function(name)(grid, block, (gx, gy, np.int32(rows), np.int32(cols)), shared_mem=smem)
        assert_close(gy.get(), want, "float32", msg=name)


@pytest.mark.gpu
def test_cuda_backend_ops() -> None:
    x = make_array((9, 131), seed=1, low=-4, high=4)
    w, b = make_array((131,), seed=2), make_array((131,), seed=3)
    tx = torch.from_numpy(x)
    assert_close(tl.kernels.softmax(x, backend="cuda"), torch.softmax(tx, -1), "float32")
    assert_close(
        tl.kernels.layer_norm(x, w, b, backend="cuda"),
        F.layer_norm(tx, (131,), torch.from_numpy(w), torch.from_numpy(b)),
        "float32",
    )
    for ap in ("none", "tanh"):
        assert_close(
            tl.kernels.bias_gelu(x, b, backend="cuda", approximate=ap),
            F.gelu(tx + torch.from_numpy(b), approximate=ap),
            "float32",
        )
    q, k, v = (make_array((2, 2, 77, 32), seed=4 + i) for i in range(3))
    for causal in (False, True):
        o = tl.kernels.flash_attention(q, k, v, causal, backend="cuda")
        assert_close(
            o, F.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)), is_causal=causal), "float32"
        )


@pytest.mark.gpu
def test_cuda_vector_reduce() -> None:
    import cupy

    x = make_array((100_003,), seed=5)
    mod = kc.load("vector_reduce")
    gx = cupy.asarray(x)
    out = cupy.zeros(1, dtype=cupy.float32)
    mod.get_function("grid_stride_reduce")((64,), (256,), (gx, out, np.int64(x.size)))
    assert abs(float(out.get()[0]) - float(x.astype(np.float64).sum())) < 1e-2
    blocks = (x.size + 511) // 512
    part = cupy.zeros(blocks, dtype=cupy.float32)
    for name in ("block_reduce_shared", "block_reduce_warp"):
        mod.get_function(name)((blocks,), (256,), (gx, part, np.int32(x.size)), shared_mem=256 * 4)
        assert abs(float(part.get().astype(np.float64).sum()) - float(x.astype(np.float64).sum())) < 1e-2, name


@pytest.mark.gpu
def test_cuda_reduce_sum_op_every_version() -> None:
    x = make_array((100_003,), seed=6)
    want = float(x.astype(np.float64).sum())
    for v in kc.REDUCE_VERSIONS:
        assert abs(float(tl.kernels.reduce_sum(x, backend="cuda", version=v)) - want) < 1e-2, v


def test_reduce_sum_registered_numpy_reference_and_cuda_here() -> None:
    """kernels.reduce_sum: numpy (float64 accumulation) is the reference; the .cu versions are its cuda backend,
    a clear RuntimeError where no device can run them."""
    from tinylearn import backends

    x = make_array((1001,), seed=7)
    got = tl.kernels.reduce_sum(x, backend="numpy")
    assert got.dtype == np.float32 and got.shape == () and got == np.float32(x.astype(np.float64).sum())
    assert backends.versions("kernels.reduce_sum", "cuda") == list(kc.REDUCE_VERSIONS)
    if not backends.cuda_available():
        with pytest.raises(RuntimeError, match="cuda"):
            tl.kernels.reduce_sum(x, backend="cuda")
    with pytest.raises(TypeError, match="x"):
        tl.kernels.reduce_sum("nope")
