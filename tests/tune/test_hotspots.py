"""HotspotMonitor: a synthetic slow op registered with two versions triggers a re-tune that picks the fast one."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tinylearn import backends
from tinylearn.profiler import HotspotMonitor, fastest_version_retune, profile

OP = "pf_test.matmul"  # the cost model reads the last segment: a matmul


def _slow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    time.sleep(0.002)  # 2 ms for 2*32^3 = 65 KFLOP: ~0.03 GFLOP/s, far below any roof
    return a @ b


def _fast(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a @ b


@pytest.fixture(autouse=True)
def _synthetic_op():
    """Register the synthetic op for this module's tests only (other tests walk ``backends.ops()``)."""
    backends.register(OP, "numpy", _slow, version="slow", default=True, priority=50)
    backends.register(OP, "numpy", _fast, version="fast", priority=1)
    yield
    backends._REGISTRY.pop(OP, None)
    backends._RESOLVED.clear()
    backends._RANKED.clear()


def _profiled():
    a = np.ones((32, 32), np.float32)
    with profile() as prof:
        for _ in range(4):
            backends.dispatch(OP, a, a)
        np.ones(10).sum()
    return prof


def test_hot_op_triggers_retune_and_gets_faster() -> None:
    prof = _profiled()
    mon = HotspotMonitor(threshold_fraction=0.3, min_calls=3, peak_gflops=100.0, bandwidth_gbs=10.0, repeat=3)
    hot = mon.hot(prof)
    assert [d.op for d in hot] == [OP] and hot[0].version == "slow" and hot[0].calls == 4
    assert hot[0].fraction < 0.3 and hot[0].share > 0.5
    seen = []

    def retune(op: str, shapes: tuple) -> object:
        seen.append((op, shapes))
        return fastest_version_retune(op, shapes, ("float32", "float32"), repeat=3)

    (d,) = mon.check(prof, retune)
    assert seen == [(OP, ((32, 32), (32, 32)))]
    assert d.action == "retuned" and d.new_version == "fast"
    assert d.before_s >= 0.002 and d.after_s < d.before_s  # the sleep alone guarantees the margin
    assert mon.decisions == [d]


def test_min_calls_and_none_retune() -> None:
    prof = _profiled()
    assert HotspotMonitor(min_calls=5, peak_gflops=100.0, bandwidth_gbs=10.0).hot(prof) == []
    mon = HotspotMonitor(peak_gflops=100.0, bandwidth_gbs=10.0)
    (d,) = mon.check(prof, lambda op, shapes: None)
    assert d.action == "kept" and d.before_s is None
    (d,) = mon.check(prof, lambda op, shapes: 1 / 0)
    assert d.action == "failed" and "ZeroDivisionError" in d.note


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="threshold_fraction"):
        HotspotMonitor(threshold_fraction=0)
    with pytest.raises(ValueError, match="min_calls"):
        HotspotMonitor(min_calls=0)
    with pytest.raises(TypeError, match="retune"):
        HotspotMonitor(peak_gflops=1.0, bandwidth_gbs=1.0).check(_profiled(), "tune")  # type: ignore[arg-type]
