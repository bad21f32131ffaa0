"""Tests for exercises/02_im2col_conv (each takes the ``impl`` fixture: your stubs or the reference)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F


def test_conv_output_size(impl):
    assert impl.conv_output_size(56, 3, 1, 1) == 56
    assert impl.conv_output_size(224, 7, 2, 3) == 112
    assert impl.conv_output_size(10, 3, 2, 0) == 4
    assert impl.conv_output_size(9, 3, 1, 0, dilation=2) == 5
    assert impl.conv_output_size(5, 5) == 1
    with pytest.raises(ValueError, match="kernel"):
        impl.conv_output_size(4, 5)


@pytest.mark.parametrize("k,s,p", [(3, 1, 1), (2, 2, 0), (3, 2, 1), (1, 1, 0)])
def test_im2col(impl, k, s, p):
    x = np.random.default_rng(0).standard_normal((2, 3, 7, 6)).astype(np.float32)
    got = impl.im2col(x, k, s, p)
    exp = F.unfold(torch.from_numpy(x), k, 1, p, s).numpy()
    assert got.shape == exp.shape
    np.testing.assert_array_equal(got, exp)


@pytest.mark.parametrize("k,s,p", [(3, 1, 1), (2, 2, 0), (3, 2, 1)])
def test_col2im(impl, k, s, p):
    L = F.unfold(torch.zeros(1, 1, 7, 6), k, 1, p, s).shape[-1]
    cols = np.random.default_rng(1).standard_normal((2, 3 * k * k, L)).astype(np.float32)
    got = impl.col2im(cols, (7, 6), k, s, p)
    exp = F.fold(torch.from_numpy(cols), (7, 6), k, 1, p, s).numpy()
    np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("s,p", [(1, 1), (2, 0)])
def test_conv2d_im2col(impl, s, p):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 8, 7)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    got = impl.conv2d_im2col(x, w, b, s, p)
    exp = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), s, p).numpy()
    np.testing.assert_allclose(got, exp, rtol=1e-4, atol=1e-4)


def test_conv2d_weight_grad(impl):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 8, 7))
    w = torch.tensor(rng.standard_normal((4, 3, 3, 3)), requires_grad=True)
    y = F.conv2d(torch.from_numpy(x), w, None, 2, 1)
    gy = rng.standard_normal(tuple(y.shape))
    y.backward(torch.from_numpy(gy))
    got = impl.conv2d_weight_grad(x, gy, 3, 2, 1)
    np.testing.assert_allclose(got, w.grad.numpy(), rtol=1e-9, atol=1e-9)


def test_winograd_input_transform(impl):
    BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype=np.float64)
    d = np.random.default_rng(4).standard_normal((3, 2, 4, 4))
    got = impl.winograd_input_transform(d)
    assert got.shape == d.shape
    np.testing.assert_allclose(got, BT @ d @ BT.T, rtol=1e-12, atol=1e-12)
    # the transform makes the 3x3 correlation of a 4x4 tile an elementwise product: check one tile end to end
    G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])
    AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]])
    g = np.random.default_rng(5).standard_normal((3, 3))
    y = AT @ ((G @ g @ G.T) * impl.winograd_input_transform(d[0, 0])) @ AT.T
    direct = np.array([[np.sum(d[0, 0, i : i + 3, j : j + 3] * g) for j in range(2)] for i in range(2)])
    np.testing.assert_allclose(y, direct, rtol=1e-12, atol=1e-12)
