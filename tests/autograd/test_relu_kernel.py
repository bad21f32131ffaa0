"""ReLU forward/backward of cpp_src/kernels_relu.cpp (_C.kernels.relu_forward / relu_backward) and the autograd ReLU
that uses them (tinylearn/autograd/ops_elementwise.py), checked bit for bit against torch.

ReLU is a select, so every path (scalar, avx2, avx512 where the CPU has them) must give torch's exact bits:
relu(NaN) = NaN, relu(-0.0) = -0.0, relu(-inf) = 0, and threshold_backward(g, y, 0) = 0 where y <= 0 (g = NaN or inf
there included), g where y > 0 or y is NaN. Layouts: C, Fortran, transposed, strided and broadcast views; the
result keeps the input's layout.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tinylearn as tl
import tinylearn.autograd.ops_elementwise as E
from tinylearn import backends
from tinylearn.autograd import gradcheck
from tinylearn.autograd.ops_elementwise import relu_array, relu_backward_array
from tinylearn.backends import load_C
from tinylearn.testing import make_layouts

K = load_C("kernels")
SPECIALS = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 5e-324, -5e-324, 1.0, -1.0, 3e38, -3e38]


def available_paths() -> list[str]:
    paths = ["scalar"]
    if K.vec_isa() in ("avx2", "avx512"):
        paths.append("avx2")
    if K.vec_isa() == "avx512":
        paths.append("avx512")
    return paths


@pytest.fixture(params=available_paths())
def path(request, monkeypatch) -> str:
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", request.param)
    assert K.relu_isa() == request.param
    return request.param


def bits_equal(got: np.ndarray, want: np.ndarray) -> None:
    """Exact equality, NaN payloads and the sign of zero included."""
    assert got.shape == want.shape and got.dtype == want.dtype
    u = np.uint32 if got.dtype == np.float32 else np.uint64
    g, w = np.ascontiguousarray(got).view(u), np.ascontiguousarray(want).view(u)
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, (
        f"{bad.size} mismatches, first at {bad[0]}: got {got.ravel()[bad[0]]}, want {want.ravel()[bad[0]]}"
    )


def with_specials(shape: tuple[int, ...], dtype: type, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape).astype(dtype)
    flat = a.reshape(-1)
    k = min(flat.size, len(SPECIALS))
    flat[rng.choice(flat.size, size=k, replace=False)] = np.array(SPECIALS[:k], dtype=dtype)
    return a


def torch_fwd(a: np.ndarray) -> np.ndarray:
    return torch.relu(torch.from_numpy(np.ascontiguousarray(a))).numpy()


def torch_bwd(g: np.ndarray, y: np.ndarray) -> np.ndarray:
    t = torch.ops.aten.threshold_backward(
        torch.from_numpy(np.ascontiguousarray(g)), torch.from_numpy(np.ascontiguousarray(y)), 0
    )
    return t.numpy()


SIZES = [0, 1, 3, 7, 8, 15, 16, 17, 31, 33, 100, 1000]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", SIZES)
def test_flat_forward_backward_bits_vs_torch(path, dtype, n):
    x = with_specials((n,), dtype, seed=n)
    out = np.empty_like(x)
    assert K.relu_forward(x, out) is True
    bits_equal(out, torch_fwd(x))
    g = with_specials((n,), dtype, seed=n + 1)
    y = with_specials((n,), dtype, seed=n + 2)  # y with NaN/-0/negatives: the backward sees any saved value
    o2 = np.empty_like(y)
    assert K.relu_backward(g, y, o2) is True
    bits_equal(o2, torch_bwd(g, y))


def test_specials_explicit(path):
    x = np.array([np.nan, -0.0, 0.0, -np.inf, np.inf, -1.0, 2.0, -1e-45], dtype=np.float32)
    y = relu_array(x)
    assert np.isnan(y[0]) and np.signbit(y[1]) and not np.signbit(y[2])
    np.testing.assert_array_equal(y[3:], np.array([0.0, np.inf, 0.0, 2.0, 0.0], dtype=np.float32))
    g = np.array([1, 2, 3, 4, 5, np.nan, 7, np.inf], dtype=np.float32)
    d = relu_backward_array(g, y)
    np.testing.assert_array_equal(d, np.array([1, 0, 0, 0, 5, 0, 7, 0], dtype=np.float32))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(128, 512), (5, 17), (3, 4, 33)])
def test_layouts_vs_torch(path, dtype, shape):
    for layout, a in make_layouts(shape, dtype, seed=3):
        y = relu_array(a)
        bits_equal(y, torch_fwd(a))
        if a.flags.c_contiguous or a.flags.f_contiguous:
            assert y.strides == a.strides, layout  # the output keeps the input's layout
        for _glayout, g in make_layouts(shape, dtype, seed=7):
            bits_equal(relu_backward_array(g, y), torch_bwd(g, y))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_transposed_and_mixed_layouts(path, dtype):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 40)).astype(dtype)
    for x in (a.T, np.asfortranarray(a), a[:, 3:37], a[::2], a.T[5:30]):
        y = relu_array(x)
        bits_equal(y, torch_fwd(x))
        if x.flags.f_contiguous and not x.flags.c_contiguous:
            assert y.flags.f_contiguous
        for g in (
            rng.standard_normal(x.shape).astype(dtype),
            np.asfortranarray(rng.standard_normal(x.shape).astype(dtype)),
        ):
            bits_equal(relu_backward_array(g, y), torch_bwd(g, y))
            bits_equal(relu_backward_array(g[::1], np.asfortranarray(y)), torch_bwd(g, y))


def test_kernel_declines_unsupported_layouts_and_fallback_matches(path):
    rng = np.random.default_rng(1)
    base = rng.standard_normal((6, 8, 10)).astype(np.float32)
    x = base[:, ::2, 1:]  # 3-D, not contiguous: neither flat nor 2-D
    out = np.zeros_like(x)
    assert K.relu_forward(x, out) is False
    assert not out.any()  # nothing written
    bits_equal(relu_array(x), torch_fwd(x))
    g = np.asfortranarray(rng.standard_normal((8, 6)).astype(np.float32))
    y = relu_array(rng.standard_normal((8, 6)).astype(np.float32))  # C layout vs g's F layout: fast axes differ
    assert K.relu_backward(g, y, np.empty_like(y)) is False
    bits_equal(relu_backward_array(g, y), torch_bwd(g, y))


def test_other_dtypes_fall_back():
    for dt in (np.int32, np.int64, np.float16):
        x = np.arange(-5, 5, dtype=dt)
        y = relu_array(x)
        assert y.dtype == dt
        np.testing.assert_array_equal(y, torch.relu(torch.from_numpy(x)).numpy())


def test_large_threaded_path(path):
    x = with_specials((1 << 20) + 5, np.float32, seed=9)  # >= 2 * grain elements: the OpenMP split
    bits_equal(relu_array(x), torch_fwd(x))
    g = with_specials(x.shape, np.float32, seed=10)
    y = with_specials(x.shape, np.float32, seed=11)
    bits_equal(relu_backward_array(g, y), torch_bwd(g, y))
    big = np.asfortranarray(with_specials((1100, 1000), np.float64, seed=12))[:, :999]  # 2-D rows, threaded
    bits_equal(relu_array(big), torch_fwd(big))


def test_kernel_argument_errors():
    x = np.zeros((3, 4), np.float32)
    with pytest.raises(ValueError, match="out shape"):
        K.relu_forward(x, np.zeros((4, 3), np.float32))
    with pytest.raises(ValueError, match="dtype"):
        K.relu_forward(x, np.zeros((3, 4), np.float64))
    with pytest.raises(ValueError, match="float32 or float64"):
        K.relu_forward(np.zeros(3, np.int32), np.zeros(3, np.int32))
    ro = np.zeros((3, 4), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        K.relu_forward(x, ro)
    with pytest.raises(ValueError, match="y shape"):
        K.relu_backward(x, np.zeros((3, 5), np.float32), x.copy())


@pytest.mark.parametrize("shapes", [((4, 5), (5,)), ((2, 1, 3), (4, 1)), ((6,), ())])
def test_autograd_broadcast_vs_torch(path, shapes):
    rng = np.random.default_rng(2)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    ta, tb = tl.Tensor(a, requires_grad=True), tl.Tensor(b, requires_grad=True)
    pa, pb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    w = rng.standard_normal(np.broadcast_shapes(a.shape, b.shape)).astype(np.float32)
    ((ta + tb).relu() * tl.Tensor(w)).sum().backward()
    (torch.relu(pa + pb) * torch.from_numpy(w)).sum().backward()
    bits_equal((ta + tb).relu().data, torch.relu(pa + pb).detach().numpy())
    np.testing.assert_allclose(ta.grad.data, pa.grad.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(tb.grad.data, pb.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_gradcheck_fp64(path):
    rng = np.random.default_rng(4)
    x = rng.uniform(-1, 1, (5, 7))
    x[np.abs(x) < 0.05] = 0.5  # keep the finite differences away from the kink at 0
    assert gradcheck(lambda t: (t.relu() * t).sum() + t.T.relu().mean(), (tl.Tensor(x, requires_grad=True),))
    f = rng.uniform(0.1, 1, (6, 3)) * np.sign(rng.uniform(-1, 1, (6, 3)))
    assert gradcheck(lambda t: t.T.relu().exp().sum() + (t * 2).relu().sum(), (tl.Tensor(f, requires_grad=True),))


@pytest.mark.parametrize("kernel", [True, False])
def test_backward_matches_torch(kernel):
    """By default (the C++ select, or numpy's exact select) relu_backward_array equals torch's threshold_backward
    bit for bit, non-finite values included; pinned to numpy "mul" (g * (y > 0), the A/B baseline) it agrees
    wherever g and y are finite."""
    assert backends.resolve("autograd.relu_backward", args=(np.ones(2), np.ones(2)))[0] == "cpp"
    pin = {} if kernel else {"backend": "numpy", "version": "mul"}
    with backends.use("autograd.relu_backward", **pin):
        _check_backward(kernel)


def test_relu_ops_are_registered():
    """Both ReLU directions are registry ops with numpy and cpp backends (numpy's backward has the A/B baseline)."""
    assert backends.versions("autograd.relu") == {"numpy": ["default"], "cpp": ["default"]}
    assert backends.versions("autograd.relu_backward") == {"numpy": ["select", "mul"], "cpp": ["select"]}
    assert E.relu_backward_array is relu_backward_array
    with backends.use("autograd.relu", backend="numpy"):
        assert backends.resolve("autograd.relu", args=(np.ones(2),))[0] == "numpy"


def _check_backward(kernel: bool) -> None:
    rng = np.random.default_rng(20)
    for dt in (np.float32, np.float64):
        g = rng.standard_normal((7, 33)).astype(dt)
        y = np.asfortranarray(np.maximum(rng.standard_normal((7, 33)), 0).astype(dt))
        y[0, :3] = -0.0
        if kernel:
            g[1, :4] = [np.nan, np.inf, -np.inf, np.nan]
            y[1, :2] = 0.0  # NaN / inf gradient where y <= 0: torch gives 0
            y[2, 5] = np.nan  # NaN output: torch passes g
        u = np.uint64 if dt == np.float64 else np.uint32
        got, want = relu_backward_array(g, y), torch_bwd(g, y)
        if kernel:
            np.testing.assert_array_equal(np.ascontiguousarray(got).view(u), np.ascontiguousarray(want).view(u))
        else:
            np.testing.assert_array_equal(got, want)
