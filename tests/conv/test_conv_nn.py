"""The autograd path: tl.nn.functional.conv2d / pools (delegating to tinylearn.conv) and tl.nn.Conv2d training."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from _conv_cases import pinned

import tinylearn as tl
from tinylearn.conv import cpp_available
from tinylearn.conv import functional as CF
from tinylearn.testing import assert_close, numba_available

F = tl.nn.functional

AVAIL = ["numpy"] + (["numba"] if numba_available() else []) + (["cpp"] if cpp_available() else [])


@pytest.fixture(params=AVAIL)
def backend(request):
    with pinned(request.param):
        yield request.param


def _t(a, rg=True):
    return tl.Tensor(a, requires_grad=rg, dtype=str(a.dtype))


@pytest.mark.parametrize(
    "cfg",
    [
        dict(stride=1, padding=1, groups=1),
        dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2),
        dict(stride=1, padding=1, groups=4),
    ],
)
def test_functional_conv2d_vs_torch(backend, cfg):
    rng = np.random.default_rng(0)
    g = cfg["groups"]
    x = rng.standard_normal((2, 4, 7, 8)).astype(np.float32)
    w = rng.standard_normal((8, 4 // g, 3, 3)).astype(np.float32) * 0.3
    b = rng.standard_normal(8).astype(np.float32)
    tx, tw, tb = _t(x), _t(w), _t(b)
    y = F.conv2d(tx, tw, tb, **cfg)
    gy = rng.standard_normal(y.shape).astype(np.float32)
    y.backward(tl.Tensor(gy))
    X, W, B = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    Y = TF.conv2d(X, W, B, **cfg)
    Y.backward(torch.from_numpy(gy))
    assert_close(y.data, Y, "float32")
    assert_close(tx.grad.data, X.grad, "float32")
    assert_close(tw.grad.data, W.grad, "float32", reduction_size=2000)
    assert_close(tb.grad.data, B.grad, "float32", reduction_size=2000)
    assert tx.grad.data.dtype == np.float32 and tw.grad.data.dtype == np.float32


def test_gradcheck_fp64(backend):
    rng = np.random.default_rng(1)
    x = _t(rng.standard_normal((2, 4, 6, 5)))
    w = _t(rng.standard_normal((4, 2, 3, 2)))
    b = _t(rng.standard_normal(4))
    assert tl.autograd.gradcheck(lambda a, ww, bb: F.conv2d(a, ww, bb, (2, 1), 1, (1, 2), 2), [x, w, b])
    assert tl.autograd.gradcheck(lambda a: F.max_pool2d(a, 3, 2, 1), [x])
    assert tl.autograd.gradcheck(lambda a: F.avg_pool2d(a, (3, 2), 1, 1, count_include_pad=False), [x])
    assert tl.autograd.gradcheck(lambda a: F.avg_pool2d(a, 2), [x])


def test_pools_vs_torch():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    cases = [
        (F.max_pool2d, TF.max_pool2d, {}),
        (F.avg_pool2d, TF.avg_pool2d, {"count_include_pad": False}),
        (F.avg_pool2d, TF.avg_pool2d, {}),
    ]
    for fn, tfn, kw in cases:
        tx = _t(x)
        y = fn(tx, 3, 2, 1, **kw)
        gy = rng.standard_normal(y.shape).astype(np.float32)
        y.backward(tl.Tensor(gy))
        X = torch.tensor(x, requires_grad=True)
        Y = tfn(X, 3, 2, 1, **kw)
        Y.backward(torch.from_numpy(gy))
        assert_close(y.data, Y, "float32")
        assert_close(tx.grad.data, X.grad, "float32")


def test_nn_conv2d_training_matches_torch():
    """Same init, same data, 5 SGD steps of Conv-ReLU-MaxPool-Linear: losses and weights track torch."""
    tl.manual_seed(0)
    rng = np.random.default_rng(3)
    model = tl.nn.Sequential(
        tl.nn.Conv2d(1, 4, 3, padding=1),
        tl.nn.ReLU(),
        tl.nn.MaxPool2d(2),
        tl.nn.Conv2d(4, 4, 3, groups=2),
        tl.nn.AvgPool2d(2, padding=1),
        tl.nn.Flatten(),
        tl.nn.Linear(4 * 2 * 2, 3),
    )
    ref = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(4, 4, 3, groups=2),
        torch.nn.AvgPool2d(2, padding=1),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 2 * 2, 3),
    )
    with torch.no_grad():
        for (_, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
            q.copy_(torch.from_numpy(p.data))
    opt = tl.optim.SGD(model.parameters(), lr=0.1)
    topt = torch.optim.SGD(ref.parameters(), lr=0.1)
    X = rng.standard_normal((8, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 3, 8)
    for _ in range(5):
        opt.zero_grad()
        loss = F.cross_entropy(model(tl.Tensor(X)), tl.Tensor(y, dtype="int64"))
        loss.backward()
        opt.step()
        topt.zero_grad()
        tloss = TF.cross_entropy(ref(torch.from_numpy(X)), torch.from_numpy(y))
        tloss.backward()
        topt.step()
        assert abs(loss.item() - tloss.item()) < 1e-4
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        assert_close(p.data, q, "float32", atol=1e-4, rtol=1e-3, msg=n)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_one_max_pool2d_every_entry_point_vs_torch(backend, dtype):
    """F.max_pool2d, nn.MaxPool2d and tinylearn.conv.functional.max_pool2d are one function: direct C++ kernel for
    backend None/cpp, im2col windows for a pinned numpy/numba; all give torch's values and gradients."""
    rng = np.random.default_rng(4)
    x = rng.integers(0, 4, (2, 3, 9, 10)).astype(dtype)  # ties: the first maximum takes the gradient, like torch
    gy = rng.standard_normal((2, 3, 5, 5)).astype(dtype)
    X = torch.tensor(x, requires_grad=True)
    Y = TF.max_pool2d(X, 3, 2, 1)
    Y.backward(torch.from_numpy(gy))
    fp = pytest.importorskip("tinylearn.nn.functional_pool")
    for fn in (F.max_pool2d, CF.max_pool2d, fp.max_pool2d, lambda a, *ar: tl.nn.MaxPool2d(*ar)(a)):
        tx = _t(x)
        y = fn(tx, 3, 2, 1)
        y.backward(tl.Tensor(gy))
        np.testing.assert_array_equal(y.data, Y.detach().numpy())  # a max selects an input value: exact
        assert_close(tx.grad.data, X.grad, dtype, reduction_size=4)  # a pixel in up to 2x2 windows: order of sums
        direct = backend == "cpp" and CF._direct_pool_kernels() is not None
        assert isinstance(y.grad_fn, CF.MaxPool2dDirect if direct else CF.MaxPool2dFunction)
    t2 = _t(x)
    y2 = CF.max_pool2d_im2col(t2, 3, 2, 1)  # the im2col rung whatever the backend
    y2.backward(tl.Tensor(gy))
    assert isinstance(y2.grad_fn, CF.MaxPool2dFunction)
    np.testing.assert_array_equal(y2.data, Y.detach().numpy())
    assert_close(t2.grad.data, X.grad, dtype, reduction_size=4)


