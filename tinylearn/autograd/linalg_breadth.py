"""einsum (numpy forward; the VJP of each operand is another einsum) and vector norms.

einsum  y = einsum("ab,bc->ac", A, B)     dA = einsum("ac,bc->ab", G, B)   (output and operand swap roles)
        letters that only operand i has are summed in the forward, so dA broadcasts G's einsum along them.
vector_norm  y = (sum |x|^p)^(1/p)  built from differentiable ops (abs, pow, sum, max for p = inf).
"""

from __future__ import annotations

import math
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


def _contract2(sa: str, sb: str, out: str, a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """``einsum(f"{sa},{sb}->{out}", a, b)`` as one batched matmul (BLAS per batch, as torch's bmm path), or None
    where that does not apply (a repeated letter, a letter whose sizes differ between the operands): letters in a,
    b and out are the batch, in a and b only are contracted (K), in a (b) and out are M (N); letters that only one
    operand has and out lacks are summed first."""
    if len(set(sa)) != len(sa) or len(set(sb)) != len(sb) or len(set(out)) != len(out):
        return None
    size = dict(zip(sa, a.shape))
    if any(size.get(c, n) != n for c, n in zip(sb, b.shape)) or not set(out) <= set(sa) | set(sb):
        return None
    size.update(zip(sb, b.shape))
    a_only = [i for i, c in enumerate(sa) if c not in sb and c not in out]
    b_only = [i for i, c in enumerate(sb) if c not in sa and c not in out]
    if a_only:
        a, sa = a.sum(axis=tuple(a_only)), "".join(c for c in sa if c in sb or c in out)
    if b_only:
        b, sb = b.sum(axis=tuple(b_only)), "".join(c for c in sb if c in sa or c in out)
    batch = [c for c in out if c in sa and c in sb]
    m = [c for c in out if c in sa and c not in sb]
    n = [c for c in out if c in sb and c not in sa]
    k = [c for c in sa if c in sb and c not in out]
    am = a.transpose([sa.index(c) for c in batch + m + k])
    bm = b.transpose([sb.index(c) for c in batch + k + n])

    def prod(cs: list[str]) -> int:
        return math.prod(size[c] for c in cs)

    nb = prod(batch)
    r = np.matmul(am.reshape(nb, prod(m), prod(k)), bm.reshape(nb, prod(k), prod(n)))
    have = batch + m + n
    r = r.reshape([size[c] for c in have])
    return r.transpose([have.index(c) for c in out])


def _einsum(ins: list[str], out: str, ops: list[Any] | tuple[Any, ...]) -> np.ndarray:
    """np.einsum, with two-operand contractions as one batched matmul (numpy's optimize path costs ~50 µs of
    Python per call and contracts batch dims without BLAS)."""
    if len(ops) == 2:
        r = _contract2(ins[0], ins[1], out, np.asarray(ops[0]), np.asarray(ops[1]))
        if r is not None:
            return r
    return np.asarray(np.einsum(f"{','.join(ins)}->{out}", *ops, optimize=len(ops) > 1))


class Einsum(Function):
    @staticmethod
    def forward(ctx, eq, *ops):
        ins, out, _ = _parse(eq, ops)
        ctx.ins, ctx.out = ins, out
        ctx.save_for_backward(*ops)
        try:
            return _einsum(ins, out, ops)
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
            r = _einsum([ctx.out] + [t for t, _ in others], keep, [g] + [o for _, o in others])
            sizes = [x.shape[s.index(c)] for c in uniq]
            shrunk = tuple(j for j, c in enumerate(keep) if x.shape[s.index(c)] == 1 and r.shape[j] != 1)
            if shrunk:  # a size-1 letter the other operands broadcast (torch allows it): sum its gradient back
                r = r.sum(axis=shrunk, keepdims=True)
            r = np.broadcast_to(r.reshape([n if c in have else 1 for c, n in zip(uniq, sizes)]), sizes)
            if len(uniq) == len(s):
                gx = r.astype(g.dtype, copy=False)
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
