"""What every allocator shares: the arena, size validation, the stats dictionary and numpy views.

An allocator owns one arena of ``capacity`` bytes and hands out *offsets* into it, the way a device allocator
hands out device pointers. Units are bytes everywhere. Invariants checked by the tests for every allocator:

    live blocks never overlap;  every offset is a multiple of the allocator's alignment;
    allocated == sum(block sizes of live blocks)  and  requested == sum(nbytes asked for);
    after freeing every live block: allocated == 0 (nothing leaks) and the free space is whole again.

Metrics (same keys for every allocator and both backends):

    external fragmentation = 1 - largest_free / total_free      (0 when total_free == 0)
    internal fragmentation = 1 - requested / allocated          (rounding waste inside handed-out blocks)

Rejected calls (size <= 0, size > capacity, double free, unknown offset, misaligned view) raise
ValueError / MemoryError naming the size or offset, and leave the allocator state unchanged.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import backends

ARENA_ALIGN = 4096  # the arena base address is page aligned, so offset alignment == address alignment

STAT_KEYS = (
    "capacity",
    "allocated",
    "requested",
    "reserved",
    "peak",
    "peak_reserved",
    "n_alloc",
    "n_free",
    "n_live",
    "total_free",
    "largest_free",
    "fragmentation",
    "internal_fragmentation",
)


def align_up(x: int, a: int) -> int:
    """Smallest multiple of ``a`` that is >= ``x`` (a > 0)."""
    if type(x) is not int or type(a) is not int:  # the check costs the allocators' hot path only for non-ints
        x, a = check_int("x", x), check_int("a", a)
    if a <= 0:
        raise ValueError(f"a: the alignment must be positive, got {a}")
    return (x + a - 1) // a * a


def external_fragmentation(total_free: int, largest_free: int) -> float:
    """1 - largest_free / total_free: 0 when all free memory is one block, -> 1 when it is shattered."""
    return 0.0 if total_free <= 0 else 1.0 - largest_free / total_free


def check_int(name: str, value: Any) -> int:
    """``value`` as a Python int; TypeError naming ``name`` for bools, floats and other non-integers."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__} {value!r}")
    return int(value)


def check_power_of_two(name: str, value: int) -> int:
    value = check_int(name, value)
    if value <= 0 or value & (value - 1):
        raise ValueError(f"{name}: must be a positive power of two, got {value}")
    return value


def make_arena(capacity: int) -> np.ndarray:
    """A uint8 numpy buffer of ``capacity`` bytes whose first byte is page aligned (pages untouched until used)."""
    raw = np.empty(capacity + ARENA_ALIGN, dtype=np.uint8)
    skip = (-raw.ctypes.data) % ARENA_ALIGN
    return raw[skip : skip + capacity]


