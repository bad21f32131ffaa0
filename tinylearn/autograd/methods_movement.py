"""Tensor methods for movement and indexing (a base mixin of ``BreadthMethods``): narrow / split / chunk / flip /
roll / tril / diagonal / unfold / movedim / tile ..., gather / scatter / index_select / masked_* / nonzero and the
``new_*`` factories. The math lives in ops_movement.py, ops_shape.py and ops_index.py; this file only maps torch's
names and arguments onto those Functions. Also the small helpers every method mixin uses (``_t``, ``_d``, ``_plain``,
``_dim``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import ops_index as _ix
from . import ops_movement as _mv
from . import ops_reduce as _rd
from . import ops_shape as _sh
from . import tensor as _tensor  # circular: read as _tensor.Tensor at call time
from .errors import ShapeError, broadcasting


def _t(x: Any) -> Any:
    """Scalars stay Python scalars; arrays/lists become constant Tensors."""
    if isinstance(x, _tensor.Tensor) or type(x) in (int, float, bool):
        return x
    if isinstance(x, np.generic):
        return x.item()
    return _tensor.Tensor(x)


def _d(x: Any) -> Any:
    return x.data if isinstance(x, _tensor.Tensor) else x


def _plain(arr: Any) -> Any:
    return _tensor.Tensor._make(np.asarray(arr), False, None, 0)


def _dim(d: int, nd: int, name: str = "dim") -> int:
    return _rd.norm_dim(d, nd, name)


_SCATTER_REDUCE = {"add": "sum", "multiply": "prod"}  # Tensor.scatter(reduce=) -> scatter_reduce's names


class MovementMethods:
    __slots__ = ()

    # -- movement ---------------------------------------------------------------------------------------------
    def _slice(self, dim: int, sl: Any) -> Any:
        d = _dim(dim, self.ndim)
        return _sh.GetItem.apply(self, (slice(None),) * d + (sl,))

    def narrow(self, dim: int, start: int, length: int) -> Any:
        d = _dim(dim, self.ndim)
        n = self.shape[d]
        start = start + n if start < 0 else start
        if not (0 <= start <= n and 0 <= length and start + length <= n):
            raise ShapeError(f"narrow: start {start} + length {length} exceeds dim {dim} of size {n}")
        return self._slice(d, slice(start, start + length))

    def split(self, split_size_or_sections: Any, dim: int = 0) -> tuple:
        d = _dim(dim, self.ndim)
        n = self.shape[d]
        if isinstance(split_size_or_sections, int | np.integer):
            s = int(split_size_or_sections)
            if s <= 0:
                raise ValueError(f"split: split_size must be positive, got {s}")
            sizes = [min(s, n - i) for i in range(0, n, s)] or [0]
        else:
            sizes = [int(v) for v in split_size_or_sections]
            if sum(sizes) != n:
                raise ShapeError(f"split: sizes {sizes} do not sum to the size {n} of dim {dim}")
        out, start = [], 0
        for s in sizes:
            out.append(self._slice(d, slice(start, start + s)))
            start += s
        return tuple(out)

    def chunk(self, chunks: int, dim: int = 0) -> tuple:
        if chunks <= 0:
            raise ValueError(f"chunk: chunks must be positive, got {chunks}")
        n = self.shape[_dim(dim, self.ndim)]
        return self.split(max(-(-n // chunks), 1), dim)

    def unbind(self, dim: int = 0) -> tuple:
        d = _dim(dim, self.ndim)
        return tuple(_sh.GetItem.apply(self, (slice(None),) * d + (i,)) for i in range(self.shape[d]))

    def flip(self, *dims: Any) -> Any:
        dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], list | tuple) else dims
        axes = [_dim(d, self.ndim) for d in dims]
        if len(set(axes)) != len(axes):
            raise ShapeError(f"dims: a dim appears multiple times in the list of dims {dims}")
        idx = [slice(None)] * self.ndim
        for a in axes if self.ndim else ():  # a 0-d tensor: dim 0 / -1 flip nothing, as torch
            idx[a] = slice(None, None, -1)
        return _sh.GetItem.apply(self, tuple(idx))

    def fliplr(self) -> Any:
        return self.flip(1)

    def flipud(self) -> Any:
        return self.flip(0)

    def roll(self, shifts: Any, dims: Any = None) -> Any:
        if dims is None:
            return _mv.Roll.apply(self.reshape(-1), shifts=shifts, dims=0).reshape(self.shape)
        if isinstance(shifts, list | tuple):
            shifts, dims = tuple(int(s) for s in shifts), tuple(_dim(d, self.ndim) for d in dims)
        else:
            shifts, dims = int(shifts), _dim(dims, self.ndim)
        return _mv.Roll.apply(self, shifts=shifts, dims=dims)

    def tril(self, diagonal: int = 0) -> Any:
        return _mv.Tri.apply(self, diagonal=diagonal, upper=False)

    def triu(self, diagonal: int = 0) -> Any:
        return _mv.Tri.apply(self, diagonal=diagonal, upper=True)

    def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Any:
        return _mv.Diagonal.apply(self, offset=offset, dim1=dim1, dim2=dim2)

    def diag(self, diagonal: int = 0) -> Any:
        if self.ndim == 1:
            return _mv.DiagEmbed.apply(self, offset=diagonal)
        if self.ndim != 2:
            raise ShapeError(f"diag: input must be 1-D or 2-D, got shape {self.shape}")
        return self.diagonal(diagonal)

    def repeat_interleave(self, repeats: Any, dim: int | None = None) -> Any:
        x = self.reshape(-1) if dim is None else self
        d = 0 if dim is None else _dim(dim, self.ndim)
        idx = np.repeat(np.arange(x.shape[d]), _d(repeats))
        return _sh.GetItem.apply(x, (slice(None),) * d + (idx,))

    def unfold(self, dimension: int, size: int, step: int) -> Any:
        """Sliding windows of ``size`` every ``step`` along ``dimension``; the window becomes a new last dim."""
        d = _dim(dimension, self.ndim)
        n = self.shape[d] if self.ndim else 1
        if size > n or size < 0 or step <= 0:
            raise ValueError(f"unfold: size {size} / step {step} invalid for dim {dimension} of size {n}")
        idx = np.arange(0, n - size + 1, step)[:, None] + np.arange(size)
        return self._slice(d, idx).movedim(d + 1, -1)

    def movedim(self, source: Any, destination: Any) -> Any:
        src = [source] if isinstance(source, int | np.integer) else list(source)
        dst = [destination] if isinstance(destination, int | np.integer) else list(destination)
        if len(src) != len(dst):
            raise ValueError(f"movedim: source {source} and destination {destination} differ in length")
        nd = self.ndim
        src, dst = [_dim(d, nd, "source") for d in src], [_dim(d, nd, "destination") for d in dst]
        for name, ds, given in (("source", src, source), ("destination", dst, destination)):
            if len(set(ds)) != len(ds):
                raise ShapeError(f"{name}: movedim has a repeated dim in {given!r}")
        rest = iter(d for d in range(nd) if d not in src)
        where = dict(zip(dst, src))
        return _sh.Permute.apply(self, tuple(where[i] if i in where else next(rest) for i in range(nd)))

    moveaxis = movedim

    def swapaxes(self, dim0: int, dim1: int) -> Any:
        return self.transpose(dim0, dim1)

    swapdims = swapaxes

    def tile(self, *reps: Any) -> Any:
        reps = tuple(reps[0]) if len(reps) == 1 and isinstance(reps[0], list | tuple) else reps
        reps = (1,) * (self.ndim - len(reps)) + tuple(int(r) for r in reps)
        return self.repeat(*reps)

    def unflatten(self, dim: int, sizes: Sequence[int]) -> Any:
        d = _dim(dim, self.ndim)
        return self.reshape(self.shape[:d] + tuple(sizes) + self.shape[d + 1 :])

    def view_as(self, other: Any) -> Any:
        return self.reshape(other.shape)

    def reshape_as(self, other: Any) -> Any:
        return self.reshape(other.shape)

    # -- indexing ---------------------------------------------------------------------------------------------
    def gather(self, dim: int, index: Any) -> Any:
        return _ix.Gather.apply(self, dim, _d(index))

    def scatter(self, dim: int, index: Any, src: Any = None, value: Any = None, *, reduce: str | None = None) -> Any:
        """torch's Tensor.scatter: src (a tensor or a number) or value= written at index along dim; with
        ``reduce="add"`` / ``"multiply"`` accumulated into self instead (differentiable here; torch is not)."""
        if src is None and value is None:
            raise TypeError("scatter: expected src or value, got neither")
        v = _t(value if src is None else src)
        if reduce is None:
            return _ix.Scatter.apply(self, dim, _d(index), v)
        if reduce not in _SCATTER_REDUCE:
            raise ValueError(f"reduce: must be one of {list(_SCATTER_REDUCE)}, got {reduce!r}")
        return _ix.ScatterReduce.apply(self, dim, _d(index), v, reduce=_SCATTER_REDUCE[reduce], include_self=True)

    def scatter_add(self, dim: int, index: Any, src: Any) -> Any:
        return _ix.Scatter.apply(self, dim, _d(index), _t(src), add=True)

    def scatter_reduce(self, dim: int, index: Any, src: Any, reduce: str, include_self: bool = True) -> Any:
        return _ix.ScatterReduce.apply(self, dim, _d(index), _t(src), reduce=reduce, include_self=include_self)

    def index_select(self, dim: int, index: Any) -> Any:
        idx = np.asarray(_d(index))
        if idx.dtype.kind not in "iu":
            raise TypeError(f"index: index_select needs an integer tensor, got dtype {idx.dtype}")
        if idx.ndim > 1:  # torch: IndexError "Index is supposed to be a vector"
            raise IndexError(f"index: index_select needs a 1-D (or 0-d) index, got shape {idx.shape}")
        return self._slice(dim, idx.reshape(-1))

    def masked_fill(self, mask: Any, value: Any) -> Any:
        m = np.asarray(_d(mask))
        if m.dtype != np.bool_:
            raise TypeError(f"masked_fill: mask must be a bool tensor, got dtype {m.dtype}")
        v = value.item() if isinstance(value, _tensor.Tensor) and value.ndim == 0 else value
        return _sh.Where.apply(m, v, self) if np.ndim(v) == 0 else _sh.Where.apply(m, _t(v), self)

    def masked_select(self, mask: Any) -> Any:
        m = np.asarray(_d(mask), dtype=bool)
        with broadcasting("masked_select", self.data, m):
            shape = np.broadcast_shapes(self.shape, m.shape)
        x = self if self.shape == shape else self.expand(*shape)
        return _sh.GetItem.apply(x, np.broadcast_to(m, shape))

    def nonzero(self, as_tuple: bool = False) -> Any:
        if as_tuple:
            return tuple(_plain(i.astype(np.int64)) for i in np.nonzero(np.atleast_1d(self.data)))
        return _plain(np.argwhere(self.data).astype(np.int64))

    def count_nonzero(self, dim: Any = None) -> Any:
        ax = _rd.norm_axes(dim, self.ndim)
        return _plain(np.asarray(np.count_nonzero(self.data, axis=ax if self.ndim else None), np.int64))

    def new_zeros(self, *size: Any) -> Any:
        size = tuple(size[0]) if len(size) == 1 and isinstance(size[0], list | tuple) else size
        return _plain(np.zeros(size, self.data.dtype))

    def new_ones(self, *size: Any) -> Any:
        size = tuple(size[0]) if len(size) == 1 and isinstance(size[0], list | tuple) else size
        return _plain(np.ones(size, self.data.dtype))

    def new_full(self, size: Sequence[int], fill_value: Any) -> Any:
        return _plain(np.full(tuple(size), fill_value, self.data.dtype))

    def new_tensor(self, data: Any) -> Any:
        return _plain(np.array(_d(data), dtype=self.data.dtype))
