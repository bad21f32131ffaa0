"""``tinylearn bench compiler`` on one small row: every implementation's run-time row and both cold compile rows."""

from __future__ import annotations

import pytest

from tinylearn.compiler import bench

pytest.importorskip("torch")


def test_softmax_row_has_every_impl_and_cold_compile_times() -> None:
    run_t, compile_t = bench.run(cases=("softmax",))
    impls = {r.impl for r in run_t.rows if r.case == "softmax" and r.median_ms is not None}
    assert {"tinylearn eager", "tl.compile", "torch"} <= impls
    cold = {r.impl: r.median_ms for r in compile_t.rows if r.case == "softmax"}
    assert cold["tl.compile (cold cache)"] > 0 and cold["tl.compile again (kernel cache hit)"] > 0
    if "torch.compile" in impls:  # Inductor needs a C++ compiler; when it runs, both of its rows are there
        assert cold["torch.compile"] > 0


def test_unknown_case_is_named() -> None:
    with pytest.raises(ValueError, match="nope"):
        bench.run(cases=("nope",))
