"""Differentiable adaptive pools and max_unpool on tl.Tensors (torch signatures, 1-3 spatial dims).

    adaptive windows   start = floor(o*L/O), end = ceil((o+1)*L/O) per axis; the average is separable (one [O, L]
                       averaging matrix per axis, its transpose in backward), the maximum loops over output cells
    max_unpool         y scattered to the max_pool indices (zeros elsewhere); backward gathers dY at the indices

numpy kernels in ``poolnd.py``; unbatched [C, *spatial] inputs are accepted like torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..autograd.function import Function
from ..autograd.tensor import Tensor
from . import poolnd as P
from ._params import as_float_array, ntuple
from ._tensor_args import batched, per_ndim, unbatch
from .functional_pool import ArgmaxPoolFunction


class MaxUnpoolFunction(Function):
    @staticmethod
    def forward(ctx, x, idx, out):
        N, C = x.shape[:2]
        total = int(np.prod(out))
        flat_idx = idx.reshape(N, C, int(np.prod(idx.shape[2:])))
        if flat_idx.size and (flat_idx.min() < 0 or flat_idx.max() >= total):
            raise ValueError(
                f"indices: values must lie in [0, {total}) for output spatial size {tuple(out)}, got range "
                f"[{int(flat_idx.min())}, {int(flat_idx.max())}]"
            )
        y = np.zeros((N, C, total), dtype=x.dtype)
        np.put_along_axis(y, flat_idx, x.reshape(N, C, int(np.prod(x.shape[2:]))), axis=2)
        ctx.save_for_backward(idx)
        return y.reshape((N, C) + tuple(out))

    @staticmethod
    def backward(ctx, gy):
        (idx,) = ctx.saved_tensors
        return P.gather_flat(gy, idx), None


def _max_unpool(nd, name, input, indices, kernel_size, stride, padding, output_size) -> Tensor:
    x, sq = batched(input, nd, name)
    idx = indices.data if isinstance(indices, Tensor) else np.asarray(indices)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"indices: expected an integer tensor, got dtype {idx.dtype}")
    if sq:
        idx = idx[None]
    if idx.shape != tuple(x.shape):
        raise ValueError(f"indices: shape {idx.shape} must equal the input shape {tuple(x.shape)}")
    k = ntuple(kernel_size, nd, "kernel_size")
    s = k if stride is None else ntuple(stride, nd, "stride")
    p = ntuple(padding, nd, "padding")
    default = tuple((x.shape[2 + i] - 1) * s[i] - 2 * p[i] + k[i] for i in range(nd))
    if output_size is None:
        out = default
    else:
        osz = tuple(int(v) for v in output_size)
        if len(osz) == nd + 2 or (len(osz) == nd + 1 and sq):
            osz = osz[-nd:]
        out = ntuple(osz, nd, "output_size")
        for i in range(nd):
            if not default[i] - s[i] < out[i] < default[i] + s[i]:
                raise ValueError(
                    f"output_size: {out} must lie strictly between {tuple(v - t for v, t in zip(default, s))} and "
                    f"{tuple(v + t for v, t in zip(default, s))} (default {default})"
                )
    if min(out) < 1:
        raise ValueError(f"output_size: {name} output size {out} is not positive")
    return unbatch(MaxUnpoolFunction.apply(x, idx, tuple(out)), sq)


@per_ndim("max_unpool{nd}d")
def _max_unpool_fn(nd: int, name: str) -> Callable[..., Tensor]:
    """torch.nn.functional.max_unpool{nd}d with torch's signature (one definition for every ndim)."""

    def fn(
        input: Tensor, indices: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, output_size: Any = None
    ) -> Tensor:
        return _max_unpool(nd, name, input, indices, kernel_size, stride, padding, output_size)

    return fn


max_unpool1d = _max_unpool_fn(
    1, "torch.nn.functional.max_unpool1d: scatter input to the max_pool1d indices, zeros elsewhere."
)
max_unpool2d = _max_unpool_fn(
    2, "torch.nn.functional.max_unpool2d: the partial inverse of max_pool2d(return_indices=True)."
)
max_unpool3d = _max_unpool_fn(3, "torch.nn.functional.max_unpool3d.")


