"""Issue 16, conv/pool breadth: conv1d/conv3d, conv_transpose1d/2d/3d, 1-d/2-d/3-d max/avg pools (ceil_mode,
return_indices, count_include_pad, divisor_override), max_unpool, adaptive pools, interpolate and their nn modules,
checked forward and backward against torch (fp32 and fp64, contiguous and strided inputs), by fp64 gradcheck, and
for clear errors on bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from _conv_cases import pinned

import tinylearn as tl
from tinylearn.autograd.gradcheck import gradcheck
from tinylearn.conv import cpp_available
from tinylearn.testing import assert_close

F = tl.nn.functional
nn = tl.nn

pytestmark = pytest.mark.filterwarnings("ignore:Using padding=.same. with even kernel:UserWarning")

BACKENDS = ["numpy"] + (["cpp"] if cpp_available() else [])


@pytest.fixture(params=BACKENDS)
def backend(request):
    with pinned(request.param):
        yield request.param


def _leaves(arrays, dtype, strided):
    """(tl leaf, tl input, torch leaf, torch input) per array; strided inputs are every other element of a leaf
    twice as long in the last dim (a non-contiguous view on both sides, the gradient lands in the leaf)."""
    out = []
    for a in arrays:
        a = a.astype(dtype)
        if strided:
            big = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), dtype=dtype)
            big[..., ::2] = a
            lt, lT = tl.Tensor(big, requires_grad=True, dtype=dtype), torch.tensor(big, requires_grad=True)
            xt, xT = lt[..., ::2], lT[..., ::2]
            assert not xt.data.flags.c_contiguous
        else:
            lt, lT = tl.Tensor(a, requires_grad=True, dtype=dtype), torch.tensor(a, requires_grad=True)
            xt, xT = lt, lT
        out.append((lt, xt, lT, xT))
    return out


def _compare(fn_tl, fn_torch, arrays, dtype="float32", strided=False, seed=0, extra=()):
    """Forward, indices (if a tuple comes back) and every input gradient vs torch."""
    rng = np.random.default_rng(seed)
    ls = _leaves(arrays, dtype, strided)
    y = fn_tl(*[v[1] for v in ls], *extra)
    Y = fn_torch(*[v[3] for v in ls], *[torch.from_numpy(np.asarray(e)) for e in extra])
    if isinstance(Y, tuple):
        assert isinstance(y, tuple) and len(y) == 2
        assert y[1].data.dtype == np.int64
        np.testing.assert_array_equal(y[1].data, Y[1].numpy())
        y, Y = y[0], Y[0]
    assert y.dtype == np.dtype(dtype), (y.dtype, dtype)
    red = max(int(np.prod(a.shape)) for a in arrays)
    assert_close(y.data, Y, dtype, reduction_size=red, msg="forward")
    g = rng.standard_normal(tuple(Y.shape)).astype(dtype)
    y.backward(tl.Tensor(g, dtype=dtype))
    Y.backward(torch.from_numpy(g))
    for i, (lt, _, lT, _) in enumerate(ls):
        assert lt.grad is not None, f"no gradient for input {i}"
        assert lt.grad.data.dtype == np.dtype(dtype)
        assert_close(lt.grad.data, lT.grad, dtype, reduction_size=10 * red, msg=f"grad of input {i}")


def _rand(rng, *shapes):
    return [rng.standard_normal(s) for s in shapes]


# ----------------------------------------------------------------------------------------- convolutions
CONV = [
    ("conv1d", (2, 4, 11), (6, 2, 3), dict(stride=2, padding=2, dilation=2, groups=2)),
    ("conv1d", (1, 3, 7), (5, 3, 7), dict()),  # kernel as long as the input
    ("conv1d", (3, 2, 9), (4, 2, 4), dict(padding="same", dilation=3)),  # asymmetric 'same' (odd total)
    ("conv1d", (2, 4, 10), (4, 1, 3), dict(groups=4, stride=3, padding="valid")),  # depthwise
    (
        "conv3d",
        (2, 4, 5, 6, 7),
        (6, 2, 2, 3, 2),
        dict(stride=(2, 1, 2), padding=(1, 0, 1), dilation=(2, 1, 1), groups=2),
    ),
    ("conv3d", (1, 3, 3, 4, 5), (2, 3, 1, 1, 1), dict()),  # pointwise
    ("conv3d", (2, 2, 4, 5, 3), (3, 2, 3, 3, 3), dict(padding=1, stride=2)),
]
CONVT = [
    ("conv_transpose1d", (2, 4, 9), (4, 3, 3), dict(stride=3, padding=1, output_padding=2, groups=2, dilation=2)),
    ("conv_transpose1d", (1, 3, 5), (3, 2, 4), dict()),
    (
        "conv_transpose2d",
        (2, 4, 5, 6),
        (4, 3, 3, 2),
        dict(stride=(2, 3), padding=(1, 0), output_padding=(1, 2), groups=2, dilation=(1, 2)),
    ),
    ("conv_transpose2d", (2, 4, 5, 6), (4, 3, 3, 3), dict(stride=1, output_padding=1, dilation=2)),  # op >= stride
    ("conv_transpose2d", (3, 2, 4, 3), (2, 5, 1, 1), dict(stride=2)),
    ("conv_transpose3d", (2, 4, 3, 2, 3), (4, 1, 2, 3, 2), dict(stride=2, padding=(0, 1, 0), groups=4)),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("strided", [False, True], ids=["contig", "strided"])
@pytest.mark.parametrize("case", CONV + CONVT, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}" if isinstance(c, tuple) else c)
def test_conv_vs_torch(backend, case, dtype, strided):
    name, xs, ws, kw = case
    rng = np.random.default_rng(1)
    oc = ws[0] if name.startswith("conv1d") or name.startswith("conv3d") else ws[1] * kw.get("groups", 1)
    x, w, b = _rand(rng, xs, ws, (oc,))
    _compare(
        lambda x, w, b: getattr(F, name)(x, w, b, **kw),
        lambda x, w, b: getattr(TF, name)(x, w, b, **kw),
        [x, w, b],
        dtype,
        strided,
    )


def test_conv_no_bias_and_unbatched():
    rng = np.random.default_rng(2)
    x, w = _rand(rng, (3, 9), (4, 3, 2))  # unbatched [C, L]
    _compare(lambda x, w: F.conv1d(x, w, stride=2), lambda x, w: TF.conv1d(x, w, stride=2), [x, w], "float64")
    x, w = _rand(rng, (3, 4, 5), (3, 2, 2, 2))
    _compare(
        lambda x, w: F.conv_transpose2d(x, w, stride=2, output_padding=1),
        lambda x, w: TF.conv_transpose2d(x, w, stride=2, output_padding=1),
        [x, w],
        "float64",
    )


def test_conv_transpose_is_adjoint_of_conv():
    """<conv(x), y> == <x, conv_transpose(y)> for the same weight (the definition conv_transpose is built from)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 4, 9, 8))
    w = rng.standard_normal((6, 2, 3, 2))
    kw = dict(stride=(2, 3), padding=(1, 1), dilation=(1, 2), groups=2)
    y = F.conv2d(tl.Tensor(x), tl.Tensor(w), **kw).data
    u = rng.standard_normal(y.shape)
    op = tuple(
        x.shape[2 + i]
        - ((y.shape[2 + i] - 1) * kw["stride"][i] - 2 * kw["padding"][i] + kw["dilation"][i] * (w.shape[2 + i] - 1) + 1)
        for i in range(2)
    )
    xt = F.conv_transpose2d(tl.Tensor(u), tl.Tensor(w), output_padding=op, **kw).data
    assert xt.shape == x.shape
    assert math.isclose(float((y * u).sum()), float((x * xt).sum()), rel_tol=1e-10)


