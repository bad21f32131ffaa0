"""Profile.key_averages / table (torch.profiler's columns), sort keys, roofline placement."""

from __future__ import annotations

import numpy as np
import pytest

import tinylearn as tl
from tinylearn.profiler import profile
from tinylearn.profiler.table import SORT_KEYS, sort_rows


def _prof():
    tl.manual_seed(0)
    m = tl.nn.Sequential(tl.nn.Linear(32, 64), tl.nn.ReLU(), tl.nn.Linear(64, 10))
    x = tl.tensor(np.random.default_rng(0).standard_normal((16, 32)).astype(np.float32))
    y = tl.tensor(np.arange(16) % 10)
    with profile() as prof:
        for _ in range(3):
            tl.nn.functional.cross_entropy(m(x), y).backward()
    return prof


def test_key_averages_counts_and_totals() -> None:
    prof = _prof()
    ka = prof.key_averages()
    lin = ka.row("Linear")
    assert lin.count == 6 and lin.flops == 3 * 2 * 16 * (32 * 64 + 64 * 10)
    assert lin.self_ns <= lin.total_ns
    relu = ka.row("ReLU")
    assert relu.self_ns < relu.total_ns  # its dispatch is a child
    assert sum(r.self_ns for r in ka) == sum(e.self_ns for e in prof.events())
    with pytest.raises(KeyError, match="Conv"):
        ka.row("Conv")
    by_shape = prof.key_averages(group_by_input_shape=True)
    assert len([r for r in by_shape if r.key == "Linear"]) == 2  # two layers, two input shapes


def test_table_columns_sorted_and_row_limit() -> None:
    prof = _prof()
    text = prof.table(sort_by="self_cpu_time_total", row_limit=4)
    head = text.splitlines()[1]
    for col in ("Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg", "# of Calls", "FLOPs"):
        assert col in head
    body = text.splitlines()[3:-2]
    assert len(body) == 4
    ordered = sort_rows(prof.key_averages(), "self_cpu_time_total")
    assert [line.split()[0] for line in body] == [r.key for r in ordered[:4]]
    selfs = [r.self_ns for r in ordered]
    assert selfs == sorted(selfs, reverse=True)
    for key in SORT_KEYS:
        prof.table(sort_by=key)
    with pytest.raises(ValueError, match="sort_by.*'bogus'"):
        prof.table(sort_by="bogus")
    with pytest.raises(TypeError, match="row_limit"):
        prof.table(row_limit="3")  # type: ignore[arg-type]


def test_roofline_rows_given_roofs() -> None:
    prof = _prof()
    rows = prof.roofline(peak_gflops=100.0, bandwidth_gbs=10.0)
    names = {r["name"] for r in rows}
    assert "Linear" in names and "LinearBackward" in names
    for r in rows:
        assert r["attainable_gflops"] == pytest.approx(min(100.0, 10.0 * r["intensity"]))
        assert r["bound"] == ("memory" if 10.0 * r["intensity"] < 100.0 else "compute")
        assert r["fraction"] == pytest.approx(r["gflops"] / r["attainable_gflops"])
    with pytest.raises(ValueError, match="peak_gflops"):
        prof.roofline(peak_gflops=-1.0, bandwidth_gbs=10.0)
