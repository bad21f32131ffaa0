"""einsum (numpy forward; the VJP of each operand is another einsum) and vector norms.

einsum  y = einsum("ab,bc->ac", A, B)     dA = einsum("ac,bc->ab", G, B)   (output and operand swap roles)
        letters that only operand i has are summed in the forward, so dA broadcasts G's einsum along them.
vector_norm  y = (sum |x|^p)^(1/p)  built from differentiable ops (abs, pow, sum, max for p = inf).
"""

from __future__ import annotations

import string
from typing import Any

import numpy as np

from .errors import ShapeError
from .function import Function
from .tensor import Tensor


def _parse(eq: str, ops: tuple) -> tuple[list[str], str, list[tuple[int, ...]]]:
    """Operand and output subscripts with any ``...`` spelled out as fresh capital letters (right-aligned across
    operands, broadcast like torch), plus the shape each operand must be expanded to for those broadcast dims."""
    eq = eq.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    ins = lhs.split(",")
    if len(ins) != len(ops):
        raise ShapeError(f"einsum: equation {eq!r} has {len(ins)} operands but {len(ops)} were given")
    n_ell = []
    for s, o in zip(ins, ops):
        named = len(s.replace("...", ""))
        if s.count("...") > 1 or ("..." not in s and named != np.ndim(o)) or named > np.ndim(o):
            raise ShapeError(f"einsum: subscripts {s!r} do not match operand shape {np.shape(o)}")
        n_ell.append(np.ndim(o) - named if "..." in s else 0)
    fresh = [c for c in string.ascii_uppercase + string.ascii_lowercase if c not in eq][: max(n_ell, default=0)]
    sizes: dict[str, int] = {}
    for k, (s, o) in enumerate(zip(ins, ops)):
        if "..." not in s:
            continue
        letters = "".join(fresh[len(fresh) - n_ell[k] :])
        at = s.index("...")
        for c, n in zip(letters, np.shape(o)[at : at + n_ell[k]]):
            if sizes.get(c, 1) not in (1, n) and n != 1:
                raise ShapeError(
                    f"einsum: broadcast dims of '...' do not match across operands {[np.shape(o) for o in ops]}"
                )
            sizes[c] = max(sizes.get(c, 1), n)
        ins[k] = s.replace("...", letters)
    ell = "".join(fresh)
    if arrow:
        rhs = rhs.replace("...", ell)
    else:
        counts = {c: lhs.count(c) for c in set(lhs.replace(",", "").replace(".", ""))}
        rhs = ell + "".join(sorted(c for c, n in counts.items() if n == 1))
    shapes = [tuple(sizes.get(c, n) for c, n in zip(s, np.shape(o))) for s, o in zip(ins, ops)]
    return ins, rhs, shapes


class Einsum(Function):
    @staticmethod
    def forward(ctx, eq, *ops):
        ins, out, _ = _parse(eq, ops)
        ctx.ins, ctx.out = ins, out
        ctx.save_for_backward(*ops)
        try:
            return np.asarray(np.einsum(f"{','.join(ins)}->{out}", *ops, optimize=len(ops) > 1))
        except ValueError as e:
            raise ShapeError(f"einsum: {e} (equation {eq!r}, shapes {[np.shape(o) for o in ops]})") from None

    @staticmethod
    def backward(ctx, g):
        ops = ctx.saved_tensors
        grads: list[Any] = [None]
        for i, (s, x) in enumerate(zip(ctx.ins, ops)):
            if not ctx.needs_input_grad[i + 1]:
                grads.append(None)
                continue
            others = [(t, o) for j, (t, o) in enumerate(zip(ctx.ins, ops)) if j != i]
            have = set(ctx.out) | {c for t, _ in others for c in t}
            uniq = "".join(dict.fromkeys(s))  # a repeated letter ("ii") is a diagonal of x
            keep = "".join(c for c in uniq if c in have)
            spec = f"{','.join([ctx.out] + [t for t, _ in others])}->{keep}"
            r = np.einsum(spec, g, *[o for _, o in others], optimize=bool(others))  # optimize: BLAS contractions
            sizes = [x.shape[s.index(c)] for c in uniq]
            r = np.broadcast_to(r.reshape([n if c in have else 1 for c, n in zip(uniq, sizes)]), sizes)
            if len(uniq) == len(s):
                gx = r.astype(g.dtype)
            else:  # write onto the diagonal: einsum("ii->i", gx) is a writeable view of gx
                gx = np.zeros(x.shape, g.dtype)
                np.einsum(f"{s}->{uniq}", gx)[...] = r
            grads.append(gx)
        return tuple(grads)


def einsum(equation: str, *operands: Any) -> Tensor:
    """torch.einsum; ``...`` broadcasts like torch; operands may also be passed as one list."""
    if len(operands) == 1 and isinstance(operands[0], list | tuple):
        operands = tuple(operands[0])
    ops = [o if isinstance(o, Tensor) else Tensor(o) for o in operands]
    if not isinstance(equation, str):
        raise TypeError(f"equation: expected a str, got {type(equation).__name__} {equation!r}")
    if "..." in equation:  # spell the ellipsis out; size-1 broadcast dims are expanded (differentiably) first
        ins, out, shapes = _parse(equation, tuple(o.data for o in ops))
        ops = [o if o.shape == shp else o.expand(*shp) for o, shp in zip(ops, shapes)]
        equation = f"{','.join(ins)}->{out}"
    return Einsum.apply(equation, *ops)


def vector_norm(x: Tensor, ord: Any = 2, dim: Any = None, keepdim: bool = False) -> Tensor:  # noqa: A002
    """torch.linalg.vector_norm: p-norm over ``dim`` (all elements by default); ord may be inf, -inf, 0."""
    a = x.abs()
    if ord == float("inf"):
        return _amax(a, dim, keepdim, 1.0)
    if ord == -float("inf"):
        return _amax(a, dim, keepdim, -1.0)
    if ord == 0:
        return (a != 0).astype(x.dtype).sum(dim, keepdim)
    if ord == 1:
        return a.sum(dim, keepdim)
    if ord == 2:
        return (x * x).sum(dim, keepdim).sqrt()
    return (a**ord).sum(dim, keepdim) ** (1.0 / ord)


def _amax(a: Tensor, dim: Any, keepdim: bool, sign: float) -> Tensor:
    from .ops_reduce import Max, norm_axes

    if dim is None or isinstance(dim, int):
        return Max.apply(a, dim=dim, keepdim=keepdim, sign=sign)
    out = a
    for d in sorted(norm_axes(dim, a.ndim), reverse=True):
        out = Max.apply(out, dim=d, keepdim=keepdim, sign=sign)
    return out
