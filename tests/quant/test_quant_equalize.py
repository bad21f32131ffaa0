"""Cross-layer equalization and bias correction (tinylearn.quant.equalize): the equalized network computes the same
function, each channel's two ranges end equal to sqrt(r1 r2) as the formula says, the bias correction removes the
mean output shift the weight rounding adds, and bad input is refused naming the argument."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import tinylearn as tl

Q = tl.quant


def _imbalanced_mlp(seed: int = 0) -> tl.nn.Sequential:
    """Linear(12, 16) -> ReLU -> Linear(16, 5) with channel i of the hidden layer scaled by c_i in e^[-3, 3] (and
    the next layer by 1 / c_i): the function is a plain MLP's, the per-channel ranges differ by up to e^6."""
    rng = np.random.default_rng(seed)
    net = tl.nn.Sequential(tl.nn.Linear(12, 16), tl.nn.ReLU(), tl.nn.Linear(16, 5))
    c = np.exp(rng.uniform(-3, 3, 16)).astype(np.float32)
    net[0].weight.data = (net[0].weight.data * c[:, None]).astype(np.float32)
    net[0].bias.data = (net[0].bias.data * c).astype(np.float32)
    net[2].weight.data = (net[2].weight.data / c[None, :]).astype(np.float32)
    return net


def _ranges(w1: np.ndarray, w2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r1 = np.abs(w1.reshape(w1.shape[0], -1)).max(1).astype(np.float64)
    r2 = np.abs(w2.reshape(w2.shape[0], w2.shape[1], -1)).max(axis=(0, 2)).astype(np.float64)
    return r1, r2


def test_equalized_mlp_computes_the_same_function():
    net = _imbalanced_mlp()
    x = np.random.default_rng(1).standard_normal((64, 12)).astype(np.float32)
    before = net(tl.Tensor(x)).data
    eq = copy.deepcopy(net)
    Q.cross_layer_equalize(eq[0], eq[2])
    np.testing.assert_allclose(eq(tl.Tensor(x)).data, before, rtol=1e-5, atol=1e-5)


def test_equalized_conv_pair_computes_the_same_function():
    rng = np.random.default_rng(2)
    c1, c2 = tl.nn.Conv2d(3, 8, 3, padding=1), tl.nn.Conv2d(8, 4, 3)
    c = np.exp(rng.uniform(-2, 2, 8)).astype(np.float32)
    c1.weight.data = (c1.weight.data * c[:, None, None, None]).astype(np.float32)
    c1.bias.data = (c1.bias.data * c).astype(np.float32)
    c2.weight.data = (c2.weight.data / c[None, :, None, None]).astype(np.float32)
    x = tl.Tensor(rng.standard_normal((2, 3, 9, 9)).astype(np.float32))
    before = c2(c1(x).relu()).data
    r1, r2 = _ranges(c1.weight.data, c2.weight.data)
    Q.cross_layer_equalize(c1, c2)
    np.testing.assert_allclose(c2(c1(x).relu()).data, before, rtol=1e-5, atol=1e-5)
    e1, e2 = _ranges(c1.weight.data, c2.weight.data)
    np.testing.assert_allclose(e1, np.sqrt(r1 * r2), rtol=1e-6)
    np.testing.assert_allclose(e2, np.sqrt(r1 * r2), rtol=1e-6)


def test_scales_and_ranges_follow_the_formula():
    net = _imbalanced_mlp(3)
    w1, b1, w2 = net[0].weight.data.copy(), net[0].bias.data.copy(), net[2].weight.data.copy()
    r1, r2 = _ranges(w1, w2)
    s = Q.equalize_scales(w1, w2)
    np.testing.assert_allclose(s, np.sqrt(r1 / r2), rtol=1e-12)
    total = Q.cross_layer_equalize(net[0], net[2])
    np.testing.assert_allclose(total, s, rtol=1e-12)
    # W1' = diag(1/s) W1, b1' = b1 / s, W2' = W2 diag(s)
    np.testing.assert_allclose(net[0].weight.data, w1 / s[:, None], rtol=1e-6)
    np.testing.assert_allclose(net[0].bias.data, b1 / s, rtol=1e-6)
    np.testing.assert_allclose(net[2].weight.data, w2 * s[None, :], rtol=1e-6)
    e1, e2 = _ranges(net[0].weight.data, net[2].weight.data)  # both ranges of channel i = sqrt(r1_i r2_i)
    np.testing.assert_allclose(e1, np.sqrt(r1 * r2), rtol=1e-6)
    np.testing.assert_allclose(e2, np.sqrt(r1 * r2), rtol=1e-6)
    again = Q.cross_layer_equalize(net[0], net[2], iterations=2)  # already equalized: scales 1 up to rounding
    np.testing.assert_allclose(again, 1.0, rtol=1e-6)


def test_zero_channel_keeps_scale_one():
    w1 = np.array([[1.0, -2.0], [0.0, 0.0], [3.0, 1.0]], np.float32)
    w2 = np.array([[4.0, 5.0, 0.0]], np.float32)
    s = Q.equalize_scales(w1, w2)
    np.testing.assert_allclose(s, [np.sqrt(2.0 / 4.0), 1.0, 1.0])


def test_bias_correction_removes_the_mean_shift():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((6, 10)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    x = (rng.standard_normal((4000, 10)) + 1.5).astype(np.float32)  # E[x] != 0: rounding shifts the mean output
    scale = np.abs(w).max(1, keepdims=True) / 7
    wq = (np.clip(np.rint(w / scale), -8, 7) * scale).astype(np.float32)  # int4-like rounding
    mean = x.mean(0).astype(np.float64)
    b_corr = Q.bias_correction(w, wq, b, mean)
    np.testing.assert_allclose(b_corr, b - (wq.astype(np.float64) - w) @ mean, rtol=1e-6, atol=1e-6)
    ref, biased, corrected = x @ w.T + b, x @ wq.T + b, x @ wq.T + b_corr
    assert np.abs((biased - ref).mean(0)).max() > 1e-3
    np.testing.assert_allclose(corrected.mean(0), ref.mean(0), atol=1e-4)
    np.testing.assert_allclose(Q.bias_correction(w, wq, None, mean), -(wq.astype(np.float64) - w) @ mean, atol=1e-6)


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: Q.equalize_scales(np.ones((4, 3)), np.ones((2, 5))), ValueError, "w1/w2"),
        (lambda: Q.equalize_scales(np.ones(4), np.ones((2, 4))), ValueError, "w1"),
        (lambda: Q.equalize_scales(np.ones((4, 3)), np.full((2, 4), np.nan)), ValueError, "w2"),
        (
            lambda: Q.cross_layer_equalize(tl.nn.Linear(3, 4), tl.nn.Linear(4, 2), iterations=-1),
            ValueError,
            "iterations",
        ),
        (lambda: Q.cross_layer_equalize(tl.nn.Linear(3, 4), tl.nn.ReLU()), TypeError, "lin2"),
        (lambda: Q.bias_correction(np.ones((2, 3)), np.ones((2, 3)), None, np.ones(4)), ValueError, "mean_x"),
    ],
)
def test_bad_input_is_named(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
