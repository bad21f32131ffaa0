"""Inference reparameterisation (tinylearn.conv.reparam): linear chains, channel scales, input affines vs torch."""

import numpy as np
import pytest
import torch

import tinylearn as tl
from tinylearn.conv import fold_channel_scale, fold_input_affine, fold_linear_chain, linear_chain_cost


def _chain(shapes, seed=0, bias=True):
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(i, o, bias=bias).double() for o, i in shapes]
    return layers, torch.nn.Sequential(*layers)


@pytest.mark.parametrize("bias", [True, False])
def test_fold_linear_chain_matches_torch(bias):
    layers, seq = _chain([(16, 8), (32, 16), (5, 32)], bias=bias)
    W, b = fold_linear_chain(
        [m.weight.detach().numpy() for m in layers],
        [None if m.bias is None else m.bias.detach().numpy() for m in layers],
    )
    assert W.shape == (5, 8) and b.shape == (5,) and W.dtype == np.float64
    x = torch.randn(7, 8, dtype=torch.float64)
    with torch.no_grad():
        expected = seq(x).numpy()
    np.testing.assert_allclose(x.numpy() @ W.T + b, expected, rtol=1e-12, atol=1e-12)


def test_fold_linear_chain_single_and_no_biases():
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    W, b = fold_linear_chain([w])
    np.testing.assert_array_equal(W, w)
    np.testing.assert_array_equal(b, np.zeros(2, np.float32))
    assert W.dtype == np.float32
    W2, b2 = fold_linear_chain([w, np.eye(2, dtype=np.float32)], [np.ones(2), None])
    np.testing.assert_allclose(W2, w)
    np.testing.assert_allclose(b2, np.ones(2))


def test_fold_linear_chain_bad_input():
    with pytest.raises(ValueError, match="weights"):
        fold_linear_chain([])
    with pytest.raises(ValueError, match="weights"):
        fold_linear_chain(np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"weights\[1\]"):
        fold_linear_chain([np.ones((4, 3)), np.ones((2, 5))])
    with pytest.raises(ValueError, match=r"weights\[0\]"):
        fold_linear_chain([np.ones(3)])
    with pytest.raises(ValueError, match="biases"):
        fold_linear_chain([np.ones((4, 3))], [np.ones(4), np.ones(4)])
    with pytest.raises(ValueError, match=r"biases\[0\]"):
        fold_linear_chain([np.ones((4, 3))], [np.ones(3)])


def test_linear_chain_cost_counts():
    c = linear_chain_cost([(64, 32), (16, 64)], tokens=10)
    assert c["params_chain"] == 64 * 32 + 64 + 16 * 64 + 16
    assert c["params_folded"] == 16 * 32 + 16
    assert c["flops_chain"] == 10 * (2 * 64 * 32 + 64 + 2 * 16 * 64 + 16)
    assert c["flops_folded"] == 10 * (2 * 16 * 32 + 16)
    assert c["intermediate_elems"] == 10 * 64
    # a low-rank bottleneck grows when folded: h (d_in + d_out) < d_in d_out
    lr = linear_chain_cost([(8, 256), (256, 8)])
    assert lr["params_folded"] > lr["params_chain"] and lr["flops_folded"] > lr["flops_chain"]


@pytest.mark.parametrize(
    "shapes, tokens",
    [([], 1), ([(2, 3), (2, 3)], 1), ([(0, 3)], 1), ([(2, 3.0)], 1), ([(2, 3)], 0), ([(2, 3)], True), ("ab", 1)],
)
def test_linear_chain_cost_bad_input(shapes, tokens):
    with pytest.raises(ValueError, match="shapes|tokens"):
        linear_chain_cost(shapes, tokens)


def test_fold_channel_scale_conv_matches_torch():
    torch.manual_seed(1)
    conv = torch.nn.Conv2d(4, 6, 3, padding=1).double()
    s, t = torch.rand(6, dtype=torch.float64) + 0.5, torch.randn(6, dtype=torch.float64)
    x = torch.randn(2, 4, 7, 7, dtype=torch.float64)
    with torch.no_grad():
        expected = (conv(x) * s[None, :, None, None] + t[None, :, None, None]).numpy()
    w2, b2 = fold_channel_scale(conv.weight.detach().numpy(), conv.bias.detach().numpy(), s.numpy(), t.numpy())
    np.testing.assert_allclose(tl.conv.conv2d(x.numpy(), w2, b2, 1, 1), expected, rtol=1e-10, atol=1e-10)


def test_fold_channel_scale_linear_and_no_bias():
    w = np.arange(6.0).reshape(2, 3)
    w2, b2 = fold_channel_scale(w, None, np.array([2.0, -1.0]))
    np.testing.assert_array_equal(w2, w * np.array([[2.0], [-1.0]]))
    np.testing.assert_array_equal(b2, np.zeros(2))


def test_fold_channel_scale_bad_input():
    w = np.ones((3, 2, 1, 1))
    with pytest.raises(ValueError, match="w"):
        fold_channel_scale(np.ones(3), None, np.ones(3))
    with pytest.raises(ValueError, match="scale"):
        fold_channel_scale(w, None, np.ones(2))
    with pytest.raises(ValueError, match="shift"):
        fold_channel_scale(w, None, np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match="b"):
        fold_channel_scale(w, np.ones(2), np.ones(3))


def test_fold_input_affine_matches_layernorm_then_linear():
    torch.manual_seed(2)
    ln = torch.nn.LayerNorm(12).double()
    lin = torch.nn.Linear(12, 5).double()
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-1, 1)
    x = torch.randn(4, 12, dtype=torch.float64)
    with torch.no_grad():
        expected = lin(ln(x)).numpy()
        xhat = torch.nn.functional.layer_norm(x, (12,)).numpy()  # the normalisation without its affine
    w2, b2 = fold_input_affine(
        lin.weight.detach().numpy(), lin.bias.detach().numpy(), ln.weight.detach().numpy(), ln.bias.detach().numpy()
    )
    np.testing.assert_allclose(xhat @ w2.T + b2, expected, rtol=1e-12, atol=1e-12)
    w3, b3 = fold_input_affine(np.eye(2, dtype=np.float32), None, np.array([3.0, 4.0], np.float32))
    np.testing.assert_array_equal(w3, np.diag([3.0, 4.0]).astype(np.float32))
    np.testing.assert_array_equal(b3, np.zeros(2, np.float32))
    assert w3.dtype == np.float32


def test_fold_input_affine_bad_input():
    w = np.ones((3, 2))
    with pytest.raises(ValueError, match="w"):
        fold_input_affine(np.ones((3, 2, 1)), None, np.ones(2))
    with pytest.raises(ValueError, match="scale"):
        fold_input_affine(w, None, np.ones(3))
    with pytest.raises(ValueError, match="shift"):
        fold_input_affine(w, None, np.ones(2), np.ones(3))
    with pytest.raises(ValueError, match="b"):
        fold_input_affine(w, np.ones(2), np.ones(2))