class PyCore:
    """Bookkeeping shared by the Python reference allocators: live blocks, counters, peaks, validation.

    Subclasses implement ``_malloc(nbytes) -> (offset, block_size)``, ``_release(offset, block_size)``,
    ``_free_info() -> (total_free, largest_free)``, ``free_blocks() -> [(offset, size)]``, and may override
    ``_reserved()``.
    """

    def __init__(self, capacity: int, alignment: int) -> None:
        capacity = check_int("capacity", capacity)
        if capacity <= 0:
            raise ValueError(f"capacity: must be positive, got {capacity}")
        self.capacity = capacity
        self.alignment = check_power_of_two("alignment", alignment)
        self.live: dict[int, tuple[int, int]] = {}  # offset -> (block_size, requested)
        self.allocated = self.requested = 0
        self.peak = self.peak_reserved = 0
        self.n_alloc = self.n_free = 0

    # -- validation -------------------------------------------------------------------------------------------
    def check_size(self, nbytes: Any) -> int:
        n = check_int("nbytes", nbytes)
        if n <= 0:
            raise ValueError(f"nbytes: must be positive, got {n}")
        if n > self.capacity:
            raise MemoryError(f"nbytes={n} exceeds the arena capacity of {self.capacity} bytes")
        return n

    def lookup(self, offset: Any) -> tuple[int, int, int]:
        off = check_int("offset", offset)
        if off not in self.live:
            raise ValueError(f"free(offset={off}): not a live allocation (double free or never allocated)")
        size, req = self.live[off]
        return off, size, req

    # -- public operations ----------------------------------------------------------------------------------
    def malloc(self, nbytes: int) -> int:
        n = self.check_size(nbytes)
        off, size = self._malloc(n)  # raises MemoryError before changing anything
        self.live[off] = (size, n)
        self.allocated += size
        self.requested += n
        self.n_alloc += 1
        self.peak = max(self.peak, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self._reserved_after_malloc(off, size))
        return off

    def free(self, offset: int) -> None:
        off, size, req = self.lookup(offset)
        del self.live[off]
        self.allocated -= size
        self.requested -= req
        self.n_free += 1
        self._release(off, size)

    def block_size(self, offset: int) -> int:
        """Size of the live block starting at ``offset`` (ValueError if none)."""
        return self.lookup(offset)[1]

    def live_blocks(self) -> list[tuple[int, int, int]]:
        """[(offset, block_size, requested)] sorted by offset."""
        return sorted((o, s, r) for o, (s, r) in self.live.items())

    # -- metrics ----------------------------------------------------------------------------------------------
    def _reserved(self) -> int:
        """Footprint: end of the highest live block (the arena prefix that must exist)."""
        return max((o + s for o, (s, _) in self.live.items()), default=0)

    def _reserved_after_malloc(self, off: int, size: int) -> int:
        return off + size

    def stats(self) -> dict[str, Any]:
        total_free, largest_free = self._free_info()
        return {
            "capacity": self.capacity,
            "allocated": self.allocated,
            "requested": self.requested,
            "reserved": self._reserved(),
            "peak": self.peak,
            "peak_reserved": self.peak_reserved,
            "n_alloc": self.n_alloc,
            "n_free": self.n_free,
            "n_live": len(self.live),
            "total_free": total_free,
            "largest_free": largest_free,
            "fragmentation": external_fragmentation(total_free, largest_free),
            "internal_fragmentation": 0.0 if self.allocated == 0 else 1.0 - self.requested / self.allocated,
        }


