"""Benchmarks for ``tinylearn bench memory``.

1. malloc+free pair latency for three size mixes, every allocator x backend, against glibc malloc (ctypes and a C++
   loop), numpy.empty and torch.empty (CPU, the baseline). Two ways of driving the C++ allocators:
   "py loop" = one Python call per malloc/free (includes the pybind11 call, ~100 ns), "C++ loop" = the whole
   trace replayed inside C++ (``replay``), which is the allocator's own cost.
2. Replay of recorded tinylearn training traces (and a random trace) through every allocator: peak reserved
   bytes, fragmentation over time, replay time; the static planner on the same lifetimes vs the lower bound.
   "tensors" traces hold tinylearn tensor storage (storage hook), "numpy" traces every numpy data allocation of
   the step (temporaries, gradients, optimizer state; recorded with a numpy memory handler).
3. A training loop under pooled(): identical losses, numpy data allocations vs allocations reaching the system.
0. (first table) The caching allocator's fast path for cached-block reuse: ns per malloc+free pair of the same size
   (64 B, 4 KiB, 1 MiB, 64 MiB) in the C++ loop for glibc, the tree path and the fast path (one mutex per call, and
   one mutex per trace) and the per-thread cache (thread-safe, no lock on a hit), with the std::set lookups per pair
   counted; and from Python, the raw fast call vs the
   pybind11 call, each against glibc malloc/free through ctypes in the same Python loop ("x glibc ctypes").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from .. import backends
from ..bench import Comparison, Row, Table, measure
from . import planner
from .base import STAT_KEYS  # noqa: F401  (STAT_KEYS: documented stats keys)
from .buddy import BuddyAllocator, next_pow2
from .bump import BumpAllocator
from .caching import CachingAllocator
from .freelist import BestFitAllocator, FirstFitAllocator
from .slab import SlabAllocator
from .trace import lifetimes_from_ops, pair_ops, random_ops, replay_stats

MiB = 1 << 20
CAPACITY = 256 * MiB
SLAB_SIZES = [64, 256, 1024, 4096, 16384, 65536, 262144, MiB]


def make(name: str, backend: str, capacity: int = CAPACITY, max_size: int = MiB) -> Any:
    """Allocator ``name``; the slab allocator gets power-of-4 classes from 64 B up to ``max_size``."""
    if name == "bump":
        return BumpAllocator(capacity, backend=backend)
    if name == "first_fit":
        return FirstFitAllocator(capacity, backend=backend)
    if name == "best_fit":
        return BestFitAllocator(capacity, backend=backend)
    if name == "buddy":
        return BuddyAllocator(capacity, backend=backend)
    if name == "slab":
        top = next_pow2(max(max_size, 64))
        sizes = [c for c in SLAB_SIZES if c < top] + [top]
        return SlabAllocator(sizes, capacity=capacity, slab_size=max(MiB, top), backend=backend)
    if name == "caching":
        return CachingAllocator(capacity, backend=backend)
    raise ValueError(f"name: unknown allocator {name!r}")


NAMES = ("caching", "bump", "first_fit", "best_fit", "buddy", "slab")


def _libc() -> Any:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def handle_replay(ops: np.ndarray, malloc: Callable[..., Any], free: Callable[[Any], Any]) -> Callable[[], None]:
    """The Python loop every handle-returning allocator is driven by (glibc through ctypes, the tinylearn
    allocators): rows converted once, outside the timed call; one malloc call and one free call per pair."""
    rows = ops.tolist()

    def run() -> None:
        out: list[Any] = []
        keep = out.append
        for op, arg in rows:
            if op:
                free(out[arg])
            else:
                keep(malloc(arg))

    return run


def glibc_ctypes() -> tuple[Callable[[int], int], Callable[[int], None]]:
    """glibc malloc / free as ctypes functions (size_t -> void*, void* -> None)."""
    libc = _libc()
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.restype, libc.free.argtypes = None, [ctypes.c_void_p]
    return libc.malloc, libc.free


def _object_replay(ops: np.ndarray, new: Callable[[int], Any], release: Callable[[Any], None]) -> Callable[[], None]:
    rows = ops.tolist()

    def run() -> None:
        objs: list[Any] = []
        for op, arg in rows:
            if op == 0:
                objs.append(new(arg))
            else:
                release(objs[arg])
                objs[arg] = None

    return run


def glibc_mmap_seconds(ops: np.ndarray, repeat: int = 7) -> float | None:
    """Median seconds of ``malloc_replay(ops)`` in a fresh process with MALLOC_MMAP_THRESHOLD_=131072, which pins
    glibc's mmap threshold (no dynamic raise), so blocks >= 128 KiB really go through mmap/munmap."""
    import os
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "ops.npy")
        np.save(path, ops)
        code = (
            "import sys, numpy as np; from tinylearn.backends import load_C; ops = np.load(sys.argv[1]); "
            f"ts = sorted(load_C('memory').malloc_replay(ops) for _ in range({repeat})); print(ts[len(ts) // 2])"
        )
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
        try:
            out = subprocess.run(
                [sys.executable, "-c", code, path], env=env, capture_output=True, text=True, timeout=120, check=True
            )
            return float(out.stdout.strip().splitlines()[-1])
        except (subprocess.SubprocessError, ValueError, IndexError):
            return None