def test_conv_gradcheck_fp64():
    rng = np.random.default_rng(4)
    x, w, b = _rand(rng, (1, 2, 5), (2, 1, 2), (2,))
    assert gradcheck(lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=1, dilation=2, groups=2), [x, w, b])
    x, w, b = _rand(rng, (1, 2, 3, 3, 3), (2, 1, 2, 2, 2), (2,))
    assert gradcheck(lambda x, w, b: F.conv3d(x, w, b, stride=2, padding=1, groups=2), [x, w, b])
    x, w, b = _rand(rng, (1, 2, 3), (2, 1, 3), (2,))
    assert gradcheck(lambda x, w, b: F.conv_transpose1d(x, w, b, stride=2, output_padding=1, groups=2), [x, w, b])
    x, w, b = _rand(rng, (1, 2, 3, 2), (2, 2, 2, 3), (2,))
    assert gradcheck(
        lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1, dilation=(1, 2)),
        [x, w, b],
    )


# ----------------------------------------------------------------------------------------- pooling
MAXPOOL = [
    ("max_pool1d", (2, 3, 10), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ("max_pool1d", (2, 3, 11), dict(kernel_size=4, dilation=2)),
    ("max_pool2d", (2, 3, 10, 9), dict(kernel_size=3, stride=2, padding=1, dilation=2, ceil_mode=True)),
    ("max_pool2d", (2, 3, 7, 8), dict(kernel_size=(2, 3), stride=(1, 2))),
    ("max_pool3d", (2, 3, 5, 8, 7), dict(kernel_size=(2, 3, 2), stride=(2, 2, 1), padding=(1, 1, 0), ceil_mode=True)),
    ("max_pool3d", (1, 2, 4, 4, 4), dict(kernel_size=2)),
]
AVGPOOL = [
    ("avg_pool1d", (2, 3, 10), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)),
    ("avg_pool1d", (2, 3, 10), dict(kernel_size=4, stride=3, ceil_mode=True)),
    ("avg_pool2d", (2, 3, 10, 9), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)),
    ("avg_pool2d", (2, 3, 10, 9), dict(kernel_size=(3, 2), stride=2, padding=1, divisor_override=5)),
    ("avg_pool2d", (2, 3, 10, 9), dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)),
    ("avg_pool3d", (2, 3, 6, 8, 7), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    (
        "avg_pool3d",
        (2, 3, 6, 8, 7),
        dict(kernel_size=(2, 3, 3), stride=(1, 2, 2), padding=(1, 1, 0), count_include_pad=False, ceil_mode=True),
    ),
    ("avg_pool3d", (1, 2, 4, 4, 4), dict(kernel_size=2, divisor_override=3)),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("strided", [False, True], ids=["contig", "strided"])
@pytest.mark.parametrize("indices", [False, True], ids=["values", "indices"])
@pytest.mark.parametrize("case", MAXPOOL, ids=lambda c: f"{c[0]}-{c[1]}-{sorted(c[2].items())}")
def test_max_pool_vs_torch(case, dtype, strided, indices):
    name, xs, kw = case
    x = np.random.default_rng(5).standard_normal(xs)
    kw = dict(kw, return_indices=indices)
    _compare(lambda x: getattr(F, name)(x, **kw), lambda x: getattr(TF, name)(x, **kw), [x], dtype, strided)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("strided", [False, True], ids=["contig", "strided"])
@pytest.mark.parametrize("case", AVGPOOL, ids=lambda c: f"{c[0]}-{c[1]}-{sorted(c[2].items())}")
def test_avg_pool_vs_torch(case, dtype, strided):
    name, xs, kw = case
    x = np.random.default_rng(6).standard_normal(xs)
    _compare(lambda x: getattr(F, name)(x, **kw), lambda x: getattr(TF, name)(x, **kw), [x], dtype, strided)


def test_max_pool_unbatched_and_nan():
    x = np.random.default_rng(7).standard_normal((3, 8, 6))  # unbatched [C, H, W]
    kw = dict(kernel_size=3, stride=2, ceil_mode=True, return_indices=True)
    _compare(lambda x: F.max_pool2d(x, **kw), lambda x: TF.max_pool2d(x, **kw), [x], "float64")
    x = np.random.default_rng(7).standard_normal((1, 1, 9))
    x[0, 0, 4] = np.nan
    y = F.max_pool1d(tl.Tensor(x), 3).data
    Y = TF.max_pool1d(torch.tensor(x), 3).numpy()
    np.testing.assert_array_equal(np.isnan(y), np.isnan(Y))  # NaN propagates like torch
    assert_close(y, Y, "float64")


INT_MAXPOOL = [
    ("max_pool2d", (2, 3, 7, 6), dict(kernel_size=2)),  # the 2-D floor-mode route (op conv.max_pool2d for floats)
    ("max_pool2d", (2, 3, 7, 6), dict(kernel_size=3, stride=2, padding=1)),
    ("max_pool2d", (3, 7, 6), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, return_indices=True)),
    ("max_pool2d", (2, 3, 7, 6), dict(kernel_size=2, dilation=2, padding=1, return_indices=True)),
    ("max_pool3d", (1, 2, 4, 7, 6), dict(kernel_size=(2, 3, 2), padding=(1, 1, 0), return_indices=True)),
]


