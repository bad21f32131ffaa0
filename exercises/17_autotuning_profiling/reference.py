"""Reference answers for exercises/17_autotuning_profiling, bound to tinylearn: random search through
tinylearn.tune.searchers.RandomSearch's ask/tell on a tunable.Space built from the knob grid, the GEMM schedule
features of tinylearn.tune.proxy_model.schedule_features, and the profile table's self-time ranking (what
tinylearn.profiler's key_averages(...).table(sort_by="self_cpu_time_total") orders by). Thin adapters validate the
exercise's arguments (ValueError naming them) before calling the library."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from tinylearn import tunable
from tinylearn._inputs import is_int
from tinylearn.tune import proxy_model
from tinylearn.tune.searchers import RandomSearch


# ------------------------------------------------------------------------------------------ (a) random search
def random_search(
    space_values: Mapping[str, Sequence[Any]], measure: Callable[[dict[str, Any]], float | None], budget: int,
    seed: int = 0,
) -> tuple[dict[str, Any] | None, float | None, list[tuple[dict[str, Any], float | None]]]:  # fmt: skip
    if not isinstance(space_values, Mapping) or not space_values:
        raise ValueError(f"space_values: expected a non-empty dict of knob -> values, got {space_values!r}")
    params = []
    for name, vals in space_values.items():
        if isinstance(vals, str | bytes) or not isinstance(vals, Sequence) or not vals:
            raise ValueError(f"space_values: knob {name!r} needs a non-empty sequence of values, got {vals!r}")
        if len(set(vals)) != len(vals):
            raise ValueError(f"space_values: knob {name!r} repeats a value: {list(vals)!r}")
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"space_values: knob names must be identifiers, got {name!r}")
        params.append(tunable.Param(name, tuple(vals)))
    if not is_int(budget) or budget < 1:
        raise ValueError(f"budget: expected an int >= 1, got {budget!r}")
    if not callable(measure):
        raise ValueError(f"measure: expected a callable config -> seconds, got {type(measure).__name__}")
    space = tunable.Space(op="exercise.grid", params=tuple(params), build=lambda cfg: None,
                          shape_of=lambda *a, **k: {}, make_args=lambda shape, rng: ((), {}),
                          default=lambda shape: {})  # fmt: skip
    searcher = RandomSearch(space, {"n": 1}, seed=int(seed))
    history: list[tuple[dict[str, Any], float | None]] = []
    best, best_t = None, None
    for _ in range(budget):
        cfg = searcher.ask()
        if cfg is None:
            break
        t = measure(dict(cfg))
        if t is not None:
            t = float(t)
            if not math.isfinite(t) or not t > 0:
                raise ValueError(f"measure: returned {t!r} for {cfg}; expected positive seconds or None")
        searcher.tell(cfg, t)
        history.append((dict(cfg), t))
        if t is not None and (best_t is None or t < best_t):
            best, best_t = dict(cfg), t
    return best, best_t, history


# ------------------------------------------------------------------------------------------ (b) GEMM features
def gemm_features(M: int, N: int, K: int, mc: int, kc: int, nc: int) -> dict[str, float]:
    for name, v in (("M", M), ("N", N), ("K", K), ("mc", mc), ("kc", kc), ("nc", nc)):
        if not is_int(v) or v < 1:
            raise ValueError(f"{name}: expected an int >= 1, got {v!r}")
    return proxy_model.schedule_features(M, N, K, mc, kc, nc)


# ------------------------------------------------------------------------------------------ (c) top ops
def top_ops(profile_rows: Sequence[Mapping[str, Any]], k: int) -> list[tuple[str, float, float]]:
    if isinstance(profile_rows, str | bytes | Mapping) or not isinstance(profile_rows, Sequence):
        raise ValueError(f"profile_rows: expected a list of dicts, got {type(profile_rows).__name__}")
    if not is_int(k) or k < 1:
        raise ValueError(f"k: expected an int >= 1, got {k!r}")
    self_ns: dict[str, float] = {}
    for i, r in enumerate(profile_rows):
        if not isinstance(r, Mapping) or "name" not in r or "self_ns" not in r:
            raise ValueError(f"profile_rows: row {i} must be a dict with 'name' and 'self_ns', got {r!r}")
        t = r["self_ns"]
        if isinstance(t, bool) or not isinstance(t, int | float | np.integer | np.floating) or not t >= 0:
            raise ValueError(f"profile_rows: row {i} ({r['name']!r}) has self_ns {t!r}; expected a number >= 0")
        self_ns[str(r["name"])] = self_ns.get(str(r["name"]), 0.0) + float(t)
    total = sum(self_ns.values())
    ranked = sorted(self_ns.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
    return [(name, t, t / total if total > 0 else 0.0) for name, t in ranked]
