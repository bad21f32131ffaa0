"""Tuned dispatch: ``backend=None`` calls run the stored fastest configuration of their shape class.

``backends.resolve`` asks an installed *tuned provider* before ranking backends by priority (pins and a named
backend or version still win). This module's provider, for an op with a declared space (``tunable.get``):

1. computes the call's shape (``space.shape_of(*args, **kwargs)``) and shape class (``tunable.class_of``);
2. looks up (op, shape class) in an in-memory dict loaded once from the ``RecordDB`` (this machine's rows only);
3. on a hit returns ``(space.backend, "tuned:<config>", space.build(config))`` (built functions are cached);
   on a miss returns None (the usual ranking) -- or, in mode ``"search"``, runs ``tune(op, shape,
   budget=SEARCH_BUDGET)`` once for that class, stores and caches the winner.

The same lookup (``_config_for``) is installed as ``tunable.set_config_provider``: code that builds kernels itself
asks ``tunable.tuned_config(space, shape)`` for a configuration (``tl.compile``'s C++ code generator asks it for
the loop schedule of each fused kernel, ``compiler.tuning.kernel_space``).

A stored configuration that no longer runs here (``space.is_valid`` is False: an ISA this CPU or the forced
``TINYLEARN_CPU_FEATURES`` level lacks, a knob removed from the space) is ignored with one warning, never run.

Modes: ``TINYLEARN_TUNE=off|cached|search`` (default off; any other value is a ValueError naming the variable),
``set_mode(m)`` overrides it for the process, ``with tuned("cached", db=...):`` for a block. ``install()`` is
what tinylearn's root calls when the variable is not "off".
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .. import backends, tunable
from .records import RecordDB
from .searchers import config_key

ENV = "TINYLEARN_TUNE"
MODES: tuple[str, ...] = ("off", "cached", "search")
SEARCH_BUDGET = 8  # configurations measured on a miss in "search" mode

_mode: str | None = None  # set_mode's choice; None: read the environment
_db: RecordDB | None = None
_cache: dict[tuple[str, str], dict] | None = None  # (op, shape class) -> config
_built: dict[tuple[str, tuple], Any] = {}
_no_space: set[str] = set()
_searched: set[tuple[str, str]] = set()
_warned: set[tuple[str, tuple]] = set()
_lock = threading.RLock()
_busy = threading.local()  # inside a search: calls of the tuner itself are not intercepted


def _check_mode(m: Any, what: str) -> str:
    if not isinstance(m, str) or m.strip().lower() not in MODES:
        raise ValueError(f"{what}: unknown tuning mode {m!r}; choose one of {list(MODES)}")
    return m.strip().lower()


def mode() -> str:
    """The tuning mode: set_mode's choice, else $TINYLEARN_TUNE, else "off"."""
    return _mode if _mode is not None else mode_env()


def database() -> RecordDB:
    """The RecordDB tuned dispatch reads (default: ``RecordDB()``, $TINYLEARN_TUNE_DB)."""
    global _db
    with _lock:
        if _db is None:
            _db = RecordDB()
        return _db


def reload() -> dict[tuple[str, str], dict]:
    """(Re)load the best stored configuration of every (op, shape class) from the database."""
    global _cache
    with _lock:
        _cache = {k: r["config"] for k, r in database().best_all().items()}
        _built.clear()
        return dict(_cache)


def cached() -> dict[tuple[str, str], dict]:
    """The (op, shape class) -> configuration table the provider uses now (loaded on first use)."""
    return dict(reload() if _cache is None else _cache)


def _version(cfg: dict) -> str:
    return "tuned:" + ",".join(f"{k}={v}" for k, v in cfg.items())


def _provider(op: str, args: tuple, kwargs: dict) -> tuple[str, str, Any] | None:
    if op in _no_space or getattr(_busy, "on", False):
        return None
    try:
        space = tunable.get(op)
    except ValueError:
        _no_space.add(op)
        return None
    try:
        shape = space.shape_of(*args, **kwargs)
    except Exception:  # noqa: BLE001 - an input the space cannot describe: no tuned choice
        return None
    cfg = _config_for(space, shape, stacklevel=5)
    if cfg is None:
        return None
    key = (op, config_key(cfg))
    fn = _built.get(key)
    if fn is None:
        fn = _built[key] = space.build(cfg)
    return space.backend, _version(cfg), fn


