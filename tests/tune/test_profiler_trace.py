"""Profile.export_chrome_trace: JSON Perfetto / chrome://tracing read, keys present, nesting consistent.

(Named test_profiler_trace.py: tests/compiler/test_trace.py already uses the basename test_trace.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import tinylearn as tl
from tinylearn.profiler import profile, record_function


def test_chrome_trace_json(tmp_path: Path) -> None:
    m = tl.nn.Sequential(tl.nn.Linear(8, 16), tl.nn.ReLU(), tl.nn.Linear(16, 4))
    x = tl.tensor(np.ones((3, 8), np.float32))
    with profile() as prof:
        with record_function("step"):
            m(x).sum().backward()
    path = prof.export_chrome_trace(str(tmp_path / "t.json"))
    data = json.loads(Path(path).read_text())
    evs = data["traceEvents"]
    assert len(evs) == len(prof.events())
    for ev in evs:
        assert {"name", "ph", "ts", "dur", "pid", "tid", "args"} <= set(ev)
        assert ev["ph"] == "X" and ev["dur"] >= 0 and ev["ts"] >= 0
        assert {"shapes", "backend", "flops"} <= set(ev["args"])
    by_id = dict(enumerate(evs))
    for ev in evs:  # a child lies inside its parent on the same thread: what the viewers nest by
        p = ev["args"].get("parent")
        if p is not None:
            par = by_id[p]
            assert par["tid"] == ev["tid"]
            assert par["ts"] <= ev["ts"] + 1e-3 and ev["ts"] + ev["dur"] <= par["ts"] + par["dur"] + 1e-3
    lin = next(ev for ev in evs if ev["name"] == "Linear")
    assert lin["args"]["shapes"] == [[3, 8], [16, 8], [16]]


def test_bad_path(tmp_path: Path) -> None:
    with profile() as prof:
        pass
    with pytest.raises(ValueError, match="does not exist"):
        prof.export_chrome_trace(str(tmp_path / "missing_dir" / "t.json"))
    with pytest.raises(ValueError, match="directory"):
        prof.export_chrome_trace(str(tmp_path))
    with pytest.raises(TypeError, match="path"):
        prof.export_chrome_trace(3)  # type: ignore[arg-type]