@pytest.mark.parametrize("dtype", ["int64", "int32", "int16", "uint8", "int8"])
@pytest.mark.parametrize("case", INT_MAXPOOL, ids=lambda c: f"{c[0]}-{c[1]}-{sorted(c[2].items())}")
def test_max_pool_keeps_integer_dtype_like_torch(case, dtype):
    """torch's max_pool2d/3d keep an integer dtype (exact values, also at the dtype's extremes next to padding)."""
    name, xs, kw = case
    info = np.iinfo(dtype)
    x = np.random.default_rng(8).integers(info.min, info.max, size=xs, endpoint=True, dtype=dtype)
    x[..., :2, :2] = info.min  # a real minimum ties with the padding value: never pick the padding
    y = getattr(F, name)(tl.Tensor(x), **kw)
    ref = getattr(TF, name)(torch.from_numpy(x), **kw)
    ys, refs = (y, ref) if kw.get("return_indices") else ((y,), (ref,))
    for a, b in zip(ys, refs, strict=True):
        assert a.dtype == b.numpy().dtype
        np.testing.assert_array_equal(a.data, b.numpy())


@pytest.mark.parametrize("dtype", ["int64", "uint8"])
@pytest.mark.parametrize(
    "name, xs, arg",
    [("max_pool1d", (2, 3, 9), 2), ("adaptive_max_pool1d", (2, 3, 9), 4), ("adaptive_max_pool2d", (3, 7, 6), (3, 4)),
     ("adaptive_max_pool3d", (1, 2, 4, 7, 6), 2)],
)  # fmt: skip
def test_max_pools_torch_refuses_for_ints_keep_the_dtype(name, xs, arg, dtype):
    """torch has no integer kernel for these (NotImplementedError); tinylearn keeps the dtype and the values and
    indices equal torch's on the same data in float64 (exact for these small integers)."""
    x = np.random.default_rng(9).integers(0, 100, size=xs).astype(dtype)
    y, idx = getattr(F, name)(tl.Tensor(x), arg, return_indices=True)
    ref, ridx = getattr(TF, name)(torch.from_numpy(x.astype(np.float64)), arg, return_indices=True)
    assert y.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(y.data, ref.numpy().astype(dtype))
    np.testing.assert_array_equal(idx.data, ridx.numpy())
    assert nn.MaxPool2d(2)(tl.Tensor(x.reshape(-1, *x.shape[-2:]) if x.ndim > 3 else x)).dtype == np.dtype(dtype)


@pytest.mark.parametrize(
    "case",
    [
        ("adaptive_avg_pool1d", (2, 3, 10), 4),
        ("adaptive_avg_pool1d", (2, 3, 5), 7),  # output longer than the input: overlapping windows
        ("adaptive_avg_pool2d", (2, 3, 10, 9), (3, 4)),
        ("adaptive_avg_pool2d", (2, 3, 7, 5), (3, None)),
        ("adaptive_avg_pool2d", (3, 7, 5), 1),  # unbatched, global pooling
        ("adaptive_avg_pool3d", (1, 2, 5, 6, 7), (2, 3, 4)),
        ("adaptive_max_pool1d", (2, 3, 10), 4),
        ("adaptive_max_pool2d", (2, 3, 10, 9), (3, 4)),
        ("adaptive_max_pool2d", (2, 3, 5, 4), (7, 6)),
        ("adaptive_max_pool3d", (1, 2, 5, 6, 7), (2, 3, 4)),
    ],
    ids=str,
)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("strided", [False, True], ids=["contig", "strided"])
def test_adaptive_pool_vs_torch(case, dtype, strided):
    name, xs, out = case
    x = np.random.default_rng(8).standard_normal(xs)
    kw = {"return_indices": True} if "max" in name else {}
    _compare(lambda x: getattr(F, name)(x, out, **kw), lambda x: getattr(TF, name)(x, out, **kw), [x], dtype, strided)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "case",
    [
        ((2, 3, 8, 8), dict(kernel_size=2), None),
        ((2, 3, 9, 8), dict(kernel_size=3, stride=2, padding=1), (9, 8)),
        ((1, 2, 9, 7), dict(kernel_size=(3, 2), stride=(2, 3)), (1, 2, 9, 7)),
        ((2, 8, 6), dict(kernel_size=2), None),  # unbatched
    ],
    ids=str,
)
def test_max_unpool2d_vs_torch(case, dtype):
    xs, kw, osz = case
    x = np.random.default_rng(9).standard_normal(xs).astype(dtype)
    yt, it = TF.max_pool2d(torch.tensor(x), return_indices=True, **kw)
    ukw = {k: v for k, v in kw.items() if k != "dilation"}
    _compare(
        lambda y, i: F.max_unpool2d(y, i, output_size=osz, **ukw),
        lambda y, i: TF.max_unpool2d(y, i, output_size=osz, **ukw),
        [yt.numpy()],
        dtype,
        extra=(it.numpy(),),
    )