class Allocator:
    """Public face of an allocator: one arena + a Python (``PyCore``) or C++ (``tinylearn._C.memory``) core.

    ``malloc(nbytes) -> offset``, ``free(offset)``, ``stats() -> dict``, ``view(offset, shape, dtype)``,
    ``snapshot()`` (blocks in address order), ``replay(ops)`` (run a whole trace, see tinylearn.memory.trace).
    """

    backend: str

    def __init__(self, core: Any, backend: str) -> None:
        self._core = core
        self.backend = backend
        self.capacity = int(core.capacity)
        self.alignment = int(core.alignment)
        if backend == "python":
            self.arena = make_arena(self.capacity)
        else:
            self.arena = np.asarray(core.arena())  # the C++ core owns the block; the array keeps it alive
        # hot path: bind the core's methods directly (no extra Python frame per call); the C++ core gets a thin
        # type check first (pybind11 would accept True as 1 and answer float/None/str with an unclear message)
        if backend == "python":
            self.malloc = core.malloc
            self.free = core.free
        else:
            c_malloc, c_free = core.malloc, core.free

            def malloc(nbytes: int, *args: Any, **kw: Any) -> int:
                return c_malloc(nbytes if type(nbytes) is int else check_int("nbytes", nbytes), *args, **kw)

            def free(offset: int, *args: Any, **kw: Any) -> None:
                c_free(offset if type(offset) is int else check_int("offset", offset), *args, **kw)

            self.malloc = malloc
            self.free = free
            if hasattr(core, "fast_calls"):  # raw METH_FASTCALL builtins; non-int arguments go to the closures above
                self.malloc, self.free = core.fast_calls(malloc, free)

    def malloc(self, nbytes: int) -> int:  # replaced per instance in __init__
        """Allocate ``nbytes`` bytes; returns the block's offset in the arena."""
        return int(self._core.malloc(nbytes))

    def free(self, offset: int) -> None:  # replaced per instance in __init__
        """Return the block that starts at ``offset``."""
        self._core.free(offset)

    def stats(self) -> dict[str, Any]:
        """Counters and metrics, keys ``STAT_KEYS`` (plus allocator-specific ones)."""
        return dict(self._core.stats())

    def block_size(self, offset: int) -> int:
        return int(self._core.block_size(offset))

    def live_blocks(self) -> list[tuple[int, int, int]]:
        """[(offset, block_size, requested)] of live blocks, sorted by offset."""
        return [tuple(map(int, b)) for b in self._core.live_blocks()]

    def free_blocks(self) -> list[tuple[int, int]]:
        """[(offset, size)] of free blocks this allocator can hand out, sorted by offset."""
        return sorted(tuple(map(int, b)) for b in self._core.free_blocks())

    def snapshot(self) -> list[dict[str, Any]]:
        """Blocks in address order: dict(offset, size, requested, state='allocated'|'free')."""
        out = [dict(offset=o, size=s, requested=r, state="allocated") for o, s, r in self.live_blocks()]
        out += [dict(offset=o, size=s, requested=0, state="free") for o, s in self.free_blocks()]
        return sorted(out, key=lambda b: b["offset"])

    def replay(self, ops: np.ndarray) -> np.ndarray:
        """Run a trace (int64 [m, 2] rows (0, nbytes) = malloc, (1, i) = free the i-th malloc) on this allocator.

        Returns the offset of every malloc. The C++ backend runs the loop in C++ (``replay_native``)."""
        from .trace import check_ops, replay_python

        if self.backend == "cpp":
            return np.asarray(self._core.replay(check_ops(ops))[0])
        return replay_python(self, check_ops(ops))

    def view(self, offset: int, shape: int | tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
        """A numpy array of ``shape``/``dtype`` over the arena at ``offset``, which must lie in a live block.

        ValueError when the offset is not inside a live block, is not a multiple of the dtype's itemsize
        (misaligned), or the view would run past the end of its block."""
        off = check_int("offset", offset)
        dt = np.dtype(dtype)
        shp = (shape,) if isinstance(shape, int | np.integer) else tuple(int(s) for s in shape)
        if any(s < 0 for s in shp):
            raise ValueError(f"shape: negative dimension in {shp}")
        nbytes = math.prod(shp) * dt.itemsize
        if off % dt.itemsize:
            raise ValueError(f"view(offset={off}): misaligned for dtype {dt} (itemsize {dt.itemsize})")
        start, size = self._containing_block(off)
        if off + nbytes > start + size:
            raise ValueError(
                f"view(offset={off}, shape={shp}, dtype={dt}): {nbytes} bytes run past the end of the live block "
                f"[{start}, {start + size})"
            )
        return self.arena[off : off + nbytes].view(dt).reshape(shp)

    def _containing_block(self, off: int) -> tuple[int, int]:
        try:
            return off, self.block_size(off)
        except ValueError:
            pass
        for o, s, _ in self.live_blocks():
            if o <= off < o + s:
                return o, s
        raise ValueError(f"view(offset={off}): not inside a live allocation")

    def __repr__(self) -> str:
        s = self.stats()
        return (
            f"{type(self).__name__}(capacity={self.capacity}, backend={self.backend!r}, allocated={s['allocated']}, "
            f"reserved={s['reserved']}, n_live={s['n_live']})"
        )


def core_workload(core: Any) -> np.ndarray:
    """The offsets a fixed malloc/free sequence gets from an allocator core, then its live blocks (offset, size,
    requested): what the python and cpp cores of one allocator must agree on (the conformance test compares it)."""
    offs = [int(core.malloc(n)) for n in (100, 3000, 64, 4000, 700, 256)]
    for i in (1, 3):
        core.free(offs[i])
    offs += [int(core.malloc(n)) for n in (2000, 50, 4096)]
    return np.array(offs + [int(v) for b in sorted(core.live_blocks()) for v in b], dtype=np.int64)


def register_core(kind: str, python_core: Any, cpp_core: Any, *args: Any) -> None:
    """Register an allocator's two cores as op ``memory.<kind>``: ``python`` (reference) and ``cpp`` (same offsets).

    ``cpp_core(_C.memory, *args)`` builds the C++ core from the Python constructor's arguments. ``args``: the
    constructor arguments of the conformance test's example (compared through ``core_workload``)."""
    backends.register(f"memory.{kind}", "python", python_core, example=lambda rng: (args, {}), compared=core_workload)
    backends.register(
        f"memory.{kind}",
        "cpp",
        lambda *args: cpp_core(backends.load_C("memory"), *args),
        available=lambda: backends.C_available("memory"),
    )


def make_core(kind: str, backend: str | None, *args: Any) -> tuple[Any, str]:
    """(core, backend name) for ``backend="python"|"cpp"`` (None: the fastest built, i.e. cpp when available)."""
    if backend is not None and backends.canonical(backend) not in ("python", "cpp"):
        raise ValueError(f"backend: expected 'python' or 'cpp' (or None), got {backend!r}")
    name, _, factory = backends.resolve(f"memory.{kind}", backend)
    return factory(*args), name
