"""perf_event_open counters: the real availability result and its reason, software counters, getrusage fallback."""

from __future__ import annotations

import mmap
import warnings

import numpy as np
import pytest

from tinylearn.profiler import (
    CountersUnavailable,
    HardwareCounters,
    RusageCounters,
    counters_available,
    profile,
    record_function,
    software_counters,
)
from tinylearn.profiler.counters import SoftwareCounters, perf_event_paranoid, software_available


def _work() -> float:
    a = np.random.default_rng(0).standard_normal((200, 200))
    return float((a @ a).sum())


def test_hardware_counters_available_or_clear_reason() -> None:
    ok, reason = counters_available()
    if ok:
        with HardwareCounters() as c:
            _work()
        assert c["instructions"] > 0 and c["cycles"] > 0
        assert c["source"].startswith("perf_event_open")
    else:
        assert "perf_event_open failed with E" in reason
        assert f"perf_event_paranoid={perf_event_paranoid()}" in reason
        with pytest.raises(CountersUnavailable, match="perf_event_paranoid"):
            with HardwareCounters():
                pass


def _fresh_pages(nbytes: int) -> None:
    """Touch ``nbytes`` of pages no allocator has handed out before: an anonymous mmap (numpy's arrays may reuse heap
    memory that tinylearn's malloc settings keep resident, which faults nothing)."""
    with mmap.mmap(-1, nbytes) as m:
        np.frombuffer(m, dtype=np.uint8)[::4096] = 1  # a temporary view: released before the map closes


def test_software_counters_or_rusage() -> None:
    ok, reason = software_available()
    with software_counters() as c:
        _work()
    if ok:
        assert isinstance(c["task-clock"], int) and c["task-clock"] > 0  # ns of CPU time of this thread
        assert c["source"] == "perf_event_open (software)"
        with SoftwareCounters(("page-faults",)) as pf:
            _fresh_pages(32 << 20)  # the kernel counts the first-touch faults
        assert pf["page-faults"] > 0
    else:
        assert "perf_event_open failed" in reason
        assert c["source"].startswith("resource.getrusage")


def test_rusage_fallback_counts() -> None:
    with RusageCounters() as c:
        _fresh_pages(64 << 20)  # fresh pages -> minor faults
    assert c["source"] == "resource.getrusage (process-wide)"
    assert c["rusage:minor_faults"] > 0 and c["rusage:user_s"] + c["rusage:system_s"] >= 0
    assert c["wall_s"] > 0


def test_bad_event_name() -> None:
    with pytest.raises(ValueError, match="'flux-capacitor'"):
        HardwareCounters(("flux-capacitor",))


def test_profile_counters_records_or_warns() -> None:
    ok, reason = counters_available()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        with profile(counters=True) as prof:
            _work()
            with record_function("block"):
                _work()
    assert prof.counters is not None
    blk = next(e for e in prof.events() if e.name == "block")
    assert blk.extra["counters"]["source"]  # each user range gets its own reading
    assert ("instructions" in blk.extra["counters"]) == ok
    if ok:
        assert prof.counters["instructions"] > 0
    else:
        assert reason in prof.counters_note
        assert "source" in prof.counters and "cycles" not in prof.counters