def test_max_unpool_roundtrip_with_tl_indices():
    x = np.random.default_rng(10).standard_normal((2, 3, 6, 9, 4))
    y, idx = F.max_pool3d(tl.Tensor(x), 2, return_indices=True)
    u = F.max_unpool3d(y, idx, 2, output_size=x.shape).data
    mask = u != 0
    np.testing.assert_array_equal(u[mask], x[mask])  # the maxima go back where they came from
    assert mask.sum() == y.data.size
    y1, i1 = F.max_pool1d(tl.Tensor(x[:, :, 0, 0]), 2, return_indices=True)
    assert_close(
        F.max_unpool1d(y1, i1, 2).data,
        TF.max_unpool1d(*TF.max_pool1d(torch.tensor(x[:, :, 0, 0]), 2, return_indices=True), 2),
    )


def test_pool_gradcheck_fp64():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, 2, 3, 4, 3))
    assert gradcheck(lambda x: F.max_pool3d(x, 2, stride=(1, 2, 2), padding=1, ceil_mode=True), [x])
    x = rng.standard_normal((2, 2, 7))
    assert gradcheck(lambda x: F.avg_pool1d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False), [x])
    assert gradcheck(lambda x: F.max_pool1d(x, 2, dilation=3), [x])
    x = rng.standard_normal((1, 2, 5, 4))
    assert gradcheck(lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, divisor_override=4), [x])
    assert gradcheck(lambda x: F.adaptive_avg_pool2d(x, (3, 3)), [x])
    assert gradcheck(lambda x: F.adaptive_max_pool2d(x, (2, 3)), [x])
    x = rng.standard_normal((1, 2, 3, 3, 2))
    assert gradcheck(lambda x: F.avg_pool3d(x, 2, 1, 1, count_include_pad=False), [x])
    y, idx = F.max_pool2d(tl.Tensor(rng.standard_normal((1, 2, 4, 4))), 2, return_indices=True)
    assert gradcheck(lambda y: F.max_unpool2d(y, idx, 2), [y.data])


