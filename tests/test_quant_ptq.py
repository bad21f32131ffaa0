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


def _qparams(x, W):
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


@pytest.mark.parametrize("relu", [False, True])
def test_quantized_linear_matches_torch_fbgemm(relu):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((65, 40)).astype(np.float32)
    W = (rng.standard_normal((24, 40)) * 0.2).astype(np.float32)
    b = (rng.standard_normal(24) * 0.1).astype(np.float32)
    (sx, zx), ws = _qparams(x, W)
    y = x @ W.T + b
    y = np.maximum(y, 0) if relu else y
    sy, zy = Q.calculate_qparams(y.min(), y.max(), "int8")
    out = Q.QuantizedLinear(W, b, ws, (sx, zx), (sy, zy), relu=relu)(tl.Tensor(x)).data
    qx, qw = _torch_q(x, W, sx, zx, ws)
    fn = torch.ao.nn.quantized.functional.linear
    tq = fn(qx, qw, torch.from_numpy(b), sy, zy + 128)
    ref = tq.dequantize().numpy()
    if relu:
        ref = np.maximum(ref, 0)
    d = np.abs(ref - out) / sy
    assert d.max() <= 1.0 + 1e-4 and (d > 0.5).mean() < 0.01  # same codes up to rare requantization ties
    assert np.abs(out - y).max() < 3 * sy + 2 * sx * np.abs(W).sum(1).max() / 127


@pytest.mark.parametrize("stride, padding", [(1, 1), (2, 0), (1, 2)])
def test_quantized_conv2d_matches_torch_fbgemm(stride, padding):
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 2, (2, 3, 9, 8)).astype(np.float32)
    W = (rng.standard_normal((5, 3, 3, 3)) * 0.3).astype(np.float32)
    b = (rng.standard_normal(5) * 0.1).astype(np.float32)
    (sx, zx), ws = _qparams(x, W)
    conv = tl.nn.Conv2d(3, 5, 3, stride=stride, padding=padding)
    conv.weight.data[...] = W
    conv.bias.data[...] = b
    y = torch.nn.functional.conv2d(
        torch.from_numpy(x), torch.from_numpy(W), torch.from_numpy(b), stride, padding
    ).numpy()
    sy, zy = Q.calculate_qparams(y.min(), y.max(), "int8")
    out = Q.QuantizedConv2d(conv, ws, (sx, zx), (sy, zy))(tl.Tensor(x)).data
    qx, qw = _torch_q(x, W, sx, zx, ws)
    tq = torch.ao.nn.quantized.functional.conv2d(
        qx, qw, torch.from_numpy(b), stride, padding, scale=sy, zero_point=zy + 128
    )
    d = np.abs(tq.dequantize().numpy() - out) / sy
    assert out.shape == y.shape and d.max() <= 1.0 + 1e-4 and (d > 0.5).mean() < 0.01


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
