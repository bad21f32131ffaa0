"""``tl.profile()``: record every autograd op and backend dispatch of a block, like torch.profiler.

Mechanism: two hooks already sit on tinylearn's hot paths and cost one ``is None`` test when off:

- ``tinylearn.autograd.function._profile_hook``: ``Function.apply`` calls ``hook.forward(cls, ctx, arrays, kwargs)``
  instead of ``cls.forward(ctx, *arrays, **kwargs)``, and the autograd engine calls ``hook.backward(node,
  grad_outputs)`` instead of ``type(node).backward(node, *grad_outputs)``;
- ``tinylearn.backends.set_dispatch_hook``: every ``backends.dispatch`` calls ``hook(op, backend, version, fn, args,
  kwargs)`` instead of ``fn(*args, **kwargs)``.

A ``Profile`` is both hooks. Each call pushes an ``Event`` (perf_counter_ns start, thread id, input shapes/dtypes,
backend/version) on a per-thread stack, runs the op (through the previously installed hook when profiles nest, so
an outer profile sees everything an inner one does), then pops it and adds its duration to the parent's
``children_ns``: a ``gemm.matmul`` dispatched inside ``Linear``'s forward is its child, and Linear's self time is
its total minus the GEMM. ``record_function(name)`` adds user ranges (NVTX-like). On exit (exceptions included) the
previous hooks are put back, then FLOPs/bytes are computed from names and shapes (``flops.op_cost``) outside the
timed region. Overhead (measured on this 2-core VM): ~3 us per event inside the block (the table includes it in
parents' self time) plus ~5 us per event for the cost model at exit.

``memory=True`` also records, per event, the peak bytes Python/numpy allocated above the op's starting point
(``tracemalloc``; slow, several x). ``counters=True`` reads hardware counters for the whole block (or warns once
with the reason and records the software / getrusage counters instead): ``Profile.counters``; each
``record_function`` range then gets its own reading too (``event.extra["counters"]``, shown in the trace).
"""

from __future__ import annotations

import threading
import time
import tracemalloc
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .. import backends
from ..autograd import function as _function
from . import counters as _counters
from . import table as _table
from . import trace as _trace
from .events import Event, arrays_meta
from .flops import op_cost

_ACTIVE: list[Profile] = []  # open profiles, innermost last (record_function writes to each)
_WARNED: set[str] = set()
_DTYPE_STR: dict[Any, str] = {}


def _dtype_str(d: Any) -> str:
    s = _DTYPE_STR.get(d)
    if s is None:
        s = _DTYPE_STR[d] = str(d)
    return s


