"""Chrome trace export: the profile as ``{"traceEvents": [...]}`` JSON that Perfetto (ui.perfetto.dev) and
chrome://tracing open.

Every event becomes one complete event (``"ph": "X"``) with ``ts`` (start, microseconds since the first event) and
``dur`` (microseconds), ``pid`` (this process), ``tid`` (the recording thread) and ``args`` (input shapes, dtypes,
backend/version, FLOPs, bytes). The viewers nest "X" events of one thread by time containment, so a dispatch drawn
inside its Function's forward is the same parent/child relation the table's self times use.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

from .events import Event


def trace_events(events: Iterable[Event]) -> list[dict]:
    evs = list(events)
    t0 = min((e.start_ns for e in evs), default=0)
    pid = os.getpid()
    out = []
    for e in evs:
        args: dict = {
            "kind": e.kind,
            "shapes": [list(s) for s in e.shapes],
            "dtypes": list(e.dtypes),
            "backend": e.backend,
            "version": e.version,
            "flops": e.flops,
            "bytes": e.bytes,
        }
        if e.parent is not None:
            args["parent"] = e.parent
        if "counters" in e.extra:
            args["counters"] = e.extra["counters"]
        if e.mem_peak is not None:
            args["mem_peak_bytes"] = e.mem_peak
        out.append(
            {
                "name": e.name,
                "cat": e.kind,
                "ph": "X",
                "ts": (e.start_ns - t0) / 1e3,
                "dur": e.duration_ns / 1e3,
                "pid": pid,
                "tid": e.tid,
                "args": args,
            }
        )
    return out


def export_chrome_trace(events: Iterable[Event], path: str | os.PathLike) -> str:
    """Write the trace JSON to ``path`` and return the path; a path that cannot be written raises ValueError."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise TypeError(f"path: expected a file path, got {type(path).__name__} {path!r}")
    p = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(p))
    if os.path.isdir(p):
        raise ValueError(f"path: {p!r} is a directory; give a file name such as trace.json")
    if not os.path.isdir(parent):
        raise ValueError(f"path: directory {parent!r} does not exist (for {p!r})")
    data = {"traceEvents": trace_events(events), "displayTimeUnit": "ms"}
    try:
        with open(p, "w") as f:
            json.dump(data, f)
    except OSError as e:
        raise ValueError(f"path: cannot write the trace to {p!r}: {e}") from e
    return p
