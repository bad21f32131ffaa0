"""GroupNorm kernels (cpp_src/kernels_groupnorm.cpp behind ``kernels.group_norm`` / ``group_norm_backward``) and the
numpy reference, against torch.nn.functional.group_norm and torch autograd; tl.nn.functional.group_norm (GroupNormFn)
on the kernel path, fp64 gradcheck, the forced CPU feature paths, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from threadpoolctl import threadpool_limits

import tinylearn as tl
from tinylearn import backends
from tinylearn.autograd import gradcheck
from tinylearn.kernels import cpu as cpu_k
from tinylearn.kernels import ops_group_norm as gn_ops
from tinylearn.kernels import reference
from tinylearn.nn import functional_norm
from tinylearn.testing import assert_close

HAVE_C = backends.C_available("kernels")
BACKENDS = ["numpy"] + (["cpp"] if HAVE_C else [])
LEVELS = ("scalar", "avx2", "avx512")
needs_c = pytest.mark.skipif(not HAVE_C, reason="tinylearn._C.kernels not built")

# (x shape, groups): the benchmark's shape, odd sizes, N=1, 2-D / 3-D / 5-D, one group, one channel per group
SHAPES = [
    ((8, 32, 16, 16), 8),
    ((2, 6, 5, 7), 3),
    ((1, 6, 5, 7), 2),
    ((3, 4, 9), 2),
    ((2, 6, 2, 3, 5), 3),
    ((4, 12), 4),
    ((2, 4, 3, 3), 1),
    ((2, 4, 3, 3), 4),
]


def _data(shape: tuple[int, ...], dtype: str, seed: int = 0, affine: bool = True) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 2 + 3).astype(dtype)  # an offset mean: centring matters
    c = shape[1]
    w = rng.standard_normal(c).astype(dtype) if affine else None
    b = rng.standard_normal(c).astype(dtype) if affine else None
    return x, w, b, rng.standard_normal(shape).astype(dtype)


def _torch(x: np.ndarray, g: int, w: np.ndarray | None, b: np.ndarray | None, dy: np.ndarray) -> list[np.ndarray]:
    """torch's y, dx, dw, db (dw/db None without affine)."""
    tx = torch.tensor(x, requires_grad=True)
    tw = None if w is None else torch.tensor(w, requires_grad=True)
    tb = None if b is None else torch.tensor(b, requires_grad=True)
    y = F.group_norm(tx, g, tw, tb, eps=1e-5)
    y.backward(torch.from_numpy(dy))
    return [y.detach().numpy(), tx.grad.numpy()] + [None if t is None else t.grad.numpy() for t in (tw, tb)]


def _red(x: np.ndarray, g: int) -> int:
    """Values per statistic (the tolerance widens for long reductions, as DESIGN.md's table says)."""
    return x.size // x.shape[0] // g


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("shape", "groups"), SHAPES)
@pytest.mark.parametrize("affine", [True, False])
def test_forward_backward_match_torch(backend: str, dtype: str, shape: tuple[int, ...], groups: int, affine: bool):
    x, w, b, dy = _data(shape, dtype, seed=len(shape) + groups, affine=affine)
    ty, tdx, tdw, tdb = _torch(x, groups, w, b, dy)
    y, mean, rstd = gn_ops.group_norm(x, groups, w, b, 1e-5, backend=backend, return_stats=True)
    assert y.dtype == x.dtype and mean.shape == rstd.shape == (shape[0], groups)
    m = _red(x, groups)
    xg = x.reshape(shape[0], groups, -1).astype(np.float64)
    assert_close(mean, xg.mean(axis=-1), dtype, reduction_size=m)
    assert_close(rstd, 1 / np.sqrt(xg.var(axis=-1) + 1e-5), dtype, reduction_size=m)
    assert_close(y, ty, dtype, reduction_size=m)
    dx, dw, db = gn_ops.group_norm_backward(dy, x, groups, w, mean, rstd, backend=backend)
    assert dx.shape == x.shape and dw.shape == db.shape == (shape[1],)
    assert_close(dx, tdx, dtype, reduction_size=m)
    if affine:
        per_channel = x.size // shape[1]
        assert_close(dw, tdw, dtype, reduction_size=per_channel)
        assert_close(db, tdb, dtype, reduction_size=per_channel)


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_contiguous_input_and_gradient(backend: str) -> None:
    """A transposed x, a strided weight and a transposed dy are read as their logical values."""
    rng = np.random.default_rng(3)
    base = rng.standard_normal((5, 7, 6, 2)).astype(np.float32)
    x = base.transpose(3, 2, 1, 0)  # [2, 6, 7, 5], Fortran-like strides
    wide = rng.standard_normal(12).astype(np.float32)
    w, b = wide[::2], wide[1::2]
    dy = rng.standard_normal((5, 7, 6, 2)).astype(np.float32).transpose(3, 2, 1, 0)
    assert not x.flags.c_contiguous and not w.flags.c_contiguous and not dy.flags.c_contiguous
    ty, tdx, tdw, tdb = _torch(np.ascontiguousarray(x), 3, w.copy(), b.copy(), np.ascontiguousarray(dy))
    y, mean, rstd = gn_ops.group_norm(x, 3, w, b, backend=backend, return_stats=True)
    assert_close(y, ty, "float32", reduction_size=70)
    dx, dw, db = gn_ops.group_norm_backward(dy, x, 3, w, mean, rstd, backend=backend)
    for got, want, n in ((dx, tdx, 70), (dw, tdw, 70), (db, tdb, 70)):
        assert_close(got, want, "float32", reduction_size=n)


