"""Block patterns for block-sparse attention: a small DSL over (query block, key block) pairs, and the layouts the
kernels iterate over (issue 44; the attention itself is in sparse_attention.py, which re-exports these names).

Patterns are sets of (query block, key block) pairs over blocks of ``block_size`` tokens, composed with ``|``
(union) and ``&`` (intersection)::

    pattern = local(1) | global_tokens(64) | strided(4)          # Longformer window + global + strided blocks
    pattern = local(2) | global_tokens(64) | random_blocks(2, seed=0)   # BigBird (ITC: global tokens first)
    pattern = local(3) | causal()                                # a causal sliding window

    local(w)            key block kb for query block qb when |qb - kb| <= w (a sliding window of 2w + 1 blocks)
    global_tokens(n)    the first n tokens (rounded up to whole blocks) attend to everything and are attended by
                        every query (Longformer's global attention, BigBird-ITC)
    strided(s)          kb with (qb - kb) % s == 0 (Child et al. 2019's strided pattern at block granularity)
    random_blocks(r, seed)  r key blocks per query block drawn without replacement (BigBird), seeded: the same
                        (seed, block grid) always gives the same blocks
    dense()             every block
    causal()            a modifier, not a set of blocks: ``p | causal()`` and ``p & causal()`` both mean "p,
                        intersected with the token-level causal mask key j <= query i" (top-left aligned, as
                        torch's is_causal); blocks entirely above the diagonal are dropped. ``causal()`` alone is
                        dense causal attention.

``pattern.layout(nq, nk, block_size)`` gives a ``BlockLayout``: the boolean block mask [nqb, nkb], its CSR form
(``row_ptr``, ``cols``: the key blocks of each query block, what the kernels iterate over), ``density`` (kept blocks
/ all blocks) and ``dense_mask()``, the equivalent token-level boolean mask (True = attend) that torch's
``scaled_dot_product_attention(attn_mask=...)`` takes: the tests compare against it.
"""

from __future__ import annotations

import abc
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._inputs import as_int

__all__ = ["BlockLayout", "BlockPattern", "causal", "dense", "global_tokens", "local", "random_blocks", "strided"]


# ----------------------------------------------------------------------------------------------------- layouts
@dataclass(frozen=True)
class BlockLayout:
    """A pattern resolved on a block grid: which key blocks each query block visits."""

    mask: np.ndarray  # bool [nqb, nkb]
    block_size: int
    nq: int
    nk: int
    causal: bool

    @property
    def nqb(self) -> int:
        return int(self.mask.shape[0])

    @property
    def nkb(self) -> int:
        return int(self.mask.shape[1])

    @functools.cached_property
    def row_ptr(self) -> np.ndarray:
        """int64 [nqb + 1]: query block b's key blocks are ``cols[row_ptr[b]:row_ptr[b + 1]]``."""
        return np.concatenate([[0], np.cumsum(self.mask.sum(axis=1))]).astype(np.int64)

    @functools.cached_property
    def cols(self) -> np.ndarray:
        """int64 [nnz]: the key blocks, ascending within each query block."""
        return np.nonzero(self.mask)[1].astype(np.int64)

    @property
    def nnz(self) -> int:
        return int(self.mask.sum())

    @property
    def density(self) -> float:
        """Kept blocks / all blocks (1.0: dense; causal dense is about 0.5)."""
        return self.nnz / max(1, self.mask.size)

    def dense_mask(self) -> np.ndarray:
        """The token-level bool mask [nq, nk] (True = attend) this layout computes."""
        bs = self.block_size
        m = np.repeat(np.repeat(self.mask, bs, axis=0), bs, axis=1)[: self.nq, : self.nk]
        if self.causal:
            m = m & np.tril(np.ones((self.nq, self.nk), bool))
        return m


