"""Allocation traces: record them from tinylearn, generate them, replay them through allocators.

A trace is an int64 array ``ops`` of shape [m, 2]:

    (0, nbytes)   malloc(nbytes); this is malloc number i (counting mallocs from 0)
    (1, i)        free the block returned by malloc number i

``lifetimes`` (size, first_use, last_use) and traces convert into each other (``ops_from_lifetimes``,
``lifetimes_from_ops``): time = index of the op; a block is in use from its malloc to just before its free.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._inputs import as_int, is_int


def check_ops(ops: Any) -> np.ndarray:
    """``ops`` as a C-contiguous int64 [m, 2] array; ValueError naming the first bad row."""
    a = np.ascontiguousarray(ops, dtype=np.int64)
    if a.ndim != 2 or a.shape[1] != 2:
        raise ValueError(f"ops: expected shape [m, 2], got {a.shape}")
    n_malloc, freed = 0, set()
    for r, (op, arg) in enumerate(a.tolist()):
        if op == 0:
            if arg <= 0:
                raise ValueError(f"ops[{r}]: malloc size must be positive, got {arg}")
            n_malloc += 1
        elif op == 1:
            if not 0 <= arg < n_malloc or arg in freed:
                raise ValueError(f"ops[{r}]: free of malloc #{arg} which is not live at that point")
            freed.add(arg)
        else:
            raise ValueError(f"ops[{r}]: op must be 0 (malloc) or 1 (free), got {op}")
    return a


def replay_python(alloc: Any, ops: np.ndarray) -> np.ndarray:
    """Run ``ops`` through ``alloc.malloc``/``alloc.free`` from Python; offsets of every malloc."""
    offsets: list[int] = []
    malloc, free = alloc.malloc, alloc.free
    for op, arg in np.asarray(ops, dtype=np.int64).tolist():
        if op == 0:
            offsets.append(malloc(arg))
        else:
            free(offsets[arg])
    return np.asarray(offsets, dtype=np.int64)


def ops_from_lifetimes(lifetimes: Sequence[Sequence[int]]) -> np.ndarray:
    """Trace for closed use intervals: at each time step the mallocs come before the frees."""
    events = []
    for i, (size, first, last) in enumerate(lifetimes):
        events.append((first, 0, i, size))
        events.append((last, 1, i, 0))
    events.sort()
    slot, ops = {}, []
    for _, kind, i, size in events:
        if kind == 0:
            slot[i] = len(slot)
            ops.append((0, size))
        else:
            ops.append((1, slot[i]))
    return np.asarray(ops, dtype=np.int64).reshape(-1, 2)


def lifetimes_from_ops(ops: np.ndarray) -> list[tuple[int, int, int]]:
    """(size, first_use, last_use) per malloc, time = op index; never-freed blocks live to the end."""
    ops = np.asarray(ops)
    out: list[list[int]] = []
    for t, (op, arg) in enumerate(ops.tolist()):
        if op == 0:
            out.append([arg, t, len(ops) - 1])
        else:
            out[arg][2] = t - 1 if t - 1 >= out[arg][1] else out[arg][1]
    return [tuple(x) for x in out]


def random_ops(
    n_ops: int,
    sizes: tuple[int, int] | Sequence[int] = (1, 4096),
    max_live: int = 64,
    seed: int = 0,
    log_uniform: bool = True,
) -> np.ndarray:
    """A random trace of ``n_ops`` ops: malloc with probability decreasing in the live count, else free a random
    live block. ``sizes`` is a (lo, hi) range (log-uniform by default) or a list to draw from. Ends with
    everything freed (so the trace has n_ops + n_live_at_end ops)."""
    n_ops, max_live = as_int(n_ops, "n_ops", min=0), as_int(max_live, "max_live", min=1)
    if isinstance(sizes, tuple) and len(sizes) == 2 and not 1 <= sizes[0] <= sizes[1]:
        raise ValueError(f"sizes: a (lo, hi) range needs 1 <= lo <= hi, got {sizes}")
    rng = np.random.default_rng(seed)
    live: list[int] = []
    ops, n_malloc = [], 0
    choices = None if isinstance(sizes, tuple) and len(sizes) == 2 else np.asarray(sizes)
    for _ in range(n_ops):
        if not live or (len(live) < max_live and rng.random() < 0.5 + 0.5 * (1 - len(live) / max_live)):
            if choices is not None:
                n = int(rng.choice(choices))
            elif log_uniform:
                n = int(np.exp(rng.uniform(np.log(sizes[0]), np.log(sizes[1] + 1))))
            else:
                n = int(rng.integers(sizes[0], sizes[1] + 1))
            ops.append((0, max(1, n)))
            live.append(n_malloc)
            n_malloc += 1
        else:
            ops.append((1, live.pop(int(rng.integers(len(live))))))
    ops += [(1, i) for i in live]
    return np.asarray(ops, dtype=np.int64).reshape(-1, 2)


def pair_ops(n_pairs: int, size: int | Sequence[int], seed: int = 0) -> np.ndarray:
    """malloc + immediate free, ``n_pairs`` times (the latency benchmark's trace)."""
    n_pairs = as_int(n_pairs, "n_pairs", min=0)
    rng = np.random.default_rng(seed)
    sizes = np.full(n_pairs, int(size)) if is_int(size) else rng.choice(np.asarray(size), n_pairs)
    ops = np.empty((2 * n_pairs, 2), dtype=np.int64)
    ops[0::2, 0], ops[0::2, 1] = 0, sizes
    ops[1::2, 0], ops[1::2, 1] = 1, np.arange(n_pairs)
    return ops


def replay_stats(alloc: Any, ops: np.ndarray, samples: int = 200) -> dict[str, Any]:
    """Replay ``ops`` on ``alloc`` (which must be empty) sampling stats ``samples`` times, then time a second,
    unsampled replay. Returns peak_reserved, peak (allocated), mean/max external fragmentation, seconds."""
    ops = np.asarray(ops, dtype=np.int64)
    every = max(1, len(ops) // samples)
    offsets: list[int] = []
    frags = []
    for t, (op, arg) in enumerate(ops.tolist()):
        if op == 0:
            offsets.append(alloc.malloc(arg))
        else:
            alloc.free(offsets[arg])
        if t % every == 0:
            frags.append(alloc.stats()["fragmentation"])
    s = alloc.stats()
    t0 = time.perf_counter()
    replay_python(alloc, ops)
    seconds = time.perf_counter() - t0
    return dict(
        peak_reserved=s["peak_reserved"],
        peak=s["peak"],
        frag_mean=float(np.mean(frags)) if frags else 0.0,
        frag_max=float(np.max(frags)) if frags else 0.0,
        seconds=seconds,
        leak=s["allocated"],
    )
