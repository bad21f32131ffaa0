"""Data-movement ops (roll, tril/triu, pad, diagonal), forward and VJP side by side.

roll(s)          y = x shifted cyclically         dx = roll(g, -s)
tril/triu        y = x * mask                     dx = g * mask
pad              y = x copied into the grown array, borders filled from it by slices one dim at a time, cropped
                 dx = g un-cropped, borders folded back onto the cells they read by slice adds (pad_maps: reference)
diagonal         y = x[..., i, i + offset]        dx = zeros with g written on that diagonal

Simpler movement ops (flip, narrow, chunk, split, index_select, repeat_interleave, movedim, tile, unflatten) are
compositions of the existing differentiable slicing / permute / reshape / repeat ops (see methods_breadth.py).
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

from .errors import ShapeError
from .function import Function
from .ops_reduce import norm_axes

PAD_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}


class Roll(Function):
    @staticmethod
    def forward(ctx, x, shifts, dims):
        ctx.shifts, ctx.dims = shifts, dims
        return np.roll(x, shifts, axis=dims)

    @staticmethod
    def backward(ctx, g):
        neg = tuple(-s for s in ctx.shifts) if isinstance(ctx.shifts, tuple) else -ctx.shifts
        return np.roll(g, neg, axis=ctx.dims)


class Tri(Function):
    @staticmethod
    def forward(ctx, x, diagonal=0, upper=False):
        if x.ndim < 2:
            raise ShapeError(f"{'triu' if upper else 'tril'}: input must have at least 2 dims, got shape {x.shape}")
        n, m = x.shape[-2:]
        mask = np.triu(np.ones((n, m), bool), diagonal) if upper else np.tril(np.ones((n, m), bool), diagonal)
        ctx.mask = mask
        return np.where(mask, x, x.dtype.type(0))

    @staticmethod
    def backward(ctx, g):
        return np.where(ctx.mask, g, g.dtype.type(0))


@functools.lru_cache(maxsize=256)
def pad_plan(shape: tuple[int, ...], pad: tuple[int, ...], mode: str) -> tuple[tuple[int, int, int, int], ...]:
    """(axis, size, left, right) per padded axis, from torch's order (last dim first: left, right, ...), after
    checking the pads against ``shape`` as torch does (a ValueError naming the dim otherwise). Cached per call key."""
    if len(pad) % 2 or len(pad) // 2 > len(shape):
        raise ValueError(f"pad: padding {pad} must have an even length <= 2 * ndim for input shape {shape}")
    plan = []
    for j in range(len(pad) // 2):
        ax = len(shape) - 1 - j
        lo, hi = int(pad[2 * j]), int(pad[2 * j + 1])
        n = shape[ax]
        if n + lo + hi < 0:
            raise ValueError(f"pad: padding {pad} would make dim {ax} (size {n}) {n + lo + hi} long ({mode!r} mode)")
        if mode == "constant" and (-lo > n or -hi > n):  # torch: "narrow(): length must be non-negative"
            raise ValueError(f"pad: cropping ({lo}, {hi}) removes more than the size {n} of dim {ax}")
        if mode == "reflect" and (lo >= n or hi >= n):
            raise ValueError(f"pad: reflect padding ({lo}, {hi}) must be < the input size {n} of dim {ax}")
        if mode == "circular" and (lo > n or hi > n):
            raise ValueError(f"pad: circular padding ({lo}, {hi}) must be <= the input size {n} of dim {ax}")
        kept = max(n - max(-lo, 0) - max(-hi, 0), 0)
        if mode == "circular" and n + lo + hi and max(lo, hi, 0) > kept:  # torch reads uninitialised cells here
            raise ValueError(f"pad: circular padding ({lo}, {hi}) must be <= the {kept} cells dim {ax} keeps")
        if mode == "replicate" and n == 0 and max(lo, hi) > 0:
            raise ValueError(f"pad: replicate padding ({lo}, {hi}) of dim {ax} needs a non-empty dim, got size 0")
        plan.append((ax, n, lo, hi))
    return tuple(plan)


def pad_maps(shape: tuple[int, ...], pad: tuple[int, ...], mode: str) -> list[tuple[int, np.ndarray]]:
    """(axis, source-index map; -1 = the constant) per padded axis, from torch's order (last dim first: left, right,
    ...). A negative entry crops that side, as torch: circular crops first and wraps the cropped input; constant /
    reflect / replicate pad the whole input first (a reflection reads cells a crop removes) and then crop. An output
    size below 0 is a ValueError. (``Pad`` itself uses slices, not these maps: this is the reference semantics.)"""
    maps = []
    for ax, n, lo, hi in pad_plan(tuple(shape), tuple(int(p) for p in pad), mode):
        grow, cut_lo, cut_hi = (max(lo, 0), max(hi, 0)), max(-lo, 0), max(-hi, 0)
        src = np.arange(n)
        if mode == "circular":  # crop, then wrap the cropped input
            src = src[cut_lo : max(n - cut_hi, cut_lo)]
            idx = np.pad(src, grow, mode="wrap") if n + lo + hi else src[:0]
        else:  # pad the whole input, then crop
            if mode == "constant":
                idx = np.concatenate([np.full(grow[0], -1), src, np.full(grow[1], -1)])
            else:
                idx = np.pad(src, grow, mode=PAD_MODES[mode])
            idx = idx[cut_lo : idx.size - cut_hi]
        maps.append((ax, idx))
    return maps


def _at(ndim: int, ax: int, sl: slice) -> tuple[slice, ...]:
    """An index that applies ``sl`` on axis ``ax`` and takes everything else."""
    return (slice(None),) * ax + (sl,)


def _fill_borders(y: np.ndarray, ax: int, n: int, lo: int, hi: int, mode: str) -> None:
    """Write the ``lo`` / ``hi`` border cells of axis ``ax`` of ``y`` (interior: [lo, lo + n)) from its interior."""
    nd = y.ndim
    if mode == "reflect":  # left cell p reads interior cell lo - p; right cell q reads n - 2 - q
        y[_at(nd, ax, slice(0, lo))] = np.flip(y[_at(nd, ax, slice(lo + 1, 2 * lo + 1))], ax)
        y[_at(nd, ax, slice(lo + n, lo + n + hi))] = np.flip(y[_at(nd, ax, slice(lo + n - 1 - hi, lo + n - 1))], ax)
    elif mode == "replicate":
        y[_at(nd, ax, slice(0, lo))] = y[_at(nd, ax, slice(lo, lo + 1))]
        y[_at(nd, ax, slice(lo + n, lo + n + hi))] = y[_at(nd, ax, slice(lo + n - 1, lo + n))]
    else:  # circular: left cell p reads n - lo + p; right cell q reads q
        y[_at(nd, ax, slice(0, lo))] = y[_at(nd, ax, slice(n, lo + n))]
        y[_at(nd, ax, slice(lo + n, lo + n + hi))] = y[_at(nd, ax, slice(lo, lo + hi))]


def _side_terms(n: int, lo: int, hi: int, mode: str) -> list[tuple[slice, slice, bool]]:
    """(source slice of the padded axis, destination slice of the input axis, sum the source over the axis?) for the
    interior and each non-empty border of one axis (``lo``, ``hi`` >= 0). Each slice pair is one-to-one (or a sum
    onto one cell), so an add through it is exact."""
    terms = [(slice(lo, lo + n), slice(0, n), False)]
    if mode == "reflect":  # left cell p read interior cell lo - p; right cell q read n - 2 - q
        sides = [
            (slice(lo - 1, None, -1), slice(1, lo + 1), False),
            (slice(lo + n + hi - 1, lo + n - 1, -1), slice(n - 1 - hi, n - 1), False),
        ]
    elif mode == "replicate":
        sides = [(slice(0, lo), slice(0, 1), True), (slice(lo + n, lo + n + hi), slice(n - 1, n), True)]
    else:  # circular: left cell p read n - lo + p; right cell q read q
        sides = [(slice(0, lo), slice(n - lo, n), False), (slice(lo + n, lo + n + hi), slice(0, hi), False)]
    return terms + [t for t, width in zip(sides, (lo, hi), strict=True) if width]


@functools.lru_cache(maxsize=256)
def _fold_terms(plan: tuple[tuple[int, int, int, int], ...], mode: str, ndim: int) -> tuple:
    """(source index, destination index, axes to sum) for every border combination of the padded axes (the all-
    interior copy first): the VJP of a separable gather is the sum over the product of the per-axis terms."""
    per_axis = [[(ax, *t) for t in _side_terms(n, lo, hi, mode)] for ax, n, lo, hi in plan]
    out = []
    for combo in itertools.product(*per_axis):
        src, dst = [slice(None)] * ndim, [slice(None)] * ndim
        for ax, s, d, _ in combo:
            src[ax], dst[ax] = s, d
        out.append((tuple(src), tuple(dst), tuple(ax for ax, _, _, summed in combo if summed)))
    return tuple(out)


class Pad(Function):
    """F.pad as slices: constant copies the (cropped) input into a filled array; reflect / replicate / circular copy
    the input into the grown array and fill the borders from it one axis at a time (``_fill_borders``), then crop.
    The VJP undoes the crop, copies the interior of ``g`` and adds each border block onto the cells it was read from
    (``_fold_terms``: one slice add per combination of sides, so one full pass over ``g``)."""

    @staticmethod
    def forward(ctx, x, pad, mode="constant", value=0.0):
        if mode not in PAD_MODES:
            raise ValueError(f"mode: must be one of {list(PAD_MODES)}, got {mode!r}")
        plan = pad_plan(x.shape, tuple(int(p) for p in pad), mode)
        ctx.plan, ctx.mode, ctx.shape = plan, mode, x.shape
        out_shape = list(x.shape)
        for ax, n, lo, hi in plan:
            out_shape[ax] = n + lo + hi
        if mode == "constant" or 0 in out_shape:
            y = np.full(out_shape, value, x.dtype)
            y[_crop_index(plan, x.ndim, "dst")] = x[_crop_index(plan, x.ndim, "src")]
            return y
        if mode == "circular":  # crop first, then wrap what is left
            x = x[_crop_index(plan, x.ndim, "src")]
            plan = tuple((ax, n - max(-lo, 0) - max(-hi, 0), max(lo, 0), max(hi, 0)) for ax, n, lo, hi in plan)
        grown = list(x.shape)
        for ax, n, lo, hi in plan:
            grown[ax] = n + max(lo, 0) + max(hi, 0)
        y = np.empty(grown, x.dtype)
        inner = [slice(None)] * x.ndim
        for ax, n, lo, _ in plan:
            inner[ax] = slice(max(lo, 0), max(lo, 0) + n)
        y[tuple(inner)] = x
        for ax, n, lo, hi in plan:  # axes already filled span their whole extent; later ones only their interior
            inner[ax] = slice(None)
            _fill_borders(y[tuple(inner)], ax, n, max(lo, 0), max(hi, 0), mode)
        return y if mode == "circular" else np.ascontiguousarray(y[_crop_index(plan, x.ndim, "grown")])

    @staticmethod
    def backward(ctx, g):
        plan, mode, shape = ctx.plan, ctx.mode, ctx.shape
        if mode == "constant" or g.size == 0:
            gx = np.zeros(shape, g.dtype)
            gx[_crop_index(plan, len(shape), "src")] = g[_crop_index(plan, len(shape), "dst")]
            return gx
        nd = len(shape)
        if mode == "circular":
            plan = tuple((ax, n - max(-lo, 0) - max(-hi, 0), lo, hi) for ax, n, lo, hi in plan)
        elif any(lo < 0 or hi < 0 for _, _, lo, hi in plan):  # undo the crop: zeros where the crop cut cells
            grown = list(g.shape)
            for ax, n, lo, hi in plan:
                grown[ax] = n + max(lo, 0) + max(hi, 0)
            full = np.zeros(grown, g.dtype)
            full[_crop_index(plan, nd, "grown")] = g
            g = full
        terms = _fold_terms(tuple((ax, n, max(lo, 0), max(hi, 0)) for ax, n, lo, hi in plan), mode, nd)
        out = g[terms[0][0]].copy()  # the one full pass (C order, owns its memory); the borders are small adds
        for src, dst, summed in terms[1:]:
            out[dst] += g[src].sum(axis=summed, keepdims=True) if summed else g[src]
        g = out
        if mode == "circular" and g.shape != tuple(shape):  # the crop happened first: zeros where it cut
            gx = np.zeros(shape, g.dtype)
            gx[_crop_index(ctx.plan, nd, "src")] = g
            return gx
        return g


def _crop_index(plan: tuple[tuple[int, int, int, int], ...], ndim: int, side: str) -> tuple[slice, ...]:
    """Slices per axis: "src" the input cells that survive the crops, "dst" where they land in a constant-padded
    output, "grown" the output inside the array padded by the positive pads only (reflect / replicate)."""
    sl = [slice(None)] * ndim
    for ax, n, lo, hi in plan:
        cut_lo, cut_hi = max(-lo, 0), max(-hi, 0)
        if side == "src":
            sl[ax] = slice(cut_lo, max(n - cut_hi, cut_lo))
        elif side == "dst":
            sl[ax] = slice(max(lo, 0), max(lo, 0) + max(n - cut_lo - cut_hi, 0))
        else:
            sl[ax] = slice(cut_lo, n + max(lo, 0) + max(hi, 0) - cut_hi)
    return tuple(sl)


class Diagonal(Function):
    @staticmethod
    def forward(ctx, x, offset=0, dim1=0, dim2=1):
        d1, d2 = norm_axes((dim1, dim2), x.ndim)
        if d1 == d2:
            raise ValueError(f"diagonal: dim1 and dim2 must differ, got {dim1} and {dim2}")
        ctx.shape, ctx.args = x.shape, (offset, d1, d2)
        return np.diagonal(x, offset, d1, d2).copy()

    @staticmethod
    def backward(ctx, g):
        offset, d1, d2 = ctx.args
        gx = np.zeros(ctx.shape, g.dtype)
        i = np.arange(g.shape[-1])
        np.moveaxis(gx, (d1, d2), (-2, -1))[..., i + max(-offset, 0), i + max(offset, 0)] = g
        return gx


class DiagEmbed(Function):
    """1-D x -> square matrix with x on diagonal ``offset`` (torch.diag of a vector)."""

    @staticmethod
    def forward(ctx, x, offset=0):
        ctx.offset = offset
        return np.diag(x, offset)

    @staticmethod
    def backward(ctx, g):
        return np.diagonal(g, ctx.offset).copy()
