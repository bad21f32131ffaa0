"""The derivative table: each fusible op's vector-Jacobian product written as graph nodes (torch's derivatives.yaml).

A rule ``RULES[op](b, n, g, needs)`` receives a ``VJPBuilder`` ``b``, the forward node ``n`` and the node ``g``
holding dL/dn, and returns one gradient node (or None) per positional argument of ``n``. Every node it builds is a
call of an op ``lowering.py`` can lower (or a movement op fusion reads through: Expand, Reshape), so the backward
graph is fused and compiled like a forward graph. A rule returns None where it does not apply (e.g. ``x ** y`` with a
tensor exponent): the joint graph then calls the op's own ``backward`` as an extern node (joint.py).

    Add  a+b       ga = ub(g)                    gb = ub(g)                 ub(g, s): unbroadcast, a Sum over the
    Sub  a-b       ga = ub(g)                    gb = ub(-g)                dims broadcasting created or stretched
    Mul  a*b       ga = ub(g*b)                  gb = ub(g*a)               (+ Reshape to s)
    Div  a/b       ga = ub(g/b)                  gb = ub(-(g*a)/(b*b))
    Pow  a**e      ga = g*(e*a**(e-1))           (scalar e; e = 2: g*(a*2))
    Neg -g;  Exp g*y;  Log g/a;  Sqrt g/(y*2);  Tanh g*(1-y*y);  Sigmoid (g*y)*(1-y);  ReLU where(y>0, g, 0)
    Abs  g*([a>0]-[a<0]);   Clip  g*[a>=lo]*[a<=hi];   Max/Minimum  ga = ub(g*w), gb = ub(g*(1-w)), w = [a>b]+[a==b]/2
    Where(c,a,b)   ga = ub(where(c, g, 0))       gb = ub(where(c, 0, g))
    GELU exact     g*(cdf + a*pdf), cdf = 0.5*(1+erf(a/sqrt2)), pdf = exp(a*a*-0.5)/sqrt(2 pi)
    GELU tanh      g*(0.5*(1+t) + 0.5*a*(1-t*t)*c*(1+3*0.044715*a*a)), t = tanh(c*(a+0.044715*a**3)), c = sqrt(2/pi)
    Sum / Mean     reshape g to keepdim form (/n for Mean), Expand to the input shape
    Softmax        y*(g - sum_d(g*y));          LogSoftmax   g - exp(y)*sum_d(g)
    LayerNorm      xh = (x-mu)*rstd; gw = g*w; dx = rstd*((gw - mean(gw)) - xh*mean(gw*xh)); dw = ub(g*xh); db = ub(g)
    Expand ub(g);  Reshape reshape(g, x.shape);  Permute permute(g, inverse)

Masks ``[a > b]`` are ``CmpF`` nodes (a float 0/1, kernel ops gt/ge/lt/le/eq); ``Erf`` is erf. Both are defined
here because the eager ops have no such Functions; lowering.py lowers them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..autograd.function import Function
from ..autograd.ops_elementwise import Add, Div, Exp, Mul, Neg, Pow, Sqrt, Sub, Tanh
from ..autograd.ops_reduce import Mean, Sum
from ..autograd.ops_shape import Expand, Permute, Reshape, Where
from .graph import Graph, Node

_CMP = {"gt": np.greater, "ge": np.greater_equal, "lt": np.less, "le": np.less_equal, "eq": np.equal}


class CmpF(Function):
    """``float(a OP b)`` (0 or 1 in the float operand's dtype): the masks of ReLU, Abs, Clip, Maximum backward."""

    @staticmethod
    def forward(ctx, a, b, op="gt"):
        dt = a.dtype if isinstance(a, np.ndarray) else np.asarray(b).dtype
        return np.asarray(_CMP[op](a, b)).astype(dt)

    @staticmethod
    def backward(ctx, g):
        return None, None


class Erf(Function):
    """erf(a) (exact GELU's backward recomputes its cdf)."""

    @staticmethod
    def forward(ctx, a):
        from scipy.special import erf

        return np.asarray(erf(a)).astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        raise RuntimeError("Erf: a backward-graph op; double backward through a compiled graph is not supported")


Scalar = int | float


class VJPBuilder:
    """Appends backward nodes to ``graph`` (shapes and dtypes set, so fusion can group them)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def call(self, cls: type, *args: Any, shape: tuple[int, ...], dtype: Any, **kwargs: Any) -> Node:
        g = self.graph
        n = Node(g.fresh_name("d_" + cls.__name__), "call", cls.__name__, cls, tuple(args), kwargs)
        n.shape, n.dtype = tuple(int(s) for s in shape), np.dtype(dtype)
        n.meta["backward"] = True
        return g.add(n)

    # -- point-wise -------------------------------------------------------------------------------------------
    def pw(self, cls: type, *args: Any, **kwargs: Any) -> Node:
        nodes = [a for a in args if isinstance(a, Node)]
        shape = np.broadcast_shapes(*[tuple(a.shape) for a in nodes])
        dt = next((a.dtype for a in nodes if np.dtype(a.dtype).kind == "f"), nodes[0].dtype)
        return self.call(cls, *args, shape=shape, dtype=dt, **kwargs)

    def add(self, a: Node | Scalar, b: Node | Scalar) -> Node:
        return self.pw(Add, a, b)

    def sub(self, a: Node | Scalar, b: Node | Scalar) -> Node:
        return self.pw(Sub, a, b)

    def mul(self, a: Node | Scalar, b: Node | Scalar) -> Node:
        return self.pw(Mul, a, b)

    def div(self, a: Node | Scalar, b: Node | Scalar) -> Node:
        return self.pw(Div, a, b)

    def neg(self, a: Node) -> Node:
        return self.pw(Neg, a)

    def cmp(self, a: Node | Scalar, b: Node | Scalar, op: str) -> Node:
        return self.pw(CmpF, a, b, op=op)

    # -- reductions and movement ------------------------------------------------------------------------------
    def reduce(self, cls: type, x: Node, axes: tuple[int, ...], keepdim: bool) -> Node:
        shape = tuple(1 if i in axes else s for i, s in enumerate(x.shape))
        if not keepdim:
            shape = tuple(s for i, s in enumerate(x.shape) if i not in axes)
        return self.call(cls, x, shape=shape, dtype=x.dtype, dim=tuple(axes), keepdim=keepdim)

    def reshape(self, x: Node, shape: tuple[int, ...]) -> Node:
        if tuple(x.shape) == tuple(shape):
            return x
        return self.call(Reshape, x, tuple(shape), shape=shape, dtype=x.dtype)

    def expand(self, x: Node, shape: tuple[int, ...]) -> Node:
        if tuple(x.shape) == tuple(shape):
            return x
        return self.call(Expand, x, tuple(shape), shape=shape, dtype=x.dtype)

    def unbroadcast(self, g: Node, shape: tuple[int, ...]) -> Node:
        """Sum ``g`` over the dims broadcasting created (leading) or stretched (size 1 in ``shape``)."""
        shape = tuple(shape)
        if tuple(g.shape) == shape:
            return g
        lead = len(g.shape) - len(shape)
        axes = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape) if s == 1 and g.shape[lead + i] != 1)
        r = self.reduce(Sum, g, axes, keepdim=False) if axes else g
        return self.reshape(r, shape)


def _nd(a: Any) -> bool:
    return isinstance(a, Node)


def _ub(b: VJPBuilder, g: Node | None, a: Any) -> Node | None:
    return b.unbroadcast(g, a.shape) if g is not None and _nd(a) else None


Rule = Callable[[VJPBuilder, Node, Node], list[Node | None] | None]


def _add(b: VJPBuilder, n: Node, g: Node) -> list[Node | None]:
    x, y = n.args
    return [_ub(b, g, x), _ub(b, g, y)]


def _sub(b: VJPBuilder, n: Node, g: Node) -> list[Node | None]:
    x, y = n.args
    return [_ub(b, g, x), _ub(b, b.neg(g), y) if _nd(y) else None]


def _mul(b: VJPBuilder, n: Node, g: Node) -> list[Node | None]:
    x, y = n.args
    return [_ub(b, b.mul(g, y), x) if _nd(x) else None, _ub(b, b.mul(g, x), y) if _nd(y) else None]


def _div(b: VJPBuilder, n: Node, g: Node) -> list[Node | None]:
    x, y = n.args
    ga = _ub(b, b.div(g, y), x) if _nd(x) else None
    gb = _ub(b, b.neg(b.div(b.mul(g, x), b.mul(y, y))), y) if _nd(y) else None
    return [ga, gb]


def _pow(b: VJPBuilder, n: Node, g: Node) -> list[Node | None] | None:
    x, e = n.args
    if not _nd(x) or _nd(e):
        return None  # a tensor exponent or a scalar base: the op's own backward
    e = float(e)
    if e == 0.0:
        return [b.mul(g, 0.0), None]
    if e == 1.0:
        return [g, None]
    d = b.mul(x, 2.0) if e == 2.0 else b.mul(b.pw(Pow, x, e - 1.0), e)
    return [_ub(b, b.mul(g, d), x), None]


def _unary(f: Callable[[VJPBuilder, Node, Node, Node], Node]) -> Rule:
    def rule(b: VJPBuilder, n: Node, g: Node) -> list[Node | None]:
        return [f(b, n, n.args[0], g)]

    return rule


_SQRT1_2, _SQRT2PI, _C = math.sqrt(0.5), math.sqrt(2.0 * math.pi), math.sqrt(2.0 / math.pi)


def _gelu(b: VJPBuilder, n: Node, g: Node) -> list[Node | None] | None:
    a = n.args[0]
    approx = n.kwargs.get("approximate", n.args[1] if len(n.args) > 1 else "none")
    if approx == "none":
        cdf = b.mul(0.5, b.add(1.0, b.pw(Erf, b.mul(a, _SQRT1_2))))  # torch's M_SQRT1_2: no division
        pdf = b.div(b.pw(Exp, b.mul(b.mul(a, a), -0.5)), _SQRT2PI)
        return [b.mul(g, b.add(cdf, b.mul(a, pdf)))]
    if approx != "tanh":
        return None
    t = b.pw(Tanh, b.mul(_C, b.add(a, b.mul(0.044715, b.pw(Pow, a, 3.0)))))
    dinner = b.mul(_C, b.add(1.0, b.mul(3 * 0.044715, b.mul(a, a))))
    left = b.mul(0.5, b.add(1.0, t))
    right = b.mul(b.mul(b.mul(0.5, a), b.sub(1.0, b.mul(t, t))), dinner)
    return [b.mul(g, b.add(left, right))]


def _clip(b: VJPBuilder, n: Node, g: Node) -> list[Node | None] | None:
    a = n.args[0]
    lo = n.kwargs.get("min", n.args[1] if len(n.args) > 1 else None)
    hi = n.kwargs.get("max", n.args[2] if len(n.args) > 2 else None)
    if _nd(lo) or _nd(hi):
        return None
    r = g
    if lo is not None:
        r = b.mul(r, b.cmp(a, lo, "ge"))
    if hi is not None:
        r = b.mul(r, b.cmp(a, hi, "le"))
    return [r] + [None] * (len(n.args) - 1)


def _extremum(win: str) -> Rule:
    def rule(b: VJPBuilder, n: Node, g: Node) -> list[Node | None]:
        x, y = n.args
        w = b.add(b.cmp(x, y, win), b.mul(b.cmp(x, y, "eq"), 0.5))
        return [_ub(b, b.mul(g, w), x) if _nd(x) else None, _ub(b, b.mul(g, b.sub(1.0, w)), y) if _nd(y) else None]

    return rule


def _where(b: VJPBuilder, n: Node, g: Node) -> list[Node | None]:
    c, x, y = n.args
    ga = _ub(b, b.pw(Where, c, g, 0.0), x) if _nd(x) else None
    gb = _ub(b, b.pw(Where, c, 0.0, g), y) if _nd(y) else None
    return [None, ga, gb]


def _axes_of(n: Node) -> tuple[int, ...] | None:
    x = n.args[0]
    nd = len(x.shape)
    dim = n.kwargs.get("dim", n.args[1] if len(n.args) > 1 else None)
    if dim is None:
        return tuple(range(nd))
    dims = (dim,) if isinstance(dim, int | np.integer) else tuple(dim)
    if nd == 0:
        return ()
    return tuple(sorted({int(d) % nd for d in dims}))


def _sum_mean(mean: bool) -> Rule:
    def rule(b: VJPBuilder, n: Node, g: Node) -> list[Node | None] | None:
        x = n.args[0]
        axes = _axes_of(n)
        if axes is None:
            return None
        if mean:
            g = b.div(g, float(math.prod(x.shape[i] for i in axes)))
        keep = tuple(1 if i in axes else s for i, s in enumerate(x.shape))
        return [b.expand(b.reshape(g, keep), tuple(x.shape))]

    return rule


def _softmax(log: bool) -> Rule:
    def rule(b: VJPBuilder, n: Node, g: Node) -> list[Node | None] | None:
        x = n.args[0]
        dim = n.kwargs.get("dim", n.args[1] if len(n.args) > 1 else -1)
        if not isinstance(dim, int) or not x.shape:
            return None
        d = (dim % len(x.shape),)
        if log:
            return [b.sub(g, b.mul(b.pw(Exp, n), b.reduce(Sum, g, d, True)))] + [None] * (len(n.args) - 1)
        return [b.mul(n, b.sub(g, b.reduce(Sum, b.mul(g, n), d, True)))] + [None] * (len(n.args) - 1)

    return rule


def _layer_norm(b: VJPBuilder, n: Node, g: Node) -> list[Node | None] | None:
    x, w, bias = (list(n.args) + [None, None])[:3]
    k = len(n.kwargs.get("normalized_shape", ()))
    if len(n.args) > 3 or not 0 < k <= len(x.shape):
        return None
    nd = len(x.shape)
    axes = tuple(range(nd - k, nd))
    mu = b.reduce(Mean, x, axes, True)
    d = b.sub(x, mu)
    var = b.reduce(Mean, b.mul(d, d), axes, True)
    rstd = b.div(1.0, b.pw(Sqrt, b.add(var, float(n.kwargs.get("eps", 1e-5)))))
    xh = b.mul(d, rstd)
    gw = b.mul(g, w) if _nd(w) else g
    c1 = b.reduce(Mean, gw, axes, True)
    c2 = b.reduce(Mean, b.mul(gw, xh), axes, True)
    dx = b.mul(rstd, b.sub(b.sub(gw, c1), b.mul(xh, c2)))
    dw = b.unbroadcast(b.mul(g, xh), w.shape) if _nd(w) else None
    db = b.unbroadcast(g, bias.shape) if _nd(bias) else None
    return [dx, dw, db]


def _permute(b: VJPBuilder, n: Node, g: Node) -> list[Node | None] | None:
    perm = n.kwargs.get("perm", n.args[1] if len(n.args) > 1 else None)
    if perm is None:
        return None
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[int(p)] = i
    x = n.args[0]
    return [b.call(Permute, g, tuple(inv), shape=x.shape, dtype=g.dtype), None]


RULES: dict[str, Rule] = {
    "Add": _add,
    "Sub": _sub,
    "Mul": _mul,
    "Div": _div,
    "Pow": _pow,
    "Neg": _unary(lambda b, n, a, g: b.neg(g)),
    "Exp": _unary(lambda b, n, a, g: b.mul(g, n)),
    "Log": _unary(lambda b, n, a, g: b.div(g, a)),
    "Sqrt": _unary(lambda b, n, a, g: b.div(g, b.mul(n, 2.0))),
    "Tanh": _unary(lambda b, n, a, g: b.mul(g, b.sub(1.0, b.mul(n, n)))),
    "Sigmoid": _unary(lambda b, n, a, g: b.mul(b.mul(g, n), b.sub(1.0, n))),
    "ReLU": _unary(lambda b, n, a, g: b.pw(Where, b.cmp(n, 0.0, "gt"), g, 0.0)),
    "Abs": _unary(lambda b, n, a, g: b.mul(g, b.sub(b.cmp(a, 0.0, "gt"), b.cmp(a, 0.0, "lt")))),
    "GELU": _gelu,
    "Clip": _clip,
    "Maximum": _extremum("gt"),
    "Minimum": _extremum("lt"),
    "Where": _where,
    "Sum": _sum_mean(False),
    "Mean": _sum_mean(True),
    "Softmax": _softmax(False),
    "LogSoftmax": _softmax(True),
    "LayerNormFn": _layer_norm,
    "Expand": lambda b, n, g: [b.unbroadcast(g, n.args[0].shape), None],
    "Reshape": lambda b, n, g: [b.reshape(g, n.args[0].shape), None],
    "Permute": _permute,
}


def vjp(b: VJPBuilder, n: Node, g: Node) -> list[Node | None] | None:
    """The gradient nodes of ``n``'s arguments given dL/dn = ``g``, or None when the table has no rule for it."""
    rule = RULES.get(n.op)
    if rule is None or n.n_out != 1 or not any(_nd(a) for a in n.args):
        return None
    if any(_nd(v) for v in n.kwargs.values()):
        return None
    return rule(b, n, g)


__all__ = ["RULES", "VJPBuilder", "vjp", "CmpF", "Erf"]
