"""Tuning records in SQLite, each tagged with the fingerprint of the machine that measured it.

One table, one row per measured configuration::

    records(id, fingerprint, fingerprint_json, op, shape, shape_class, config, seconds, spread, ok, error, created)

``fingerprint`` is ``machine_id`` of ``fingerprint_json`` (``tinylearn.tune.fingerprint``); shape and config are
canonical JSON (sorted keys). Reads return only this machine's rows unless ``any_machine=True``: a timing measured
on another CPU says little about this one, so rows of other machines are skipped (with one warning per database
saying how many). ``best`` is the fastest correct row of (op, shape class).

Failure modes are explicit: a path that cannot be created or written (a read-only directory, a parent that is a
file) gives a warning naming it and an in-memory database (``persistent`` is False; an existing read-only file's
rows are copied in first), and a file that is not an SQLite database raises ValueError naming the path. One
connection guarded by a lock serves every thread of the process.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..tunable import class_of
from .fingerprint import fingerprint as _fingerprint
from .fingerprint import machine_id
from .measure import Measurement

ENV = "TINYLEARN_TUNE_DB"
_SCHEMA = """CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY AUTOINCREMENT, fingerprint TEXT NOT NULL, fingerprint_json TEXT NOT NULL,
    op TEXT NOT NULL, shape TEXT NOT NULL, shape_class TEXT NOT NULL, config TEXT NOT NULL,
    seconds REAL, spread REAL, ok INTEGER NOT NULL, error TEXT, created REAL NOT NULL)"""
_INDEX = "CREATE INDEX IF NOT EXISTS records_op ON records (op, shape_class, fingerprint)"
_COLS = "fingerprint, fingerprint_json, op, shape, shape_class, config, seconds, spread, ok, error, created"


def default_path() -> str:
    """$TINYLEARN_TUNE_DB, else ~/.cache/tinylearn/tune.sqlite."""
    env = os.environ.get(ENV, "").strip()
    return env or str(Path.home() / ".cache" / "tinylearn" / "tune.sqlite")


def _dumps(x: Mapping[str, Any]) -> str:
    return json.dumps(dict(x), sort_keys=True, separators=(",", ":"), default=str)


class RecordDB:
    """SQLite store of tuning records (see the module docstring). ``path``: a file, ``":memory:"`` or None."""

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path: expected a file path, ':memory:' or None, got {type(path).__name__}")
        self.path = default_path() if path is None else os.fspath(path)
        self.persistent = self.path != ":memory:"
        self._lock = threading.Lock()
        self._warned_skip = False
        self._fp: dict[str, Any] | None = None
        self._conn = self._open()

    # -- opening --------------------------------------------------------------------------------------------
    def _open(self) -> sqlite3.Connection:
        if not self.persistent:
            return self._init(sqlite3.connect(":memory:", check_same_thread=False))
        p = Path(self.path)
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, check_same_thread=False)
            try:
                return self._init(conn)
            except sqlite3.DatabaseError as e:
                conn.close()
                if "not a database" in str(e) or "malformed" in str(e):
                    raise ValueError(f"path: {self.path!r} is not a readable SQLite tuning database ({e})") from e
                raise
        except (OSError, sqlite3.OperationalError) as e:
            warnings.warn(
                f"tinylearn.tune: cannot write the tuning database at {self.path!r} ({e}); using an in-memory "
                "database instead: records of this session will NOT be saved",
                RuntimeWarning,
                stacklevel=3,
            )
            self.persistent = False
            mem = sqlite3.connect(":memory:", check_same_thread=False)
            if p.is_file():  # keep what a read-only file already holds
                try:
                    src = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
                    src.backup(mem)
                    src.close()
                except sqlite3.DatabaseError:
                    pass
            return self._init(mem)

    @staticmethod
    def _init(conn: sqlite3.Connection) -> sqlite3.Connection:
        conn.execute(_SCHEMA)
        conn.execute(_INDEX)
        conn.commit()
        return conn

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __repr__(self) -> str:
        return f"RecordDB({self.path!r}, persistent={self.persistent})"

    # -- writing --------------------------------------------------------------------------------------------
    def _this_fp(self) -> dict[str, Any]:
        if self._fp is None:
            self._fp = _fingerprint()
        return self._fp

    def add(
        self,
        op: str,
        shape: Mapping[str, int],
        config: Mapping[str, Any],
        measurement: Measurement,
        fingerprint: dict[str, Any] | None = None,
    ) -> None:
        """Store one measured configuration of ``op`` at ``shape`` (failed ones too: ok=0 with the error)."""
        if not isinstance(op, str) or not op:
            raise ValueError(f"op: expected an op name, got {op!r}")
        if not isinstance(shape, Mapping) or not shape:
            raise ValueError(f"shape: expected a non-empty dict of named sizes, got {shape!r}")
        if not isinstance(config, Mapping):
            raise TypeError(f"config: expected a dict, got {type(config).__name__}")
        if not isinstance(measurement, Measurement):
            raise TypeError(f"measurement: expected a Measurement, got {type(measurement).__name__}")
        fp = self._this_fp() if fingerprint is None else fingerprint
        if not isinstance(fp, dict):
            raise TypeError(f"fingerprint: expected a dict or None, got {type(fp).__name__}")
        row = (
            machine_id(fp),
            _dumps(fp),
            op,
            _dumps(shape),
            class_of(shape),
            _dumps(config),
            measurement.seconds,
            measurement.spread,
            int(bool(measurement.ok)),
            measurement.error,
            time.time(),
        )
        with self._lock:
            self._conn.execute(f"INSERT INTO records ({_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)", row)
            self._conn.commit()

    # -- reading --------------------------------------------------------------------------------------------
    def records(self, op: str, shape_class: str | None = None, any_machine: bool = False) -> list[dict[str, Any]]:
        """Rows of ``op`` (and ``shape_class``), oldest first; only this machine's unless ``any_machine``."""
        if not isinstance(op, str):
            raise TypeError(f"op: expected an op name (str), got {type(op).__name__}")
        if shape_class is not None and not isinstance(shape_class, str):
            raise TypeError(f"shape_class: expected a str like 'K256_M256_N256' or None, got {shape_class!r}")
        q, params = f"SELECT id, {_COLS} FROM records WHERE op = ?", [op]
        if shape_class is not None:
            q += " AND shape_class = ?"
            params.append(shape_class)
        with self._lock:
            rows = self._conn.execute(q + " ORDER BY id", params).fetchall()
        mine = machine_id(self._this_fp())
        out, skipped = [], 0
        for r in rows:
            if not any_machine and r[1] != mine:
                skipped += 1
                continue
            out.append(
                {
                    "id": r[0],
                    "fingerprint": r[1],
                    "fingerprint_json": json.loads(r[2]),
                    "op": r[3],
                    "shape": json.loads(r[4]),
                    "shape_class": r[5],
                    "config": json.loads(r[6]),
                    "seconds": r[7],
                    "spread": r[8],
                    "ok": bool(r[9]),
                    "error": r[10],
                    "created": r[11],
                }
            )
        if skipped and not self._warned_skip:
            self._warned_skip = True
            warnings.warn(
                f"tinylearn.tune: skipped {skipped} record(s) of {op!r} measured on another machine "
                f"(fingerprint differs from {mine}); pass any_machine=True to use them",
                RuntimeWarning,
                stacklevel=2,
            )
        return out

    def best(self, op: str, shape_class: str, any_machine: bool = False) -> dict[str, Any] | None:
        """The fastest correct record of (op, shape_class) (a dict with "config" and "seconds"), or None."""
        if not isinstance(shape_class, str):
            raise TypeError(f"shape_class: expected a str like 'K256_M256_N256', got {shape_class!r}")
        ok = [r for r in self.records(op, shape_class, any_machine) if r["ok"] and r["seconds"] is not None]
        return min(ok, key=lambda r: r["seconds"]) if ok else None

    def best_all(self, op: str | None = None) -> dict[tuple[str, str], dict[str, Any]]:
        """{(op, shape_class): best record} of this machine, for every op (or one): what tuned dispatch loads."""
        with self._lock:
            ops = [r[0] for r in self._conn.execute("SELECT DISTINCT op FROM records").fetchall()]
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for o in ops if op is None else [op]:
            for r in self.records(o):
                if r["ok"] and r["seconds"] is not None:
                    key = (o, r["shape_class"])
                    if key not in out or r["seconds"] < out[key]["seconds"]:
                        out[key] = r
        return out
