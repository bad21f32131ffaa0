"""Smoke test of tinylearn.kernels.bench on tiny shapes: tables are built and every row ran (no timed asserts)."""

from __future__ import annotations

import inspect

import pytest

if not __import__("tinylearn.backends").backends.C_available("kernels"):
    pytest.skip("tinylearn._C.kernels not built", allow_module_level=True)

from tinylearn.kernels import bench  # noqa: E402


def test_run_signature() -> None:
    params = inspect.signature(bench.run).parameters
    assert list(params) == ["full", "progress"] and params["full"].default is False


def test_tiny_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "machine_roofs", lambda: (50.0, 10.0))  # skip the slow machine measurement
    t = bench.op_table("softmax", [(8, 32)], compile=False, tinygrad=False)
    assert t.impls() == ["numpy unfused", "tinylearn cpu", "torch"]
    assert all(r.median_ms is not None and r.extra["roofline ms"] > 0 for r in t.rows)
    a = bench.attention_table([32], heads=2, d=8, tinygrad=False)
    assert a.impls() == ["numpy naive", "tinylearn flash", "torch naive", "torch sdpa"]
    assert all(r.median_ms is not None for r in a.rows)
