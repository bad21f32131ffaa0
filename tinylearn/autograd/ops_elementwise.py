"""Elementwise ops, forward and VJP side by side. Binary ops broadcast like numpy/torch.

Broadcasting rule for the VJP: if z = f(a, b) with a broadcast from shape s_a, then dL/da = sum of
dL/dz * df/da over the axes broadcasting created or stretched (``unbroadcast(grad, s_a)``).

    add  z=a+b     da = g            db = g
    sub  z=a-b     da = g            db = -g
    mul  z=a*b     da = g*b          db = g*a
    div  z=a/b     da = g/b          db = -g*a/b^2
    pow  z=a^b     da = g*b*a^(b-1)  db = g*z*ln(a)   (0 where a == 0, as torch)
    exp  z=e^a     da = g*z;   log  da = g/a;   sqrt  da = g/(2z);   tanh  da = g*(1-z^2)
    sigmoid        da = g*z*(1-z);  relu  da = [z>0] ? g : 0;  abs  da = g*sign(a);  clip  da = g*[lo<=a<=hi]
    gelu  z = a*Phi(a)        da = g*(Phi(a) + a*phi(a))       (tanh approximation differentiated exactly)
    maximum        da = g*([a>b] + 0.5*[a==b])  (ties split evenly, like torch)
"""

from __future__ import annotations

import math
import operator

import numpy as np

from .dtypes import promote_pair
from .errors import ShapeError, broadcasting
from .function import Function, unbroadcast
from .relu import relu_array, relu_backward_array  # registered ops autograd.relu / autograd.relu_backward


def _bshape(op: str, a, b) -> None:
    raise ShapeError(f"{op}: shapes {np.shape(a)} and {np.shape(b)} cannot be broadcast together")


def _broadcast(op: str, fn, a, b):
    """``fn(a, b)``; a numpy broadcast failure becomes the ShapeError naming ``op`` and both shapes."""
    try:
        return fn(a, b)
    except ValueError:
        _bshape(op, a, b)


_promote = promote_pair  # torch's type promotion (dtypes.py)


def _int_pow(a, b):
    """Integer a ** b with negative integer exponents in b as torch: 1 ** -k = 1, (-1) ** -k = +-1, else 0 (a
    python int exponent below 0 is refused, as torch does)."""
    if not isinstance(b, np.ndarray):
        raise ValueError(f"exponent: integers to negative integer powers are not allowed, got {b}")
    neg = b < 0
    with np.errstate(all="ignore"):
        pos = np.power(a, np.where(neg, 0, b))
    one = np.ones_like(pos)
    small = np.where(np.asarray(a) == 1, one, np.where(np.asarray(a) == -1, np.where(b % 2 == 0, one, -one), 0 * one))
    return np.where(neg, small, pos).astype(pos.dtype)


def _saving_out(ctx, out):
    """Save the forward output for backward (ops whose VJP is written in z) and return it."""
    ctx.save_for_backward(out)
    return out


def _float_in(a):
    """Float-producing unary ops promote integer/bool inputs to float32, like torch."""
    return a.astype(np.float32) if isinstance(a, np.ndarray) and a.dtype.kind in "biu" else a


class Add(Function):
    # forward and backward side by side for each op (notebook 01 counts calls of Add.backward)
    @staticmethod
    def forward(ctx, a, b):
        a, b = _promote(a, b)
        ctx.sa, ctx.sb = np.shape(a), np.shape(b)
        return _broadcast("add", operator.add, a, b)

    @staticmethod
    def backward(ctx, g):
        na, nb = ctx.needs_input_grad
        return (unbroadcast(g, ctx.sa) if na else None, unbroadcast(g, ctx.sb) if nb else None)


class Sub(Function):
    @staticmethod
    def forward(ctx, a, b):
        a, b = _promote(a, b)
        ctx.sa, ctx.sb = np.shape(a), np.shape(b)
        return _broadcast("sub", operator.sub, a, b)

    @staticmethod
    def backward(ctx, g):
        na, nb = ctx.needs_input_grad
        return (unbroadcast(g, ctx.sa) if na else None, unbroadcast(-g, ctx.sb) if nb else None)


