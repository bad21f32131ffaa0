"""tl.amp.saved_precision: saved activations stored in bf16/fp16/int8, and the per-layer plan under a budget."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tinylearn as tl
from tinylearn import amp


@pytest.mark.parametrize("fmt", ["fp32", "bf16", "fp16", "int8"])
def test_quantize_saved_matches_torch_rounding(fmt: str) -> None:
    x = np.random.default_rng(0).standard_normal((64, 33)).astype(np.float32) * 3
    q, nbytes = amp.quantize_saved(x, fmt)
    assert nbytes == amp.FORMAT_BYTES[fmt] and q.dtype == np.float32 and q.shape == x.shape
    t = torch.from_numpy(x)
    if fmt == "fp32":
        assert np.array_equal(q, x)
    elif fmt in ("bf16", "fp16"):
        want = t.to(torch.bfloat16 if fmt == "bf16" else torch.float16).float().numpy()
        assert np.array_equal(q, want)
    else:
        s = np.abs(x).max() / 127
        assert np.abs(q - x).max() <= s / 2 + 1e-6 and len(np.unique(np.round(q / s))) <= 255


def test_quant_saved_linear_forward_exact_and_backward_uses_the_stored_input() -> None:
    rng = np.random.default_rng(1)
    x = tl.Tensor(rng.standard_normal((16, 8)).astype(np.float32), requires_grad=True)
    w = tl.Tensor(rng.standard_normal((4, 8)).astype(np.float32), requires_grad=True)
    b = tl.Tensor(rng.standard_normal(4).astype(np.float32), requires_grad=True)
    for fmt in ("fp32", "int8"):
        for p in (x, w, b):
            p.grad = None
        y = amp.quant_saved_linear(x, w, b, fmt=fmt)
        np.testing.assert_allclose(y.data, x.data @ w.data.T + b.data, rtol=1e-6, atol=1e-6)
        assert y.grad_fn.saved_bytes == 16 * 8 * amp.FORMAT_BYTES[fmt]
        g = rng.standard_normal((16, 4)).astype(np.float32)
        y.backward(tl.Tensor(g))
        xq = amp.quantize_saved(x.data, fmt)[0]
        np.testing.assert_allclose(w.grad.data, g.T @ xq, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(x.grad.data, g @ w.data, rtol=1e-5, atol=1e-5)  # dX needs no saved x
        np.testing.assert_allclose(b.grad.data, g.sum(0), rtol=1e-5, atol=1e-5)


def test_plan_is_the_brute_force_optimum() -> None:
    sizes = [100, 50, 200]
    errors = [{"fp32": 0.0, "bf16": 1e-3, "int8": 5e-2}, {"fp32": 0.0, "bf16": 1e-2, "int8": 1.0}, {"fp32": 0.0,
              "bf16": 1e-5, "int8": 1e-4}]  # fmt: skip
    fmts, nbytes, err = amp.plan_saved_precision(sizes, errors, budget_bytes=100 * 2 + 50 * 4 + 200 * 1)
    assert fmts == ["bf16", "fp32", "int8"] and nbytes == 600 and err == pytest.approx(1e-3 + 1e-4)
    assert amp.plan_saved_precision(sizes, errors, 10**9)[0] == ["fp32"] * 3
    assert amp.plan_saved_precision(sizes, errors, 350)[0] == ["int8"] * 3


def test_plan_bad_input() -> None:
    e = [{"fp32": 0.0, "int8": 1.0}]
    with pytest.raises(ValueError, match="budget_bytes"):
        amp.plan_saved_precision([10], e, 5)
    with pytest.raises(ValueError, match="errors\\[0\\]"):
        amp.plan_saved_precision([10], [{"fp4": 0.1}], 100)
    with pytest.raises(ValueError, match="sizes\\[0\\]"):
        amp.plan_saved_precision([-1], e, 100)
    with pytest.raises(ValueError, match="sizes and errors"):
        amp.plan_saved_precision([1, 2], e, 100)
    with pytest.raises(ValueError, match="fmt"):
        amp.quantize_saved(np.ones(3, np.float32), "fp4")
    with pytest.raises(ValueError, match="x"):
        amp.quant_saved_linear(tl.Tensor(np.ones(3, np.float32)), tl.Tensor(np.ones((2, 3), np.float32)))
