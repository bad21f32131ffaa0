"""A set-associative LRU cache simulator and the address traces of matmul loop orders (a model, notebook 08 §1b).

    CacheSim(size_bytes, line_bytes=64, ways=8).run(addresses) -> {"accesses", "misses", "miss_rate"}
    matmul_trace(n, order) -> byte addresses, in program order, of C = A @ B for n x n fp32 row-major matrices
    simulate_matmul(n, order, cache_bytes) -> the counts of one order

Orders: ``ijk`` (inner loop walks B down a column: a new line per access once B's column lines are evicted),
``ikj`` (inner loop streams rows of B and C: one miss per line of 16 floats), ``tiled`` (ikj over tile x tile
blocks so the three blocks stay resident: temporal locality). The counts are the model's, not a hardware counter's.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator

import numpy as np

from .._inputs import is_int

ORDERS = ("ijk", "ikj", "tiled")


def _pos_int(name: str, v: int) -> int:
    if not is_int(v) or v < 1:
        raise ValueError(f"{name}: expected an int >= 1, got {v!r}")
    return int(v)


class CacheSim:
    """``ways``-way set-associative cache of ``size_bytes`` with ``line_bytes`` lines and LRU replacement per set."""

    def __init__(self, size_bytes: int, line_bytes: int = 64, ways: int = 8) -> None:
        size_bytes, line_bytes, ways = (
            _pos_int(name, v) for name, v in (("size_bytes", size_bytes), ("line_bytes", line_bytes), ("ways", ways))
        )
        if line_bytes & (line_bytes - 1):
            raise ValueError(f"line_bytes: expected a power of two, got {line_bytes}")
        if size_bytes % (line_bytes * ways):
            raise ValueError(f"size_bytes: {size_bytes} is not a multiple of line_bytes * ways = {line_bytes * ways}")
        self.line_bytes, self.ways = line_bytes, ways
        self.n_sets = size_bytes // (line_bytes * ways)
        self.sets: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(self.n_sets)]
        self.accesses = self.misses = 0

    def access(self, addr: int) -> bool:
        """Touch the line holding byte ``addr``; True on a hit."""
        line = addr // self.line_bytes
        s = self.sets[line % self.n_sets]
        self.accesses += 1
        if line in s:
            s.move_to_end(line)
            return True
        self.misses += 1
        s[line] = None
        if len(s) > self.ways:
            s.popitem(last=False)
        return False

    def run(self, addresses: Iterable[int]) -> dict[str, float]:
        for a in addresses:
            self.access(int(a))
        return {"accesses": self.accesses, "misses": self.misses, "miss_rate": self.misses / max(self.accesses, 1)}


def matmul_trace(n: int, order: str, tile: int = 16, elem_bytes: int = 4) -> Iterator[int]:
    """Byte addresses of A[i,k], B[k,j], C[i,j] (C read and written: one access) per multiply-add, in the loop
    ``order``; A, B, C are n x n row-major and laid out one after another. Arguments are checked at the call,
    not at the first ``next``."""
    n, tile, elem_bytes = _pos_int("n", n), _pos_int("tile", tile), _pos_int("elem_bytes", elem_bytes)
    if order not in ORDERS:
        raise ValueError(f"order: expected one of {ORDERS}, got {order!r}")
    return _trace(n, order, tile, elem_bytes)


def _trace(n: int, order: str, tile: int, elem_bytes: int) -> Iterator[int]:
    a0, b0, c0 = 0, n * n * elem_bytes, 2 * n * n * elem_bytes

    def fma(i: int, k: int, j: int) -> Iterator[int]:
        yield a0 + (i * n + k) * elem_bytes
        yield b0 + (k * n + j) * elem_bytes
        yield c0 + (i * n + j) * elem_bytes

    if order == "ijk":
        for i in range(n):
            for j in range(n):
                for k in range(n):
                    yield from fma(i, k, j)
    elif order == "ikj":
        for i in range(n):
            for k in range(n):
                for j in range(n):
                    yield from fma(i, k, j)
    else:
        for i0 in range(0, n, tile):
            for k0 in range(0, n, tile):
                for j0 in range(0, n, tile):
                    for i in range(i0, min(i0 + tile, n)):
                        for k in range(k0, min(k0 + tile, n)):
                            for j in range(j0, min(j0 + tile, n)):
                                yield from fma(i, k, j)


def simulate_matmul(
    n: int, order: str, cache_bytes: int, tile: int = 16, line_bytes: int = 64, ways: int = 8
) -> dict[str, float]:
    """Accesses, misses and miss rate of one loop order of an n x n x n fp32 matmul in a modelled cache."""
    return CacheSim(cache_bytes, line_bytes, ways).run(matmul_trace(n, order, tile))


def compulsory_misses(n: int, line_bytes: int = 64, elem_bytes: int = 4) -> int:
    """Lines of A, B and C: the misses no order can avoid (every line touched once)."""
    n, line_bytes, elem_bytes = _pos_int("n", n), _pos_int("line_bytes", line_bytes), _pos_int("elem_bytes", elem_bytes)
    return int(3 * np.ceil(n * n * elem_bytes / line_bytes))
