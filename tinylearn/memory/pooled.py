"""Pooled tensor storage and trace recording through tinylearn's storage hook.

``tinylearn.autograd.tensor.set_storage_hook(fn)`` makes every freshly computed tensor array pass through
``fn(array) -> array``. ``pooled(alloc)`` installs a hook that copies the array into a block of ``alloc`` and
returns a numpy view of the arena; the block is freed when the last view of it dies (arrays that are views of
other arrays pass through unchanged, which keeps aliasing):

    owner = _Block(arena, offset, nbytes)          # exposes __array_interface__ over arena[offset:offset+nbytes]
    view  = np.asarray(owner).view(dtype).reshape(shape)      # numpy sets view.base = owner, and every further
                                                              # view/slice of it also gets base = owner
    weakref.finalize(owner, alloc.free, offset)    # owner dies with the last view -> block returned

(Putting the finalizer on the view itself would be wrong: numpy collapses view chains to the first base that is
not an ndarray, so a slice of the view would keep the arena alive but not the view, and the block would be
freed under it.) A request that does not fit (MemoryError) falls back to the original array and is counted.

``pooled(alloc, numpy=True)`` (C++ CachingAllocator only) goes one level lower: it installs a numpy data-memory
handler (NEP 49, ``tinylearn._C.memory.numpy_handler``) so that *every* numpy array allocated in the block -- op
outputs, temporaries, gradients -- gets its data straight from the arena (malloc only when the arena is full).
That is what removes system allocations; the storage hook only re-homes tensors after numpy allocated them.
``count_numpy_allocations()`` installs a counting handler (plain malloc/free) to count the unpooled baseline.

``TraceRecorder`` records (nbytes, malloc index) and frees through the same hook, giving a real training
trace to replay through every allocator.
"""

from __future__ import annotations

import contextlib
import importlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .. import backends


class _Block:
    """Owner of one allocator block; numpy arrays built from it keep it (and the arena) alive."""

    __slots__ = ("__array_interface__", "arena", "__weakref__")

    def __init__(self, arena: np.ndarray, offset: int, nbytes: int) -> None:
        self.arena = arena
        self.__array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (arena.ctypes.data + offset, False),
            "version": 3,
        }


def _hook_module() -> Any:
    try:
        return importlib.import_module("tinylearn.autograd.tensor")
    except ImportError as e:
        raise RuntimeError(f"pooled/TraceRecorder need tinylearn.autograd.tensor.set_storage_hook ({e})") from e


def _set_hook(fn: Callable[[np.ndarray], np.ndarray] | None) -> Any:
    """Install ``fn``; returns the previously installed hook (None if the module does not expose it)."""
    mod = _hook_module()
    if not hasattr(mod, "set_storage_hook"):
        raise RuntimeError("tinylearn.autograd.tensor has no set_storage_hook(fn)")
    prev = getattr(mod, "get_storage_hook", lambda: getattr(mod, "_storage_hook", None))()
    mod.set_storage_hook(fn)
    return prev


class PoolHook:
    """The storage hook of ``pooled``: counters n_pooled (arrays moved into the arena), n_fallback
    (did not fit), bytes_pooled."""

    def __init__(self, alloc: Any) -> None:
        self.alloc = alloc
        self.n_pooled = self.n_fallback = self.n_skipped = self.bytes_pooled = 0

    def __call__(self, array: Any) -> Any:
        if not isinstance(array, np.ndarray) or array.base is not None or array.nbytes == 0 or array.dtype.hasobject:
            self.n_skipped += 1  # views share storage with another array: copying them would break aliasing
            return array
        alloc = self.alloc
        try:
            off = alloc.malloc(array.nbytes)
        except MemoryError:
            self.n_fallback += 1
            return array
        owner = _Block(alloc.arena, off, array.nbytes)
        weakref.finalize(owner, alloc.free, off)
        # same memory layout as the array it replaces (an array that owns its data is C- or F-contiguous): a
        # column-major result copied into a row-major view would send later BLAS calls down another path
        order = "F" if array.flags.f_contiguous and not array.flags.c_contiguous else "C"
        out = np.asarray(owner).view(array.dtype).reshape(array.shape, order=order)
        out[...] = array
        self.n_pooled += 1
        self.bytes_pooled += array.nbytes
        return out