def _add(c: Any, impl: str, fn: Callable[[], Any], how: str, pairs: int) -> None:
    row = c.add(impl, fn, note=how)
    if row.median_ms is not None:
        row.extra["ns/pair"] = round(row.median_ms * 1e6 / pairs, 1)


def _drop(obj: Any) -> None:
    """Releasing a numpy/torch buffer = dropping the reference (done by the replay loop)."""


def _numpy_empty(n: int) -> np.ndarray:
    return np.empty(n, np.uint8)


def _torch_empty(torch: Any) -> Callable[[int], Any]:
    return lambda n: torch.empty(n, dtype=torch.uint8)


def latency_table(full: bool = False, progress: Any = None) -> Table:
    import torch

    n_pairs = 20_000 if full else 2_000
    cmp = Comparison(
        "memory: malloc+free pair latency", baseline="torch.empty", warmup=2, repeat=7 if full else 5, progress=progress
    )
    rng = np.random.default_rng(0)
    mixes = {
        "small 64B-16KB mix": pair_ops(n_pairs, [64, 200, 512, 1000, 4096, 16384], seed=1),
        "1 MiB blocks": pair_ops(n_pairs, MiB),
        "random trace 16B-1MiB": random_ops(2 * n_pairs, (16, MiB), max_live=64, seed=int(rng.integers(1000))),
    }
    c_malloc, c_free = glibc_ctypes()
    for case, ops in mixes.items():
        pairs = int((ops[:, 0] == 0).sum())
        with cmp.case(case) as c:
            fns: list[tuple[str, Callable[[], Any], str]] = [
                ("torch.empty", _object_replay(ops, _torch_empty(torch), _drop), "py loop"),
                ("numpy.empty", _object_replay(ops, _numpy_empty, _drop), "py loop"),
                ("glibc malloc", handle_replay(ops, c_malloc, c_free), "py loop (ctypes)"),
                ("glibc malloc C++", partial(backends.load_C("memory").malloc_replay, ops), "C++ loop"),
            ]
            for impl, fn, how in fns:
                _add(c, impl, fn, how, pairs)
            secs = glibc_mmap_seconds(ops)
            row = Row(
                case,
                "glibc mmap C++",
                None if secs is None else secs * 1e3,
                note="C++ loop, subprocess, MALLOC_MMAP_THRESHOLD_=131072" if secs else "n/a: subprocess failed",
            )
            if secs is not None:
                row.extra["ns/pair"] = round(secs * 1e9 / pairs, 1)
            cmp.table.add(row)
            for name in NAMES:
                _add(c, f"{name} cpp C++", partial(make(name, "cpp")._core.replay, ops), "C++ loop", pairs)
                a_cpp, a_py = make(name, "cpp"), make(name, "python")
                _add(c, f"{name} cpp", handle_replay(ops, a_cpp.malloc, a_cpp.free), "py loop", pairs)
                _add(c, f"{name} python", handle_replay(ops, a_py.malloc, a_py.free), "py loop", pairs)
    cmp.note(
        "ns/pair = median time of the whole trace / number of malloc+free pairs; 'C++ loop' rows run the trace "
        "inside C++ (the allocator's own cost), 'py loop' rows make one Python call per malloc and per free "
        "(glibc through ctypes and the allocators share one loop, handle_replay; numpy/torch drop the object)."
    )
    cmp.note(
        "glibc raises its mmap threshold dynamically after the first free of an mmapped chunk, so repeated 1 MiB "
        "malloc/free pairs come from the heap, not mmap/munmap; only the first ones pay the syscalls."
    )
    cmp.note(
        "torch.empty on CPU = c10 CPU allocator (posix_memalign) + tensor object; tinygrad has no user-facing "
        "allocator API (its buffers are allocated by the runtime at realize time), so it has no column here."
    )
    return cmp.table


