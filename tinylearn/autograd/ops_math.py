"""Elementwise math beyond the basics (torch's names), forward and VJP side by side.

Unary ops are one table row each: ``name: (forward, dy/dx as a function of (x, y))``; the VJP is g * dy/dx.

    sin  cos x          cos  -sin x         tan  1 + y^2          asin  1/sqrt(1-x^2)    acos  -1/sqrt(1-x^2)
    atan 1/(1+x^2)      sinh cosh x         cosh sinh x           asinh 1/sqrt(x^2+1)    acosh 1/sqrt(x^2-1)
    atanh 1/(1-x^2)     erf  2/sqrt(pi) e^(-x^2)                  erfc  -erf'            exp2  y ln 2
    expm1 y + 1         log2 1/(x ln 2)     log10 1/(x ln 10)     log1p 1/(1+x)          rsqrt -y^3/2
    reciprocal -y^2     square 2x           frac 1                floor/ceil/round/trunc/sign  0 (as torch)

Binary:
    atan2(a, b)     da = g b/(a^2+b^2)       db = -g a/(a^2+b^2)
    copysign(a, b)  da = g y/a (0 at a = 0)  db = 0
    logaddexp       da = g e^(a-y)           db = g e^(b-y)
    remainder       da = g                   db = -g floor(a/b)     (python's sign: follows the divisor)
    fmod            da = g                   db = -g trunc(a/b)     (C's sign: follows the dividend)
    lerp(a, b, w)   y = a + w (b - a)        da = g (1-w)   db = g w   dw = g (b - a)

Integer/bool inputs of ops that produce floats are promoted to float32 first, as torch does.
"""

from __future__ import annotations

import math

import numpy as np

from .dtypes import promote_pair
from .errors import ShapeError, broadcasting
from .function import Function, unbroadcast