def test_bad_input_through_autograd():
    x = tl.Tensor(np.zeros((1, 4, 5, 5), np.float32))
    with pytest.raises(ValueError, match="groups"):
        F.conv2d(x, tl.Tensor(np.zeros((6, 1, 3, 3), np.float32)), groups=3)
    with pytest.raises(ValueError, match="kernel_size"):
        F.conv2d(x, tl.Tensor(np.zeros((6, 4, 7, 7), np.float32)))
    with pytest.raises(ValueError, match="weight"):
        F.conv2d(x, tl.Tensor(np.zeros((6, 4, 3), np.float32)))
    with pytest.raises(ValueError, match="stride"):
        F.max_pool2d(x, 2, stride=0)


def test_gradcheck_fp64_pointwise_and_stem(backend):
    """The direct 1x1 path (no im2col, cols=None saved) and a strided stem-like conv, through autograd."""
    rng = np.random.default_rng(2)
    x = _t(rng.standard_normal((2, 4, 5, 6)))
    w1 = _t(rng.standard_normal((6, 2, 1, 1)))
    b1 = _t(rng.standard_normal(6))
    assert tl.autograd.gradcheck(lambda a, ww, bb: F.conv2d(a, ww, bb, 1, 0, 1, 2), [x, w1, b1])
    w7 = _t(rng.standard_normal((3, 4, 3, 3)))
    assert tl.autograd.gradcheck(lambda a, ww: F.conv2d(a, ww, None, 2, 1), [x, w7])
    x1 = _t(rng.standard_normal((1, 4, 5, 6)))  # batch 1
    assert tl.autograd.gradcheck(lambda a, ww: F.conv2d(a, ww, None, 1, 1), [x1, w7])