FASTPATH_SIZES = {"64 B": 64, "4 KiB": 4096, "1 MiB": MiB, "64 MiB": 64 * MiB}
THREAD_CACHE = 16  # blocks per size class in the "thread cache" rows (sizes up to 32 KiB are cached)


def _cpp_seconds(fn: Callable[[], float], repeat: int) -> tuple[float, float]:
    """(median, min) of the seconds ``fn`` reports (timed inside C++, around the loop only), after one warm-up."""
    fn()
    ts = sorted(fn() for _ in range(repeat))
    return ts[len(ts) // 2], ts[0]


def fastpath_rows(
    sizes: dict[str, int] | None = None, n_pairs: int = 20_000, repeat: int = 7, py_pairs: int = 2_000
) -> Table:
    """ns per malloc+free pair of one size, C++ loop and Python loop (see the module docstring, table 0)."""
    sizes = FASTPATH_SIZES if sizes is None else sizes
    C = backends.load_C("memory")
    table = Table("memory: caching allocator fast path, malloc+free pairs of one size", baseline="glibc malloc C++")
    c_malloc, c_free = glibc_ctypes()

    def add(case: str, impl: str, secs: tuple[float, float], pairs: int, note: str, **extra: Any) -> Row:
        row = Row(case, impl, secs[0] * 1e3, min_ms=secs[1] * 1e3, note=note)
        row.extra["ns/pair"] = round(secs[0] * 1e9 / pairs, 1)
        row.extra.update(extra)
        table.add(row)
        return row

    for case, size in sizes.items():
        pairs = n_pairs if size <= 16 * MiB else max(1, n_pairs // 10)  # glibc mmaps 64 MiB: ~10-40 us a pair
        ops = pair_ops(pairs, size)
        add(case, "glibc malloc C++", _cpp_seconds(partial(C.malloc_replay, ops), repeat), pairs, "C++ loop")
        for impl, fast, per_call, tc in (
            ("caching tree path C++", False, True, 0),
            ("caching fast path C++", True, True, 0),
            ("caching fast path C++, 1 lock", True, False, 0),
            ("caching thread cache C++", True, True, THREAD_CACHE),
        ):
            a = CachingAllocator(CAPACITY, backend="cpp", fast_path=fast, thread_cache=tc)
            secs = _cpp_seconds(lambda a=a, per_call=per_call, ops=ops: a._core.replay(ops, per_call)[1], repeat)
            k = a.fast_counters()
            runs = repeat + 1
            how = "C++ loop, mutex per call" if per_call else "C++ loop, mutex once per trace"
            if tc:
                how = "C++ loop, per-thread cache (no lock on a hit), thread-safe"
            add(
                case,
                impl,
                secs,
                pairs,
                how,
                **{
                    "tree lookups/pair": round(k["tree_lookups"] / (runs * pairs), 3),
                    "tree updates/pair": round(k["tree_updates"] / (runs * pairs), 3),
                },
            )
        # from Python: the same loop for every row; ratio to glibc through ctypes
        pops = pair_ops(py_pairs, size)
        g = measure(handle_replay(pops, c_malloc, c_free), warmup=2, repeat=repeat)
        add(case, "glibc malloc (ctypes)", (g.median, g.min), py_pairs, "py loop", **{"x glibc ctypes": 1.0})
        fast = CachingAllocator(CAPACITY, backend="cpp")
        slow = CachingAllocator(CAPACITY, backend="cpp", fast_path=False)
        tcache = CachingAllocator(CAPACITY, backend="cpp", thread_cache=THREAD_CACHE)
        core = slow._core
        for impl, mf, ff, how in (
            ("caching fast call", fast.malloc, fast.free, "py loop, raw METH_FASTCALL builtins, fast path"),
            ("caching fast call, thread cache", tcache.malloc, tcache.free, "py loop, raw builtins, per-thread cache"),
            ("caching pybind11 call", core.malloc, core.free, "py loop, pybind11 methods, tree path"),
        ):
            t = measure(handle_replay(pops, mf, ff), warmup=2, repeat=repeat)
            add(case, impl, (t.median, t.min), py_pairs, how, **{"x glibc ctypes": round(t.median / g.median, 3)})
    table.compute_ratios()
    for r in table.rows:
        if r.note.startswith("py loop"):
            r.ratio = None  # "x glibc malloc C++" is for the C++ loop rows; py rows carry "x glibc ctypes"
    table.notes.append(
        "ns/pair = median seconds of the trace (timed inside C++ for C++-loop rows) / pairs; tree lookups and "
        "updates per pair are std::set lower_bound and insert/erase calls counted by the allocator (fast_counters)."
    )
    table.notes.append(
        "the fast path makes the tree path's decisions (same offsets and stats); a malloc whose block is freed "
        "before the next operation costs no tree work. glibc serves 64 B from its per-thread tcache without any "
        "atomic, and maps/unmaps 64 MiB blocks (above the mmap threshold) on every pair. The thread cache rows put a "
        f"per-thread cache ({THREAD_CACHE} blocks per size class up to 32 KiB) in front of the locked pool: a hit "
        "takes no lock (1 MiB and 64 MiB are not cached and take the locked path)."
    )
    return table


def fastpath_table(full: bool = False, progress: Any = None) -> Table:
    t = fastpath_rows(n_pairs=100_000 if full else 20_000, repeat=9 if full else 7, py_pairs=10_000 if full else 2_000)
    if progress is not None:
        progress("caching fast path")
    return t


def traces(full: bool = False) -> dict[str, np.ndarray]:
    from .workload import training_trace

    batch = 128 if full else 64
    out = {
        "MLP step x2 tensors": training_trace(2, model="mlp", batch=batch),
        "MLP step x2 numpy": training_trace(2, model="mlp", batch=batch, level="numpy"),
        "CNN step x2 tensors": training_trace(2, model="cnn", batch=batch),
        "CNN step x2 numpy": training_trace(2, model="cnn", batch=batch, level="numpy"),
        "random 16B-4MiB": random_ops(20_000 if full else 4_000, (16, 4 * MiB), max_live=100, seed=3),
    }
    return out


def replay_table(full: bool = False, progress: Any = None, recorded: dict[str, np.ndarray] | None = None) -> Table:
    table = Table("memory: trace replay (peak reserved, fragmentation) and static planning", baseline="caching cpp")
    recorded = recorded if recorded is not None else traces(full)
    for case, ops in recorded.items():
        lts = lifetimes_from_ops(ops)
        lb = planner.lower_bound(lts)
        n = int((ops[:, 0] == 0).sum())
        biggest = int(ops[ops[:, 0] == 0, 1].max())
        for name in NAMES:
            for backend in ("cpp", "python"):
                alloc = make(name, backend, 1 << 30, biggest)
                r = replay_stats(alloc, ops)
                if backend == "cpp":
                    t = measure(partial(make(name, "cpp", 1 << 30, biggest)._core.replay, ops), warmup=2, repeat=5)
                    ms, how = t.median * 1e3, "C++ loop"
                else:
                    ms, how = r["seconds"] * 1e3, "py loop, 1 run"
                table.add(
                    Row(
                        case,
                        f"{name} {backend}",
                        ms,
                        note=how,
                        extra={
                            "mallocs": n,
                            "peak reserved MB": round(r["peak_reserved"] / MiB, 3),
                            "x lower bound": round(r["peak_reserved"] / lb, 2),
                            "frag mean": round(r["frag_mean"], 3),
                            "frag max": round(r["frag_max"], 3),
                        },
                    )
                )
        for strategy in ("size", "interval", "breadth", "best"):
            t0 = time.perf_counter()
            _, peak = planner.plan(lts, strategy=strategy)
            ms = (time.perf_counter() - t0) * 1e3
            table.add(
                Row(
                    case,
                    f"plan {strategy}",
                    ms,
                    note="static plan (time = planning)",
                    extra={
                        "mallocs": n,
                        "peak reserved MB": round(peak / MiB, 3),
                        "x lower bound": round(peak / lb, 2),
                    },
                )
            )
        table.add(
            Row(
                case,
                "lower bound",
                None,
                note="max live bytes",
                extra={"mallocs": n, "peak reserved MB": round(lb / MiB, 3), "x lower bound": 1.0},
            )
        )
        if progress is not None:
            progress(f"replay {case}")
    table.compute_ratios()
    table.notes.append(
        "peak reserved: caching = sum of segments ('cudaMalloc'), slab = slabs in use, bump = top, "
        "others = end of the highest live block; lower bound = max bytes live at once (no rounding)."
    )
    table.notes.append(
        "frag = external fragmentation 1 - largest_free/total_free, sampled 200 times during the replay; "
        "the caching allocator's free memory is the cached part of its segments."
    )
    return table


def pooled_table(full: bool = False, progress: Any = None) -> Table:
    """Training under pooled(): same losses, time, and how many numpy data allocations reach glibc malloc."""
    from .workload import train

    steps = 50 if full else 20
    table = Table(f"memory: MLP training ({steps} SGD steps incl. model setup) under pooled()", baseline="unpooled")
    train(1)
    losses0, _, counted = train(steps, count=True)
    base = counted.stats()
    configs: list[tuple[str, Callable[[], Any], str]] = [
        ("unpooled", lambda: None, "numpy default allocator"),
        ("pooled hook, caching python", lambda: CachingAllocator(64 * MiB), "storage hook copies tensors in"),
        ("pooled hook, caching cpp", lambda: CachingAllocator(64 * MiB, backend="cpp"), "storage hook"),
        ("pooled numpy, caching cpp", lambda: CachingAllocator(64 * MiB, backend="cpp"), "numpy memory handler"),
    ]
    for impl, make_alloc, how in configs:
        numpy_mode = impl.startswith("pooled numpy")
        alloc = make_alloc()
        losses, _, pool = train(steps, alloc, numpy=numpy_mode)
        if alloc is None:
            requests, system = base["n_malloc"], base["n_system"]
        elif numpy_mode:
            requests = pool.stats()["n_malloc"]
            system = pool.stats()["n_system"] + alloc.stats()["n_segment_alloc"]
        else:  # numpy still allocates every array; the pool adds its segments
            requests, system = base["n_malloc"], base["n_system"] + alloc.stats()["n_segment_alloc"]
        t = measure(partial(_train_with, train, steps, make_alloc, numpy_mode), warmup=2, repeat=5)
        table.add(
            Row(
                "MLP digits",
                impl,
                t.median * 1e3,
                note=how,
                extra={
                    "min ms": round(t.min * 1e3, 2),
                    "same losses": losses == losses0,
                    "numpy data allocs": requests,
                    "system allocs": system,
                },
            )
        )
        if progress is not None:
            progress(f"pooled {impl}")
    table.compute_ratios()
    table.notes.append(
        "system allocs = numpy data allocations that reach glibc malloc (counted with a counting numpy memory "
        "handler) + arena segments taken by the caching allocator; the storage hook copies each tensor into the "
        "arena after numpy allocated it, so only the numpy-handler mode removes system allocations."
    )
    table.notes.append(
        "times include building the model and BLAS matmuls; on a shared 2-core box they vary by several x between "
        "runs (see min ms) -- the allocation counts and identical losses are the result here."
    )
    return table


def _train_with(train: Any, steps: int, make_alloc: Callable[[], Any], numpy_mode: bool) -> None:
    train(steps, make_alloc(), numpy=numpy_mode)


def run(full: bool = False, progress: Any = None) -> list[Table]:
    return [
        fastpath_table(full, progress),
        latency_table(full, progress),
        replay_table(full, progress),
        pooled_table(full, progress),
    ]


if __name__ == "__main__":
    for tab in run():
        print(tab.to_text())
        print()
