"""im2col / col2im vs torch.nn.functional.unfold / fold: bit-exact fp32, every backend, every layout."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tinylearn as tl
from tinylearn.backends import load_C
from tinylearn.conv import cpp_available
from tinylearn.testing import make_layouts, numba_available

BACKENDS = [
    "numpy",
    pytest.param("numba", marks=pytest.mark.skipif(not numba_available(), reason="numba not installed")),
    pytest.param("cpp", marks=pytest.mark.skipif(not cpp_available(), reason="tinylearn._C.conv not built")),
]

# (kernel, stride, padding, dilation) incl. non-square everything
GRID = [
    (1, 1, 0, 1),
    (3, 1, 1, 1),
    (3, 2, 1, 1),
    (3, 1, 0, 2),
    (2, 2, 0, 1),
    ((2, 3), (1, 2), (1, 0), (2, 1)),
    ((3, 1), (2, 1), (0, 1), 1),
    (5, 3, 2, 1),
    ((1, 4), 1, (0, 2), (1, 2)),
    (2, 3, 1, 1),  # stride > kernel: gaps between windows
    (1, 2, 0, 1),
    (2, 1, 3, 1),  # padding > kernel: all-zero columns
]
SHAPES = [(2, 3, 9, 7), (1, 2, 6, 11)]


def _unfold(x, k, s, p, d):
    return F.unfold(torch.from_numpy(np.ascontiguousarray(x)), k, d, p, s).numpy()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("k,s,p,d", GRID)
@pytest.mark.parametrize("shape", SHAPES)
def test_im2col_bit_exact(backend, k, s, p, d, shape):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    got = tl.conv.im2col(x, k, s, p, d, backend=backend)
    exp = _unfold(x, k, s, p, d)
    assert got.shape == exp.shape and got.dtype == np.float32
    assert np.array_equal(got, exp)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("k,s,p,d", GRID)
@pytest.mark.parametrize("shape", SHAPES)
def test_col2im_bit_exact(backend, k, s, p, d, shape):
    exp_cols = _unfold(np.zeros(shape, np.float32), k, s, p, d)
    cols = np.random.default_rng(1).standard_normal(exp_cols.shape).astype(np.float32)
    got = tl.conv.col2im(cols, shape[2:], k, s, p, d, backend=backend)
    exp = F.fold(torch.from_numpy(cols), shape[2:], k, d, p, s).numpy()
    assert got.shape == exp.shape
    assert np.array_equal(got, exp)  # same summation order as torch -> identical bits


@pytest.mark.parametrize("backend", BACKENDS)
def test_layouts_and_float64(backend):
    for name, x in make_layouts((2, 3, 8, 6), "float32"):
        got = tl.conv.im2col(x, (3, 2), 2, 1, (1, 2), backend=backend)
        assert np.array_equal(got, _unfold(x, (3, 2), 2, 1, (1, 2))), name
        back = tl.conv.col2im(got, (8, 6), (3, 2), 2, 1, (1, 2), backend=backend)
        exp = F.fold(torch.from_numpy(got), (8, 6), (3, 2), (1, 2), 1, 2).numpy()
        assert np.array_equal(back, exp), name
    x64 = np.random.default_rng(2).standard_normal((2, 2, 7, 7))
    assert np.array_equal(tl.conv.im2col(x64, 3, 1, 1, backend=backend), _unfold(x64, 3, 1, 1, 1))


def test_backends_agree_and_adjoint():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 4, 10, 9))
    avail = ["numpy"] + (["numba"] if numba_available() else []) + (["cpp"] if cpp_available() else [])
    for k, s, p, d in GRID[:6]:
        outs = [tl.conv.im2col(x, k, s, p, d, backend=b) for b in avail]
        for o in outs[1:]:
            assert np.array_equal(o, outs[0])
        cols = rng.standard_normal(outs[0].shape)
        backs = [tl.conv.col2im(cols, (10, 9), k, s, p, d, backend=b) for b in avail]
        for o in backs[1:]:
            assert np.array_equal(o, backs[0])
        # col2im is the adjoint of im2col: <im2col(x), c> == <x, col2im(c)>
        assert np.isclose(np.vdot(outs[0], cols), np.vdot(x, backs[0]), rtol=1e-12)


def test_unbatched_and_float16():
    x = np.random.default_rng(4).standard_normal((3, 5, 5)).astype(np.float16)
    got = tl.conv.im2col(x, 2)
    exp = F.unfold(torch.from_numpy(x.astype(np.float32))[None], 2)[0].numpy().astype(np.float16)
    assert got.dtype == np.float16 and np.array_equal(got, exp)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_input(backend):
    x = np.zeros((1, 2, 5, 5), np.float32)
    with pytest.raises(ValueError, match=r"kernel_size.*\(7, 7\).*\(5, 5\)"):
        tl.conv.im2col(x, 7, backend=backend)
    with pytest.raises(ValueError, match="stride.*0"):
        tl.conv.im2col(x, 3, stride=0, backend=backend)
    with pytest.raises(ValueError, match="dilation.*-1"):
        tl.conv.im2col(x, 3, dilation=-1, backend=backend)
    with pytest.raises(ValueError, match="padding"):
        tl.conv.im2col(x, 3, padding=-1, backend=backend)
    with pytest.raises(ValueError, match=r"x: expected a 4-D.*\(5, 5\)"):
        tl.conv.im2col(np.zeros((5, 5), np.float32), 3, backend=backend)
    with pytest.raises(ValueError, match=r"cols: dim 2"):
        tl.conv.col2im(np.zeros((1, 18, 10), np.float32), (5, 5), 3, backend=backend)
    with pytest.raises(ValueError, match=r"cols: dim 1"):
        tl.conv.col2im(np.zeros((1, 17, 9), np.float32), (5, 5), 3, backend=backend)
    with pytest.raises(TypeError, match="kernel_size"):
        tl.conv.im2col(x, "3", backend=backend)
    with pytest.raises(ValueError, match="backend"):
        tl.conv.im2col(x, 3, backend="cuda")


@pytest.mark.skipif(not cpp_available(), reason="tinylearn._C.conv not built")
def test_cpp_validates_before_touching_memory():
    C = load_C("conv")
    x = np.zeros((1, 2, 5, 5), np.float32)
    for args, pat in [
        (((7, 7), (1, 1), (0, 0), (1, 1)), "kernel_size"),
        (((3, 3), (0, 1), (0, 0), (1, 1)), "stride"),
        (((3, 3), (1, 1), (0, 0), (0, 1)), "dilation"),
        (((3, 3), (1, 1), (-1, 0), (1, 1)), "padding"),
    ]:
        with pytest.raises(ValueError, match=pat):
            C.im2col(x, *args)
    with pytest.raises(ValueError, match="C-contiguous"):
        C.im2col(np.zeros((1, 2, 5, 10), np.float32)[..., ::2], (3, 3), (1, 1), (0, 0), (1, 1))
    with pytest.raises(TypeError, match="float32 or float64"):
        C.im2col(x.astype(np.int32), (3, 3), (1, 1), (0, 0), (1, 1))
    with pytest.raises(ValueError, match="cols"):
        C.col2im(np.zeros((1, 18, 8), np.float32), (5, 5), (3, 3), (1, 1), (0, 0), (1, 1))
    with pytest.raises(ValueError, match="layout"):
        C.im2col(x, (3, 3), (1, 1), (0, 0), (1, 1), "NLK")


def test_import_is_lazy_about_numba():
    import subprocess
    import sys

    code = "import sys, tinylearn.conv; assert 'numba' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_grid_is_nontrivial():
    # every parameter takes more than one value somewhere in the grid (guards against a degenerate grid)
    for i in range(4):
        assert len({str(g[i]) for g in GRID}) > 2
    assert len(list(itertools.product(GRID, SHAPES))) >= 18


# ---------------------------------------------------------------- the C++ versions ladder (v0 -> v1)
needs_cpp = pytest.mark.skipif(not cpp_available(), reason="tinylearn._C.conv not built")
LADDER_GRID = GRID + [(3, 2, 3, 1), ((7, 7), 2, 3, 1), ((3, 3), (2, 3), (1, 2), (2, 1)), (4, 4, 1, 1)]


@needs_cpp
@pytest.mark.parametrize("version", ["v0", "v1"])
@pytest.mark.parametrize("k,s,p,d", LADDER_GRID)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cpp_versions_vs_v0_and_torch(version, k, s, p, d, dtype):
    """Every rung equals torch's unfold / fold bit for bit (both layouts) and therefore v0."""
    from tinylearn import backends

    C = backends.load_C("conv")
    shape = (3, 4, 11, 9)
    x = np.random.default_rng(2).standard_normal(shape).astype(dtype)
    kk, ss, pp, dd = (tl.conv._params.pair(v, n) for v, n in ((k, "k"), (s, "s"), (p, "p"), (d, "d")))
    exp = F.unfold(torch.from_numpy(x), kk, dd, pp, ss).numpy()
    got = C.im2col(x, kk, ss, pp, dd, "NKL", version)
    assert got.dtype == x.dtype and np.array_equal(got, exp)
    assert np.array_equal(got, C.im2col(x, kk, ss, pp, dd, "NKL", "v0"))
    knl = C.im2col(x, kk, ss, pp, dd, "KNL", version)
    assert np.array_equal(knl, exp.transpose(1, 0, 2).reshape(exp.shape[1], -1))
    g = np.random.default_rng(3).standard_normal(exp.shape).astype(dtype)
    fold = F.fold(torch.from_numpy(g), shape[2:], kk, dd, pp, ss).numpy()
    assert np.array_equal(C.col2im(g, shape[2:], kk, ss, pp, dd, "NKL", 0, version), fold)
    gk = np.ascontiguousarray(g.transpose(1, 0, 2).reshape(g.shape[1], -1))
    assert np.array_equal(C.col2im(gk, shape[2:], kk, ss, pp, dd, "KNL", shape[0], version), fold)


