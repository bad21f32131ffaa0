"""Fused normalisation ops (one graph node each, forward and VJP side by side).

All three normalise x_hat = (x - mu) / sqrt(var + eps) with the *biased* variance, then y = gamma * x_hat + beta.
With m values per statistic and dxh = g * gamma, the VJP through the statistics is

    dx = (1 / sqrt(var + eps)) * (dxh - mean(dxh) - x_hat * mean(dxh * x_hat))
    dgamma = sum(g * x_hat),  dbeta = sum(g)        (sums over everything but the feature dims)

group_norm: statistics over each group of channels of one sample (and its spatial positions); float32/float64 run
the registered ``kernels.group_norm`` / ``group_norm_backward`` kernel (the C++ one when built), other dtypes the
numpy code of GroupNormFn.
batch_norm: statistics over all dims except 1 (channels). Training uses the batch statistics and updates the
running buffers in place: running = (1 - momentum) * running + momentum * batch, with the *unbiased* variance
(m / (m - 1)) for running_var — exactly torch's rule. Eval uses the running statistics (a per-channel affine
map, so dx = g * gamma / sqrt(running_var + eps)); its arithmetic is the registered ``kernels.batch_norm`` /
``batch_norm_backward`` kernel for float32/float64, else the numpy reference (other dtypes, mixed dtypes, empty).
layer_norm: statistics over the trailing ``normalized_shape`` dims of each sample; its arithmetic is the registered
``kernels.layer_norm`` / ``layer_norm_backward`` kernel (float32/float64: the C++ one when built; see
functional_fused.py), else ``tinylearn.kernels.reference`` (the unfused numpy reference), not a copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..autograd.function import Function
from ..autograd.tensor import Tensor
from ..kernels import ops as _k
from ..kernels import reference
from . import functional_fused as _fused


def _stats_vjp(dxh: np.ndarray, xhat: np.ndarray, rstd: np.ndarray) -> np.ndarray:
    """dx = rstd * (dxh - mean(dxh) - xhat * mean(dxh * xhat)), the means over the last axis (one contiguous row per
    statistic: einsum avoids the dxh * xhat temporary); overwrites and returns ``dxh`` (group_norm's numpy path)."""
    m = dxh.shape[-1]
    mean_d = dxh.sum(axis=-1, keepdims=True) / m
    mean_dx = np.einsum("...k,...k->...", dxh, xhat)[..., None] / m
    dxh -= mean_d
    dxh -= xhat * mean_dx
    dxh *= rstd
    return dxh


class BatchNormFn(Function):
    backward_temporary = False  # the backward's one full-size array is dx itself (tl.memory.estimate)

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean=None, running_var=None, training=False, momentum=0.1, eps=1e-5):
        if x.ndim < 2:
            raise ValueError(f"batch_norm: input must have >= 2 dims [N, C, ...], got shape {x.shape}")
        c = x.shape[1]
        for name, a in (
            ("weight", weight),
            ("bias", bias),
            ("running_mean", running_mean),
            ("running_var", running_var),
        ):
            if a is not None and np.shape(a) != (c,):
                raise ValueError(
                    f"batch_norm: {name} shape {np.shape(a)} does not match {c} channels of input {x.shape}"
                )
        m = x.size // c if c else 0
        if training and m <= 1:
            raise ValueError(f"batch_norm: expected more than 1 value per channel when training, got input {x.shape}")
        if not training and (running_mean is None or running_var is None):
            raise ValueError("batch_norm: running_mean and running_var are required when training=False")
        ctx.meta = training
        ctx.kernel = _k.affine_path("batch_norm", x, weight, bias)
        x3 = np.ascontiguousarray(x).reshape(x.shape[0], c, int(np.prod(x.shape[2:])))
        if ctx.kernel is not None:  # the registry's kernel (C++ or its numpy reference) in x's dtype
            given = (None, None) if training else (_as(running_mean, x.dtype), _as(running_var, x.dtype))
            y, mean, invstd, var = _k._kernel("batch_norm", *ctx.kernel)(x3, weight, bias, *given, eps)
        else:  # other dtypes, mixed dtypes, empty input: the reference with numpy's promotion, y in x's dtype
            given = (None, None) if training else (running_mean, running_var)
            y, mean, invstd, var = reference.batch_norm(x3, weight, bias, *given, eps)
        if training:
            _update_running(running_mean, running_var, mean, var, momentum, m)
        ctx.save_for_backward(x3, weight, mean, invstd)  # x and (mean, invstd), not xhat
        y.shape = x.shape  # in place: a fresh array, not a view
        return y

    @staticmethod
    def backward(ctx, g):
        """dx = (dy - xhat sum(dy xhat) / m - sum(dy) / m) invstd w in training (the statistics' VJP), dy invstd w
        in eval; dweight = sum(dy xhat), dbias = sum(dy) (kernels.batch_norm_backward)."""
        training = ctx.meta
        nx, nw, nb = ctx.needs_input_grad[:3]
        x3, weight, mean, invstd = ctx.saved_tensors
        if ctx.kernel is not None:
            kernel = _k._kernel("batch_norm_backward", _k.backward_backend("batch_norm", ctx.kernel[0]))
        else:
            kernel = reference.batch_norm_backward
        gx, gw, gb = kernel(np.ascontiguousarray(g, x3.dtype).reshape(x3.shape), x3, weight, mean, invstd, training,
                            need_dx=bool(nx))  # fmt: skip
        if nx:
            gx.shape = g.shape
        return gx, gw if nw else None, gb if nb else None