class _SavesInputs(Function):
    """Binary ops whose VJP needs both inputs: promote, save a and b, apply ``_fn`` (``_op`` names it in errors)."""

    _true_div = False

    @staticmethod
    def forward(ctx, a, b):
        a, b = _promote(a, b, true_div=ctx._true_div)
        ctx.save_for_backward(a, b)
        return _broadcast(ctx._op, ctx._fn, a, b)


class Mul(_SavesInputs):
    _op, _fn = "mul", operator.mul

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        na, nb = ctx.needs_input_grad
        return (unbroadcast(g * b, np.shape(a)) if na else None, unbroadcast(g * a, np.shape(b)) if nb else None)


class Div(_SavesInputs):
    _op, _fn, _true_div = "div", operator.truediv, True

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        na, nb = ctx.needs_input_grad
        ga = unbroadcast(g / b, np.shape(a)) if na else None
        gb = unbroadcast(-g * a / (b * b), np.shape(b)) if nb else None
        return ga, gb


class Pow(Function):
    @staticmethod
    def forward(ctx, a, b):
        a, b = _promote(a, b)
        try:
            with np.errstate(divide="ignore", invalid="ignore"):
                out = np.power(a, b)
        except ValueError:  # a broadcast error, or numpy refusing integers to negative integer powers
            with broadcasting("pow", a, b):
                np.broadcast_shapes(np.shape(a), np.shape(b))
            out = _int_pow(a, b)
        if type(out) is not np.ndarray:
            out = np.asarray(out, dtype=np.result_type(a, b))
        ctx.save_for_backward(a, b, out)
        return out

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors[:2]
        out = ctx.saved_tensors[2]
        na, nb = ctx.needs_input_grad
        ga = gb = None
        if na:
            if np.isscalar(b) and b == 0:
                ga = np.zeros(np.shape(a), dtype=g.dtype)
            else:
                with np.errstate(divide="ignore", invalid="ignore"):
                    # b * a^(b-1) is 0 where b == 0 (torch), not 0 * inf = NaN at a == 0
                    ga = unbroadcast(g * np.where(np.asarray(b) == 0, 0, b * np.power(a, b - 1)), np.shape(a))
                    ga = ga.astype(g.dtype, copy=False)
        if nb:
            # torch: g * z * ln(a), masked to 0 where a == 0 and b >= 0 (NaN for a < 0, as ln(a) is)
            with np.errstate(divide="ignore", invalid="ignore"):
                t = g * out * np.log(a)
                t = np.where((np.asarray(a) == 0) & (np.asarray(b) >= 0), 0, t)
            gb = unbroadcast(np.asarray(t), np.shape(b)).astype(g.dtype, copy=False)
        return ga, gb


class Neg(Function):
    @staticmethod
    def forward(ctx, a):
        return -a

    @staticmethod
    def backward(ctx, g):
        return -g


class Exp(Function):
    @staticmethod
    def forward(ctx, a):
        return _saving_out(ctx, np.exp(_float_in(a)))

    @staticmethod
    def backward(ctx, g):
        return g * ctx.saved_tensors[0]


class Log(Function):
    @staticmethod
    def forward(ctx, a):
        a = _float_in(a)
        ctx.save_for_backward(a)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log(a)

    @staticmethod
    def backward(ctx, g):
        with np.errstate(divide="ignore"):
            return g / ctx.saved_tensors[0]


class Sqrt(Function):
    @staticmethod
    def forward(ctx, a):
        with np.errstate(invalid="ignore"):
            return _saving_out(ctx, np.sqrt(_float_in(a)))

    @staticmethod
    def backward(ctx, g):
        with np.errstate(divide="ignore"):
            return g / (2 * ctx.saved_tensors[0])