@needs_cpp
@pytest.mark.parametrize("version", ["v0", "v1"])
def test_cpp_versions_through_the_registry(version):
    from tinylearn import backends

    assert backends.versions("conv.im2col", "cpp") == ["v0", "v1"]
    x = np.random.default_rng(4).standard_normal((2, 3, 8, 9)).astype(np.float32)
    got = tl.conv.im2col(x[:, :, ::-1], 3, 2, 1, backend="cpp", version=version)  # non-contiguous input
    assert np.array_equal(got, _unfold(x[:, :, ::-1], 3, 2, 1, 1))
    back = tl.conv.col2im(got, (8, 9), 3, 2, 1, backend="cpp", version=version)
    exp = F.fold(torch.from_numpy(got), (8, 9), 3, 1, 1, 2).numpy()
    assert np.array_equal(back, exp)
    assert tl.conv.im2col(x[:0], 3, 1, 1, backend="cpp", version=version).shape == (0, 27, 72)
    with pytest.raises(ValueError, match="version"):
        tl.conv.im2col(x, 3, backend="cpp", version="v9")


@needs_cpp
def test_cpp_im2col_large_threaded_and_out_workspace():
    """Sizes above the threading threshold (threads over channels) and the out= workspace."""
    from tinylearn import backends

    C = backends.load_C("conv")
    x = np.random.default_rng(5).standard_normal((3, 17, 30, 31)).astype(np.float32)
    exp = F.unfold(torch.from_numpy(x), 3, 1, 1, 1).numpy()
    knl = exp.transpose(1, 0, 2).reshape(exp.shape[1], -1)
    out = np.full(knl.shape, np.nan, np.float32)
    res = C.im2col(x, (3, 3), (1, 1), (1, 1), (1, 1), "KNL", "v1", out)
    assert res is out or np.shares_memory(res, out)
    assert np.array_equal(out, knl)
    back = C.col2im(np.ascontiguousarray(knl), (30, 31), (3, 3), (1, 1), (1, 1), (1, 1), "KNL", 3, "v1")
    assert np.array_equal(back, F.fold(torch.from_numpy(exp), (30, 31), 3, 1, 1, 1).numpy())
    # a 1-channel input above the threading threshold: items are (channel, kernel row) / (channel, image) pairs
    x1 = np.random.default_rng(7).standard_normal((8, 1, 64, 60)).astype(np.float32)
    for k, s, p in [((3, 3), (1, 1), (1, 1)), ((7, 5), (2, 2), (3, 2))]:
        e1 = F.unfold(torch.from_numpy(x1), k, 1, p, s).numpy()
        assert np.array_equal(C.im2col(x1, k, s, p, (1, 1), "NKL", "v1"), e1)
        f1 = F.fold(torch.from_numpy(e1), (64, 60), k, 1, p, s).numpy()
        assert np.array_equal(C.col2im(e1, (64, 60), k, s, p, (1, 1), "NKL", 0, "v1"), f1)
    with pytest.raises(ValueError, match=r"out: .*float32.*shape \(153, 2790\)"):
        C.im2col(x, (3, 3), (1, 1), (1, 1), (1, 1), "KNL", "v1", np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError, match=r"out: "):
        C.im2col(x, (3, 3), (1, 1), (1, 1), (1, 1), "KNL", "v1", np.zeros(knl.shape, np.float64))
    with pytest.raises(TypeError, match=r"out: "):
        C.im2col(x, (3, 3), (1, 1), (1, 1), (1, 1), "KNL", "v1", [1.0])


