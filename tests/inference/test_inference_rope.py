"""inference.rope: the C++ rotate-half RoPE kernel vs torch (forward and the autograd backward), strided inputs, the
numpy pin, the cases that fall back to numpy, bad input to the kernel entry point."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tinylearn as tl
from tinylearn import backends
from tinylearn.inference import rope as R
from tinylearn.inference.model import apply_rope, rope_tables

pytestmark = pytest.mark.skipif(not backends.C_available("inference"), reason="tinylearn._C is not built")
F32 = dict(rtol=1e-5, atol=1e-6)


def _torch_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., h:], x[..., :h]], -1) * sin


@pytest.mark.parametrize(
    "shape, perm, rows",
    [
        ((1, 128, 8, 16), (0, 2, 1, 3), "T"),  # q as the transposed view of a projection's output
        ((2, 5, 3, 8), (0, 2, 1, 3), "T"),
        ((1, 8, 1, 16), None, "one"),  # a decode step: one position
        ((7, 12), None, "T"),
        ((12,), None, "one"),
    ],
)
def test_rope_matches_torch_forward_and_backward(shape, perm, rows):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    x = x.transpose(perm) if perm else x
    d = x.shape[-1]
    cos, sin = rope_tables(256, d)
    t = x.shape[-2] if x.ndim >= 2 else 1
    c, s = (cos[3:4], sin[3:4]) if rows == "one" else (cos[:t], sin[:t])
    if x.ndim == 1:
        c, s = c[0], s[0]  # one position as a [D] row (apply_rope: broadcasting to x's shape)
    assert R.rope_kernel(x, c, s, False) is not None  # the C++ kernel runs for these inputs
    xt = tl.Tensor(x, requires_grad=True)
    y = apply_rope(xt, c, s)
    g = rng.standard_normal(y.shape).astype(np.float32)
    y.backward(tl.Tensor(g))
    px = torch.tensor(x, requires_grad=True)
    py = _torch_rope(px, torch.from_numpy(c), torch.from_numpy(s))
    py.backward(torch.from_numpy(g))
    np.testing.assert_allclose(y.numpy(), py.detach().numpy(), **F32)
    np.testing.assert_allclose(xt.grad.numpy(), px.grad.numpy(), **F32)


def test_numpy_pin_and_fallbacks_give_the_same_values():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 4, 6, 8)).astype(np.float32)
    cos, sin = rope_tables(16, 8)
    with backends.use("inference.rope", backend="numpy"):
        assert R.rope_kernel(x, cos[:6], sin[:6], False) is None  # the pin: Rope's own numpy code runs
        ref = apply_rope(tl.Tensor(x), cos[:6], sin[:6]).numpy()
    np.testing.assert_allclose(apply_rope(tl.Tensor(x), cos[:6], sin[:6]).numpy(), ref, **F32)
    assert R.rope_kernel(x.astype(np.float64), cos[:6], sin[:6], False) is None  # float64: numpy
    per_head = np.broadcast_to(cos[:6, None, :], (6, 4, 8))  # broadcast some other way: numpy
    assert R.rope_kernel(x.transpose(0, 2, 1, 3), per_head, per_head, False) is None


def test_rope_cpp_bad_input_names_the_argument():
    cos, sin = rope_tables(8, 8)
    with pytest.raises(ValueError, match="x: expected a float32 array of 1-4 dims"):
        R.rope_cpp(np.zeros((2, 8), np.float64), cos[:2], sin[:2])
    with pytest.raises(ValueError, match="cos, sin: expected"):
        R.rope_cpp(np.zeros((2, 8), np.float32), cos[:3], sin[:3])
    with pytest.raises(ValueError, match="last dim must be even"):
        backends.load_C("inference").rope(np.zeros((1, 1, 2, 7), np.float32), np.zeros((2, 7), np.float32),
                                           np.zeros((2, 7), np.float32))  # fmt: skip
