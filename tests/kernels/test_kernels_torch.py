"""tinylearn.kernels.torch_ops: the cpu fused kernels as torch.autograd.Functions, checked by gradcheck (fp64)
and against torch's own ops in a small model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tinylearn.kernels import torch_ops
from tinylearn.testing import assert_close

if not __import__("tinylearn.backends").backends.C_available("kernels"):
    pytest.skip("tinylearn._C.kernels not built", allow_module_level=True)


def _r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64, requires_grad=True)


def test_gradcheck_softmax() -> None:
    torch.manual_seed(0)
    x = _r(3, 4, 5)
    for dim in (-1, 0, 1):
        assert torch.autograd.gradcheck(lambda t, d=dim: torch_ops.softmax(t, d), (x,))


def test_gradcheck_layer_norm() -> None:
    torch.manual_seed(1)
    assert torch.autograd.gradcheck(torch_ops.layer_norm, (_r(4, 7), _r(7), _r(7)))
    assert torch.autograd.gradcheck(torch_ops.layer_norm, (_r(2, 3, 4), _r(3, 4), _r(3, 4)))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gradcheck_bias_gelu(approximate: str) -> None:
    torch.manual_seed(2)
    assert torch.autograd.gradcheck(lambda x, b: torch_ops.bias_gelu(x, b, approximate), (_r(3, 6) * 3, _r(6)))


@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck_flash_attention(causal: bool) -> None:
    torch.manual_seed(3)
    q, k, v = _r(1, 2, 9, 4), _r(1, 2, 9, 4), _r(1, 2, 9, 4)
    assert torch.autograd.gradcheck(lambda a, b, c: torch_ops.flash_attention(a, b, c, causal, 4), (q, k, v))


def test_drop_in_block_matches_torch() -> None:
    """A pre-LN transformer block fragment built from torch_ops vs the same with torch ops: outputs and grads."""
    torch.manual_seed(4)
    x = torch.randn(2, 16, 32, dtype=torch.float64)
    w, b, fc_b = _r(32), _r(32), _r(32)
    wq = torch.randn(32, 32, dtype=torch.float64, requires_grad=True)

    def block(ln, attn, gelu):
        h = ln(x, w, b)
        q = (h @ wq).view(2, 16, 4, 8).transpose(1, 2)
        a = attn(q, q, q).transpose(1, 2).reshape(2, 16, 32)
        return gelu(a, fc_b).sum()

    ours = block(torch_ops.layer_norm, lambda q, k, v: torch_ops.flash_attention(q, k, v, True, 8), torch_ops.bias_gelu)
    g_ours = torch.autograd.grad(ours, (w, b, wq, fc_b))
    ref = block(
        lambda t, ww, bb: F.layer_norm(t, (32,), ww, bb),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        lambda t, bb: F.gelu(t + bb),
    )
    g_ref = torch.autograd.grad(ref, (w, b, wq, fc_b))
    assert_close(ours, ref, "float64")
    for go, gr in zip(g_ours, g_ref, strict=True):
        assert_close(go, gr, "float64")


def test_rejects_unsupported() -> None:
    with pytest.raises(TypeError, match="tensor: .*dtype"):
        torch_ops.softmax(torch.zeros(2, 3, dtype=torch.bfloat16))