def _as(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=dtype)


def _update_running(rm: Any, rv: Any, mean: np.ndarray, var: np.ndarray, momentum: float, m: int) -> None:
    """torch's running statistics, in place: r = (1 - momentum) r + momentum stat, var unbiased (m / (m - 1))."""
    if rm is not None:
        rm *= 1 - momentum
        rm += momentum * mean
    if rv is not None:
        rv *= 1 - momentum
        rv += momentum * var * (m / (m - 1))


def group_norm_path(x: np.ndarray, weight: np.ndarray | None, bias: np.ndarray | None) -> tuple[str, str | None] | None:
    """The registered ``kernels.group_norm`` path (backend, version) for these arrays (float32/float64: the C++
    kernel when built, else the numpy reference; a ``backends.use`` pin wins), or None for GroupNormFn's own numpy
    code (other dtypes, mixed dtypes, empty input)."""
    return _k.affine_path("group_norm", x, weight, bias)


class GroupNormFn(Function):
    """group_norm: statistics over each group of C/G channels and all spatial positions of one sample (m = C/G * HW
    values); gamma/beta per channel. On ``group_norm_path``'s kernel (cpp_src/kernels_groupnorm.cpp: one fused pass
    for the statistics and one for y; the backward from per-channel sums, then one pass for dx) when it picks one;
    else the numpy code below, the same VJP as above with the group as the statistic's set: reductions over
    contiguous [N, G, m] / [N, C, HW] views and element-wise steps in place. The kernel saves x and (mean, rstd),
    the numpy code xhat and rstd."""

    @staticmethod
    def forward(ctx, x, weight, bias, num_groups=1, eps=1e-5):
        ctx.kernel = group_norm_path(x, weight, bias)
        ctx.meta = (num_groups, x.shape)
        if ctx.kernel is not None:  # functional_extra.group_norm checked the arguments: the registry's kernel itself
            x3 = np.ascontiguousarray(x).reshape(x.shape[0], x.shape[1], -1)
            y, mean, rstd = _k._kernel("group_norm", *ctx.kernel)(x3, weight, bias, num_groups, eps)
            ctx.save_for_backward(x3, weight, mean, rstd)
            return y.reshape(x.shape)
        n, c = x.shape[:2]
        xg = x.reshape(n, num_groups, -1)
        m = xg.shape[-1]
        mean = xg.sum(axis=-1, keepdims=True) / m
        xhat = np.subtract(xg, mean)  # centred, then scaled in place below
        var = np.einsum("ngk,ngk->ng", xhat, xhat)[..., None] / m
        rstd = (1.0 / np.sqrt(var + eps)).astype(x.dtype, copy=False)
        xhat *= rstd
        xh3 = xhat.reshape(n, c, -1)
        out3 = xh3 * weight[:, None] if weight is not None else xh3.copy()
        if bias is not None:
            out3 += bias[:, None]
        ctx.save_for_backward(xh3, rstd, weight)
        return out3.reshape(x.shape)

    @staticmethod
    def backward(ctx, g):
        groups, shape = ctx.meta
        nx, nw, nb = ctx.needs_input_grad[:3]
        if ctx.kernel is not None:
            x3, weight, mean, rstd = ctx.saved_tensors
            kernel = _k._kernel("group_norm_backward", _k.backward_backend("group_norm", ctx.kernel[0]))
            dx, dw, db = kernel(np.ascontiguousarray(g, x3.dtype).reshape(x3.shape), x3, weight, mean, rstd, groups)
            return dx.reshape(shape) if nx else None, dw if nw else None, db if nb else None
        xh3, rstd, weight = ctx.saved_tensors
        g3 = np.ascontiguousarray(g).reshape(xh3.shape)
        gw = np.einsum("nck,nck->c", g3, xh3) if nw else None
        gb = g3.sum(axis=-1).sum(axis=0) if nb else None
        gx = None
        if nx:
            n = shape[0]
            dxh = (g3 * weight[:, None] if weight is not None else g3.copy()).reshape(n, groups, -1)
            gx = _stats_vjp(dxh, xh3.reshape(n, groups, -1), rstd).reshape(shape)
        return gx, gw, gb


