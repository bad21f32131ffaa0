"""``tune(op, shape)``: search an op's declared space for its fastest correct configuration at one shape.

The loop:

1. ``space = tunable.get(op)``; inputs are drawn with ``space.make_args(shape, rng)`` and the expected output
   computed once by ``space.reference`` (or the op's numpy backend, ``backends.dispatch(op, backend="numpy")``).
2. The default configuration (what an untuned ``backend=None`` call runs) is measured first; it counts against
   ``budget`` and is told to the searcher, so the searcher starts knowing the baseline.
3. Until ``budget`` configurations are measured (or the searcher has nothing left): ``cfg = searcher.ask()``,
   ``measure_config`` (correctness check against the expected output before any timing), ``searcher.tell``.
   A configuration that raises or is wrong lands in ``rejected`` and is never chosen.
4. Optionally (``confirm_top=k``) the k fastest and the default are re-measured interleaved (``confirm``): on a
   shared machine one lucky measurement (taken while a neighbour was idle) must not decide the winner.
5. With ``store=True`` every measurement is written to the ``RecordDB`` with this machine's fingerprint, so
   ``best(op, shape_class)`` and tuned dispatch find the winner later for every shape of the same class.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import backends, tunable
from .measure import Measurement, measure_config, reject_outliers, spread_of
from .records import RecordDB
from .searchers import SEARCHERS, Searcher


@dataclass
class TuneResult:
    """The outcome of one ``tune`` call (``history``: every measurement in order, ``rejected``: the failed ones)."""

    op: str
    shape: dict
    shape_class: str
    best: dict
    best_s: float | None
    default: dict
    default_s: float | None
    history: list[Measurement] = field(default_factory=list)
    rejected: list[Measurement] = field(default_factory=list)
    searcher: str = ""

    @property
    def speedup(self) -> float | None:
        """default time / best time (None when either failed)."""
        if self.best_s is None or self.default_s is None:
            return None
        return self.default_s / self.best_s

    def best_so_far(self) -> list[float]:
        """The best correct time after each measurement (inf until one is correct): a search's progress curve."""
        out, cur = [], float("inf")
        for m in self.history:
            if m.ok and m.seconds is not None:
                cur = min(cur, m.seconds)
            out.append(cur)
        return out


def check_shape(space: tunable.Space, shape: Any) -> dict[str, int]:
    """``shape`` as a dict of positive ints, or ValueError naming it."""
    if not isinstance(shape, Mapping) or not shape:
        raise ValueError(f"shape: expected a non-empty dict of named sizes for {space.op}, got {shape!r}")
    out = {}
    for k, v in shape.items():
        if not isinstance(k, str) or not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"shape: {k!r}={v!r} is not a positive int size ({space.op})")
        out[k] = int(v)
    return out


def make_searcher(searcher: Any, space: tunable.Space, shape: dict, seed: int) -> Searcher:
    """A Searcher from a name (``SEARCHERS``, "tpe", "model"), a Searcher subclass or a factory."""
    if isinstance(searcher, str):
        if searcher == "tpe":
            from .tpe import TPESearch

            return TPESearch(space, shape, seed=seed)
        cls = SEARCHERS.get(searcher)
        if cls is None and searcher == "model":
            try:
                from .cost_model import ModelGuidedSearch  # type: ignore[import-not-found]
            except ImportError as e:
                raise ValueError(f"searcher: 'model' needs tinylearn.tune.cost_model ({e})") from e
            cls = ModelGuidedSearch
        if cls is None:
            names = sorted({*SEARCHERS, "tpe", "model"})
            raise ValueError(f"searcher: unknown searcher {searcher!r}; choose one of {names}")
        return cls(space, shape, seed=seed)
    if isinstance(searcher, type) and issubclass(searcher, Searcher):
        return searcher(space, shape, seed=seed)
    if callable(searcher):
        s = searcher(space, shape, seed)
        if not isinstance(s, Searcher):
            raise TypeError(f"searcher: the factory returned {type(s).__name__}, not a Searcher")
        return s
    raise ValueError(f"searcher: expected a name, a Searcher subclass or a factory, got {searcher!r}")


def expected_output(space: tunable.Space, args: tuple, kwargs: dict) -> Any:
    """The reference result of ``space.op`` on (args, kwargs): ``space.reference`` or the op's numpy backend."""
    if space.reference is not None:
        return space.reference(*args, **kwargs)
    return backends.dispatch(space.op, *args, backend="numpy", **kwargs)


