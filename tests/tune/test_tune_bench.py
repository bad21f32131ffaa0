"""``tinylearn bench tune`` at a minimal configuration: every table has its rows, times are positive where a row
ran, tinygrad's rows either ran or say why, Kendall taus are in [-1, 1]. No timing is asserted."""

from __future__ import annotations

import math

import pytest

from tinylearn.tune import bench

pytest.importorskip("torch")

TINY = dict(budget=2, repeat=1, warmup=0, search_shape={"M": 32, "N": 32, "K": 32}, search_budget=2,
            exhaustive_max=0, cm_train=5, cm_test=4, proxy_n=4, gemm_sizes=(48,), gemm_budget=2, compiled_shape=(8, 24),
            compiled_budget=2)  # fmt: skip


def test_tuned_table_rows() -> None:
    t = bench.tuned_table(**{**TINY, "ops": ["kernels.softmax", "gemm.matmul"]})
    cases = t.cases()
    assert len(cases) == 2 and cases[0].startswith("kernels.softmax") and cases[1].startswith("gemm.matmul")
    for case in cases:
        impls = {r.impl: r for r in t.rows if r.case == case}
        assert set(impls) == {"tl default", "tl tuned", "torch", "tinygrad"}
        assert impls["torch"].median_ms > 0 and impls["torch"].ratio == pytest.approx(1.0)
        tg = impls["tinygrad"]
        assert (tg.median_ms is not None and tg.median_ms > 0) or "n/a" in tg.note or "tinygrad" in tg.note
        tuned = impls["tl tuned"]
        assert tuned.extra["measured"] <= 2
        if tuned.median_ms is not None:  # the best of what was measured, the default included
            assert tuned.median_ms <= impls["tl default"].median_ms or impls["tl default"].median_ms is None


def test_unknown_op_shape_is_a_note() -> None:
    t = bench.tuned_table(**{**TINY, "ops": ["no.such_op"]})
    assert not t.rows and any("no.such_op" in n for n in t.notes)


def test_searcher_table_rows() -> None:
    t = bench.searcher_table(**{**TINY, "exhaustive_max": 10_000})
    impls = [r.impl for r in t.rows]
    assert impls[0] == "exhaustive" and {"grid", "random", "anneal", "evolution"} <= set(impls)
    ex = t.rows[0]
    assert ex.median_ms > 0
    for r in t.rows[1:]:
        if r.median_ms is not None:
            assert r.extra["trials"] <= 2 and 1 <= r.extra["trials_to_5pct"] <= r.extra["trials"]


def test_cost_model_table_taus() -> None:
    t = bench.cost_model_table(**TINY)
    proxy = next(r for r in t.rows if "MODEL" in r.impl)
    assert -1 <= proxy.extra["tau"] <= 1 and proxy.extra["configs"] >= 3
    assert any("MODEL" in n for n in t.notes)
    cm = next(r for r in t.rows if r.impl.startswith("CostModel"))
    assert "not run" in cm.note or (-1 <= cm.extra["tau"] <= 1 or math.isnan(cm.extra["tau"]))


def test_gemm_blas_table_rows() -> None:
    t = bench.gemm_blas_table(**TINY)
    impls = {r.impl for r in t.rows}
    assert impls == {"tl default", "tl tuned", "OpenBLAS (numpy)", "torch"}
    assert all(r.median_ms is not None and r.median_ms > 0 for r in t.rows)  # every candidate checked correct first
    assert {r.case for r in t.rows} >= {"48^3, 1 thread"}


def test_compiled_table_rows() -> None:
    t = bench.compiled_table(**TINY)
    assert len(t.cases()) == 3
    for case in t.cases():
        impls = {r.impl: r for r in t.rows if r.case == case}
        assert set(impls) == {"tl eager", "tl.compile default", "tl.compile tuned", "torch", "tinygrad"}
        for name in ("tl eager", "tl.compile default", "tl.compile tuned", "torch"):
            assert impls[name].median_ms is not None and impls[name].median_ms > 0, (case, name)
        assert impls["tl.compile tuned"].note.startswith("changed: ")
        tg = impls["tinygrad"]
        assert (tg.median_ms is not None and tg.median_ms > 0) or "n/a" in tg.note


def test_run_returns_five_tables() -> None:
    tables = bench.run(**{**TINY, "ops": ["kernels.softmax"]})
    assert len(tables) == 5 and all(t.rows for t in tables)