class Tanh(Function):
    @staticmethod
    def forward(ctx, a):
        return _saving_out(ctx, np.tanh(_float_in(a)))

    @staticmethod
    def backward(ctx, g):
        out = ctx.saved_tensors[0]
        return g * (1 - out * out)


class Sigmoid(Function):
    @staticmethod
    def forward(ctx, a):
        a = _float_in(a)
        # stable: exp of a non-positive number only, e = exp(-|a|): 1 / (1 + e) where a >= 0, e / (1 + e) below.
        # The numerator is picked by arithmetic (m + (1 - m) * e is exactly 1 or e), not np.where: a select on
        # random signs mispredicts a branch per element (np.where measured 2.3 ms of a 2.5 ms sigmoid at [512, 1024])
        a = np.asarray(a)
        e = np.exp(-np.abs(a))
        m = np.greater_equal(a, 0).astype(e.dtype)
        return _saving_out(ctx, ((m + (1 - m) * e) / (1 + e)).astype(a.dtype, copy=False))

    @staticmethod
    def backward(ctx, g):
        out = ctx.saved_tensors[0]
        return g * out * (1 - out)


class ReLU(Function):
    @staticmethod
    def forward(ctx, a):
        return _saving_out(ctx, relu_array(np.asarray(a)))

    @staticmethod
    def backward(ctx, g):
        return relu_backward_array(g, ctx.saved_tensors[0])


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _erf(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf

    return erf(x)


class GELU(Function):
    @staticmethod
    def forward(ctx, a, approximate="none"):
        if approximate not in ("none", "tanh"):
            raise ValueError(f"approximate: must be 'none' or 'tanh', got {approximate!r}")
        ctx.approximate = approximate
        if approximate == "none":
            cdf = 0.5 * (1.0 + _erf(a / math.sqrt(2.0)))
            ctx.save_for_backward(a, cdf)
            return (a * cdf).astype(a.dtype, copy=False)
        inner = _SQRT_2_OVER_PI * (a + 0.044715 * a**3)
        t = np.tanh(inner)
        ctx.save_for_backward(a, t)
        return (0.5 * a * (1 + t)).astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        a, c = ctx.saved_tensors
        if ctx.approximate == "none":
            pdf = np.exp(-0.5 * a * a) / math.sqrt(2 * math.pi)
            return (g * (c + a * pdf)).astype(g.dtype, copy=False)
        dinner = _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * a * a)
        return (g * (0.5 * (1 + c) + 0.5 * a * (1 - c * c) * dinner)).astype(g.dtype, copy=False)


class Abs(Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return np.abs(a)

    @staticmethod
    def backward(ctx, g):
        return g * np.sign(ctx.saved_tensors[0])


class Clip(Function):
    @staticmethod
    def forward(ctx, a, min=None, max=None):  # noqa: A002
        if min is None and max is None:
            raise ValueError("clip: at least one of min and max must be given")
        ctx.save_for_backward(a)
        ctx.lo, ctx.hi = min, max
        return np.clip(a, min, max)

    @staticmethod
    def backward(ctx, g):
        a = ctx.saved_tensors[0]
        mask = np.ones(a.shape, dtype=bool)
        if ctx.lo is not None:
            mask &= a >= ctx.lo
        if ctx.hi is not None:
            mask &= a <= ctx.hi
        return g * mask


class _Extremum(_SavesInputs):
    """Elementwise maximum/minimum (``_fn``): the winner of each pair (``_wins``) takes the gradient, ties split it
    evenly (torch)."""

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        na, nb = ctx.needs_input_grad
        wa = (ctx._wins(a, b) + 0.5 * (a == b)).astype(g.dtype)
        ga = unbroadcast(g * wa, np.shape(a)) if na else None
        gb = unbroadcast(g * (1 - wa), np.shape(b)) if nb else None
        return ga, gb


class Maximum(_Extremum):
    _op, _fn, _wins = "maximum", np.maximum, np.greater


class Minimum(_Extremum):
    _op, _fn, _wins = "minimum", np.minimum, np.less