_LN2, _LN10 = math.log(2.0), math.log(10.0)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def _erf(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf

    return erf(x)


def _erfc(x: np.ndarray) -> np.ndarray:
    from scipy.special import erfc

    return erfc(x)


def _zero(x, y):
    return np.zeros_like(y)


# name: (forward, derivative(x, y), promotes integers to float)
UNARY: dict = {
    "sin": (np.sin, lambda x, y: np.cos(x), True),
    "cos": (np.cos, lambda x, y: -np.sin(x), True),
    "tan": (np.tan, lambda x, y: 1 + y * y, True),
    "asin": (np.arcsin, lambda x, y: 1 / np.sqrt(1 - x * x), True),
    "acos": (np.arccos, lambda x, y: -1 / np.sqrt(1 - x * x), True),
    "atan": (np.arctan, lambda x, y: 1 / (1 + x * x), True),
    "sinh": (np.sinh, lambda x, y: np.cosh(x), True),
    "cosh": (np.cosh, lambda x, y: np.sinh(x), True),
    "asinh": (np.arcsinh, lambda x, y: 1 / np.sqrt(x * x + 1), True),
    "acosh": (np.arccosh, lambda x, y: 1 / np.sqrt(x * x - 1), True),
    "atanh": (np.arctanh, lambda x, y: 1 / (1 - x * x), True),
    "erf": (_erf, lambda x, y: _TWO_OVER_SQRT_PI * np.exp(-x * x), True),
    "erfc": (_erfc, lambda x, y: -_TWO_OVER_SQRT_PI * np.exp(-x * x), True),
    "exp2": (np.exp2, lambda x, y: y * _LN2, True),
    "expm1": (np.expm1, lambda x, y: y + 1, True),
    "log2": (np.log2, lambda x, y: 1 / (x * _LN2), True),
    "log10": (np.log10, lambda x, y: 1 / (x * _LN10), True),
    "log1p": (np.log1p, lambda x, y: 1 / (1 + x), True),
    "rsqrt": (lambda x: 1 / np.sqrt(x), lambda x, y: -0.5 * y * y * y, True),
    "reciprocal": (lambda x: 1 / x, lambda x, y: -y * y, True),
    "square": (np.square, lambda x, y: 2 * x, False),
    "floor": (np.floor, _zero, False),
    "ceil": (np.ceil, _zero, False),
    "trunc": (np.trunc, _zero, False),
    "sign": (np.sign, _zero, False),
    "frac": (lambda x: x - np.trunc(x), lambda x, y: np.ones_like(y), False),
}


def promote_float(x: np.ndarray) -> np.ndarray:
    """torch's rule for float-producing ops: integer/bool inputs become float32 (float inputs keep their dtype)."""
    return x if x.dtype.kind in "fc" or x.dtype.name == "bfloat16" else x.astype(np.float32)


class Unary(Function):
    """One elementwise map from the UNARY table, chosen by ``op=``."""

    @staticmethod
    def forward(ctx, x, op="sin"):
        f, _, promote = UNARY[op]
        if promote:
            x = promote_float(x)
        with np.errstate(all="ignore"):
            y = x.copy() if op in ("floor", "ceil", "trunc") and x.dtype.kind in "iub" else np.asarray(f(x))
        if y.dtype != x.dtype and x.dtype.kind in "fc":
            y = y.astype(x.dtype)
        ctx.op = op
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        with np.errstate(all="ignore"):
            return (g * UNARY[ctx.op][1](x, y)).astype(g.dtype, copy=False)


class Round(Function):
    @staticmethod
    def forward(ctx, x, decimals=0):
        ctx.shape = x.shape
        return np.round(x, decimals)

    @staticmethod
    def backward(ctx, g):
        return np.zeros(ctx.shape, g.dtype)


def _binary_prep(a, b, op: str = "binary op"):
    if np.shape(a) != np.shape(b):
        with broadcasting(op, a, b):
            np.broadcast_shapes(np.shape(a), np.shape(b))
    a, b = promote_pair(a, b)  # torch's pairwise rule first (an int tensor meeting float16 becomes float16)
    if isinstance(a, np.ndarray):
        a = promote_float(a)
    if isinstance(b, np.ndarray):
        b = promote_float(b)
    return a, b


def _cast(out, a, b):
    """Python scalars do not upcast a float32 tensor (numpy 2 already follows this; keep 0-d results arrays)."""
    return np.asarray(out)


class Atan2(Function):
    @staticmethod
    def forward(ctx, a, b):
        a, b = _binary_prep(a, b, "atan2")
        ctx.save_for_backward(a, b)
        return _cast(np.arctan2(a, b), a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        na, nb = ctx.needs_input_grad
        with np.errstate(all="ignore"):
            den = a * a + b * b
            ga = unbroadcast(g * b / den, np.shape(a)) if na else None
            gb = unbroadcast(-g * a / den, np.shape(b)) if nb else None
        return ga, gb


class Copysign(Function):
    @staticmethod
    def forward(ctx, a, b):
        a, b = _binary_prep(a, b, "copysign")
        y = _cast(np.copysign(a, b), a, b)
        ctx.save_for_backward(a, y)
        return y

    @staticmethod
    def backward(ctx, g):
        a, y = ctx.saved_tensors
        na, nb = ctx.needs_input_grad
        ga = gb = None
        if na:
            with np.errstate(all="ignore"):
                r = np.where(np.asarray(a) == 0, 0.0, y / a)
            ga = unbroadcast((g * r).astype(g.dtype, copy=False), np.shape(a))
        if nb:
            gb = np.zeros(np.shape(ctx.inputs[1]), g.dtype)
        return ga, gb


class LogAddExp(Function):
    @staticmethod
    def forward(ctx, a, b):
        a, b = _binary_prep(a, b, "logaddexp")
        y = _cast(np.logaddexp(a, b), a, b)
        ctx.save_for_backward(a, b, y)
        return y

    @staticmethod
    def backward(ctx, g):
        a, b, y = ctx.saved_tensors
        na, nb = ctx.needs_input_grad
        ga = unbroadcast(g * np.exp(a - y), np.shape(a)) if na else None
        gb = unbroadcast(g * np.exp(b - y), np.shape(b)) if nb else None
        return ga, gb


class Remainder(Function):
    """``fmod=False``: python's remainder (sign of the divisor); ``fmod=True``: C's fmod (sign of the dividend)."""

    @staticmethod
    def forward(ctx, a, b, fmod=False):
        a, b = promote_pair(a, b)
        ctx.save_for_backward(a, b)
        ctx.fmod = fmod
        with np.errstate(all="ignore"), broadcasting("fmod" if fmod else "remainder", a, b):
            return _cast(np.fmod(a, b) if fmod else np.remainder(a, b), a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        na, nb = ctx.needs_input_grad
        ga = unbroadcast(g, np.shape(a)) if na else None
        gb = None
        if nb:
            with np.errstate(all="ignore"):
                q = np.trunc(a / b) if ctx.fmod else np.floor(a / b)
            gb = unbroadcast((-g * q).astype(g.dtype, copy=False), np.shape(b))
        return ga, gb


class Lerp(Function):
    @staticmethod
    def forward(ctx, a, b, w):
        ctx.save_for_backward(a, b, w)
        try:
            return _cast(a + w * (b - a), a, b)
        except ValueError:
            raise ShapeError(f"lerp: shapes {np.shape(a)}, {np.shape(b)}, {np.shape(w)} cannot be broadcast") from None

    @staticmethod
    def backward(ctx, g):
        a, b, w = ctx.saved_tensors
        na, nb, nw = ctx.needs_input_grad
        ga = unbroadcast(g * (1 - w), np.shape(a)) if na else None
        gb = unbroadcast(g * w, np.shape(b)) if nb else None
        gw = unbroadcast(g * (b - a), np.shape(w)) if nw else None
        return ga, gb, gw
