"""conv2d (forward + backward), pooling, Winograd, BN folding and tiled conv vs torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _conv_cases import conv_case

import tinylearn as tl
from tinylearn.conv import cpp_available
from tinylearn.testing import assert_close, make_layouts, numba_available

BACKENDS = [
    "numpy",
    pytest.param("numba", marks=pytest.mark.skipif(not numba_available(), reason="numba not installed")),
    pytest.param("cpp", marks=pytest.mark.skipif(not cpp_available(), reason="tinylearn._C.conv not built")),
]

# (N, C, H, W, OC, kernel, stride, padding, dilation, groups)
CASES = [
    (2, 4, 9, 7, 6, 3, 1, 1, 1, 1),
    (2, 4, 9, 7, 6, (2, 3), (2, 1), (1, 0), (1, 2), 2),
    (3, 6, 8, 8, 6, 3, 1, 1, 1, 6),  # depthwise
    (2, 4, 8, 8, 8, 3, 2, 1, 1, 4),  # depthwise, channel multiplier 2
    (2, 4, 5, 6, 8, 1, 1, 0, 1, 1),  # pointwise (no im2col)
    (1, 3, 15, 15, 4, 7, 2, 3, 1, 1),  # 7x7/2 stem
]


def _torch_conv(x, w, b, s, p, d, g, gy):
    tx = torch.tensor(x, requires_grad=True)
    tw = torch.tensor(w, requires_grad=True)
    tb = torch.tensor(b, requires_grad=True)
    y = F.conv2d(tx, tw, tb, s, p, d, g)
    y.backward(torch.from_numpy(gy))
    return y.detach().numpy(), tx.grad.numpy(), tw.grad.numpy(), tb.grad.numpy()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_conv2d_forward_backward_vs_torch(backend, case, dtype):
    x, w, b, s, p, d, g = conv_case(case, dtype)
    y = tl.conv.conv2d(x, w, b, s, p, d, g, backend=backend)
    gy = np.random.default_rng(9).standard_normal(y.shape).astype(dtype)
    ey, edx, edw, edb = _torch_conv(x, w, b, s, p, d, g, gy)
    assert y.dtype == np.dtype(dtype)
    assert_close(y, ey, dtype)
    dx, dw, db = tl.conv.conv2d_backward(gy, x, w, s, p, d, g, backend=backend)
    assert_close(dx, edx, dtype)
    assert_close(dw, edw, dtype, reduction_size=gy.size // gy.shape[1])
    assert_close(db, edb, dtype, reduction_size=gy.size // gy.shape[1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_conv2d_noncontiguous_inputs(backend):
    w = np.random.default_rng(5).standard_normal((4, 3, 3, 2)).astype(np.float32)
    for name, x in make_layouts((2, 3, 7, 8), "float32"):
        got = tl.conv.conv2d(x, w[:, :, ::-1], None, 1, (1, 0), 1, backend=backend)
        exp = F.conv2d(
            torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(w[:, :, ::-1].copy()), None, 1, (1, 0)
        )
        assert_close(got, exp, msg=name)


def test_conv2d_backward_reuses_cols_and_needs():
    x, w, b, s, p, d, g = conv_case(CASES[1], "float64")
    y, cols = tl.conv.conv2d_forward(x, w, b, s, p, d, g)
    gy = np.ones_like(y)
    full = tl.conv.conv2d_backward(gy, x, w, s, p, d, g, cols=cols)
    part = tl.conv.conv2d_backward(gy, x, w, s, p, d, g, needs=(False, True, False))
    assert part[0] is None and part[2] is None
    assert_close(part[1], full[1], "float64")


def test_conv2d_bad_input():
    x = np.zeros((1, 4, 5, 5), np.float32)
    w = np.zeros((6, 2, 3, 3), np.float32)
    with pytest.raises(ValueError, match=r"groups.*4.*\(1, 4, 5, 5\).*groups=3"):
        tl.conv.conv2d(x, np.zeros((6, 1, 3, 3), np.float32), groups=3)
    with pytest.raises(ValueError, match=r"weight: expected a 4-D.*\(6, 2, 3\)"):
        tl.conv.conv2d(x, np.zeros((6, 2, 3), np.float32))
    with pytest.raises(ValueError, match=r"weight: shape \(6, 2, 3, 3\).*\(1, 4, 5, 5\)"):
        tl.conv.conv2d(x, w, groups=1)
    with pytest.raises(ValueError, match=r"kernel_size.*\(3, 3\).*larger than the padded input \(2, 2\)"):
        tl.conv.conv2d(np.zeros((1, 4, 2, 2), np.float32), w, groups=2)
    with pytest.raises(ValueError, match="stride"):
        tl.conv.conv2d(x, w, stride=(1, 0), groups=2)
    with pytest.raises(ValueError, match="dilation"):
        tl.conv.conv2d(x, w, dilation=0, groups=2)
    with pytest.raises(ValueError, match=r"bias: expected shape \(6,\)"):
        tl.conv.conv2d(x, w, np.zeros(5, np.float32), groups=2)
    with pytest.raises(ValueError, match="groups"):
        tl.conv.conv2d(x, w, groups=0)
    with pytest.raises(ValueError, match=r"x: expected a 4-D"):
        tl.conv.conv2d(np.zeros((4, 5, 5), np.float32), w, groups=2)
    with pytest.raises(ValueError, match="grad_out"):
        tl.conv.conv2d_backward(np.zeros((1, 6, 2, 2)), x, w, groups=2)


# ---------------------------------------------------------------- pooling
POOL_CASES = [(3, 2, 1), (2, None, 0), ((3, 2), (1, 2), (1, 1)), (3, 1, 0)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("k,s,p", POOL_CASES)
def test_max_pool_vs_torch(backend, k, s, p):
    x = np.random.default_rng(6).standard_normal((2, 3, 9, 8))
    x[0, 0, :3, :3] = 0.5  # ties: the first maximum receives the gradient, like torch
    tx = torch.tensor(x, requires_grad=True)
    ty = F.max_pool2d(tx, k, s, p)
    gy = np.random.default_rng(7).standard_normal(ty.shape)
    ty.backward(torch.from_numpy(gy))
    y, idx = tl.conv.max_pool2d(x, k, s, p, return_indices=True)
    assert_close(y, ty, "float64")
    dx = tl.conv.max_pool2d_backward(gy, idx, x.shape, k, s, p, backend=backend)
    assert_close(dx, tx.grad, "float64")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("k,s,p", POOL_CASES)
@pytest.mark.parametrize("cip", [True, False])
def test_avg_pool_vs_torch(backend, k, s, p, cip):
    x = np.random.default_rng(8).standard_normal((2, 3, 9, 8))
    tx = torch.tensor(x, requires_grad=True)
    ty = F.avg_pool2d(tx, k, s, p, count_include_pad=cip)
    gy = np.random.default_rng(7).standard_normal(ty.shape)
    ty.backward(torch.from_numpy(gy))
    assert_close(tl.conv.avg_pool2d(x, k, s, p, cip), ty, "float64")
    assert_close(tl.conv.avg_pool2d_backward(gy, x.shape, k, s, p, cip, backend=backend), tx.grad, "float64")


def test_pool_fp32_layouts_and_errors():
    for name, x in make_layouts((2, 3, 8, 8), "float32"):
        exp = F.max_pool2d(torch.from_numpy(np.ascontiguousarray(x)), 3, 2, 1)
        assert_close(tl.conv.max_pool2d(x, 3, 2, 1), exp, msg=name)
    with pytest.raises(ValueError, match="padding.*half"):
        tl.conv.max_pool2d(np.zeros((1, 1, 8, 8)), 2, padding=2)
    with pytest.raises(ValueError, match="kernel_size"):
        tl.conv.avg_pool2d(np.zeros((1, 1, 3, 3)), 5)


# ---------------------------------------------------------------- Winograd
@pytest.mark.parametrize("shape,oc,pad", [((2, 3, 8, 8), 4, 1), ((1, 5, 7, 9), 3, 0), ((2, 2, 6, 5), 2, (1, 0))])
def test_winograd_matches_direct_fp32(shape, oc, pad):
    rng = np.random.default_rng(10)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((oc, shape[1], 3, 3)).astype(np.float32)
    b = rng.standard_normal(oc).astype(np.float32)
    got = tl.conv.winograd_conv2d(x, w, b, padding=pad)
    exp = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), padding=pad)
    assert got.dtype == np.float32
    assert_close(got, exp, "float32", reduction_size=2000)  # 4x4 transforms widen fp32 error slightly
    assert_close(
        tl.conv.winograd_conv2d(x.astype(np.float64), w.astype(np.float64), b, pad),
        F.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), torch.from_numpy(b).double(), padding=pad),
        "float64",
    )


def test_winograd_counts_and_errors():
    assert tl.conv.MULS_DIRECT_PER_TILE == 36 and tl.conv.MULS_WINOGRAD_PER_TILE == 16
    with pytest.raises(ValueError, match=r"weight.*\[OC, C, 3, 3\].*\(2, 3, 5, 5\)"):
        tl.conv.winograd_conv2d(np.zeros((1, 3, 8, 8)), np.zeros((2, 3, 5, 5)))
    with pytest.raises(ValueError, match="kernel_size"):
        tl.conv.winograd_conv2d(np.zeros((1, 3, 2, 2)), np.zeros((2, 3, 3, 3)))


# ---------------------------------------------------------------- BN folding, tiled conv
@pytest.mark.parametrize("bias", [True, False])
def test_fold_batchnorm_vs_conv_then_bn(bias):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(4, 6, 3, padding=1, bias=bias).double()
    bn = torch.nn.BatchNorm2d(6, eps=1e-3).double()
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-1, 1)
    bn.eval()
    x = torch.randn(2, 4, 7, 7, dtype=torch.float64)
    exp = bn(conv(x)).detach()
    cb = conv.bias.detach().numpy() if bias else None
    w2, b2 = tl.conv.fold_batchnorm(
        conv.weight.detach().numpy(),
        cb,
        bn.running_mean.numpy(),
        bn.running_var.numpy(),
        bn.weight.detach().numpy(),
        bn.bias.detach().numpy(),
        1e-3,
    )
    assert_close(tl.conv.conv2d(x.numpy(), w2, b2, padding=1), exp, "float64")
    w32, b32 = tl.conv.fold_batchnorm(
        conv.weight.detach().float().numpy(),
        None if cb is None else cb.astype(np.float32),
        *(t.float().numpy() for t in (bn.running_mean, bn.running_var)),
        bn.weight.detach().float().numpy(),
        bn.bias.detach().float().numpy(),
        1e-3,
    )
    assert w32.dtype == np.float32
    assert_close(tl.conv.conv2d(x.float().numpy(), w32, b32, padding=1), exp.float(), "float32")
    with pytest.raises(ValueError, match=r"bn_var: expected shape \(6,\)"):
        tl.conv.fold_batchnorm(np.zeros((6, 4, 3, 3)), None, np.zeros(6), np.zeros(5), np.ones(6), np.zeros(6), 1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_tiled_conv_matches_and_bounds_workspace(backend):
    x, w, b, s, p, d, g = conv_case((2, 4, 13, 11, 6, 3, (2, 1), 1, 1, 2), "float32")
    full = tl.conv.conv2d(x, w, b, s, p, d, g, backend=backend)
    for rows in (1, 2, 5, 100):
        assert_close(tl.conv.conv2d_tiled(x, w, b, s, p, d, g, rows_per_tile=rows, backend=backend), full, "float32")
    one_row = tl.conv.im2col_workspace_bytes(x.shape, w.shape, s, p, d, g, rows=1)
    assert tl.conv.im2col_workspace_bytes(x.shape, w.shape, s, p, d, g) == one_row * full.shape[2]
    assert one_row == 2 * 4 * 9 * full.shape[3] * 4
    got = tl.conv.conv2d_tiled(x, w, b, s, p, d, g, max_workspace_bytes=3 * one_row, backend=backend)
    assert_close(got, full, "float32")
    with pytest.raises(MemoryError, match="max_workspace_bytes"):
        tl.conv.conv2d_tiled(x, w, b, s, p, d, g, max_workspace_bytes=one_row - 1)


def test_bench_helpers_run_small():
    from tinylearn.conv import bench

    x, w, b = bench.layer_arrays(3, 4, 8, 3, batch=1)
    assert x.shape == (1, 3, 8, 8) and w.shape == (4, 3, 3, 3)
    assert 0.0 <= bench.im2col_share(x, w, 1, 1, "numpy", repeat=1) <= 1.0
    run = bench._fwd_bwd(x, w, b, np.ones((1, 4, 8, 8), np.float32), 1, 1, "numpy")
    dx, dw, db = run()
    assert dx.shape == x.shape and dw.shape == w.shape and db.shape == b.shape
    assert {name for name, *_ in bench.LAYERS} >= {"3x3 64->64 @56", "1x1 64->256 @56", "7x7/2 3->64 @224"}


# ---------------------------------------------------------------- issue 18: direct 1x1 path, batch 0/1, transposes
EDGE_CASES = [
    (2, 6, 5, 4, 9, 1, 1, 0, 1, 3),  # pointwise with groups: direct batched matmul
    (1, 4, 6, 7, 8, 1, 1, 0, 1, 1),  # pointwise, batch 1
    (1, 3, 6, 6, 4, 3, 1, 1, 1, 1),  # batch 1
    (3, 4, 9, 9, 5, 1, 2, 0, 1, 1),  # 1x1 stride 2: not pointwise, goes through im2col
    (2, 3, 9, 8, 4, 3, 3, 2, 2, 1),  # stride 3 with dilation: the generic-stride gather
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", EDGE_CASES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_conv2d_edge_cases_vs_torch(backend, case, dtype):
    x, w, b, s, p, d, g = conv_case(case, dtype, seed=7)
    y, cols = tl.conv.conv2d_forward(x, w, b, s, p, d, g, backend=backend)
    gy = np.random.default_rng(8).standard_normal(y.shape).astype(dtype)
    ey, edx, edw, edb = _torch_conv(x, w, b, s, p, d, g, gy)
    assert_close(y, ey, dtype)
    for c in (cols, None):  # the forward's columns, or recomputed
        dx, dw, db = tl.conv.conv2d_backward(gy, x, w, s, p, d, g, backend=backend, cols=c)
        red = gy.size // gy.shape[1]
        assert_close(dx, edx, dtype)
        assert_close(dw, edw, dtype, reduction_size=red)
        assert_close(db, edb, dtype, reduction_size=red)
        assert dx.dtype == dw.dtype == db.dtype == np.dtype(dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("k,p", [(1, 0), (3, 1)])
def test_conv2d_empty_batch(backend, k, p):
    x = np.zeros((0, 4, 6, 6), np.float32)
    w = np.ones((5, 4, k, k), np.float32)
    b = np.arange(5, dtype=np.float32)
    y, cols = tl.conv.conv2d_forward(x, w, b, 1, p, backend=backend)
    ey = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), 1, p).numpy()
    assert y.shape == ey.shape == (0, 5, 6, 6)
    dx, dw, db = tl.conv.conv2d_backward(np.zeros_like(y), x, w, 1, p, backend=backend, cols=cols)
    assert dx.shape == x.shape and np.array_equal(dw, np.zeros_like(w)) and np.array_equal(db, np.zeros(5))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("k,p", [(1, 0), (3, 1)])
def test_conv2d_noncontiguous_grad_and_weight(backend, k, p):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((3, 8, 6, 2, 5)).astype(np.float32)[:, ::2, :, 1, :]  # strided channels, sliced W
    w = rng.standard_normal((k, k, 4, 6)).astype(np.float32).transpose(3, 2, 0, 1)  # [6, 4, k, k] transposed view
    y, cols = tl.conv.conv2d_forward(x, w, None, 1, p, backend=backend)
    gy = rng.standard_normal(y.shape[::-1]).astype(np.float32).T  # Fortran-ordered grad
    dx, dw, db = tl.conv.conv2d_backward(gy, x, w, 1, p, backend=backend, cols=cols)
    tx, tw = torch.tensor(np.ascontiguousarray(x), requires_grad=True), torch.tensor(w.copy(), requires_grad=True)
    ty = F.conv2d(tx, tw, None, 1, p)
    ty.backward(torch.from_numpy(np.ascontiguousarray(gy)))
    assert_close(y, ty, "float32")
    assert_close(dx, tx.grad, "float32")
    assert_close(dw, tw.grad, "float32", reduction_size=gy.size // gy.shape[1])


def test_transpose01_numpy_and_cpp_agree():
    from tinylearn.conv.conv2d import transpose01

    a = np.random.default_rng(10).standard_normal((4, 3, 5)).astype(np.float32)
    b = np.arange(4, dtype=np.float32)
    exp = a.transpose(1, 0, 2) + b[None, :, None]
    for be in ["numpy"] + (["cpp"] if cpp_available() else []):
        got = transpose01(a, b, be)
        assert got.flags.c_contiguous and np.array_equal(got, exp)
    assert np.array_equal(transpose01(a.astype(np.float16), None, "cpp"), a.astype(np.float16).transpose(1, 0, 2))


@pytest.mark.skipif(not cpp_available(), reason="tinylearn._C.conv not built")
def test_bench_im2col_stats_and_v0_forward():
    from tinylearn.conv import bench

    x, w, b = bench.layer_arrays(3, 4, 9, 3, batch=2)
    st = bench.im2col_stats(x, w, 2, 1, "cpp", "v1", repeat=1)
    assert 0.0 <= st["share"] <= 1.0 and st["gbs"] > 0 and st["gemm_gflops"] > 0
    cols_bytes = 4 * (3 * 9) * (2 * 5 * 5)  # [C*kh*kw, N*OH*OW] fp32 for 9x9, stride 2, pad 1 -> 5x5
    assert np.isclose(st["gbs"] * st["t_cols"] * 1e9, x.nbytes + cols_bytes)
    v2 = bench.im2col_stats(x, w, 2, 1, "cpp", repeat=1)  # the implicit GEMM: no columns, GFLOP/s of the forward
    assert v2["share"] == 0.0 and v2["gbs"] is None and v2["gemm_gflops"] > 0
    flops = 2 * 4 * 27 * 2 * 25
    assert np.isclose(v2["gemm_gflops"] * v2["t_all"] * 1e9, flops)
    for ver in ("v0", "v1", "v2"):
        y = tl.conv.conv2d(x, w, b, 2, 1, backend="cpp", version=ver)
        assert_close(y, tl.conv.conv2d(x, w, b, 2, 1), "float32", reduction_size=27)
    pw = bench.im2col_stats(*bench.layer_arrays(4, 6, 5, 1, batch=1)[:2], 1, 0, "cpp", "v1", repeat=1)
    assert pw["share"] == 0.0  # the 1x1 layer's forward builds no columns


def test_conv2d_paths_are_registry_versions():
    """Every conv2d path is a version of op conv.conv2d (and its backward); a version the backend lacks is a
    ValueError naming ``version`` and listing the backend's versions; backend/version are keyword-only."""
    assert tl.backends.versions("conv.conv2d", "cpp") == ["auto", "v0", "v1", "v2", "v3"]
    assert tl.backends.versions("conv.conv2d_backward") == tl.backends.versions("conv.conv2d")
    assert tl.backends.versions("conv.conv2d", "numpy") == ["default"]
    x, w, b, s, p, d, g = conv_case(CASES[0], "float32")
    with pytest.raises(ValueError, match=r"version: 'v3' .*numpy.*\['default'\]"):
        tl.conv.conv2d(x, w, backend="numpy", version="v3")
    with pytest.raises(ValueError, match=r"version: 'v7'"):
        tl.conv.conv2d_forward(x, w, version="v7")
    gy = np.ones((2, 6, 9, 7), np.float32)
    with pytest.raises(ValueError, match=r"version: 'v2' .*numpy"):
        tl.conv.conv2d_backward(gy, x, w, 1, 1, backend="numpy", version="v2")
    with pytest.raises(TypeError):
        tl.conv.conv2d(x, w, b, s, p, d, g, "numpy")  # backend is keyword-only


@pytest.mark.skipif(not cpp_available(), reason="tinylearn._C.conv not built")
def test_conv2d_pin_with_backends_use():
    """``backends.use`` pins what a call naming no backend runs (here: numpy's im2col path, which keeps its
    columns, instead of cpp auto's implicit GEMM for 32 output channels); a named backend is not affected."""
    x, w, b, s, p, d, g = conv_case((2, 3, 8, 8, 32, 3, 1, 1, 1, 1), "float32")
    y_auto, cols = tl.conv.conv2d_forward(x, w, b, s, p, d, g)
    assert cols is None  # cpp auto: v2 from 32 output channels per group
    with tl.backends.use("conv.conv2d", backend="numpy"):
        y_np, cols = tl.conv.conv2d_forward(x, w, b, s, p, d, g)
        assert cols is not None
        assert tl.conv.conv2d_forward(x, w, b, s, p, d, g, backend="cpp", version="v2")[1] is None
    assert_close(y_np, y_auto, "float32", reduction_size=27)
    with tl.backends.use("conv.conv2d", backend="cpp", version="v1"):
        assert tl.conv.conv2d_forward(x, w, b, s, p, d, g)[1] is not None