@pytest.mark.skipif(not tl.backends.C_available("kernels"), reason="C++ extension not built")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_maxpool2x2_fast_path_first_max_and_nan(dtype):
    """The branch-free 2x2/2 kernel: value and flat index of the first maximum (row-major taps), the first NaN when
    a window holds one, the first tap of an all -inf window; ties, +-inf and NaN drawn on purpose."""
    K = tl.backends.load_C("kernels")
    rng = np.random.default_rng(7)
    for _ in range(50):
        x = rng.integers(-2, 3, (2, 3, 6, 8)).astype(dtype)
        u = rng.random(x.shape)
        x[u < 0.05], x[(u >= 0.05) & (u < 0.1)], x[(u >= 0.1) & (u < 0.12)] = np.nan, -np.inf, np.inf
        y, idx = K.maxpool2d_forward(x, 2, 2, 2, 2, 0, 0, 1, 1, 3, 4)
        win = x.reshape(2, 3, 3, 2, 4, 2).transpose(0, 1, 2, 4, 3, 5).reshape(2, 3, 3, 4, 4)
        isn = np.isnan(win)
        first = np.where(isn.any(-1), isn.argmax(-1), np.argmax(np.where(isn, -np.inf, win), -1))
        base = (np.arange(3)[:, None] * 16 + np.arange(4)[None, :] * 2)[None, None]
        np.testing.assert_array_equal(idx, base + first // 2 * 8 + first % 2)
        np.testing.assert_array_equal(y, np.take_along_axis(win, first[..., None], -1)[..., 0])
    xf = rng.standard_normal((2, 3, 6, 8)).astype(dtype)  # finite values: torch's values and indices
    ty, ti = torch.nn.functional.max_pool2d(torch.from_numpy(xf), 2, return_indices=True)
    y, idx = K.maxpool2d_forward(xf, 2, 2, 2, 2, 0, 0, 1, 1, 3, 4)
    np.testing.assert_array_equal(y, ty.numpy())
    np.testing.assert_array_equal(idx, ti.numpy())


def test_one_nd_stack_functions_and_modules():
    """One functional stack and one module family for every ndim (torch's _ConvNd pattern): the 2-D names are the
    N-d objects; modules keep torch's tuple attributes and the layers' repr."""
    from tinylearn.conv import functional_nd
    from tinylearn.nn import layers, layers_spatial

    assert CF.conv2d is functional_nd.conv2d is F.conv2d and CF.Conv2dFunction is functional_nd.ConvNdFunction
    assert CF.max_pool2d is functional_nd.max_pool2d_nd and CF.avg_pool2d is functional_nd.avg_pool2d_nd
    assert layers.Conv2d is layers_spatial.Conv2d is tl.nn.Conv2d
    fams = {
        layers_spatial._ConvNd: (tl.nn.Conv1d, tl.nn.Conv2d, tl.nn.Conv3d, tl.nn.ConvTranspose2d),
        layers_spatial._MaxPoolNd: (tl.nn.MaxPool1d, tl.nn.MaxPool2d, tl.nn.MaxPool3d),
        layers_spatial._AvgPoolNd: (tl.nn.AvgPool1d, tl.nn.AvgPool2d, tl.nn.AvgPool3d),
    }
    assert all(issubclass(c, base) for base, classes in fams.items() for c in classes)
    conv = tl.nn.Conv2d(1, 8, 3, padding=1)
    assert repr(conv) == "Conv2d(1, 8, kernel_size=(3, 3), stride=1, padding=1)"
    assert conv.stride == (1, 1) and conv.padding == (1, 1) and conv.weight.shape == (8, 1, 3, 3)
    x = np.random.default_rng(0).standard_normal((2, 1, 6, 6)).astype(np.float32)
    ref = torch.nn.Conv2d(1, 8, 3, padding=1)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(conv.weight.data))
        ref.bias.copy_(torch.from_numpy(conv.bias.data))
    assert_close(conv(tl.Tensor(x)).data, ref(torch.from_numpy(x)).detach(), "float32", reduction_size=9)
    y = tl.nn.AvgPool2d(2, divisor_override=3)(tl.Tensor(x))
    assert_close(y.data, TF.avg_pool2d(torch.from_numpy(x), 2, divisor_override=3), "float32", reduction_size=4)


@pytest.mark.skipif(not cpp_available(), reason="tinylearn._C.conv not built")
def test_conv2d_pin_governs_forward_and_backward():
    """A pin of conv.conv2d set around the forward also runs the backward (after the ``with`` block)."""
    rng = np.random.default_rng(3)
    x, w = (
        _t(rng.standard_normal((2, 3, 6, 6)).astype(np.float32)),
        _t(rng.standard_normal((32, 3, 3, 3)).astype(np.float32)),
    )
    with tl.backends.use("conv.conv2d", backend="numpy"):
        y = F.conv2d(x, w, None, 1, 1)
    assert y.grad_fn.args[2:4] == ("numpy", "default")
    y.sum().backward()
    X, W = torch.from_numpy(x.data).requires_grad_(), torch.from_numpy(w.data).requires_grad_()
    TF.conv2d(X, W, None, 1, 1).sum().backward()
    assert_close(x.grad.data, X.grad, "float32", reduction_size=288)
    assert_close(w.grad.data, W.grad, "float32", reduction_size=72)
