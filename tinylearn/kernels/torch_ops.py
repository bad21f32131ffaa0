"""The fused CPU kernels as ``torch.autograd.Function``s, so they drop into a torch model (CPU tensors).

    from tinylearn.kernels import torch_ops
    y = torch_ops.layer_norm(x, weight, bias)              # differentiable in x, weight, bias
    o = torch_ops.flash_attention(q, k, v, causal=True)    # [B, H, N, D]; backward recomputes P from lse

Forward and backward both call the ``cpu`` backend (C++/OpenMP); float32 and float64 run natively (float64 is
what torch.autograd.gradcheck uses; tests/kernels/test_kernels_torch.py runs it on every op). Saved for backward:
softmax its output y; LayerNorm x, weight, mean, rstd; bias+GELU x, bias; attention q, k, v, o, lse.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .._inputs import as_array
from . import ops

BACKEND = "cpu"


def _np(t: torch.Tensor) -> np.ndarray:
    """The one input policy (CPU tensors only; ValueError naming the device otherwise), float32/float64 only."""
    return as_array(t, "tensor", dtypes=(np.float32, np.float64))


def _t(a: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).to(like.dtype)


class Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int) -> torch.Tensor:
        y = _t(ops.softmax(_np(x), dim=dim, backend=BACKEND), x)
        ctx.dim = dim
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, None]:
        (y,) = ctx.saved_tensors
        return _t(ops.softmax_backward(_np(y), _np(dy), dim=ctx.dim, backend=BACKEND), y), None


class LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
        y, mean, rstd = ops.layer_norm(_np(x), _np(weight), _np(bias), eps, backend=BACKEND, return_stats=True)
        ctx.save_for_backward(x, weight, _t(mean, x), _t(rstd, x))
        return _t(y, x)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
        x, w, mean, rstd = ctx.saved_tensors
        dx, dw, db = ops.layer_norm_backward(_np(dy), _np(x), _np(w), _np(mean), _np(rstd), backend=BACKEND)
        return _t(dx, x), _t(dw, w), _t(db, w), None


class BiasGelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, bias: torch.Tensor, approximate: str) -> torch.Tensor:
        ctx.approximate = approximate
        ctx.save_for_backward(x, bias)
        return _t(ops.bias_gelu(_np(x), _np(bias), backend=BACKEND, approximate=approximate), x)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, b = ctx.saved_tensors
        dx, db = ops.bias_gelu_backward(_np(dy), _np(x), _np(b), backend=BACKEND, approximate=ctx.approximate)
        return _t(dx, x), _t(db, b), None


class FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, block_size: int
    ) -> torch.Tensor:
        o, lse = ops.flash_attention(_np(q), _np(k), _np(v), causal, block_size, backend=BACKEND, return_lse=True)
        ot = _t(o, q)
        ctx.causal, ctx.block_size = causal, block_size
        ctx.save_for_backward(q, k, v, ot, _t(lse, q))
        return ot

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None]:
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = ops.flash_attention_backward(
            _np(q), _np(k), _np(v), _np(o), _np(lse), _np(do), ctx.causal, ctx.block_size, backend=BACKEND
        )
        return _t(dq, q), _t(dk, k), _t(dv, v), None, None


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return Softmax.apply(x, dim)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return LayerNorm.apply(x, weight, bias, eps)


def bias_gelu(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return BiasGelu.apply(x, bias, approximate)


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, block_size: int = 64
) -> torch.Tensor:
    return FlashAttention.apply(q, k, v, causal, block_size)
