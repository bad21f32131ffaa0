"""Forward-mode differentiation with dual numbers: x + x' eps with eps^2 = 0.

Every operation propagates the tangent by its derivative, so one forward pass of f on (x, v) gives
f(x) and the Jacobian-vector product J v (``jvp``). Cost: one pass per *input direction*; reverse mode costs one
pass per *output*. So forward mode wins for f: R -> R^m and reverse mode for f: R^n -> R (a loss).

    (a, a') + (b, b') = (a + b, a' + b')        (a, a') * (b, b') = (ab, a'b + ab')
    g((a, a')) = (g(a), g'(a) a')               e.g. exp, log, sin, cos, tanh, sigmoid
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .errors import ShapeError


class Dual:
    """A value and its tangent (numpy arrays or floats of the same shape)."""

    __slots__ = ("val", "tan")
    __array_priority__ = 1000

    def __init__(self, val: Any, tan: Any = 0.0) -> None:
        self.val = np.asarray(val, dtype=np.float64)
        self.tan = np.broadcast_to(np.asarray(tan, dtype=np.float64), self.val.shape).copy()

    def __repr__(self) -> str:
        return f"Dual(val={self.val}, tan={self.tan})"

    def __add__(self, o: Any) -> Dual:
        o = _d(o)
        return Dual(self.val + o.val, self.tan + o.tan)

    __radd__ = __add__

    def __sub__(self, o: Any) -> Dual:
        o = _d(o)
        return Dual(self.val - o.val, self.tan - o.tan)

    def __rsub__(self, o: Any) -> Dual:
        return _d(o) - self

    def __mul__(self, o: Any) -> Dual:
        o = _d(o)
        return Dual(self.val * o.val, self.tan * o.val + self.val * o.tan)

    __rmul__ = __mul__

    def __truediv__(self, o: Any) -> Dual:
        o = _d(o)
        return Dual(self.val / o.val, (self.tan * o.val - self.val * o.tan) / (o.val * o.val))

    def __rtruediv__(self, o: Any) -> Dual:
        return _d(o) / self

    def __neg__(self) -> Dual:
        return Dual(-self.val, -self.tan)

    def __pow__(self, p: float) -> Dual:
        if isinstance(p, Dual):
            return exp(p * log(self))
        return Dual(self.val**p, p * self.val ** (p - 1) * self.tan)

    def __matmul__(self, o: Any) -> Dual:
        o = _d(o)
        return Dual(self.val @ o.val, self.tan @ o.val + self.val @ o.tan)

    def sum(self) -> Dual:
        return Dual(self.val.sum(), self.tan.sum())


def _d(x: Any) -> Dual:
    return x if isinstance(x, Dual) else Dual(x, 0.0)


def exp(x: Any) -> Dual:
    x = _d(x)
    e = np.exp(x.val)
    return Dual(e, e * x.tan)


def log(x: Any) -> Dual:
    x = _d(x)
    return Dual(np.log(x.val), x.tan / x.val)


def sin(x: Any) -> Dual:
    x = _d(x)
    return Dual(np.sin(x.val), np.cos(x.val) * x.tan)


def cos(x: Any) -> Dual:
    x = _d(x)
    return Dual(np.cos(x.val), -np.sin(x.val) * x.tan)


def tanh(x: Any) -> Dual:
    x = _d(x)
    t = np.tanh(x.val)
    return Dual(t, (1 - t * t) * x.tan)


def sigmoid(x: Any) -> Dual:
    x = _d(x)
    s = 1 / (1 + np.exp(-x.val))
    return Dual(s, s * (1 - s) * x.tan)


def jvp(fn: Callable[..., Any], primals: Sequence[Any], tangents: Sequence[Any]) -> tuple[Any, Any]:
    """(f(primals), J_f(primals) @ tangents) by one forward pass on dual numbers.

    ``fn`` must be written with operators and the functions of this module (``tl.autograd.dual.exp`` ...).
    """
    primals, tangents = tuple(primals), tuple(tangents)
    if len(primals) != len(tangents):
        raise ValueError(f"tangents: got {len(tangents)} tangents for {len(primals)} primals")
    for i, (p, t) in enumerate(zip(primals, tangents)):
        if np.shape(p) != np.shape(t):
            raise ShapeError(f"tangents: tangent {i} has shape {np.shape(t)}, primal has shape {np.shape(p)}")
    out = fn(*[Dual(p, t) for p, t in zip(primals, tangents)])
    out = _d(out)
    val = out.val.item() if out.val.ndim == 0 else out.val
    tan = out.tan.item() if out.tan.ndim == 0 else out.tan
    return val, tan