class LayerNormFn(Function):
    @staticmethod
    def forward(ctx, x, weight, bias, normalized_shape=(), eps=1e-5):
        k = len(normalized_shape)
        if tuple(x.shape[x.ndim - k :]) != tuple(normalized_shape) or k == 0:
            raise ValueError(f"layer_norm: normalized_shape {tuple(normalized_shape)} does not match input {x.shape}")
        for name, a in (("weight", weight), ("bias", bias)):
            if a is not None and a.shape != tuple(normalized_shape):
                raise ValueError(f"layer_norm: {name} shape {a.shape} != normalized_shape {tuple(normalized_shape)}")
        # the fused-kernels topic's registered kernel (float32/float64: the C++ one when built), else its numpy
        # reference (one copy of the math): rows = leading dims, cols = normalised
        c = int(np.prod(normalized_shape))
        w = np.ones(c, x.dtype) if weight is None else weight.reshape(c)
        b = np.zeros(c, x.dtype) if bias is None else bias.reshape(c)
        x2 = x.reshape(-1, c)
        ctx.kernel = _fused.layer_norm_path(x, weight, bias)
        if ctx.kernel is None:
            y, mean, rstd = reference.layer_norm(x2, w, b, eps)
        else:
            y, mean, rstd = _fused.layer_norm_forward(x2, w, b, eps, ctx.kernel)
        ctx.save_for_backward(x2, w, mean, rstd)
        ctx.shapes = (x.shape, tuple(normalized_shape), weight is not None, bias is not None)
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx, g):
        x2, w, mean, rstd = ctx.saved_tensors
        x_shape, norm, has_w, has_b = ctx.shapes
        nx, nw, nb = ctx.needs_input_grad[:3]
        if ctx.kernel is None:
            dx, dw, db = reference.layer_norm_backward(g.reshape(x2.shape), x2, w, mean, rstd)
        else:
            dx, dw, db = _fused.layer_norm_backward(g.reshape(x2.shape), x2, w, mean, rstd, ctx.kernel)
        return (
            dx.reshape(x_shape) if nx else None,
            dw.reshape(norm) if nw and has_w else None,
            db.reshape(norm) if nb and has_b else None,
        )


def batch_norm(
    x: Tensor,
    running_mean: Tensor | np.ndarray | None,
    running_var: Tensor | np.ndarray | None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """torch.nn.functional.batch_norm; running buffers (if given) are updated in place when training."""
    rm = running_mean.data if isinstance(running_mean, Tensor) else running_mean
    rv = running_var.data if isinstance(running_var, Tensor) else running_var
    return BatchNormFn.apply(
        x, weight, bias, running_mean=rm, running_var=rv, training=training, momentum=momentum, eps=eps
    )


def layer_norm(
    x: Tensor,
    normalized_shape: int | Sequence[int],
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    return LayerNormFn.apply(x, weight, bias, normalized_shape=ns, eps=eps)
