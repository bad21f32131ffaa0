"""Hot op -> re-tune trigger: read a profile, find the dispatch ops that dominate time yet run far below their
roofline, and hand each to a ``retune(op, shape)`` callback (a JIT / autotuner), recording what it decided.

Rule (``HotspotMonitor.hot``): group the profile's dispatch events by (op, input shapes, dtypes, backend, version);
a group is hot when it has at least ``min_calls`` calls, at least ``min_share`` of the profile's self time, and its
achieved GFLOP/s (FLOPs / self time) is below ``threshold_fraction`` x its attainable roof
min(peak, intensity x bandwidth). ``HotspotMonitor.check(profile)`` calls ``retune(op, shapes)`` for each hot group
(``shapes`` = the tuple of its input shapes; an adapter turns it into a tuner's named shape, e.g. {"M","K","N"}),
which returns a callable with the op's signature or None ("keep what runs"). The monitor then times the old
implementation (``backends.resolve(op, backend, version)``) and the new callable on fresh random inputs of those
shapes (``tinylearn.bench.measure``, min of repeats) and keeps the decision: ``HotspotDecision``.

This module never imports ``tinylearn.tune`` (the import rules put the profiler below it): the notebook or the tuner
passes its own ``retune``. ``fastest_version_retune`` is the simple built-in one: time every registered version of the
op that runs here, check it against the current output, return the fastest (tagged with ``.backend``/``.version``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import backends
from .._inputs import is_real
from ..bench import roofline as _roofline
from ..bench.timing import measure

Shapes = tuple[tuple[int, ...], ...]


@dataclass
class HotspotDecision:
    op: str
    shapes: Shapes
    dtypes: tuple[str, ...]
    backend: str | None
    version: str | None
    calls: int
    share: float  # of the profile's self time
    gflops: float  # achieved
    attainable_gflops: float
    fraction: float  # achieved / attainable
    action: str  # "retuned" | "kept" (retune returned None or nothing faster) | "failed"
    new_backend: str | None = None
    new_version: str | None = None
    before_s: float | None = None
    after_s: float | None = None
    note: str = ""

    @property
    def speedup(self) -> float | None:
        return self.before_s / self.after_s if self.before_s and self.after_s else None


def random_inputs(shapes: Sequence[tuple[int, ...]], dtypes: Sequence[str], seed: int = 0) -> tuple[np.ndarray, ...]:
    """Fresh arrays of the recorded shapes/dtypes (floats ~ N(0,1), ints zeros) to time an op on."""
    if len(shapes) != len(dtypes):
        raise ValueError(f"dtypes: {len(dtypes)} dtypes for {len(shapes)} shapes")
    rng = np.random.default_rng(seed)
    out = []
    for s, d in zip(shapes, dtypes):
        dt = np.dtype(d)
        out.append(rng.standard_normal(s).astype(dt) if dt.kind == "f" else np.zeros(s, dt))
    return tuple(out)


def _time(fn: Callable[..., Any], args: tuple, repeat: int) -> float:
    return measure(lambda: fn(*args), warmup=1, repeat=repeat, warmup_s=0.0).min


def fastest_version_retune(
    op: str,
    shapes: Shapes,
    dtypes: Sequence[str] | None = None,
    *,
    repeat: int = 5,
    exclude: Sequence[tuple[str, str]] = (),
    max_call_s: float = 0.5,
) -> Callable[..., Any] | None:
    """Time every (backend, version) of ``op`` that runs here on random inputs of ``shapes``; return the fastest
    whose output matches the reference backend's (np.allclose, rtol 1e-3), tagged with ``.backend``/``.version``/
    ``.seconds`` and ``.tried`` ({"backend/version": seconds or why skipped}); None when nothing runs.
    ``exclude``: (backend, version) pairs not to try; a version whose first (checking) call takes longer than
    ``max_call_s`` (an interpreter, a first JIT compile) is skipped rather than timed."""
    dts = tuple(dtypes) if dtypes is not None else ("float32",) * len(shapes)
    args = random_inputs(shapes, dts)
    ref = backends.resolve(op, None, None, args, {})[2](*args)
    best: tuple[float, str, str, Callable[..., Any]] | None = None
    tried: dict[str, float | str] = {}
    for b, vs in backends.versions(op).items():
        for v in vs:
            if (b, v) in tuple(exclude) or not backends.runs_here(op, b, v):
                continue
            fn = backends.resolve(op, b, v, args, {})[2]
            try:
                t0 = time.perf_counter()
                out = fn(*args)
                first = time.perf_counter() - t0
                if first > max_call_s:
                    tried[f"{b}/{v}"] = f"skipped: first call {first:.2f} s > max_call_s"
                    continue
                if not np.allclose(np.asarray(out), np.asarray(ref), rtol=1e-3, atol=1e-3):
                    tried[f"{b}/{v}"] = "rejected: output differs from the reference"
                    continue
                t = _time(fn, args, repeat)
            except Exception as e:  # noqa: BLE001 - a version that cannot run this input is simply not a candidate
                tried[f"{b}/{v}"] = f"failed: {type(e).__name__}"
                continue
            tried[f"{b}/{v}"] = t
            if best is None or t < best[0]:
                best = (t, b, v, fn)
    if best is None:
        return None
    t, b, v, fn = best

    def tuned(*a: Any, **k: Any) -> Any:
        return fn(*a, **k)

    tuned.backend, tuned.version, tuned.seconds, tuned.tried = b, v, t, tried  # type: ignore[attr-defined]
    return tuned


class HotspotMonitor:
    """Find hot, under-performing dispatch ops in a profile and trigger ``retune`` on them (see module docstring)."""

    def __init__(
        self,
        threshold_fraction: float = 0.3,
        min_calls: int = 3,
        min_share: float = 0.05,
        *,
        peak_gflops: float | None = None,
        bandwidth_gbs: float | None = None,
        repeat: int = 5,
    ) -> None:
        if not (is_real(threshold_fraction) and 0 < threshold_fraction <= 1):
            raise ValueError(f"threshold_fraction: expected a number in (0, 1], got {threshold_fraction!r}")
        if isinstance(min_calls, bool) or not isinstance(min_calls, int) or min_calls < 1:
            raise ValueError(f"min_calls: expected an int >= 1, got {min_calls!r}")
        if not (isinstance(min_share, (int, float)) and 0 <= min_share <= 1):
            raise ValueError(f"min_share: expected a number in [0, 1], got {min_share!r}")
        self.threshold_fraction, self.min_calls, self.min_share = float(threshold_fraction), min_calls, min_share
        self.peak_gflops, self.bandwidth_gbs, self.repeat = peak_gflops, bandwidth_gbs, repeat
        self.decisions: list[HotspotDecision] = []

    def _roofs(self) -> tuple[float, float]:
        if self.peak_gflops is None or self.bandwidth_gbs is None:
            mp = _roofline.machine_peak()
            return (self.peak_gflops or mp["gflops_fp32"], self.bandwidth_gbs or mp["bandwidth_gbs"])
        return self.peak_gflops, self.bandwidth_gbs

    def hot(self, prof: Any) -> list[HotspotDecision]:
        """The hot groups of ``prof`` (a ``Profile``), hottest first, as decisions with action "pending"."""
        events = prof.events()
        total = sum(e.self_ns for e in events) or 1
        groups: dict[tuple, list] = {}
        for e in events:
            if e.kind == "dispatch":
                groups.setdefault((e.name, e.shapes, e.dtypes, e.backend, e.version), []).append(e)
        peak, bw = self._roofs()
        out = []
        for (op, shapes, dtypes, b, v), evs in groups.items():
            self_ns = sum(e.self_ns for e in evs)
            flops = sum(e.flops or 0 for e in evs)
            nbytes = sum(e.bytes or 0 for e in evs)
            if len(evs) < self.min_calls or self_ns / total < self.min_share or not flops or not nbytes:
                continue
            rf = _roofline.roofline(flops, nbytes, peak, bw)
            achieved = flops / max(self_ns, 1)
            frac = achieved / rf["attainable_gflops"]
            if frac < self.threshold_fraction:
                out.append(
                    HotspotDecision(
                        op,
                        shapes,
                        dtypes,
                        b,
                        v,
                        len(evs),
                        self_ns / total,
                        achieved,
                        rf["attainable_gflops"],
                        frac,
                        "pending",
                    )
                )
        return sorted(out, key=lambda d: -d.share)

    def check(self, prof: Any, retune: Callable[[str, Shapes], Callable[..., Any] | None]) -> list[HotspotDecision]:
        """Run ``retune`` on every hot group of ``prof``; time before/after; record and return the decisions."""
        if not callable(retune):
            raise TypeError(f"retune: expected a callable (op, shapes) -> callable | None, got {type(retune).__name__}")
        done = []
        for d in self.hot(prof):
            try:
                new = retune(d.op, d.shapes)
            except Exception as e:  # noqa: BLE001 - a failed re-tune is recorded, the program goes on
                d.action, d.note = "failed", f"retune raised {type(e).__name__}: {e}"
                done.append(d)
                continue
            if new is None:
                d.action, d.note = "kept", "retune returned None"
                done.append(d)
                continue
            args = random_inputs(d.shapes, d.dtypes)
            old = backends.resolve(d.op, d.backend, d.version, args, {})[2]
            d.before_s, d.after_s = _time(old, args, self.repeat), _time(new, args, self.repeat)
            d.new_backend, d.new_version = getattr(new, "backend", None), getattr(new, "version", None)
            faster = d.after_s < d.before_s
            d.action = "retuned" if faster else "kept"
            d.note = f"{d.before_s * 1e6:.1f} us -> {d.after_s * 1e6:.1f} us" + ("" if faster else " (not faster)")
            done.append(d)
        self.decisions.extend(done)
        return done
