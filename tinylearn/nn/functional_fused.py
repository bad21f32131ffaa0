"""Tensor-level ops on the registered fused kernels: ``tl.nn.functional.softmax / gelu / layer_norm /
scaled_dot_product_attention`` on tl.Tensors reach ``kernels.<op>`` in ``tinylearn.backends`` (the C++ kernels when
built), with autograd.

Forward: the kernel ``tinylearn.kernels.ops.tensor_path`` picks for the input's dtype (a ``backends.use`` pin on
``kernels.<op>``, else the fastest available; float64 stays float64). Backward: the same backend's ``<op>_backward``
kernel where it has one, else the numpy reference. Inputs of other dtypes (float16 / bfloat16 Tensors, integer)
run the Tensor ops' own numpy code, as before. Non-contiguous and broadcast arrays are copied to C order by the
kernels' dispatcher.

The Function classes keep the names of the ops they replace (``Softmax``, ``GELU``, ``LayerNormFn``) so autocast's
op lists (matched by class name) treat them the same way.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..autograd import ops_elementwise as _ew
from ..autograd import ops_reduce as _red
from ..autograd.autocast_state import is_autocast_enabled
from ..autograd.function import Function
from ..autograd.tensor import Tensor
from ..kernels import ops as _k


class Softmax(_red.Softmax):
    @staticmethod
    def forward(ctx, x, dim=-1):
        path = _k.tensor_path("softmax", x.dtype) if x.ndim and x.size else None
        ctx.kernel = path
        if path is None:
            return _red.Softmax.forward(ctx, x, dim)
        ctx.d = _red.norm_dim(dim, x.ndim)  # the Tensor op's argument checks and messages
        y = _k.softmax(x, ctx.d, backend=path[0], version=path[1])
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        if ctx.kernel is None:
            return _red.Softmax.backward(ctx, g)
        (y,) = ctx.saved_tensors
        return _k.softmax_backward(y, g, ctx.d, backend=_k.backward_backend("softmax", ctx.kernel[0]))


def _colmajor(a: np.ndarray) -> bool:
    """A 2-D column-major array (not also row-major): its transpose is C-contiguous, so an element-wise kernel runs
    on ``a.T`` and its result is transposed back, instead of the kernels' dispatcher copying it to C order (a
    transposing copy cost ~10x the GELU itself on Linear's [512, 1024] output)."""
    return a.ndim == 2 and a.flags.f_contiguous and not a.flags.c_contiguous


class GELU(_ew.GELU):
    @staticmethod
    def forward(ctx, a, approximate="none"):
        path = _k.tensor_path("bias_gelu", a.dtype) if a.ndim and a.size else None
        ctx.kernel = path
        if path is None:
            return _ew.GELU.forward(ctx, a, approximate)
        _k._check_approx(approximate)
        ctx.approximate = approximate
        ctx.save_for_backward(a)
        if _colmajor(a):  # e.g. Linear's [N, out] output (autograd/linalg.py): element-wise on the same memory
            return _k.bias_gelu(a.T, np.zeros(a.shape[0], a.dtype), backend=path[0], approximate=approximate).T
        return _k.bias_gelu(a, np.zeros(a.shape[-1], a.dtype), backend=path[0], approximate=approximate)

    @staticmethod
    def backward(ctx, g):
        if ctx.kernel is None:
            return _ew.GELU.backward(ctx, g)
        (a,) = ctx.saved_tensors
        b = _k.backward_backend("bias_gelu", ctx.kernel[0])
        if _colmajor(a) and _colmajor(g):
            zeros = np.zeros(a.shape[0], a.dtype)
            return _k.bias_gelu_backward(g.T, a.T, zeros, backend=b, approximate=ctx.approximate)[0].T
        return _k.bias_gelu_backward(g, a, np.zeros(a.shape[-1], a.dtype), backend=b, approximate=ctx.approximate)[0]


def layer_norm_path(x: np.ndarray, weight: Any, bias: Any) -> tuple[str, str | None] | None:
    """The kernel path of a layer_norm on these arrays, or None for the numpy reference (other dtypes, mixed
    dtypes, empty input)."""
    return _k.affine_path("layer_norm", x, weight, bias)


def layer_norm_forward(
    x2: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float, path: tuple[str, str | None]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(y, mean, rstd) of rows ``x2`` [R, C] on the kernel ``path``. LayerNormFn has checked the shapes and made w, b
    [C] arrays of x's dtype, so a native dtype goes straight to the registered kernel (kernels.layer_norm's argument
    checks cost more than the kernel at decode sizes); anything else takes the checked entry point."""
    kern = _k._kernel("layer_norm", path[0], path[1])
    if x2.shape[0] and type(eps) is float and eps >= 0 and x2.dtype.type in kern.module.NATIVE_DTYPES:
        y, mean, rstd = kern(np.ascontiguousarray(x2), np.ascontiguousarray(w), np.ascontiguousarray(b), eps)
        return y, mean, rstd
    return _k.layer_norm(x2, w, b, eps, backend=path[0], version=path[1], return_stats=True)


def layer_norm_backward(
    g2: np.ndarray, x2: np.ndarray, w: np.ndarray, mean: np.ndarray, rstd: np.ndarray, path: tuple[str, str | None]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dx, dw, db) of rows [R, C] after a forward on ``path``."""
    return _k.layer_norm_backward(g2, x2, w, mean, rstd, backend=_k.backward_backend("layer_norm", path[0]))


class ScaledDotProductAttention(Function):
    """softmax(q k^T / sqrt(D) [+ causal mask]) v on the flash-attention kernel; backward by recomputation."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False):
        path = _k.tensor_path("attention", q.dtype)
        o, lse = _k.flash_attention(q, k, v, causal=causal, backend=path[0], version=path[1], return_lse=True)
        ctx.kernel, ctx.causal = path, causal
        ctx.save_for_backward(q, k, v, o, lse)
        return o

    @staticmethod
    def backward(ctx, g):
        q, k, v, o, lse = ctx.saved_tensors
        b = _k.backward_backend("attention", ctx.kernel[0])
        return _k.flash_attention_backward(q, k, v, o, lse, g, causal=ctx.causal, backend=b)


def sdpa_fits(query: Tensor, key: Tensor, value: Tensor, attn_mask: Any, dropout_p: float, scale: Any) -> bool:
    """Whether scaled_dot_product_attention can run on the flash kernel: no mask or dropout, the default scale,
    equal leading dims (no broadcasting), one float32/float64 dtype, at least one key, and autocast off (its
    lower-precision list lowers the composite's matmuls)."""
    q, k, v = (t.data if isinstance(t, Tensor) else None for t in (query, key, value))
    if q is None or k is None or v is None or attn_mask is not None or dropout_p > 0 or is_autocast_enabled():
        return False
    if (
        q.ndim < 2
        or k.ndim != q.ndim
        or v.ndim != q.ndim
        or q.shape[:-2] != k.shape[:-2]
        or k.shape[:-2] != v.shape[:-2]
    ):
        return False
    if q.dtype != k.dtype or q.dtype != v.dtype or _k.tensor_path("attention", q.dtype) is None:
        return False
    if k.shape[-1] != q.shape[-1] or v.shape[-2] != k.shape[-2] or k.shape[-2] < 1 or q.shape[-1] < 1:
        return False
    return scale is None or float(scale) == 1.0 / math.sqrt(q.shape[-1])