@needs_c
def test_cpp_matches_the_numpy_reference_float64() -> None:
    x, w, b, dy = _data((3, 12, 4, 5), "float64", seed=11)
    x3, dy3 = x.reshape(3, 12, 20), dy.reshape(3, 12, 20)
    got = cpu_k.group_norm(x3, w, b, 4, 1e-5)
    want = reference.group_norm(x3, w, b, 4, 1e-5)
    for a, e in zip(got, want):
        assert_close(a, e, "float64")
    gb = cpu_k.group_norm_backward(dy3, x3, w, got[1], got[2], 4)
    wb = reference.group_norm_backward(dy3, x3, w, want[1], want[2], 4)
    for a, e in zip(gb, wb):
        assert_close(a, e, "float64")


@needs_c
@pytest.mark.parametrize(("shape", "groups"), [((8, 32, 16, 16), 8), ((2, 6, 5, 7), 3), ((1, 3, 17), 3)])
def test_forced_cpu_feature_paths(monkeypatch: pytest.MonkeyPatch, shape: tuple[int, ...], groups: int) -> None:
    """TINYLEARN_CPU_FEATURES picks the compiled copy (scalar is always there); every copy matches torch and the
    copies agree to rounding (they differ only in summation order)."""
    x, w, b, dy = _data(shape, "float32", seed=5)
    ty, tdx, tdw, tdb = _torch(x, groups, w, b, dy)
    m = _red(x, groups)
    results = {}
    for level in LEVELS:
        monkeypatch.setenv("TINYLEARN_CPU_FEATURES", level)
        path = cpu_k.group_norm_path()
        if level == "scalar":
            assert path == "scalar"
        y, mean, rstd = gn_ops.group_norm(x, groups, w, b, backend="cpp", return_stats=True)
        dx, dw, db = gn_ops.group_norm_backward(dy, x, groups, w, mean, rstd, backend="cpp")
        assert_close(y, ty, "float32", reduction_size=m, msg=path)
        assert_close(dx, tdx, "float32", reduction_size=m, msg=path)
        assert_close(dw, tdw, "float32", reduction_size=x.size // shape[1], msg=path)
        assert_close(db, tdb, "float32", reduction_size=x.size // shape[1], msg=path)
        results[path] = (y, dx)
    for y, dx in results.values():
        assert_close(y, results["scalar"][0], "float32", reduction_size=m)
        assert_close(dx, results["scalar"][1], "float32", reduction_size=m)


@needs_c
def test_threads_give_the_same_bits_and_match_torch() -> None:
    """Above 2 x 128 Ki elements the kernels split the (n, g) items over OpenMP threads; each item is computed by one
    thread and dweight/dbias are summed after the loop in a fixed order, so any thread count gives the same bits."""
    x, w, b, dy = _data((4, 32, 48, 48), "float32", seed=13)
    x3, dy3 = x.reshape(4, 32, -1), dy.reshape(4, 32, -1)
    out = {}
    for n in (1, 2, 3):
        with threadpool_limits(n):
            fwd = cpu_k.group_norm(x3, w, b, 8, 1e-5)
            out[n] = fwd + cpu_k.group_norm_backward(dy3, x3, w, fwd[1], fwd[2], 8)
    for n in (2, 3):
        for got, want in zip(out[n], out[1]):
            np.testing.assert_array_equal(got, want)
    ty, tdx, tdw, tdb = _torch(x, 8, w, b, dy)
    m = _red(x, 8)
    assert_close(out[2][0].reshape(x.shape), ty, "float32", reduction_size=m)
    assert_close(out[2][3].reshape(x.shape), tdx, "float32", reduction_size=m)
    assert_close(out[2][4], tdw, "float32", reduction_size=x.size // 32)
    assert_close(out[2][5], tdb, "float32", reduction_size=x.size // 32)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("affine", [True, False])
def test_tensor_group_norm_takes_the_kernel_and_matches_torch(dtype: str, affine: bool) -> None:
    """tl.nn.functional.group_norm on a float32/float64 Tensor runs the registered kernel (the C++ one when built);
    forward and all three gradients match torch, on a non-contiguous (transposed) input too."""
    x, w, b, dy = _data((4, 6, 5, 7), dtype, seed=9, affine=affine)
    assert functional_norm.group_norm_path(x, w, b) == (("cpp", "default") if HAVE_C else ("numpy", "default"))
    ty, tdx, tdw, tdb = _torch(x, 3, w, b, dy)
    xt = tl.Tensor(x.transpose(0, 1, 3, 2).copy().transpose(0, 1, 3, 2), requires_grad=True)  # non-contiguous view
    wt = None if w is None else tl.Tensor(w, requires_grad=True)
    bt = None if b is None else tl.Tensor(b, requires_grad=True)
    y = tl.nn.functional.group_norm(xt, 3, wt, bt)
    (y * tl.Tensor(dy)).sum().backward()
    assert_close(y.data, ty, dtype, reduction_size=70)
    assert_close(xt.grad.data, tdx, dtype, reduction_size=70)
    if affine:
        assert_close(wt.grad.data, tdw, dtype, reduction_size=140)
        assert_close(bt.grad.data, tdb, dtype, reduction_size=140)


def test_tensor_group_norm_numpy_pin_and_other_dtypes_keep_working() -> None:
    """A ``backends.use`` pin on numpy runs the reference; mixed dtypes take GroupNormFn's own numpy code."""
    x, w, b, dy = _data((2, 4, 3, 3), "float32", seed=4)
    ty = _torch(x, 2, w, b, dy)[0]
    with backends.use("kernels.group_norm", backend="numpy"):
        assert functional_norm.group_norm_path(x, w, b)[0] == "numpy"
        y = tl.nn.functional.group_norm(tl.Tensor(x), 2, tl.Tensor(w), tl.Tensor(b))
    assert_close(y.data, ty, "float32")
    assert functional_norm.group_norm_path(x, w.astype(np.float64), b) is None
    y64w = tl.nn.functional.group_norm(tl.Tensor(x), 2, tl.Tensor(w.astype(np.float64)), tl.Tensor(b))
    assert_close(y64w.data, ty, "float32")


def test_gradcheck_fp64_through_group_norm() -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 6, 3, 2))
    w, b = rng.standard_normal(6), rng.standard_normal(6)
    assert gradcheck(lambda x, w, b: tl.nn.functional.group_norm(x, 3, w, b), (x, w, b))
    assert gradcheck(lambda x: tl.nn.functional.group_norm(x, 2), (rng.standard_normal((3, 4, 5)),))
    assert gradcheck(lambda x, w: tl.nn.GroupNorm(3, 6)(x) * w.reshape(6, 1), (rng.standard_normal((2, 6, 4)), w))


def test_bad_input() -> None:
    x = np.zeros((2, 6, 4), np.float32)
    with pytest.raises(ValueError, match="not divisible by 4 groups"):
        tl.nn.functional.group_norm(tl.Tensor(x), 4)
    with pytest.raises(ValueError, match="num_groups: 6 channels .* not divisible by 4 groups"):
        gn_ops.group_norm(x, 4)
    with pytest.raises(ValueError, match="num_groups: must be a positive int, got 0"):
        gn_ops.group_norm(x, 0)
    with pytest.raises(ValueError, match=r"weight: expected shape \(6,\) for 6 channels, got \(4,\)"):
        gn_ops.group_norm(x, 3, np.ones(4, np.float32))
    with pytest.raises(ValueError, match="x: group_norm needs >= 2 dims"):
        gn_ops.group_norm(np.zeros(6, np.float32), 3)
    with pytest.raises(ValueError, match=r"mean: shape \(2, 2\) must be \(2, 3\)"):
        gn_ops.group_norm_backward(x, x, 3, None, np.zeros((2, 2), np.float32), np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError, match="x"):
        gn_ops.group_norm(x.astype(np.int32), 3)


@needs_c
def test_cpp_kernel_checks_its_arguments() -> None:
    C = backends.load_C("kernels")
    x = np.zeros((2, 6, 4), np.float32)
    with pytest.raises(ValueError, match="group_norm_forward: 6 channels not divisible by num_groups 4"):
        C.group_norm_forward(x, None, None, 4, 1e-5)
    with pytest.raises(ValueError, match="num_groups must be >= 1, got 0"):
        C.group_norm_forward(x, None, None, 0, 1e-5)
    with pytest.raises(ValueError, match=r"weight shape \(5,\) must be \(6,\)"):
        C.group_norm_forward(x, np.ones(5, np.float32), None, 3, 1e-5)
    with pytest.raises(ValueError, match="x must be 3-D"):
        C.group_norm_forward(x.reshape(12, 4, 1, 1), None, None, 3, 1e-5)
    with pytest.raises(ValueError, match=r"rstd shape \(2,\) must be \(2, 3\)"):
        C.group_norm_backward(x, x, None, np.zeros((2, 3), np.float32), np.zeros(2, np.float32), 3)
    with pytest.raises(ValueError, match="eps must be >= 0"):
        C.group_norm_forward(x, None, None, 3, -1.0)
