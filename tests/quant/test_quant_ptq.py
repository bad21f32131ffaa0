"""Quantized Linear/Conv2d vs torch's quantized kernels (fbgemm), and the PTQ / QAT pipeline on digits."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import tinylearn as tl
from tinylearn.nn.models import DigitsCNN, DigitsMLP
from tinylearn.nn.training import evaluate, fit

warnings.filterwarnings("ignore", message=".*deprecated.*")
Q = tl.quant


def _qparams(x, W, reduce_range=False):
    """Per-tensor affine int8 activation qparams (7-bit [0, 127] u8 range when ``reduce_range``, from torch's own
    observer, shifted to tinylearn's int8 codes) and per-channel symmetric int8 weight scales."""
    if reduce_range:
        obs = torch.ao.quantization.MinMaxObserver(dtype=torch.quint8, quant_min=0, quant_max=127)
        obs(torch.from_numpy(np.ascontiguousarray(x)))
        s, z = obs.calculate_qparams()
        sx, zx = float(s), int(z) - 128  # u8 code c <-> int8 code c - 128
    else:
        sx, zx = Q.calculate_qparams(x.min(), x.max(), "int8")
    axes = tuple(range(1, W.ndim))
    ws, _ = Q.calculate_qparams(W.min(axes), W.max(axes), "int8", symmetric=True)
    return (sx, zx), ws


def _torch_q(x, W, sx, zx, ws):
    qx = torch.quantize_per_tensor(torch.from_numpy(np.ascontiguousarray(x)), sx, zx + 128, torch.quint8)
    qw = torch.quantize_per_channel(
        torch.from_numpy(W),
        torch.from_numpy(ws.astype(np.float64)),
        torch.zeros(W.shape[0], dtype=torch.long),
        0,
        torch.qint8,
    )
    return qx, qw


def _exact_codes(acc, b, sx, ws, sy, zy, relu):
    """The exact oracle's requantization of an int64 accumulator [..., OC] (channel last): the integer bias
    round(b / (s_x s_w)), then clamp(round(acc * s_x s_w / s_y) + z_y) in float64 (module docstring)."""
    acc_scale = np.float64(sx) * ws.astype(np.float64)
    acc = acc + np.rint(b.astype(np.float64) / acc_scale).astype(np.int64)
    yq = np.rint(acc * (acc_scale / np.float64(sy))) + zy
    return np.clip(yq, zy if relu else -128, 127).astype(np.int64)


def _exact_linear(x, W, b, sx, zx, ws, sy, zy, relu=False):
    """Exact int8 Linear: integer codes, int64 numpy GEMM (no saturation anywhere), requantize."""
    xq = Q.quantize(x, sx, zx, "int8").astype(np.int64)
    wq = Q.quantize(W, ws, np.zeros(len(ws), np.int64), "int8", axis=0).astype(np.int64)
    return _exact_codes((xq - zx) @ wq.T, b, sx, ws, sy, zy, relu)


def _exact_conv2d(x, W, b, sx, zx, ws, sy, zy, stride, padding):
    """Exact int8 Conv2d as a direct convolution in int64 (one tap at a time, no im2col): [N, OC, OH, OW] codes."""
    xq = Q.quantize(x, sx, zx, "int8").astype(np.int64) - zx  # zero padding of (x_q - z_x) == padding with z_x
    wq = Q.quantize(W.reshape(len(W), -1), ws, np.zeros(len(ws), np.int64), "int8", axis=0).astype(np.int64)
    wq = wq.reshape(W.shape)
    xp = np.pad(xq, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    kh, kw = W.shape[2:]
    oh, ow = (xp.shape[2] - kh) // stride + 1, (xp.shape[3] - kw) // stride + 1
    acc = np.zeros((x.shape[0], oh, ow, W.shape[0]), np.int64)
    for i in range(kh):
        for j in range(kw):
            tap = xp[:, :, i : i + stride * oh : stride, j : j + stride * ow : stride]  # [N, C, OH, OW]
            acc += np.einsum("nchw,oc->nhwo", tap, wq[:, :, i, j])
    return _exact_codes(acc, b, sx, ws, sy, zy, False).transpose(0, 3, 1, 2)


def _codes(y, sy, zy):
    return np.rint(y / sy).astype(np.int64) + zy


def _linear_case(seed, reduce_range, saturating=False):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((65, 40)).astype(np.float32)
    W = (rng.standard_normal((24, 40)) * 0.2).astype(np.float32)
    if saturating:  # rows at the top of the activation range times large weights of one sign: a u8 x s8 pair
        x[:8] = x.max()  # sum 255 * 127 * 2 = 64770 would overflow int16 (vpmaddubsw saturates at 32767)
        W[:4] = np.abs(W[:4]) + 0.3
    b = (rng.standard_normal(24) * 0.1).astype(np.float32)
    return x, W, b, *_qparams(x, W, reduce_range)


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("reduce_range", [False, True])
@pytest.mark.parametrize("saturating", [False, True])
def test_quantized_linear_is_exact(relu, reduce_range, saturating):
    x, W, b, (sx, zx), ws = _linear_case(0, reduce_range, saturating)
    y = x @ W.T + b
    y = np.maximum(y, 0) if relu else y
    sy, zy = Q.calculate_qparams(y.min(), y.max(), "int8")
    out = Q.QuantizedLinear(W, b, ws, (sx, zx), (sy, zy), relu=relu)(tl.Tensor(x)).data
    exact = _exact_linear(x, W, b, sx, zx, ws, sy, zy, relu)
    np.testing.assert_array_equal(_codes(out, sy, zy), exact)  # bit-exact int8 codes
    np.testing.assert_array_equal(out, ((exact - zy) * np.float32(sy)).astype(np.float32))
    # and within the rounding-error bound of the float layer: output step, input step through |W|, weight steps
    # through |x|, their product, the integer bias (elementwise, first order in each rounding)
    ax, aw = np.abs(x).sum(1, keepdims=True), np.abs(W).sum(1)[None, :]
    bound = 0.5 * (sy + sx * aw + ws[None, :] * ax + sx * ws[None, :]) + 0.25 * sx * ws[None, :] * W.shape[1]
    assert (np.abs(out - y) <= bound * (1 + 1e-5)).all()


@pytest.mark.parametrize("relu", [False, True])
def test_quantized_linear_matches_torch_fbgemm_with_7bit_activations(relu):
    """fbgemm is exact on every x86 CPU only with 7-bit activations (reduce_range=True): u8 codes <= 127 keep the
    AVX2 vpmaddubsw int16 pair sums within 127 * 128 * 2 = 32512 <= 32767. Then torch, tinylearn and the exact
    oracle agree (torch requantizes in float32 with a float bias: rare one-step ties)."""
    x, W, b, (sx, zx), ws = _linear_case(0, reduce_range=True, saturating=True)
    y = x @ W.T + b
    y = np.maximum(y, 0) if relu else y
    sy, zy = Q.calculate_qparams(y.min(), y.max(), "int8")
    out = Q.QuantizedLinear(W, b, ws, (sx, zx), (sy, zy), relu=relu)(tl.Tensor(x)).data
    qx, qw = _torch_q(x, W, sx, zx, ws)
    assert int(qx.int_repr().max()) <= 127  # really 7-bit
    fn = torch.ao.nn.quantized.functional.linear
    ref = fn(qx, qw, torch.from_numpy(b), sy, zy + 128).dequantize().numpy()
    if relu:
        ref = np.maximum(ref, 0)
    d = np.abs(ref - out) / sy
    assert d.max() <= 1.0 + 1e-4 and (d > 0.5).mean() < 0.01, (d.max(), (d > 0.5).mean())


@pytest.mark.parametrize("stride, padding", [(1, 1), (2, 0), (1, 2)])
@pytest.mark.parametrize("reduce_range", [False, True])
def test_quantized_conv2d_is_exact(stride, padding, reduce_range):
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 2, (2, 3, 9, 8)).astype(np.float32)
    W = (rng.standard_normal((5, 3, 3, 3)) * 0.3).astype(np.float32)
    b = (rng.standard_normal(5) * 0.1).astype(np.float32)
    (sx, zx), ws = _qparams(x, W, reduce_range)
    conv = tl.nn.Conv2d(3, 5, 3, stride=stride, padding=padding)
    conv.weight.data[...] = W
    conv.bias.data[...] = b
    y = torch.nn.functional.conv2d(
        torch.from_numpy(x), torch.from_numpy(W), torch.from_numpy(b), stride, padding
    ).numpy()
    sy, zy = Q.calculate_qparams(y.min(), y.max(), "int8")
    out = Q.QuantizedConv2d(conv, ws, (sx, zx), (sy, zy))(tl.Tensor(x)).data
    assert out.shape == y.shape
    np.testing.assert_array_equal(_codes(out, sy, zy), _exact_conv2d(x, W, b, sx, zx, ws, sy, zy, stride, padding))
    if reduce_range:  # torch's fbgemm conv is exact here on every CPU: compare codes up to requantization ties
        qx, qw = _torch_q(x, W, sx, zx, ws)
        assert int(qx.int_repr().max()) <= 127
        tq = torch.ao.nn.quantized.functional.conv2d(
            qx, qw, torch.from_numpy(b), stride, padding, scale=sy, zero_point=zy + 128
        )
        d = np.abs(tq.dequantize().numpy() - out) / sy
        assert d.max() <= 1.0 + 1e-4 and (d > 0.5).mean() < 0.01, (d.max(), (d > 0.5).mean())


def test_exact_oracle_sees_int16_saturation():
    """The oracle is strict: the int16-saturating u8 x s8 pair sums (AVX2 vpmaddubsw semantics, simulated) give a
    different result on the saturating case, so an implementation with that bug would fail the tests above."""
    x, W, b, (sx, zx), ws = _linear_case(0, reduce_range=False, saturating=True)
    xq = Q.quantize(x, sx, zx, "int8").astype(np.int64)
    u = xq + 128  # u8 activation codes
    wq = Q.quantize(W, ws, np.zeros(len(ws), np.int64), "int8", axis=0).astype(np.int64)
    pairs = u[:, None, 0::2] * wq[None, :, 0::2] + u[:, None, 1::2] * wq[None, :, 1::2]  # [M, OC, K/2]
    exact = xq @ wq.T
    np.testing.assert_array_equal(pairs.sum(-1) - 128 * wq.sum(1), exact)  # u8 = s8 + 128: offset column sum
    sat = np.clip(pairs, -32768, 32767).sum(-1) - 128 * wq.sum(1)
    assert (sat != exact).sum() >= 8  # saturation changed accumulators of the saturating rows


def test_im2col_codes_pads_with_zero_point():
    xq = np.full((1, 1, 2, 2), 5, np.int8)
    rows, oh, ow = Q.modules.im2col_codes(xq, (3, 3), 1, 1, 1, pad_value=-7)
    assert (oh, ow) == (2, 2) and rows.shape == (4, 9)
    assert (rows == -7).sum() == 4 * 5 and (rows == 5).sum() == 4 * 4


@pytest.fixture(scope="module")
def digits():
    X, y = tl.data.load_digits()
    return tl.data.train_test_split(X, y, 0.25, seed=0)


@pytest.fixture(scope="module")
def mlp(digits):
    Xtr, Xte, ytr, yte = digits
    tl.manual_seed(0)
    m = DigitsMLP()
    fit(m, Xtr, ytr, epochs=10, lr=1e-2, seed=0)
    return m


@pytest.fixture(scope="module")
def cnn(digits):
    Xtr, Xte, ytr, yte = digits
    tl.manual_seed(0)
    m = DigitsCNN(c1=8, c2=16)
    fit(m, Xtr, ytr, epochs=4, lr=1e-2, seed=0)
    return m


@pytest.mark.parametrize("model_name", ["mlp", "cnn"])
def test_ptq_int8_within_half_point(model_name, digits, request):
    Xtr, Xte, ytr, yte = digits
    m = request.getfixturevalue(model_name)
    acc = evaluate(m, Xte, yte)
    prepared = Q.prepare(m, Q.default_qconfig("int8"))
    Q.calibrate(prepared, Xtr[:512])
    qm = Q.convert(prepared)
    assert evaluate(m, Xte, yte) == acc  # prepare copies: the float model is untouched
    kinds = {type(mod).__name__ for mod in qm.modules()}
    assert ("QuantizedConv2d" in kinds) == (model_name == "cnn") and "QuantizedLinear" in kinds
    qacc = evaluate(qm, Xte, yte)
    assert qacc >= acc - 0.005, (acc, qacc)
    assert Q.model_size_bytes(qm) < 0.3 * Q.model_size_bytes(m)


@pytest.mark.parametrize("mode", ["int4_weight", "fp8", "w4a8"])
def test_ptq_other_modes_run_and_stay_close(mode, mlp, digits):
    Xtr, Xte, ytr, yte = digits
    acc = evaluate(mlp, Xte, yte)
    p = Q.prepare(mlp, Q.default_qconfig(mode))
    Q.calibrate(p, Xtr[:256])
    qm = Q.convert(p)
    assert evaluate(qm, Xte, yte) >= acc - 0.03


def test_qat_recovers_per_tensor_int4(cnn, digits):
    Xtr, Xte, ytr, yte = digits
    qc = lambda learnable: Q.QConfig(
        weight=lambda: Q.MinMaxObserver("int4", symmetric=True),
        mode="w4a8",  # noqa: E731
        learnable=learnable,
    )
    p = Q.prepare(cnn, qc(False))
    Q.calibrate(p, Xtr[:512])
    ptq = evaluate(Q.convert(p), Xte, yte)
    qat = Q.prepare_qat(cnn, qc(True))
    fit(qat, Xtr, ytr, epochs=2, lr=2e-3, seed=1)
    qacc = evaluate(Q.convert(qat), Xte, yte)
    assert qacc >= ptq - 0.005 and qacc >= evaluate(cnn, Xte, yte) - 0.02, (ptq, qacc)


def test_fuse_folds_batchnorm_exactly(cnn, digits):
    Xte = digits[1][:50]
    import copy

    fused = Q.fuse_modules(copy.deepcopy(cnn).eval())
    cnn.eval()
    with tl.no_grad():
        np.testing.assert_allclose(fused(tl.Tensor(Xte)).data, cnn(tl.Tensor(Xte)).data, rtol=1e-4, atol=1e-4)


def test_pipeline_bad_input(mlp):
    with pytest.raises(ValueError, match="model"):
        Q.convert(mlp, inplace=False)
    with pytest.raises(TypeError, match="model"):
        Q.prepare("not a model")
    with pytest.raises(ValueError, match="mode"):
        Q.QConfig(mode="int3")
