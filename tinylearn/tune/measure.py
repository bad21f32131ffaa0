"""Measuring one configuration: correctness first, then robust timing.

``measure_config`` builds the configuration's function (``space.build``), runs it once and compares the output
with ``expected`` under the DESIGN.md tolerance table (``tinylearn.tolerance``; atol scaled by the output's
magnitude, see ``check_output``): a configuration that raises or computes a wrong answer is reported (``ok=False``,
``seconds=None``, the error text kept) and never timed, so a searcher can never pick a fast wrong kernel.

Timing reuses ``tinylearn.bench.measure`` (time-based warm-up, batching of fast calls, median). The samples are then
cleaned: any sample beyond ``median + 3 * MAD`` (median absolute deviation) is dropped as an outlier (a preemption
by another process, a page-fault storm). The spread of what remains is the relative inter-quartile range
(IQR / median); above ``max_spread`` the run is considered noisy and repeated up to ``retries`` times, keeping the
tightest run. The reported time is the median of the kept samples.
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import backends
from ..bench.timing import measure
from ..tolerance import assert_close, to_numpy, tolerance
from ..tunable import Space


@dataclass
class Measurement:
    """One configuration's outcome: ``seconds`` (median after outlier rejection) or None when it failed."""

    config: dict
    seconds: float | None
    spread: float
    times: list[float] = field(default_factory=list)
    ok: bool = True
    error: str | None = None


def reject_outliers(times: list[float]) -> list[float]:
    """``times`` without the samples above ``median + 3 * MAD`` (all kept when the MAD is zero)."""
    if len(times) < 3:
        return list(times)
    t = np.asarray(times, dtype=np.float64)
    med = float(np.median(t))
    mad = float(np.median(np.abs(t - med)))
    if mad == 0.0:
        return list(times)
    return [float(x) for x in t if x <= med + 3.0 * mad]


def spread_of(times: list[float]) -> float:
    """Relative inter-quartile range: (q75 - q25) / median (0 for fewer than 2 samples)."""
    if len(times) < 2:
        return 0.0
    q25, med, q75 = np.percentile(np.asarray(times, dtype=np.float64), [25, 50, 75])
    return float((q75 - q25) / med) if med > 0 else 0.0


def _reduction_size(space: Space, args: tuple, kwargs: dict) -> int | None:
    try:
        shape = space.shape_of(*args, **kwargs)
        return max(int(v) for v in shape.values()) if shape else None
    except Exception:  # noqa: BLE001 - a shape_of that cannot read these args: use the plain tolerance
        return None


def check_output(space: Space, out: Any, expected: Any, args: tuple, kwargs: dict) -> str | None:
    """None when ``out`` matches ``expected`` within the tolerance table, else the mismatch text.

    The table's atol is meant for values of order one; it is scaled by the expected output's largest magnitude
    (a K-long fp32 dot product of unit-variance inputs has values ~sqrt(K) and a rounding error to match), and the
    reduction length is taken as the largest size of the call's shape (fp32 widens beyond 1k elements)."""
    red = _reduction_size(space, args, kwargs)
    if backends.is_registered(space.op):  # the part every implementation must agree on (conv: y, not its saved columns)
        out, expected = backends.compared(space.op, out), backends.compared(space.op, expected)
    outs, exps = (out, expected) if isinstance(expected, tuple) else ((out,), (expected,))
    if not isinstance(outs, tuple) or len(outs) != len(exps):
        return f"wrong result: expected a tuple of {len(exps)} outputs, got {type(out).__name__}"
    for i, (o, x) in enumerate(zip(outs, exps)):
        if x is None:  # an optional output the reference does not produce
            continue
        what = "wrong result" if len(exps) == 1 else f"wrong result (output {i})"
        try:
            e = to_numpy(x)
            if e.dtype.kind != "f":
                assert_close(o, x, reduction_size=red, msg=what)
                continue
            atol, rtol = tolerance(e.dtype, red)
            finite = np.abs(e[np.isfinite(e)])
            scale = max(1.0, float(finite.max())) if finite.size else 1.0
            assert_close(o, x, atol=atol * scale, rtol=rtol, reduction_size=red, msg=what)
        except (AssertionError, ValueError, TypeError) as err:
            return str(err)
    return None


def _short(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    where = f" (at {tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno})" if tb else ""
    return f"{type(e).__name__}: {e}{where}"


def measure_config(
    space: Space,
    config: Mapping[str, Any],
    args: tuple,
    kwargs: dict | None = None,
    *,
    expected: Any = None,
    warmup: int = 2,
    repeat: int = 7,
    max_spread: float = 0.25,
    retries: int = 2,
) -> Measurement:
    """Check ``config`` of ``space`` against ``expected`` (when given), then time it (see the module docstring)."""
    if not isinstance(space, Space):
        raise TypeError(f"space: expected a tunable.Space, got {type(space).__name__}")
    cfg = space.check(config)
    if not isinstance(args, tuple):
        raise TypeError(f"args: expected a tuple of positional arguments, got {type(args).__name__}")
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(kwargs, dict):
        raise TypeError(f"kwargs: expected a dict, got {type(kwargs).__name__}")
    for name, v in (("warmup", warmup), ("repeat", repeat), ("retries", retries)):
        if not isinstance(v, int) or isinstance(v, bool) or v < (1 if name == "repeat" else 0):
            raise ValueError(f"{name}: expected an int >= {1 if name == 'repeat' else 0}, got {v!r}")
    if not isinstance(max_spread, (int, float)) or not max_spread > 0:
        raise ValueError(f"max_spread: expected a positive number, got {max_spread!r}")
    try:
        fn = space.build(cfg)
        out = fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - a configuration that raises is reported, not fatal
        return Measurement(cfg, None, 0.0, [], False, _short(e))
    if expected is not None:
        err = check_output(space, out, expected, args, kwargs)
        if err is not None:
            return Measurement(cfg, None, 0.0, [], False, err)
    best: list[float] | None = None
    best_spread = float("inf")
    try:
        for _ in range(retries + 1):
            timing = measure(lambda: fn(*args, **kwargs), warmup=warmup, repeat=repeat)
            kept = reject_outliers(timing.times)
            s = spread_of(kept)
            if s < best_spread:
                best, best_spread = kept, s
            if s <= max_spread:
                break
    except Exception as e:  # noqa: BLE001 - raised on a later call (a flaky kernel): reported
        return Measurement(cfg, None, 0.0, [], False, _short(e))
    assert best is not None
    return Measurement(cfg, float(np.median(best)), best_spread, best, True, None)