def _config_for(space: tunable.Space, shape: dict, stacklevel: int = 3) -> dict | None:
    """The stored (or, in "search" mode, searched) configuration of ``space`` for ``shape``'s class, checked
    against the space; None on a miss or when the stored one cannot run here (warned once)."""
    if getattr(_busy, "on", False):
        return None
    op, cls = space.op, tunable.class_of(shape)
    table = cached() if _cache is None else _cache
    cfg = table.get((op, cls))
    if cfg is None and mode() == "search" and (op, cls) not in _searched:
        cfg = _search(op, shape, cls)
    if cfg is None:
        return None
    try:
        cfg = space.check(cfg)
        ok = space.is_valid(cfg, shape)
    except (ValueError, TypeError):
        ok = False
    if not ok:
        key = (op, config_key(cfg))
        if key not in _warned:
            _warned.add(key)
            warnings.warn(
                f"tinylearn.tune: the stored configuration {cfg} of {op} ({cls}) cannot run here (an ISA or knob "
                "this machine lacks); ignored, using the default ranking",
                RuntimeWarning,
                stacklevel=stacklevel,
            )
        return None
    return cfg


def _search(op: str, shape: dict, cls: str) -> dict | None:
    from .tuner import tune

    with _lock:
        _searched.add((op, cls))
        _busy.on = True
        try:
            res = tune(op, shape, budget=SEARCH_BUDGET, db=database())
        finally:
            _busy.on = False
        if res.best_s is None:
            return None
        if _cache is None:
            reload()
        _cache[(op, cls)] = res.best  # type: ignore[index]
        return res.best


def set_mode(m: str | None) -> str:
    """Set the tuning mode for this process ("off" removes the provider; None: follow $TINYLEARN_TUNE again);
    returns the previous mode."""
    global _mode
    new = mode_env() if m is None else _check_mode(m, "mode")
    prev = mode()
    _mode = None if m is None else new
    if new == "off":
        old = backends.set_tuned_provider(None)
        if old is not None and old is not _provider:  # someone else's provider: leave it in place
            backends.set_tuned_provider(old)
        old_cfg = tunable.set_config_provider(None)
        if old_cfg is not None and old_cfg is not _config_for:
            tunable.set_config_provider(old_cfg)
    else:
        backends.set_tuned_provider(_provider)
        tunable.set_config_provider(_config_for)
    return prev


def install() -> None:
    """Install the provider when $TINYLEARN_TUNE (or set_mode) is "cached" or "search" (tinylearn's root calls
    this at import when the variable is set)."""
    set_mode(_mode)


@contextmanager
def tuned(mode: str = "cached", db: RecordDB | None = None) -> Iterator[RecordDB]:
    """Within the block, ``backend=None`` calls use tuned configurations from ``db`` (default: the usual one)."""
    global _db, _cache
    new = _check_mode(mode, "mode")
    if db is not None and not isinstance(db, RecordDB):
        raise TypeError(f"db: expected a RecordDB or None, got {type(db).__name__}")
    with _lock:
        saved = (_db, _cache, _mode, dict(_built), set(_searched))
        if db is not None:
            _db = db
        _cache = None
        _searched.clear()
        _warned.clear()  # say it again in this block
        reload()
    set_mode(new)
    try:
        yield database()
    finally:
        with _lock:
            _db, _cache, old_mode, built, searched = saved
            _built.clear()
            _built.update(built)
            _searched.clear()
            _searched.update(searched)
        set_mode(old_mode)


def mode_env() -> str:
    """The mode $TINYLEARN_TUNE asks for (ValueError naming the variable for a bad value)."""
    return _check_mode(backends.env_flag(ENV, "off") or "off", ENV)