# ----------------------------------------------------------------------------------------- interpolate
INTERP = [
    ((2, 3, 5, 6), dict(size=(7, 13), mode="bilinear", align_corners=False)),
    ((2, 3, 5, 6), dict(size=(7, 13), mode="bilinear", align_corners=True)),
    ((2, 3, 5, 6), dict(scale_factor=1.7, mode="bilinear")),
    ((2, 3, 8, 9), dict(size=(3, 4), mode="bilinear", align_corners=False)),  # downsampling
    ((2, 3, 5, 6), dict(scale_factor=1.5, mode="bilinear", recompute_scale_factor=True)),
    ((2, 3, 1, 6), dict(size=(1, 4), mode="bilinear", align_corners=True)),
    ((2, 3, 5, 6), dict(scale_factor=(2.5, 0.7), mode="nearest")),
    ((2, 3, 5, 6), dict(size=(7, 4))),
    ((2, 3, 5, 6), dict(scale_factor=2)),
    ((2, 3, 5, 6), dict(size=(9, 11), mode="nearest-exact")),
    ((2, 3, 7), dict(size=12, mode="linear", align_corners=True)),
    ((2, 3, 7), dict(scale_factor=0.5, mode="nearest")),
    ((1, 2, 3, 4, 5), dict(size=(5, 3, 7), mode="trilinear")),
    ((1, 2, 3, 4, 5), dict(scale_factor=2, mode="nearest")),
    ((2, 3, 8, 9), dict(size=(3, 4), mode="area")),
    ((2, 3, 5, 6), dict(size=(7, 13), mode="bicubic")),
    ((2, 3, 5, 6), dict(scale_factor=0.6, mode="bicubic", align_corners=True)),
    ((2, 3, 8, 9), dict(size=(3, 4), mode="bicubic")),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("strided", [False, True], ids=["contig", "strided"])
@pytest.mark.parametrize("case", INTERP, ids=lambda c: f"{c[0]}-{sorted(c[1].items())}")
def test_interpolate_vs_torch(case, dtype, strided):
    xs, kw = case
    x = np.random.default_rng(12).standard_normal(xs)
    _compare(lambda x: F.interpolate(x, **kw), lambda x: TF.interpolate(x, **kw), [x], dtype, strided)


@pytest.mark.parametrize("mode", ["nearest", "bilinear", "bicubic"])
def test_interpolate_taps_path_long_axes_and_non_finite_inputs(mode):
    """Axes up to poolnd.DENSE_INTERP_MAX resample as dense matrix products; a longer axis, or a non-finite value
    (0 * inf would spread NaN along the row), takes the per-tap path: forward and backward still equal torch's."""
    from tinylearn.conv import poolnd

    rng = np.random.default_rng(14)
    x = rng.standard_normal((1, 2, 3, poolnd.DENSE_INTERP_MAX + 44))
    _compare(lambda x: F.interpolate(x, size=(5, 333), mode=mode), lambda x: TF.interpolate(x, size=(5, 333),
             mode=mode), [x], "float32", False)  # fmt: skip
    x = rng.standard_normal((1, 2, 5, 6))
    x[0, 1, 2, 3] = np.inf
    y = F.interpolate(tl.Tensor(x), size=(9, 11), mode=mode).numpy()
    yt = TF.interpolate(torch.from_numpy(x), size=(9, 11), mode=mode).numpy()
    assert np.array_equal(np.isnan(y), np.isnan(yt)) and np.array_equal(np.isinf(y), np.isinf(yt))
    assert np.isfinite(y[0, 0]).all()  # the other channel is untouched by the inf
    ok = np.isfinite(yt)
    np.testing.assert_allclose(y[ok], yt[ok], rtol=1e-6, atol=1e-9)


def test_interpolate_gradcheck_fp64():
    rng = np.random.default_rng(13)
    x = rng.standard_normal((1, 2, 3, 4))
    assert gradcheck(lambda x: F.interpolate(x, size=(5, 3), mode="bilinear", align_corners=False), [x])
    assert gradcheck(lambda x: F.interpolate(x, scale_factor=1.5, mode="bilinear", align_corners=True), [x])
    assert gradcheck(lambda x: F.interpolate(x, size=(5, 7), mode="nearest"), [x])
    assert gradcheck(lambda x: F.interpolate(x, size=(2, 5), mode="bicubic"), [x])
    x = rng.standard_normal((1, 1, 2, 3, 2))
    assert gradcheck(lambda x: F.interpolate(x, size=(3, 2, 4), mode="trilinear"), [x])


# ----------------------------------------------------------------------------------------- modules
MODULES = [
    (lambda M: M.Conv1d(4, 6, 3, stride=2, padding=1, groups=2), (2, 4, 9)),
    (lambda M: M.Conv1d(4, 6, 4, padding="same", padding_mode="reflect"), (2, 4, 9)),
    (lambda M: M.Conv1d(4, 6, 3, padding=2, padding_mode="circular", bias=False), (2, 4, 9)),
    (lambda M: M.Conv3d(4, 6, (2, 3, 3), padding=1, padding_mode="replicate"), (2, 4, 4, 5, 6)),
    (lambda M: M.Conv3d(2, 4, 3, stride=2, dilation=(1, 2, 1)), (1, 2, 5, 7, 5)),
    (lambda M: M.ConvTranspose1d(4, 6, 3, stride=2, output_padding=1, groups=2), (2, 4, 9)),
    (lambda M: M.ConvTranspose2d(4, 6, 3, stride=2, padding=1, bias=False), (2, 4, 5, 6)),
    (lambda M: M.ConvTranspose3d(4, 2, 2, stride=2), (2, 4, 3, 2, 3)),
    (lambda M: M.MaxPool1d(3, 2, ceil_mode=True), (2, 4, 10)),
    (lambda M: M.MaxPool3d(2, ceil_mode=True), (2, 4, 5, 5, 3)),
    (lambda M: M.AvgPool1d(3, 2, 1, count_include_pad=False), (2, 4, 10)),
    (lambda M: M.AvgPool3d(3, 2, 1, ceil_mode=True), (2, 4, 5, 5, 3)),
    (lambda M: M.AdaptiveAvgPool2d((3, None)), (2, 4, 7, 5)),
    (lambda M: M.AdaptiveMaxPool2d(3), (2, 4, 7, 5)),
    (lambda M: M.AdaptiveAvgPool1d(3), (2, 4, 7)),
    (lambda M: M.Upsample(scale_factor=2, mode="bilinear", align_corners=False), (2, 4, 3, 5)),
    (lambda M: M.Upsample(size=(5, 7)), (2, 4, 3, 5)),
    (lambda M: M.UpsamplingBilinear2d(scale_factor=2), (2, 4, 3, 5)),
    (lambda M: M.UpsamplingNearest2d(size=4), (2, 4, 3, 5)),
]


@pytest.mark.parametrize("case", range(len(MODULES)))
def test_modules_vs_torch(case):
    mk, shape = MODULES[case]
    torch.manual_seed(case)
    m, tm = mk(nn), mk(torch.nn)
    assert type(m).__name__ == type(tm).__name__
    names = [n for n, _ in m.named_parameters()]
    assert names == [n for n, _ in tm.named_parameters()]
    for (_, p), (_, tp) in zip(m.named_parameters(), tm.named_parameters(), strict=True):
        assert p.shape == tuple(tp.shape)
        p.data[...] = tp.detach().numpy()
    x = np.random.default_rng(case).standard_normal(shape).astype(np.float32)
    xt, X = tl.Tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    y, Y = m(xt), tm(X)
    assert_close(y.data, Y, "float32", reduction_size=2000)
    y.sum().backward()
    Y.sum().backward()
    assert_close(xt.grad.data, X.grad, "float32", reduction_size=2000)
    for (n, p), (_, tp) in zip(m.named_parameters(), tm.named_parameters(), strict=True):
        assert_close(p.grad.data, tp.grad, "float32", reduction_size=2000, msg=n)


@pytest.mark.parametrize(
    "mk",
    [
        lambda M: M.Conv1d(6, 8, 5, groups=2),
        lambda M: M.Conv3d(4, 8, (3, 2, 3)),
        lambda M: M.ConvTranspose1d(6, 8, 5, groups=2),
        lambda M: M.ConvTranspose2d(8, 16, 3),
        lambda M: M.ConvTranspose3d(4, 6, 2),
    ],
)
def test_conv_module_init_like_torch(mk):
    """torch's default init: weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = weight.shape[1]*prod(k)."""
    m, tm = mk(nn), mk(torch.nn)
    assert m.weight.shape == tuple(tm.weight.shape) and m.bias.shape == tuple(tm.bias.shape)
    assert m.weight.dtype == np.float32
    bound = 1 / math.sqrt(int(np.prod(tm.weight.shape[1:])))
    w = m.weight.data
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.8 * bound
    assert abs(w.std() - bound / math.sqrt(3)) < 0.25 * bound / math.sqrt(3)
    assert np.abs(m.bias.data).max() <= bound


def test_conv_transpose_module_output_size():
    m, tm = nn.ConvTranspose2d(4, 6, 3, stride=2), torch.nn.ConvTranspose2d(4, 6, 3, stride=2)
    for p, tp in zip(m.parameters(), tm.parameters(), strict=True):
        p.data[...] = tp.detach().numpy()
    x = np.random.default_rng(14).standard_normal((2, 4, 5, 6)).astype(np.float32)
    for osz in [(11, 13), (12, 14), (2, 6, 12, 13)]:
        assert_close(m(tl.Tensor(x), output_size=osz).data, tm(torch.tensor(x), output_size=osz), "float32")
    with pytest.raises(ValueError, match="output_size"):
        m(tl.Tensor(x), output_size=(13, 13))


def test_maxpool_module_return_indices_feeds_unpool():
    pool, unpool = nn.MaxPool1d(2, return_indices=True), nn.MaxUnpool2d(2)
    y, idx = pool(tl.Tensor(np.arange(8.0).reshape(1, 1, 8)))
    np.testing.assert_array_equal(idx.data, [[[1, 3, 5, 7]]])
    y2, i2 = nn.MaxPool3d(2, return_indices=True)(tl.Tensor(np.arange(8.0).reshape(1, 1, 2, 2, 2)))
    assert y2.data.item() == 7.0 and i2.data.item() == 7
    x = np.random.default_rng(15).standard_normal((1, 2, 5, 7)).astype(np.float32)
    y, idx = F.max_pool2d(tl.Tensor(x), 2, return_indices=True)
    Y, IDX = TF.max_pool2d(torch.tensor(x), 2, return_indices=True)
    np.testing.assert_array_equal(idx.data, IDX.numpy())
    assert_close(unpool(y, idx, output_size=(5, 7)).data, torch.nn.MaxUnpool2d(2)(Y, IDX, output_size=(5, 7)))


# ----------------------------------------------------------------------------------------- bad input
def _t(*shape):
    return tl.Tensor(np.zeros(shape, dtype=np.float32))


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: F.conv1d(_t(2, 3, 8), _t(4, 2, 3)), ValueError, "weight.*input channels"),
        (lambda: F.conv1d(_t(2, 4, 8), _t(5, 2, 3), groups=2), ValueError, "groups"),
        (lambda: F.conv1d(_t(2, 4, 8), _t(4, 4, 3), _t(3)), ValueError, "bias"),
        (lambda: F.conv1d(_t(2, 4, 2), _t(4, 4, 3)), ValueError, "kernel_size"),
        (lambda: F.conv1d(_t(2, 4, 8), _t(4, 4, 3), padding="same", stride=2), ValueError, "padding"),
        (lambda: F.conv1d(_t(2, 4, 8), _t(4, 4, 3), padding="full"), ValueError, "padding"),
        (lambda: F.conv1d(_t(2, 4, 8, 8), _t(4, 4, 3)), ValueError, "input"),
        (lambda: F.conv1d(_t(2, 4, 8), _t(4, 4, 3), stride=0), ValueError, "stride"),
        (lambda: F.conv1d(_t(2, 4, 8), _t(4, 4, 3), stride=(1, 2)), TypeError, "stride"),
        (lambda: F.conv3d(_t(1, 3, 4, 4, 4), _t(2, 2, 1, 1, 1)), ValueError, "weight.*input channels"),
        (lambda: F.conv3d(_t(1, 3, 4, 4, 4), _t(2, 3, 3, 3)), ValueError, "weight"),
        (lambda: F.conv3d(_t(1, 2, 4, 4, 4), _t(2, 2, 3, 3, 3), dilation=(1, 0, 1)), ValueError, "dilation"),
        (lambda: F.conv_transpose2d(_t(1, 3, 4, 4), _t(4, 2, 3, 3)), ValueError, "weight.*input channels"),
        (
            lambda: F.conv_transpose2d(_t(1, 4, 4, 4), _t(4, 2, 3, 3), stride=2, output_padding=2),
            ValueError,
            "output_padding",
        ),
        (lambda: F.conv_transpose1d(_t(1, 4, 4), _t(4, 2, 3), output_padding=1), ValueError, "output_padding"),
        (lambda: F.conv_transpose1d(_t(1, 4, 2), _t(4, 2, 1), padding=3), ValueError, "output size"),
        (lambda: F.conv_transpose1d(_t(1, 6, 4), _t(6, 2, 3), groups=4), ValueError, "groups"),
        (lambda: F.conv_transpose1d(_t(1, 6, 4), _t(6, 2, 3), _t(3)), ValueError, "bias"),
        (lambda: F.max_pool1d(_t(1, 2, 8), 3, padding=2), ValueError, "padding"),
        (lambda: F.max_pool3d(_t(1, 2, 2, 8, 8), 3), ValueError, "kernel_size"),
        (lambda: F.max_pool2d(_t(1, 2, 8, 8), 2, ceil_mode=True, stride=0), ValueError, "stride"),
        (lambda: F.avg_pool3d(_t(2, 4, 4), 2), ValueError, "input"),
        (lambda: F.avg_pool3d(_t(1, 2, 4, 4, 4), 2, divisor_override=0), ValueError, "divisor_override"),
        (lambda: F.avg_pool1d(_t(1, 2, 8), (2, 2)), TypeError, "kernel_size"),
        (lambda: F.adaptive_avg_pool2d(_t(1, 2, 4, 4), (0, 2)), ValueError, "output_size"),
        (lambda: F.adaptive_max_pool2d(_t(1, 2, 4, 4), (1, 2, 3)), TypeError, "output_size"),
        (lambda: F.max_unpool2d(_t(1, 1, 2, 2), np.full((1, 1, 2, 2), 16), 2), ValueError, "indices"),
        (lambda: F.max_unpool2d(_t(1, 1, 2, 2), np.zeros((1, 1, 2, 2)), 2), TypeError, "indices"),
        (lambda: F.max_unpool2d(_t(1, 1, 2, 2), np.zeros((1, 1, 2, 3), np.int64), 2), ValueError, "indices"),
        (
            lambda: F.max_unpool2d(_t(1, 1, 2, 2), np.zeros((1, 1, 2, 2), np.int64), 2, output_size=(9, 4)),
            ValueError,
            "output_size",
        ),
        (lambda: F.interpolate(_t(1, 2, 4, 4), size=3, scale_factor=2), ValueError, "scale_factor"),
        (lambda: F.interpolate(_t(1, 2, 4, 4)), ValueError, "size"),
        (lambda: F.interpolate(_t(1, 2, 4, 4), size=3, align_corners=True), ValueError, "align_corners"),
        (lambda: F.interpolate(_t(1, 2, 4), size=3, mode="bilinear"), ValueError, "mode"),
        (lambda: F.interpolate(_t(1, 2, 4, 4), size=3, mode="cubic"), ValueError, "mode"),
        (lambda: F.interpolate(_t(1, 2, 4), size=3, mode="bicubic"), ValueError, "mode"),
        (lambda: F.interpolate(_t(1, 2, 4, 4), size=3, antialias=True), ValueError, "antialias"),
        (lambda: F.interpolate(_t(2, 4), size=3), ValueError, "input"),
        (lambda: F.interpolate(_t(1, 2, 4, 4), scale_factor=-1.0), ValueError, "scale_factor"),
        (lambda: F.interpolate(_t(1, 2, 4, 4), scale_factor=(2, 2, 2)), ValueError, "scale_factor"),
        (lambda: nn.Conv1d(4, 6, 3, groups=4), ValueError, "groups"),
        (lambda: nn.Conv3d(4, 6, 0), ValueError, "kernel_size"),
        (lambda: nn.Conv1d(4, 6, 3, padding_mode="mirror"), ValueError, "padding_mode"),
        (lambda: nn.ConvTranspose2d(4, 6, 3, padding="same"), ValueError, "padding"),
        (lambda: nn.ConvTranspose1d(0, 6, 3), ValueError, "in_channels"),
    ],
)
def test_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize(
    "name, xs, args, kw",
    [
        ("conv3d", (0, 4, 5, 6, 7), [(6, 2, 2, 3, 2)], dict(groups=2)),
        ("conv_transpose1d", (0, 4, 5), [(4, 3, 2)], dict(stride=2)),
        ("conv_transpose2d", (0, 4, 5, 3), [(4, 3, 2, 2)], dict()),
        ("max_pool3d", (0, 2, 4, 4, 4), [], dict(kernel_size=2, return_indices=True)),
        ("avg_pool1d", (0, 2, 5), [], dict(kernel_size=2, ceil_mode=True)),
        ("adaptive_max_pool2d", (0, 2, 5, 4), [], dict(output_size=3)),
        ("interpolate", (0, 2, 5, 4), [], dict(size=(7, 3), mode="bilinear")),
    ],
)
def test_empty_batch(backend, name, xs, args, kw):
    rng = np.random.default_rng(16)
    arrays = [np.zeros(xs)] + [rng.standard_normal(s) for s in args]
    _compare(lambda *a: getattr(F, name)(*a, **kw), lambda *a: getattr(TF, name)(*a, **kw), arrays, "float32")


