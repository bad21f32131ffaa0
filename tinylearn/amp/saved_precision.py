"""Saved activations in mixed precision under a memory budget (``tl.amp.plan_saved_precision``) -- seed Q250.

A Linear layer keeps its input x only for dW = g^T x. Storing x in fewer bits (bf16, fp16, int8 with one absmax
scale) shrinks what backward keeps, at the price of an error in dW that is the layer's *sensitivity* times the
*quantization error* of its saved input: ||g^T (x - q(x))|| grows with how large the layer's output gradient g is
and with how coarse q is. So keep the layers whose gradients are sensitive in high precision and the others low:

    min_f  sum_i err_i(f_i)   s.t.   sum_i size_i * bytes(f_i) <= budget

a multiple-choice knapsack, solved exactly here by enumeration (a few layers) -- ``err_i(f)`` measured by running
the backward once per layer and format (``quant_saved_linear``), so error accumulation through the layers is in it.

    quantize_saved(x, fmt) -> the float32 values backward will see, and the bytes per element
    quant_saved_linear(x, w, b, fmt) -> y = x W^T + b whose saved x is stored in ``fmt``
    plan_saved_precision(sizes, errors, budget_bytes) -> the format per layer, its bytes and its summed error
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .._inputs import as_array
from ..autograd import Function, Tensor
from .bf16 import round_to_bf16

__all__ = ["FORMAT_BYTES", "QuantSavedLinear", "plan_saved_precision", "quant_saved_linear", "quantize_saved"]

FORMAT_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1}


def quantize_saved(x: np.ndarray, fmt: str) -> tuple[np.ndarray, int]:
    """(x as backward will see it after storing it in ``fmt``, bytes per element). int8: symmetric, one absmax scale."""
    if not isinstance(fmt, str) or fmt not in FORMAT_BYTES:
        raise ValueError(f"fmt: expected one of {sorted(FORMAT_BYTES)}, got {fmt!r}")
    x = np.asarray(as_array(x, "x", dtypes=("f", "i", "u")), np.float32)
    if fmt == "int8" and not np.isfinite(x).all():  # a NaN/Inf absmax would make the one shared scale NaN/Inf
        raise ValueError("x: int8 storage needs finite values, got NaN or Inf")
    if fmt == "fp32":
        q = x.copy()
    elif fmt == "bf16":
        q = round_to_bf16(x)
    elif fmt == "fp16":
        q = x.astype(np.float16).astype(np.float32)
    else:
        amax = float(np.abs(x).max()) if x.size else 0.0
        s = amax / 127.0 if amax > 0 else 1.0
        q = (np.clip(np.rint(x / s), -127, 127) * s).astype(np.float32)
    return q, FORMAT_BYTES[fmt]


class QuantSavedLinear(Function):
    """y = x W^T + b computed exactly; the input saved for dW is stored in a low-precision format."""

    @staticmethod
    def forward(ctx: Any, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, fmt: str = "fp32") -> np.ndarray:
        xq, nbytes = quantize_saved(x, fmt)
        ctx.save_for_backward(xq, w)
        ctx.has_b = b is not None
        ctx.saved_bytes = xq.size * nbytes
        out = x @ w.T
        return out + b if b is not None else out

    @staticmethod
    def backward(ctx: Any, g: np.ndarray) -> tuple[Any, ...]:
        xq, w = ctx.saved_tensors
        gx = g @ w if ctx.needs_input_grad[0] else None
        gw = g.T @ xq if ctx.needs_input_grad[1] else None
        gb = g.sum(0) if ctx.has_b and ctx.needs_input_grad[2] else None
        return (gx, gw, gb) if ctx.has_b else (gx, gw)


def quant_saved_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, fmt: str = "fp32") -> Tensor:
    """Linear (x [N, in]) whose saved input is stored in ``fmt`` (fp32, bf16, fp16, int8); the output is exact."""
    if not isinstance(x, Tensor) or x.ndim != 2:
        raise ValueError(f"x: expected a 2-D tinylearn Tensor, got {getattr(x, 'shape', type(x).__name__)}")
    if not isinstance(weight, Tensor) or weight.ndim != 2 or weight.shape[1] != x.shape[1]:
        raise ValueError(
            f"weight: expected a Tensor of shape [out, {x.shape[1]}], got {getattr(weight, 'shape', None)}"
        )
    if fmt not in FORMAT_BYTES:
        raise ValueError(f"fmt: expected one of {sorted(FORMAT_BYTES)}, got {fmt!r}")
    if bias is None:
        return QuantSavedLinear.apply(x, weight, fmt=fmt)
    return QuantSavedLinear.apply(x, weight, bias, fmt=fmt)


def plan_saved_precision(
    sizes: Sequence[int], errors: Sequence[Mapping[str, float]], budget_bytes: float, max_configs: int = 1 << 20
) -> tuple[list[str], int, float]:
    """The format per layer minimising the summed error within ``budget_bytes`` (exact: every combination).

    ``sizes[i]``: elements layer i saves; ``errors[i][fmt]``: the error that storing layer i in ``fmt`` adds (only the
    formats listed are candidates). Returns (formats, bytes, summed error); ValueError if nothing fits."""
    if len(sizes) != len(errors) or not sizes:
        raise ValueError(f"sizes and errors: need one entry per layer, got {len(sizes)} and {len(errors)}")
    for i, (n, e) in enumerate(zip(sizes, errors, strict=True)):
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
            raise ValueError(f"sizes[{i}]: expected an int >= 0, got {n!r}")
        bad = [f for f in e if f not in FORMAT_BYTES]
        if not e or bad:
            raise ValueError(f"errors[{i}]: expected formats from {sorted(FORMAT_BYTES)}, got {sorted(e)}")
        if any(not np.isfinite(v) or v < 0 for v in e.values()):
            raise ValueError(f"errors[{i}]: errors must be finite and >= 0, got {dict(e)}")
    if not np.isfinite(budget_bytes) or budget_bytes < 0:
        raise ValueError(f"budget_bytes: expected a finite number >= 0, got {budget_bytes}")
    n_configs = int(np.prod([len(e) for e in errors]))
    if n_configs > max_configs:
        raise ValueError(f"errors: {n_configs} combinations exceed max_configs={max_configs}")
    best: tuple[float, int, list[str]] | None = None
    for combo in itertools.product(*[sorted(e) for e in errors]):
        nbytes = sum(int(n) * FORMAT_BYTES[f] for n, f in zip(sizes, combo, strict=True))
        if nbytes > budget_bytes:
            continue
        err = float(sum(e[f] for e, f in zip(errors, combo, strict=True)))
        if best is None or (err, nbytes) < best[:2]:
            best = (err, nbytes, list(combo))
    if best is None:
        smallest = sum(int(n) * min(FORMAT_BYTES[f] for f in e) for n, e in zip(sizes, errors, strict=True))
        raise ValueError(f"budget_bytes: {budget_bytes} is below the smallest possible {smallest} bytes")
    return best[2], best[1], best[0]