class BlockPattern(abc.ABC):
    """A set of (query block, key block) pairs, composable with ``|`` and ``&``; ``causal`` applies the token-level
    causal mask on top (see the module docstring)."""

    causal: bool = False

    @abc.abstractmethod
    def blocks(self, nqb: int, nkb: int, block_size: int) -> np.ndarray:
        """The [nqb, nkb] boolean block mask of this pattern."""

    def layout(self, nq: int, nk: int | None = None, block_size: int = 64) -> BlockLayout:
        """Resolve on the grid of ``nq`` queries and ``nk`` keys (default nq) in blocks of ``block_size``."""
        nq = as_int(nq, "nq", min=1)
        nk = nq if nk is None else as_int(nk, "nk", min=1)
        bs = as_int(block_size, "block_size", min=1)
        nqb, nkb = -(-nq // bs), -(-nk // bs)
        m = np.asarray(self.blocks(nqb, nkb, bs), bool)
        if m.shape != (nqb, nkb):  # pragma: no cover - a subclass bug
            raise RuntimeError(f"{self!r}: blocks() gave shape {m.shape}, expected {(nqb, nkb)}")
        if self.causal:  # drop blocks whose first key comes after the block's last query
            last_q = np.minimum(np.arange(1, nqb + 1) * bs, nq) - 1
            m = m & (np.arange(nkb)[None, :] * bs <= last_q[:, None])
        return BlockLayout(m, bs, nq, nk, bool(self.causal))

    def density(self, nq: int, nk: int | None = None, block_size: int = 64) -> float:
        return self.layout(nq, nk, block_size).density

    def __or__(self, other: Any) -> BlockPattern:
        return _combine(self, other, "|")

    def __and__(self, other: Any) -> BlockPattern:
        return _combine(self, other, "&")


class _Causal(BlockPattern):
    causal = True

    def blocks(self, nqb: int, nkb: int, block_size: int) -> np.ndarray:
        return np.ones((nqb, nkb), bool)

    def __repr__(self) -> str:
        return "causal()"


class _WithCausal(BlockPattern):
    causal = True

    def __init__(self, inner: BlockPattern) -> None:
        self.inner = inner

    def blocks(self, nqb: int, nkb: int, block_size: int) -> np.ndarray:
        return self.inner.blocks(nqb, nkb, block_size)

    def __repr__(self) -> str:
        return f"({self.inner!r} | causal())"


class _Binary(BlockPattern):
    def __init__(self, a: BlockPattern, b: BlockPattern, op: str) -> None:
        self.a, self.b, self.op = a, b, op
        self.causal = a.causal or b.causal

    def blocks(self, nqb: int, nkb: int, block_size: int) -> np.ndarray:
        x, y = self.a.blocks(nqb, nkb, block_size), self.b.blocks(nqb, nkb, block_size)
        return (x | y) if self.op == "|" else (x & y)

    def __repr__(self) -> str:
        return f"({self.a!r} {self.op} {self.b!r})"


def _combine(a: BlockPattern, b: Any, op: str) -> BlockPattern:
    if not isinstance(b, BlockPattern):
        return NotImplemented
    if isinstance(b, _Causal):
        return a if a.causal else _WithCausal(a)
    if isinstance(a, _Causal):
        return b if b.causal else _WithCausal(b)
    return _Binary(a, b, op)


class _Local(BlockPattern):
    def __init__(self, window_blocks: int) -> None:
        self.w = as_int(window_blocks, "window_blocks", min=0)

    def blocks(self, nqb: int, nkb: int, block_size: int) -> np.ndarray:
        return np.abs(np.arange(nqb)[:, None] - np.arange(nkb)[None, :]) <= self.w

    def __repr__(self) -> str:
        return f"local({self.w})"


class _Global(BlockPattern):
    def __init__(self, n: int) -> None:
        self.n = as_int(n, "n", min=0)

    def blocks(self, nqb: int, nkb: int, block_size: int) -> np.ndarray:
        g = -(-self.n // block_size)
        m = np.zeros((nqb, nkb), bool)
        m[:g, :] = True
        m[:, :g] = True
        return m

    def __repr__(self) -> str:
        return f"global_tokens({self.n})"


class _Strided(BlockPattern):
    def __init__(self, stride: int) -> None:
        self.s = as_int(stride, "stride", min=1)

    def blocks(self, nqb: int, nkb: int, block_size: int) -> np.ndarray:
        return (np.arange(nqb)[:, None] - np.arange(nkb)[None, :]) % self.s == 0

    def __repr__(self) -> str:
        return f"strided({self.s})"


class _Random(BlockPattern):
    def __init__(self, n_blocks: int, seed: int) -> None:
        self.r = as_int(n_blocks, "n_blocks", min=0)
        self.seed = as_int(seed, "seed", min=0)

    def blocks(self, nqb: int, nkb: int, block_size: int) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        m = np.zeros((nqb, nkb), bool)
        r = min(self.r, nkb)
        for b in range(nqb):
            m[b, rng.choice(nkb, size=r, replace=False)] = True
        return m

    def __repr__(self) -> str:
        return f"random_blocks({self.r}, seed={self.seed})"


class _Dense(BlockPattern):
    def blocks(self, nqb: int, nkb: int, block_size: int) -> np.ndarray:
        return np.ones((nqb, nkb), bool)

    def __repr__(self) -> str:
        return "dense()"


def local(window_blocks: int) -> BlockPattern:
    """Sliding window: key blocks within ``window_blocks`` of the query block (2w + 1 blocks)."""
    return _Local(window_blocks)


def global_tokens(n: int) -> BlockPattern:
    """The first ``n`` tokens (rounded up to whole blocks) attend everywhere and are attended by every query."""
    return _Global(n)


def strided(stride: int) -> BlockPattern:
    """Key blocks at distances that are multiples of ``stride`` blocks (the diagonal included)."""
    return _Strided(stride)


def random_blocks(n_blocks: int, seed: int = 0) -> BlockPattern:
    """``n_blocks`` random key blocks per query block (BigBird), reproducible from ``seed``."""
    return _Random(n_blocks, seed)


def dense() -> BlockPattern:
    """Every block (dense attention)."""
    return _Dense()


def causal() -> BlockPattern:
    """The causal modifier (``p | causal()``); alone, dense causal attention."""
    return _Causal()