def test_huge_stride_and_single_tap_dilation():
    """A stride beyond the padded input gives one window; a dilation on a 1-tap axis is unused (torch accepts both)."""
    rng = np.random.default_rng(17)
    x, w = _rand(rng, (2, 4, 9, 5, 3), (3, 4, 1, 2, 1))
    _compare(
        lambda x, w: F.conv3d(x, w, stride=2**40, dilation=(2**30, 3, 2**30)),
        lambda x, w: TF.conv3d(x, w, stride=2**40, dilation=(2**30, 3, 2**30)),
        [x, w],
        "float64",
    )


@pytest.mark.parametrize("which", ["input", "weight"])
def test_conv_partial_requires_grad(backend, which):
    """Only one of input/weight requires grad: the other gets none, the one asked for matches torch."""
    rng = np.random.default_rng(18)
    x, w = _rand(rng, (2, 4, 5, 6), (4, 3, 3, 2))
    for name, args in (("conv_transpose2d", (x, w)), ("conv3d", (x[:, :, None], np.moveaxis(w, 0, 1)[:, :, None]))):
        xt = tl.Tensor(args[0], requires_grad=which == "input")
        wt = tl.Tensor(args[1], requires_grad=which == "weight")
        X = torch.tensor(args[0], requires_grad=which == "input")
        W = torch.tensor(args[1], requires_grad=which == "weight")
        getattr(F, name)(xt, wt, stride=2).sum().backward()
        getattr(TF, name)(X, W, stride=2).sum().backward()
        got, other, ref = (xt, wt, X) if which == "input" else (wt, xt, W)
        assert other.grad is None
        assert_close(got.grad.data, ref.grad, "float64", msg=name)