@needs_cpp
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_transpose01_and_stream_copy(dtype):
    from tinylearn import backends

    C = backends.load_C("conv")
    rng = np.random.default_rng(6)
    for shape in [(5, 3, 7), (64, 4, 300), (0, 2, 3), (2, 0, 3)]:
        a = rng.standard_normal(shape).astype(dtype)
        b = rng.standard_normal(shape[0]).astype(dtype)
        assert np.array_equal(C.transpose01(a), a.transpose(1, 0, 2))
        assert np.array_equal(C.transpose01(a, b), a.transpose(1, 0, 2) + b[None, :, None])
    with pytest.raises(ValueError, match=r"bias: expected shape \(5,\)"):
        C.transpose01(np.zeros((5, 3, 7), dtype), np.zeros(4, dtype))
    with pytest.raises(ValueError, match=r"a: expected a 3-D"):
        C.transpose01(np.zeros((5, 3), dtype))
    src = rng.standard_normal(1 << 18).astype(dtype)
    dst = np.zeros_like(src)
    C.stream_copy(dst, src)
    assert np.array_equal(dst, src)
    with pytest.raises(ValueError, match="sizes differ"):
        C.stream_copy(dst[:-1], src)


def test_stream_copy_gbs_is_a_bandwidth():
    from tinylearn.conv import bench

    gbs = bench.stream_copy_gbs(nbytes=1 << 22, repeat=2)
    assert 0.1 < gbs < 10_000  # a copy of 4 MiB: anywhere from a slow VM to an HBM part
    with pytest.raises(ValueError, match="nbytes"):
        bench.stream_copy_gbs(nbytes=10)
