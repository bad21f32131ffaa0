"""Side-by-side comparisons in one process: tinylearn backends, torch eager, torch.compile, tinygrad (TinyJit).

A ``Comparison`` is one table; each ``case(...)`` is one problem size with several implementations:

    cmp = Comparison("matmul fp32", baseline="torch")
    with cmp.case("512x512", flops=2 * 512**3) as c:
        c.add("numpy", lambda: a @ b)
        c.add("torch", lambda: ta @ tb)
        c.add_tinygrad("tinygrad", lambda tg: build_fn(tg))   # build gets the tinygrad module, returns a callable
    print(cmp.table)

An implementation that cannot run here (tinygrad without clang, no GPU, ...) is a row with ``n/a: reason``,
never a crash and never a silent fallback. tinygrad always runs on DEV=CPU: without clang that column reads
"n/a: clang not found" rather than falling back to the 1000x slower PYTHON device.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

from ..backends import clang_available
from .table import Row, Table
from .timing import measure


def tinygrad_status() -> tuple[bool, str]:
    """(ok, reason): can tinygrad run on its CPU device in this process?"""
    if not clang_available():
        return False, "n/a: clang not found"
    dev = os.environ.get("DEV")
    if "tinygrad" not in sys.modules and dev is None:
        os.environ["DEV"] = "CPU"
    elif dev not in (None, "CPU"):
        return False, f"n/a: DEV={dev} (benchmarks use DEV=CPU)"
    try:
        import tinygrad  # noqa: F401
    except Exception as e:  # pragma: no cover - depends on the install
        return False, f"n/a: tinygrad import failed ({type(e).__name__}: {e})"
    return True, ""


def import_tinygrad() -> Any:
    """The tinygrad module set up for DEV=CPU; raises RuntimeError with the reason when it cannot run."""
    ok, reason = tinygrad_status()
    if not ok:
        raise RuntimeError(f"tinygrad unavailable: {reason}")
    import tinygrad

    return tinygrad


def tinygrad_jit(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``fn(*tinygrad tensors) -> Tensor|tuple`` in TinyJit and realize the outputs on every call.

    TinyJit captures on the 2nd call and replays from the 3rd: run it at least twice before timing
    (``measure(warmup>=2)`` does). Inputs must keep their shapes between calls.
    """
    tg = import_tinygrad()
    jitted = tg.TinyJit(lambda *xs: _realize(fn(*xs)))

    def call(*xs: Any) -> Any:
        return jitted(*xs)

    return call


def _realize(out: Any) -> Any:
    if isinstance(out, tuple | list):
        return type(out)(o.realize() for o in out)
    return out.realize()


class _Case:
    def __init__(self, cmp: Comparison, name: str, flops: float | None, nbytes: float | None) -> None:
        self.cmp, self.name, self.flops, self.nbytes = cmp, name, flops, nbytes

    def add(self, impl: str, fn: Callable[[], Any], note: str = "", **extra: Any) -> Row:
        """Time ``fn()`` and add a row; an exception while running it becomes an ``n/a`` row naming the error."""
        try:
            t = measure(fn, warmup=self.cmp.warmup, repeat=self.cmp.repeat, memory=self.cmp.memory)
        except Exception as e:
            return self.unavailable(impl, f"n/a: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
        row = Row(self.name, impl, t.median * 1e3, t.min * 1e3, note=note, extra=dict(extra))
        if self.flops:
            row.gflops = self.flops / t.median / 1e9
        if self.nbytes:
            row.gbps = self.nbytes / t.median / 1e9
        if t.peak_bytes is not None:
            row.peak_mb = t.peak_bytes / 2**20
        self.cmp.table.add(row)
        self.cmp._progress(f"{self.name} / {impl}")
        return row

    def unavailable(self, impl: str, reason: str) -> Row:
        row = Row(self.name, impl, None, note=reason if reason.startswith("n/a") else f"n/a: {reason}")
        self.cmp.table.add(row)
        return row

    def add_tinygrad(self, impl: str, build: Callable[[Any], Callable[[], Any]], note: str = "TinyJit") -> Row:
        """``build(tinygrad_module)`` returns a no-argument callable (usually made with ``tinygrad_jit``)."""
        ok, reason = tinygrad_status()
        if not ok:
            return self.unavailable(impl, reason)
        try:
            fn = build(import_tinygrad())
        except Exception as e:
            return self.unavailable(impl, f"n/a: {type(e).__name__}: {e}")
        return self.add(impl, fn, note=note)

    def add_torch_compile(self, impl: str, fn: Callable[..., Any], *args: Any, note: str = "torch.compile") -> Row:
        """``torch.compile(fn)(*args)``; compilation happens in warm-up (needs a C++ compiler on CPU)."""
        import torch

        try:
            import torch._inductor.config as inductor_config

            # compile in this process: inductor's default pool of compile workers (compile_threads = cores) starts
            # at the first compile and goes on warming up in the background, and on a 2-core box it slowed the rows
            # timed after it (1-thread 1024x4096 bias+GELU: 7.2 ms right after a table with a compiled row, 4.3 ms
            # once the pool was up)
            inductor_config.compile_threads = 1
            compiled = torch.compile(fn)
            compiled(*args)
        except Exception as e:
            return self.unavailable(impl, f"n/a: torch.compile failed ({type(e).__name__})")
        return self.add(impl, lambda: compiled(*args), note=note)


class Comparison:
    """Collects rows from several cases into one ``Table`` (ratios to ``baseline`` filled on access)."""

    def __init__(
        self,
        title: str,
        baseline: str = "torch",
        warmup: int = 2,
        repeat: int = 10,
        memory: bool = False,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        if warmup < 2:
            raise ValueError(f"warmup: TinyJit needs >= 2 warm-up calls, got {warmup}")
        self._table = Table(title, baseline)
        self.warmup, self.repeat, self.memory, self.progress = warmup, repeat, memory, progress

    def _progress(self, msg: str) -> None:
        if self.progress is not None:
            self.progress(msg)

    @contextlib.contextmanager
    def case(self, name: str, flops: float | None = None, nbytes: float | None = None) -> Iterator[_Case]:
        yield _Case(self, name, flops, nbytes)

    def note(self, text: str) -> None:
        self._table.notes.append(text)

    @property
    def table(self) -> Table:
        self._table.compute_ratios()
        return self._table