class Profile:
    """The recorder (installed as both hooks while its ``with`` block runs) and the result afterwards."""

    def __init__(
        self, *, record_shapes: bool = True, with_flops: bool = True, counters: bool = False, memory: bool = False
    ) -> None:
        for name, v in (
            ("record_shapes", record_shapes),
            ("with_flops", with_flops),
            ("counters", counters),
            ("memory", memory),
        ):
            if not isinstance(v, bool):
                raise TypeError(f"{name}: expected a bool, got {type(v).__name__} {v!r}")
        self.record_shapes, self.with_flops, self.memory = record_shapes, with_flops, memory
        self.want_counters = counters
        self.counters: dict[str, Any] | None = None
        self.counters_note = ""
        self._events: list[Event] = []
        self._local = threading.local()
        self._lock = threading.Lock()
        self._prev_fwd: Any = None
        self._prev_dispatch: Any = None
        self._active = False
        self._done = False
        self._started_tracemalloc = False
        self._counter_cm: Any = None
        self.start_ns = self.end_ns = 0

    # -- context manager ------------------------------------------------------------------------------------
    def __enter__(self) -> Profile:
        if self._active or self._done:
            raise RuntimeError("profile: a Profile records one block; create a new one with tl.profile()")
        if self.want_counters:  # before the hooks: a warning raised as an error here leaves nothing installed
            self._start_counters()
        if self.memory and not tracemalloc.is_tracing():
            tracemalloc.start()
            self._started_tracemalloc = True
        self._prev_fwd = _function._profile_hook
        _function._profile_hook = self
        self._prev_dispatch = backends.set_dispatch_hook(self._dispatch)
        _ACTIVE.append(self)
        self._active = True
        self.start_ns = time.perf_counter_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        self.end_ns = time.perf_counter_ns()
        try:
            if self._counter_cm is not None:
                self._counter_cm.__exit__(None, None, None)
                self.counters = dict(self._counter_cm.values)
        finally:
            _function._profile_hook = self._prev_fwd
            backends.set_dispatch_hook(self._prev_dispatch)
            if self in _ACTIVE:
                _ACTIVE.remove(self)
            self._active, self._done = False, True
            if self._started_tracemalloc:
                tracemalloc.stop()
        for e in self._events:  # dtypes were kept as numpy objects while timing
            e.dtypes = tuple(_dtype_str(d) for d in e.dtypes)
            e.out_dtypes = tuple(_dtype_str(d) for d in e.out_dtypes)
        if self.with_flops:
            for e in self._events:
                self._cost(e)
            self._self_costs()
        if not self.record_shapes:
            for e in self._events:
                e.shapes = e.dtypes = e.out_shapes = e.out_dtypes = ()

    def _start_counters(self) -> None:
        ok, reason = _counters.counters_available()
        cm: Any = _counters.HardwareCounters() if ok else _counters.software_counters()
        if not ok:
            self.counters_note = f"hardware counters unavailable ({reason}); recorded {type(cm).__name__}"
            if reason not in _WARNED:
                _WARNED.add(reason)
                warnings.warn(f"tl.profile(counters=True): {self.counters_note}", RuntimeWarning, stacklevel=3)
        try:
            cm.__enter__()
        except _counters.CountersUnavailable as e:  # opened in the probe but not now: fall back to getrusage
            self.counters_note = f"{e}; recorded RusageCounters"
            cm = _counters.RusageCounters()
            cm.__enter__()
        self._counter_cm = cm

    # -- event stack ----------------------------------------------------------------------------------------
    def _stack(self) -> list[Event]:
        st = getattr(self._local, "stack", None)
        if st is None:
            st = self._local.stack = []
        return st

    def _begin(
        self, name: str, kind: str, values: Any = (), backend: str | None = None, version: str | None = None
    ) -> Event:
        st = self._stack()
        shapes, dtypes = arrays_meta(values)
        with self._lock:
            e = Event(
                len(self._events),
                name,
                kind,
                0,
                tid=threading.get_ident(),
                shapes=shapes,
                dtypes=dtypes,
                backend=backend,
                version=version,
            )
            self._events.append(e)
        if st:
            e.parent, e.depth = st[-1].id, st[-1].depth + 1
        st.append(e)
        if self.memory:
            e.mem_base = tracemalloc.get_traced_memory()[0]
            e.mem_peak = 0
            tracemalloc.reset_peak()
        e.start_ns = time.perf_counter_ns()
        return e

    def _end(self, e: Event, out: Any = None) -> None:
        e.end_ns = time.perf_counter_ns()
        st = self._stack()
        if st and st[-1] is e:
            st.pop()
        if out is not None:
            e.out_shapes, e.out_dtypes = arrays_meta(out if isinstance(out, (tuple, list)) else (out,))
        if self.memory and e.mem_base is not None:
            own = tracemalloc.get_traced_memory()[1] - e.mem_base  # peak since the last reset (our last child's end)
            e.mem_peak = max(e.mem_peak or 0, own)
        if st:
            parent = st[-1]
            parent.children_ns += e.duration_ns
            if self.memory and parent.mem_base is not None and e.mem_base is not None:
                parent.mem_peak = max(parent.mem_peak or 0, e.mem_base - parent.mem_base + (e.mem_peak or 0))
                tracemalloc.reset_peak()

    # -- the hooks ------------------------------------------------------------------------------------------
    def forward(self, cls: type, ctx: Any, arrays: list, kwargs: dict) -> Any:
        e = self._begin(cls.__name__, "forward", arrays)
        out = None
        try:
            if self._prev_fwd is not None:
                out = self._prev_fwd.forward(cls, ctx, arrays, kwargs)
            else:
                out = cls.forward(ctx, *arrays, **kwargs)
        finally:
            self._end(e, out)
        ctx.__dict__["_pf_meta"] = (e.shapes, e.dtypes, e.out_shapes, e.out_dtypes)  # the backward's cost model
        return out

    def backward(self, node: Any, grad_outputs: Any) -> Any:
        e = self._begin(f"{type(node).__name__}Backward", "backward", grad_outputs)
        meta = node.__dict__.get("_pf_meta")
        if meta is not None:  # cost of a backward: from the forward's shapes
            e.extra["fwd_meta"] = meta
        try:
            if self._prev_fwd is not None:
                return self._prev_fwd.backward(node, grad_outputs)
            return type(node).backward(node, *grad_outputs)
        finally:
            self._end(e)

    def _dispatch(self, op: str, backend: str, version: str, fn: Any, args: tuple, kwargs: dict) -> Any:
        e = self._begin(op, "dispatch", args, backend, version)
        out = None
        try:
            if self._prev_dispatch is not None:
                out = self._prev_dispatch(op, backend, version, fn, args, kwargs)
            else:
                out = fn(*args, **kwargs)
        finally:
            self._end(e, out)
        return out

    def _cost(self, e: Event) -> None:
        if e.kind == "user":
            return
        meta = e.extra.pop("fwd_meta", None)
        if meta is not None:
            shapes, dtypes, out_shapes, out_dtypes = meta
            e.flops, e.bytes = op_cost(
                e.name, shapes, [str(d) for d in dtypes], out_shapes, [str(d) for d in out_dtypes]
            )
        else:
            e.flops, e.bytes = op_cost(e.name, e.shapes, e.dtypes, e.out_shapes, e.out_dtypes)

    def _self_costs(self) -> None:
        # a parent's FLOPs/bytes exclude what its children count (Linear's forward that dispatches gemm.matmul keeps
        # only the bias add), so the table's totals count each FLOP once
        orig = [(e.flops, e.bytes) for e in self._events]
        for e, (f, b) in zip(self._events, orig):
            if e.parent is None:
                continue
            p = self._events[e.parent]
            if f is not None and p.flops is not None:
                p.flops = max(0, p.flops - f)
            if b is not None and p.bytes is not None:
                p.bytes = max(0, p.bytes - b)

    # -- results --------------------------------------------------------------------------------------------
    def events(self) -> list[Event]:
        """Every recorded event in start order (a copy of the list; the events themselves are shared)."""
        return list(self._events)

    @property
    def wall_ns(self) -> int:
        return self.end_ns - self.start_ns

    def key_averages(self, group_by_input_shape: bool = False) -> _table.KeyAverages:
        """Events aggregated per name (and per input shapes): torch.profiler's ``key_averages()``."""
        if group_by_input_shape and not self.record_shapes:
            raise ValueError("group_by_input_shape: needs profile(record_shapes=True)")
        return _table.key_averages(self._events, group_by_input_shape=group_by_input_shape)

    def table(self, sort_by: str = "self_cpu_time_total", row_limit: int = 20) -> str:
        """torch.profiler-style text table of ``key_averages()`` (plus FLOPs, GFLOP/s, bytes, intensity)."""
        return self.key_averages().table(sort_by=sort_by, row_limit=row_limit)

    def roofline(self, peak_gflops: float | None = None, bandwidth_gbs: float | None = None) -> list[dict]:
        """Per op with a FLOP count: intensity, achieved GFLOP/s, bound ("memory"/"compute"), fraction of its roof."""
        return _table.roofline_rows(self.key_averages(), peak_gflops, bandwidth_gbs)

    def export_chrome_trace(self, path: str) -> str:
        """Write the events as Chrome trace JSON (open in https://ui.perfetto.dev or chrome://tracing)."""
        return _trace.export_chrome_trace(self._events, path)


def profile(
    *, record_shapes: bool = True, with_flops: bool = True, counters: bool = False, memory: bool = False
) -> Profile:
    """``with tl.profile() as prof: ...`` then ``print(prof.table())`` / ``prof.export_chrome_trace(path)``."""
    return Profile(record_shapes=record_shapes, with_flops=with_flops, counters=counters, memory=memory)


@contextmanager
def record_function(name: str) -> Iterator[None]:
    """A named user range in every open profile (a no-op when none is open), like torch's ``record_function``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: expected a non-empty string, got {name!r}")
    opened = [(p, p._begin(name, "user")) for p in list(_ACTIVE)]
    cm: Any = None
    if any(p.want_counters for p, _ in opened):
        cm = _counters.HardwareCounters() if _counters.counters_available()[0] else _counters.software_counters()
        try:
            cm.__enter__()
        except _counters.CountersUnavailable:
            cm = _counters.RusageCounters()
            cm.__enter__()
    try:
        yield
    finally:
        if cm is not None:
            cm.__exit__(None, None, None)
            for p, e in opened:
                if p.want_counters:
                    e.extra["counters"] = dict(cm.values)
        for p, e in reversed(opened):
            p._end(e)