def confirm(
    space: tunable.Space,
    configs: list[dict],
    args: tuple,
    kwargs: dict,
    *,
    rounds: int = 3,
    repeat: int = 5,
) -> list[Measurement]:
    """Re-measure ``configs`` interleaved: ``rounds`` passes, each timing every configuration once (``repeat``
    samples), so a burst of load on the machine hits all of them alike instead of one; returns one Measurement per
    configuration over all its samples (median after outlier rejection). Used to confirm a search's top candidates
    before trusting a single lucky measurement."""
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
        raise ValueError(f"rounds: expected an int >= 1, got {rounds!r}")
    samples: list[list[float]] = [[] for _ in configs]
    failed: list[Measurement | None] = [None] * len(configs)
    for _ in range(rounds):
        for i, cfg in enumerate(configs):
            if failed[i] is not None:
                continue
            m = measure_config(space, cfg, args, kwargs, warmup=1, repeat=repeat, retries=0)
            if not m.ok:
                failed[i] = m
            else:
                samples[i] += m.times
    out = []
    for cfg, ts, bad in zip(configs, samples, failed):
        if bad is not None:
            out.append(bad)
            continue
        kept = reject_outliers(ts)
        out.append(Measurement(space.check(cfg), float(np.median(kept)), spread_of(kept), kept, True, None))
    return out


def tune(
    op: str,
    shape: Mapping[str, int],
    *,
    searcher: str | type[Searcher] | Callable[..., Searcher] = "random",
    budget: int = 32,
    seed: int = 0,
    db: RecordDB | None = None,
    store: bool = True,
    warmup: int = 2,
    repeat: int = 7,
    confirm_top: int = 0,
) -> TuneResult:
    """Search ``op``'s space at ``shape`` for at most ``budget`` measured configurations (see the module docstring).

    ``searcher``: "grid" | "random" | "anneal" | "evolution" | "tpe" | "model", a Searcher subclass or a callable
    (space, shape, seed) -> Searcher. ``db``: where records go (default ``RecordDB()``); ``store=False`` keeps
    nothing. ``confirm_top=k``: after the search, the k fastest configurations and the default are re-measured
    interleaved (``confirm``) and the winner chosen on those times; the confirmed measurements replace the search's
    for those configurations (in ``history`` order and in the database)."""
    if not isinstance(op, str):
        raise TypeError(f"op: expected an op name (str), got {type(op).__name__}")
    space = tunable.get(op)
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        raise ValueError(
            f"budget: expected an int >= 1 (measured configurations, the default included), got {budget!r}"
        )
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed: expected an int, got {type(seed).__name__}")
    if not isinstance(confirm_top, int) or isinstance(confirm_top, bool) or confirm_top < 0:
        raise ValueError(f"confirm_top: expected an int >= 0, got {confirm_top!r}")
    if db is not None and not isinstance(db, RecordDB):
        raise TypeError(f"db: expected a RecordDB or None, got {type(db).__name__}")
    shape = check_shape(space, shape)
    try:  # a shape missing a size the space reads is the caller's error, named as such
        args, kwargs = space.make_args(shape, np.random.default_rng(seed))
        first = next(space.configs(shape), None)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"shape: {shape} does not describe an input of {op} ({type(e).__name__}: {e})") from e
    if first is None:
        raise ValueError(f"shape: no configuration of {op} is valid for {shape} (empty search space)")
    s = make_searcher(searcher, space, shape, seed)
    expected = expected_output(space, args, kwargs)
    default = space.check(space.default(shape))
    history: list[Measurement] = []

    def run(cfg: dict) -> None:
        m = measure_config(space, cfg, args, kwargs, expected=expected, warmup=warmup, repeat=repeat)
        history.append(m)
        s.tell(cfg, m.seconds)

    run(default)
    while len(history) < budget:
        cfg = s.ask()
        if cfg is None:
            break
        run(cfg)
    if confirm_top > 0:
        ranked = sorted((m for m in history if m.ok and m.seconds is not None), key=lambda m: m.seconds)  # type: ignore[arg-type, return-value]
        picks = [m.config for m in ranked[:confirm_top]]
        if default not in picks and history[0].ok:
            picks.append(default)
        again = {tuple(sorted(m.config.items())): m for m in confirm(space, picks, args, kwargs, repeat=repeat)}
        history = [again.get(tuple(sorted(m.config.items())), m) for m in history]
    ok = [m for m in history if m.ok and m.seconds is not None]
    rejected = [m for m in history if not m.ok]
    if ok:
        win = min(ok, key=lambda m: m.seconds)  # type: ignore[arg-type, return-value]
        best_cfg, best_s = win.config, win.seconds
    else:
        warnings.warn(f"tinylearn.tune: no configuration of {op} was correct at {shape}", RuntimeWarning, stacklevel=2)
        best_cfg, best_s = default, None
    if store:
        db = RecordDB() if db is None else db
        for m in history:
            db.add(op, shape, m.config, m)
    return TuneResult(
        op,
        shape,
        tunable.class_of(shape),
        best_cfg,
        best_s,
        default,
        history[0].seconds,
        history,
        rejected,
        getattr(s, "name", type(s).__name__),
    )


def best(op: str, shape_class: str, *, db: RecordDB | None = None) -> dict | None:
    """The stored fastest correct configuration of ``op`` for ``shape_class`` on this machine, or None."""
    if not isinstance(op, str):
        raise TypeError(f"op: expected an op name (str), got {type(op).__name__}")
    rec = (RecordDB() if db is None else db).best(op, shape_class)
    return None if rec is None else rec["config"]