def _adaptive_size(output_size: Any, spatial: tuple[int, ...]) -> tuple[int, ...]:
    nd = len(spatial)
    if isinstance(output_size, int | np.integer) and not isinstance(output_size, bool):
        out = (int(output_size),) * nd
    elif isinstance(output_size, tuple | list) and len(output_size) == nd:
        out = tuple(spatial[i] if v is None else int(v) for i, v in enumerate(output_size))
    else:
        raise TypeError(f"output_size: expected an int or a {nd}-tuple (None keeps a size), got {output_size!r}")
    if min(out) < 1:
        raise ValueError(f"output_size: must be positive, got {out}")
    if min(spatial) < 1:
        raise ValueError(f"input: adaptive pooling needs non-empty spatial dims, got {spatial}")
    return out


class AdaptiveAvgPoolFunction(Function):
    @staticmethod
    def forward(ctx, x, output_size=1):
        x = as_float_array(x, "input")
        out = _adaptive_size(output_size, x.shape[2:])
        ctx.spatial = x.shape[2:]
        if all(o == 1 for o in out) and x.size:  # global average pooling: one mean over the spatial axes
            ctx.mats = None
            axes = tuple(range(2, x.ndim))
            return x.mean(axis=axes, keepdims=True, dtype=x.dtype)
        mats = [P.adaptive_avg_matrix(L, O, x.dtype) for L, O in zip(x.shape[2:], out, strict=True)]
        ctx.mats = mats
        return P.apply_along(x, mats)

    @staticmethod
    def backward(ctx, gy):
        if ctx.mats is None:  # every input position gets g / (number of positions)
            n = int(np.prod(ctx.spatial))
            return np.broadcast_to(gy / gy.dtype.type(n), gy.shape[:2] + tuple(ctx.spatial)).copy()
        return P.apply_along(gy, ctx.mats, transpose=True)


class AdaptiveMaxPoolFunction(ArgmaxPoolFunction):
    @staticmethod
    def _pool(x, output_size=1):
        return P.adaptive_max_nd(x, _adaptive_size(output_size, x.shape[2:]))


def _adaptive(nd, name, input, output_size, kind, return_indices=False) -> Any:
    x, sq = batched(input, nd, name)
    if kind == "avg":
        return unbatch(AdaptiveAvgPoolFunction.apply(x, output_size=output_size), sq)
    y, idx = AdaptiveMaxPoolFunction.apply(x, output_size=output_size)
    return unbatch((y, idx), sq) if return_indices else unbatch(y, sq)


def adaptive_avg_pool1d(input: Tensor, output_size: Any) -> Tensor:
    """torch.nn.functional.adaptive_avg_pool1d: windows [floor(o*L/O), ceil((o+1)*L/O))."""
    return _adaptive(1, "adaptive_avg_pool1d", input, output_size, "avg")


def adaptive_avg_pool2d(input: Tensor, output_size: Any) -> Tensor:
    """torch.nn.functional.adaptive_avg_pool2d (separable: one averaging matrix per axis)."""
    return _adaptive(2, "adaptive_avg_pool2d", input, output_size, "avg")


def adaptive_avg_pool3d(input: Tensor, output_size: Any) -> Tensor:
    """torch.nn.functional.adaptive_avg_pool3d."""
    return _adaptive(3, "adaptive_avg_pool3d", input, output_size, "avg")


def adaptive_max_pool1d(input: Tensor, output_size: Any, return_indices: bool = False) -> Any:
    """torch.nn.functional.adaptive_max_pool1d."""
    return _adaptive(1, "adaptive_max_pool1d", input, output_size, "max", return_indices)


def adaptive_max_pool2d(input: Tensor, output_size: Any, return_indices: bool = False) -> Any:
    """torch.nn.functional.adaptive_max_pool2d (indices are h*W + w into the input plane)."""
    return _adaptive(2, "adaptive_max_pool2d", input, output_size, "max", return_indices)


def adaptive_max_pool3d(input: Tensor, output_size: Any, return_indices: bool = False) -> Any:
    """torch.nn.functional.adaptive_max_pool3d."""
    return _adaptive(3, "adaptive_max_pool3d", input, output_size, "max", return_indices)


__all__ = [
    "AdaptiveAvgPoolFunction",
    "AdaptiveMaxPoolFunction",
    "MaxUnpoolFunction",
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "adaptive_avg_pool3d",
    "adaptive_max_pool1d",
    "adaptive_max_pool2d",
    "adaptive_max_pool3d",
    "max_unpool1d",
    "max_unpool2d",
    "max_unpool3d",
]
