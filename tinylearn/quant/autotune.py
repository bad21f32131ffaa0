"""Run-time feedback for choosing an operator implementation: measure once per shape, cache, re-measure on drift.

``KernelAutotuner(candidates)`` wraps several implementations of one op (here the int8 GEMM versions registered in
tinylearn.backends: ``int8_gemm_autotuner()``). On the first call with a new *key* (the shapes and dtypes of the
arguments) it runs every candidate ``warmup`` + ``repeat`` times, checks that they agree with the first one
(``check``; a candidate that disagrees is dropped, never chosen), and caches the one with the smallest median time
(``stat="min"``: the minimum, robust to interference on a shared machine).
Later calls with that key run only the cached choice and time it (one ``perf_counter`` pair, the feedback signal);
when the median (or min) of its last ``window`` times exceeds ``(1 + drift)`` times the median it was chosen with (the
machine got busier, the data moved out of cache, a frequency change) the key is re-measured and may switch
implementation. That is the loop cuDNN's ``benchmark=True``, TVM's and Triton's autotuners run: the measurement, not
a static rule, decides, and the cache makes the cost one-time per shape.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import backends
from .._inputs import is_int, is_real
from .gemm import int8_gemm


def shape_key(*args: Any) -> tuple:
    """The default cache key: (shape, dtype) of every array argument, the value of every other one."""
    return tuple((tuple(a.shape), str(a.dtype)) if isinstance(a, np.ndarray) else a for a in args)


@dataclass
class TuneRecord:
    choice: str
    times: dict[str, float]  # candidate -> median seconds at the last measurement
    chosen_time: float
    recent: list[float] = field(default_factory=list)
    calls: int = 0
    measurements: int = 1


class KernelAutotuner:
    """Pick the fastest of ``candidates`` (name -> callable) per key by measurement; see the module docstring."""

    def __init__(
        self,
        candidates: dict[str, Callable[..., Any]],
        key: Callable[..., Any] = shape_key,
        repeat: int = 5,
        warmup: int = 1,
        window: int = 8,
        drift: float = 0.5,
        check: Callable[[Any, Any], bool] | None = None,
        timer: Callable[[], float] = time.perf_counter,
        stat: str = "median",
    ) -> None:
        if not isinstance(candidates, dict) or not candidates or not all(callable(f) for f in candidates.values()):
            raise ValueError(f"candidates: need a non-empty dict of name -> callable, got {candidates!r}")
        for name, v in (("repeat", repeat), ("window", window)):
            if not is_int(v) or v < 1:
                raise ValueError(f"{name}: must be an int >= 1, got {v!r}")
        if not is_int(warmup) or warmup < 0:
            raise ValueError(f"warmup: must be an int >= 0, got {warmup!r}")
        real = is_real(drift)
        if not (real and drift > 0):
            raise ValueError(f"drift: must be a number > 0, got {drift!r}")
        if stat not in ("median", "min"):
            raise ValueError(f"stat: expected 'median' or 'min', got {stat!r}")
        self.candidates = dict(candidates)
        self.key, self.drift = key, float(drift)
        self.repeat, self.warmup, self.window = int(repeat), int(warmup), int(window)
        self.check, self.timer = check, timer
        self._stat = statistics.median if stat == "median" else min
        self.cache: dict[Any, TuneRecord] = {}
        self.rejected: dict[str, str] = {}  # candidate -> why it was dropped

    def _time(self, fn: Callable[..., Any], args: tuple) -> tuple[float, Any]:
        out = None
        for _ in range(self.warmup):
            out = fn(*args)
        ts = []
        for _ in range(self.repeat):
            t0 = self.timer()
            out = fn(*args)
            ts.append(self.timer() - t0)
        return self._stat(ts), out

    def measure(self, *args: Any) -> TuneRecord:
        """Time every candidate on ``args`` now and (re)cache the fastest for their key."""
        times, ref = {}, None
        for name, fn in self.candidates.items():
            if name in self.rejected:
                continue
            t, out = self._time(fn, args)
            if ref is None:
                ref = out
            elif self.check is not None and not self.check(out, ref):
                self.rejected[name] = "result differs from the first candidate's"
                continue
            times[name] = t
        if not times:
            raise RuntimeError("candidates: every candidate was rejected; nothing to choose")
        best = min(times, key=times.__getitem__)
        k = self.key(*args)
        old = self.cache.get(k)
        rec = TuneRecord(best, times, times[best])
        if old is not None:
            rec.calls, rec.measurements = old.calls, old.measurements + 1
        self.cache[k] = rec
        return rec

    def __call__(self, *args: Any) -> Any:
        k = self.key(*args)
        rec = self.cache.get(k)
        if rec is None:
            rec = self.measure(*args)
        t0 = self.timer()
        out = self.candidates[rec.choice](*args)
        rec.recent = (rec.recent + [self.timer() - t0])[-self.window :]
        rec.calls += 1
        if len(rec.recent) == self.window and self._stat(rec.recent) > (1 + self.drift) * rec.chosen_time:
            self.measure(*args)  # feedback says the cached choice got slow: measure again
        return out

    def choice(self, *args: Any) -> str | None:
        """The cached implementation for these arguments' key (None before the first call)."""
        rec = self.cache.get(self.key(*args))
        return None if rec is None else rec.choice


def int8_gemm_autotuner(**kwargs: Any) -> KernelAutotuner:
    """A KernelAutotuner over every int8_gemm implementation this machine runs (the C++ versions registered in
    tinylearn.backends except "auto", plus numpy's exact int32 matmul), checked to agree exactly."""

    def make(backend: str, version: str | None) -> Callable[..., Any]:
        return lambda a, b: int8_gemm(a, b, backend=backend, version=version)

    cands: dict[str, Callable[..., Any]] = {}
    if backends.C_available("quant"):
        from .gemm import int8_gemm_versions

        for v in int8_gemm_versions():
            cands[f"cpp:{v}"] = make("cpp", v)
    cands["numpy:int32_matmul"] = make("numpy", None)
    kwargs.setdefault("check", np.array_equal)
    return KernelAutotuner(cands, **kwargs)