@pytest.mark.parametrize(
    "xs, ws, kw",
    [
        ((2, 4, 7, 8), (6, 2, 4, 3), dict(padding="same", dilation=(1, 2), groups=2)),
        ((2, 4, 7, 8), (6, 4, 3, 3), dict(padding="valid", stride=2)),
        ((4, 7, 8), (6, 4, 3, 2), dict(padding=1, stride=(2, 1))),  # unbatched [C, H, W]
    ],
    ids=str,
)
def test_conv2d_string_padding_and_unbatched(backend, xs, ws, kw):
    rng = np.random.default_rng(19)
    x, w, b = _rand(rng, xs, ws, (ws[0],))
    _compare(lambda x, w, b: F.conv2d(x, w, b, **kw), lambda x, w, b: TF.conv2d(x, w, b, **kw), [x, w, b], "float64")


# ----------------------------------------------------------------------------------------- unfold/fold, pixel, lp
EXTRA = [
    ("unfold", (2, 3, 7, 8), dict(kernel_size=(2, 3), dilation=(2, 1), padding=1, stride=(2, 1))),
    ("unfold", (3, 5, 4), dict(kernel_size=2)),  # unbatched
    ("fold", (2, 18, 32), dict(output_size=(7, 8), kernel_size=(2, 3), dilation=(2, 1), padding=1, stride=(2, 1))),
    ("fold", (12, 12), dict(output_size=(5, 4), kernel_size=2, stride=1, padding=0)),  # unbatched, overlaps
    ("pixel_shuffle", (2, 2, 8, 3, 4), dict(upscale_factor=2)),
    ("pixel_unshuffle", (3, 6, 9), dict(downscale_factor=3)),
    ("lp_pool1d", (2, 3, 9), dict(norm_type=2, kernel_size=2)),
    ("lp_pool2d", (2, 3, 7, 8), dict(norm_type=3, kernel_size=3, stride=2, ceil_mode=True)),
    ("lp_pool3d", (1, 2, 4, 4, 5), dict(norm_type=1.5, kernel_size=2)),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("strided", [False, True], ids=["contig", "strided"])
@pytest.mark.parametrize("case", EXTRA, ids=lambda c: f"{c[0]}-{c[1]}")
def test_unfold_fold_pixel_lp_vs_torch(case, dtype, strided):
    name, xs, kw = case
    x = np.random.default_rng(21).standard_normal(xs)
    if name.startswith("lp_pool"):
        x = np.abs(x) + 0.1  # x ** p with a fractional 1/p: positive inputs (negative ones give NaN in both)
    _compare(lambda x: getattr(F, name)(x, **kw), lambda x: getattr(TF, name)(x, **kw), [x], dtype, strided)


def test_unfold_fold_lp_gradcheck_fp64():
    rng = np.random.default_rng(22)
    x = rng.standard_normal((1, 2, 4, 3))
    assert gradcheck(lambda x: F.unfold(x, 2, dilation=(1, 2), padding=1, stride=(2, 1)), [x])
    c = rng.standard_normal((1, 8, 10))
    assert gradcheck(lambda c: F.fold(c, (4, 3), 2, padding=(1, 0), stride=(1, 1)), [c])
    assert gradcheck(lambda x: F.lp_pool2d(x, 2, 2, ceil_mode=True), [np.abs(x) + 0.1])
    assert gradcheck(lambda x: F.pixel_shuffle(x, 2), [rng.standard_normal((1, 8, 2, 3))])


@pytest.mark.parametrize(
    "mk, shape",
    [
        (lambda M: M.Unfold(3, padding=1), (2, 3, 5, 6)),
        (lambda M: M.Fold((5, 6), 3, padding=1), (2, 27, 30)),
        (lambda M: M.PixelShuffle(3), (2, 18, 2, 3)),
        (lambda M: M.PixelUnshuffle(2), (2, 3, 4, 6)),
        (lambda M: M.LPPool1d(2, 3, stride=2), (2, 3, 9)),
        (lambda M: M.LPPool2d(2, (2, 3)), (2, 3, 6, 7)),
    ],
)
def test_extra_modules_vs_torch(mk, shape):
    x = np.abs(np.random.default_rng(23).standard_normal(shape)).astype(np.float32) + 0.1
    assert_close(mk(nn)(tl.Tensor(x)).data, mk(torch.nn)(torch.tensor(x)), "float32")


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: F.pixel_shuffle(_t(1, 6, 2, 2), 2), ValueError, "upscale_factor"),
        (lambda: F.pixel_shuffle(_t(1, 8, 2, 2), 0), ValueError, "upscale_factor"),
        (lambda: F.pixel_unshuffle(_t(1, 2, 5, 4), 2), ValueError, "downscale_factor"),
        (lambda: F.pixel_shuffle(_t(4, 2), 2), ValueError, "input"),
        (lambda: F.unfold(_t(1, 2, 3, 3), 4), ValueError, "kernel_size"),
        (lambda: F.fold(_t(1, 8, 5), (4, 3), 2), ValueError, "cols"),
        (lambda: F.fold(_t(1, 7, 6), (4, 3), 2), ValueError, "cols"),
        (lambda: F.fold(_t(8), (4, 3), 2), ValueError, "input"),
        (lambda: F.lp_pool2d(_t(1, 2, 4, 4), 2, 5), ValueError, "kernel_size"),
    ],
)
def test_extra_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize("args", [(3, 2, 1, True, False), (3, 2, 1, False, True, 5), (2,), (3, 1, 1, True)])
def test_avg_pool2d_positional_order_is_torch(args):
    # torch's 5th positional argument is ceil_mode, then count_include_pad, divisor_override (function and module)
    x = np.random.default_rng(0).standard_normal((2, 3, 9, 8))
    assert_close(F.avg_pool2d(tl.Tensor(x), *args), torch.nn.functional.avg_pool2d(torch.tensor(x), *args), "float64")
    assert_close(tl.nn.AvgPool2d(*args)(tl.Tensor(x)), torch.nn.AvgPool2d(*args)(torch.tensor(x)), "float64")


@pytest.mark.parametrize("args", [(3, 2, 1, 1, True, True), (3, 2, 1, 2, False, True), (2,)])
def test_max_pool2d_module_options_as_torch(args):
    x = np.random.default_rng(1).standard_normal((2, 3, 9, 8))
    out, ref = tl.nn.MaxPool2d(*args)(tl.Tensor(x)), torch.nn.MaxPool2d(*args)(torch.tensor(x))
    if isinstance(ref, tuple):
        assert_close(out[0], ref[0], "float64")
        assert np.array_equal(np.asarray(out[1].data), ref[1].numpy())
    else:
        assert_close(out, ref, "float64")