class NumpyHandlerStats:
    """Counters of a tinylearn numpy data-memory handler: n_malloc (numpy data allocations), n_free, n_fallback
    (did not fit the arena), n_system (went to glibc malloc/realloc)."""

    def __init__(self, handler: Any) -> None:
        self._handler = handler

    def stats(self) -> dict[str, int]:

        return dict(backends.load_C("memory").handler_stats(self._handler))

    def __getattr__(self, name: str) -> int:
        if name in ("n_malloc", "n_free", "n_fallback", "n_system"):
            return self.stats()[name]
        raise AttributeError(name)


@contextlib.contextmanager
def _numpy_handler(handler: Any) -> Iterator[NumpyHandlerStats]:

    prev = backends.load_C("memory").set_numpy_handler(handler)
    try:
        yield NumpyHandlerStats(handler)
    finally:
        backends.load_C("memory").set_numpy_handler(prev)


def count_numpy_allocations() -> contextlib.AbstractContextManager[NumpyHandlerStats]:
    """Context manager: numpy data allocations go to glibc malloc as usual but are counted (``.n_malloc``)."""

    return _numpy_handler(backends.load_C("memory").counting_numpy_handler())


@contextlib.contextmanager
def pooled(alloc: Any, numpy: bool = False) -> Iterator[Any]:
    """Within the block, tinylearn Tensor storage comes from ``alloc`` (numpy views into its arena).

    Yields the hook (counters). Values are bit-identical to the unpooled run; blocks return to ``alloc`` when
    the tensors die (also after the block ends). ``numpy=True`` (C++ CachingAllocator only): every numpy data
    allocation comes from the arena through a numpy memory handler; yields its counters instead."""
    for name in ("malloc", "free", "arena"):
        if not hasattr(alloc, name):
            raise TypeError(f"alloc: expected a tinylearn.memory allocator, got {type(alloc).__name__}")
    if numpy:
        from .caching import CachingAllocator

        if not isinstance(alloc, CachingAllocator) or alloc.backend != "cpp":
            raise TypeError(f"alloc: numpy=True needs CachingAllocator(backend='cpp'), got {alloc!r}")

        with _numpy_handler(backends.load_C("memory").numpy_handler(alloc._core)) as counters:
            yield counters
        return
    hook = PoolHook(alloc)
    prev = _set_hook(hook)
    try:
        yield hook
    finally:
        _set_hook(prev)


class TraceRecorder:
    """Context manager recording an allocation trace (see tinylearn.memory.trace); ``rec.ops`` after the block.

    level="tensor": tinylearn tensor storage, through the storage hook; level="numpy": every numpy data
    allocation (outputs, temporaries, gradients, optimizer state), through a recording numpy memory handler.
    Blocks still alive at exit get a free at the end."""

    def __init__(self, level: str = "tensor") -> None:
        if level not in ("tensor", "numpy"):
            raise ValueError(f"level: expected 'tensor' or 'numpy', got {level!r}")
        self.level = level
        self._handler: Any = None
        self._ctx: Any = None
        self._ops: list[tuple[int, int]] = []
        self._n = 0
        self._live: set[int] = set()
        self._prev: Any = None
        self._closed = False

    def _free(self, i: int) -> None:
        if not self._closed and i in self._live:
            self._live.discard(i)
            self._ops.append((1, i))

    def __call__(self, array: Any) -> Any:
        if isinstance(array, np.ndarray) and array.base is None and array.nbytes > 0:  # owns fresh storage
            i = self._n
            self._n += 1
            self._ops.append((0, int(array.nbytes)))
            self._live.add(i)
            weakref.finalize(array, self._free, i)
        return array

    def __enter__(self) -> TraceRecorder:
        if self.level == "numpy":
            self._handler = backends.load_C("memory").recording_numpy_handler()
            self._ctx = _numpy_handler(self._handler)
            self._ctx.__enter__()
        else:
            self._prev = _set_hook(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.level == "numpy":
            self._ctx.__exit__(*exc)
            rows = [tuple(r) for r in backends.load_C("memory").handler_trace(self._handler).tolist()]
            n = sum(1 for op, _ in rows if op == 0)
            freed = {arg for op, arg in rows if op == 1}
            self._ops = rows + [(1, i) for i in range(n) if i not in freed]
        else:
            _set_hook(self._prev)
            self._ops += [(1, i) for i in sorted(self._live)]
            self._live.clear()
        self._closed = True

    @property
    def ops(self) -> np.ndarray:
        return np.asarray(self._ops, dtype=np.int64).reshape(-1, 2)
