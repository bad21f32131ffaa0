"""``tl.autocast(dtype="bfloat16"|"float16")``: run GEMM-like ops in the low dtype, precision-sensitive ops in fp32.

Inside the context every differentiable op goes through one hook in ``Function.apply`` which looks the op up in
two lists (torch's autocast op categories, aten/src/ATen/autocast_mode.cpp):

- **lower precision** (``LOWER_PRECISION_OPS``): floating inputs are cast to the autocast dtype, the op runs on
  low-precision arrays (products accumulated in fp32, as torch's CPU bf16 GEMM does) and its output is stored in
  the low dtype. torch's CPU list: conv1d/2d/3d, conv_transpose*, bmm, mm, baddbmm, addmm, addbmm, linear,
  matmul, linalg_vecdot, prelu, scaled_dot_product_attention, _native_multi_head_attention, conv_tbc,
  mkldnn_rnn_layer. tinylearn has: matmul (MatMul), linear (Linear), conv2d (ConvNdFunction), conv1d/conv3d
  (ConvNdFunction), conv_transpose1d/2d/3d (ConvTransposeNdFunction).
- **fp32** (``FP32_OPS``): low-precision inputs are cast up to float32 and the output is float32. These entries
  are on torch's CUDA fp32 list ("CUDA Ops that can autocast to float32": softmax, log_softmax, layer_norm,
  sum, cross_entropy, exp, log, pow, ...); torch's CPU fp32 list has only the losses (mse_loss, nll_loss,
  cross_entropy_loss, ...) and runs softmax / layer_norm / sum in their input dtype (with fp32 math inside), so
  on CPU the two policies differ only in whether those outputs are rounded to bf16.
  ``TINYLEARN_FP32_OPS`` are tinylearn's own additions, on **no** torch autocast list: batch_norm (torch runs it
  in the input dtype; cuDNN keeps the statistics and affine parameters in fp32), mean and var (torch: input
  dtype, fp32 accumulation). tinylearn's kernels for them have no low-precision path with fp32 accumulation, so
  they run in fp32 -- within bf16 tolerance of torch either way.
- everything else (add, mul, relu, reshape, pooling, ...) runs in whatever dtype its inputs have; mixed inputs
  promote (bf16 + fp32 -> fp32), like torch's "promote" list.

Casts are differentiable: the gradient of a cast is cast back to the source dtype, so fp32 parameters receive
fp32 gradients (the "master weights" of mixed-precision training).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import backends
from ..autograd import Function, Tensor
from ..autograd.autocast_state import (  # noqa: F401  (get_/is_autocast_*: the state lives in autograd, re-exported)
    _State,
    get_autocast_dtype,
    is_autocast_enabled,
    register_hook,
    set_dtype,
)
from .bf16_ops import FROM_BF16, ROUND_BF16, TO_BF16
from .dtypes import bfloat16, float16, float32, is_floating, low_dtype

# torch aten op -> tinylearn Function class name
LOWER_PRECISION_OPS: dict[str, str] = {
    "matmul": "MatMul",
    "mm": "MatMul",
    "bmm": "MatMul",
    "linear": "Linear",
    "addmm": "Linear",
    "conv2d": "ConvNdFunction",
    "conv1d": "ConvNdFunction",
    "conv3d": "ConvNdFunction",
    "conv_transpose1d": "ConvTransposeNdFunction",
    "conv_transpose2d": "ConvTransposeNdFunction",
    "conv_transpose3d": "ConvTransposeNdFunction",
}
FP32_OPS: dict[str, str] = {  # a subset of torch's CUDA autocast-to-float32 list
    "softmax": "Softmax",
    "log_softmax": "LogSoftmax",
    "layer_norm": "LayerNormFn",
    "sum": "Sum",
    "cross_entropy_loss": "CrossEntropyFn",
    "exp": "Exp",
    "log": "Log",
    "pow": "Pow",
}
# run in fp32 by tinylearn although no torch autocast list has them (torch: input dtype, fp32 math inside)
TINYLEARN_FP32_OPS: dict[str, str] = {
    "batch_norm": "BatchNormFn",
    "mean": "Mean",
    "var": "Var",
}
# lower-precision ops whose tinylearn kernels only take fp32: inputs are rounded to the low dtype, the op runs in
# fp32 on those values and the output is rounded (same numbers as a low-precision kernel with fp32 accumulation)
EMULATED_OPS = frozenset({"ConvNdFunction", "ConvTransposeNdFunction"})
_CATEGORY: dict[str, str] = {
    **{v: "lower" for v in LOWER_PRECISION_OPS.values()},
    **{v: "fp32" for v in FP32_OPS.values()},
    **{v: "fp32" for v in TINYLEARN_FP32_OPS.values()},
}


def op_category(fn_class: type | str) -> str | None:
    """'lower', 'fp32' or None (runs in its input dtype) for a Function class or its name."""
    if not isinstance(fn_class, (str, type)):
        raise TypeError(f"fn_class: expected a Function class or its name, got {type(fn_class).__name__}")
    name = fn_class if isinstance(fn_class, str) else fn_class.__name__
    return _CATEGORY.get(name)


class AutocastCast(Function):
    """Differentiable dtype cast; the backward casts the gradient back to the source dtype."""

    @staticmethod
    def forward(ctx, x, dtype):
        ctx.src = x.dtype
        return _convert(x, dtype)

    @staticmethod
    def backward(ctx, g):
        return _convert(g, ctx.src), None


def _convert(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """x in ``dtype``; float32 <-> bfloat16 on the registered casts (C++ for contiguous arrays: 4x ml_dtypes'
    astype to bf16, 4.5x from it)."""
    if dtype == bfloat16 and x.dtype == float32:
        return backends.dispatch(TO_BF16, x)
    if dtype == float32 and x.dtype == bfloat16:
        return backends.dispatch(FROM_BF16, x)
    return x.astype(dtype)


class AutocastRound(Function):
    """x rounded to the autocast dtype but kept in float32: one node for an emulated op's input (instead of a cast
    to bf16 and a cast back, two nodes and two arrays); the backward rounds the gradient the same way (the two
    casts' backward)."""

    @staticmethod
    def forward(ctx, x, dtype):
        ctx.dtype = dtype
        return _round_fp32(x, dtype)

    @staticmethod
    def backward(ctx, g):
        return _round_fp32(g, ctx.dtype), None


def _round_fp32(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if dtype == bfloat16 and x.dtype == float32:
        return backends.dispatch(ROUND_BF16, x)  # one pass (C++ for contiguous arrays) instead of two casts
    return _convert(_convert(x, dtype), x.dtype)


def _emulated_input(a: Any, dtype: np.dtype) -> Any:
    """An fp32 input of an emulated op: its values rounded to ``dtype``, in float32 (a low-precision one: cast up)."""
    if not isinstance(a, Tensor) or not is_floating(a.dtype):
        return a
    _State.n_cast += 1
    if a.dtype == float32:
        return AutocastRound.apply(a, dtype)
    return AutocastCast.apply(_cast(a, dtype), float32)


def _cast(a: Any, dtype: np.dtype) -> Any:
    if isinstance(a, Tensor) and a.dtype != dtype and is_floating(a.dtype):
        _State.n_cast += 1
        return AutocastCast.apply(a, dtype)
    return a


def autocast_hook(cls: type, args: tuple, kwargs: dict) -> Any:
    """Called by ``Function.apply`` while autocast is on; NotImplemented means "apply the op unchanged"."""
    dt = _State.dtype
    cat = _CATEGORY.get(cls.__name__)
    if dt is None or cat is None or _State.inside:
        return NotImplemented
    target = dt if cat == "lower" else float32
    emulated = cat == "lower" and (cls.__name__ in EMULATED_OPS or dt == float16)
    if emulated:
        # no low-precision kernel here (conv backends take fp32; numpy's fp16 matmul has no BLAS): compute in fp32
        # on the rounded inputs -- exact products, fp32 accumulation, like torch's CPU kernels -- then round once
        new_args = tuple(_emulated_input(a, dt) for a in args)
    else:
        new_args = tuple(_cast(a, target) for a in args)
    _State.inside = True
    try:
        out = cls.apply(*new_args, **kwargs)
    finally:
        _State.inside = False
    if isinstance(out, Tensor) and out.dtype != target and cat == "lower" and not emulated:
        # numpy accumulates low-precision GEMMs in fp32: round the result once and store it in the low dtype
        # (replacing the array, not adding a cast node, so the fp32 result is not kept alive by the graph);
        # emulated ops get a cast node instead: their fp32 backward kernels need an fp32 output gradient
        out.data = out.data.astype(target)
    elif isinstance(out, Tensor) and out.dtype != target:
        return _cast(out, target)
    return out


register_hook(autocast_hook)


class autocast:  # noqa: N801  (torch's name)
    """Context manager / decorator: ``with tl.autocast(dtype="bfloat16"): loss = model(x) ...``.

    ``dtype``: 'bfloat16' / 'float16' (or 'bf16', 'fp16', 'half'), the numpy/ml_dtypes dtypes, or torch.bfloat16 /
    torch.float16. Nested contexts restore the outer dtype on exit; ``enabled=False`` turns autocast off inside.
    Thread-local like torch's: the context changes only the calling thread's ops."""

    def __init__(self, dtype: Any = "bfloat16", enabled: bool = True) -> None:
        self.dtype = low_dtype(dtype)
        if not isinstance(enabled, (bool, np.bool_)):
            raise TypeError(f"enabled: expected a bool, got {type(enabled).__name__} {enabled!r}")
        self.enabled = bool(enabled)
        self._prev = threading.local()  # per-thread stack: one autocast object may be entered by several threads

    def __enter__(self) -> autocast:
        stack = self._prev.__dict__.setdefault("stack", [])
        stack.append(set_dtype(self.dtype if self.enabled else None))
        return self

    def __exit__(self, *exc: object) -> None:
        set_dtype(self._prev.stack.pop())

    def __call__(self, fn: Callable) -> Callable:
        if not callable(fn):
            raise TypeError(f"fn: autocast decorates a callable, got {type(fn).__name__}")

        @functools.wraps(fn)
        def wrapped(*a: Any, **k: Any) -> Any:
            with autocast(self.dtype, self.enabled):
                return fn(*a, **k)

        return wrapped
