"""tinylearn.dist.counters: the per-process counters the parallel operators share (ring, Ulysses, SP, TP)."""

import importlib

import pytest

from tinylearn.dist.counters import Counters


def test_counters_reset_and_snapshot() -> None:
    c = Counters("bytes_sent", "messages")
    assert c == {"bytes_sent": 0, "messages": 0}
    c["bytes_sent"] += 128
    c["messages"] += 1
    snap = c.snapshot()
    c["bytes_sent"] += 1
    assert snap == {"bytes_sent": 128, "messages": 1} and type(snap) is dict  # a copy, not a view
    c.reset()
    assert c == {"bytes_sent": 0, "messages": 0}


@pytest.mark.parametrize("names", [(), ("",), ("ok", 3)])
def test_counters_bad_names(names: tuple) -> None:
    with pytest.raises(ValueError, match="names"):
        Counters(*names)


@pytest.mark.parametrize(
    "name, reset, read",
    [
        ("ring_attention", "reset_ring_counts", "ring_counts"),
        ("ulysses", "reset_ulysses_counts", "ulysses_counts"),
        ("seq_parallel", "reset_sp_counts", "sp_counts"),
        ("tensor_parallel", "reset_counts", "collective_counts"),
    ],
)
def test_parallel_modules_use_one_counter_type(name: str, reset: str, read: str) -> None:
    mod = importlib.import_module(f"tinylearn.parallel.{name}")  # the package re-exports functions of these names
    assert isinstance(mod.COUNTS, Counters)
    key = next(iter(mod.COUNTS))
    mod.COUNTS[key] += 5
    assert getattr(mod, read)()[key] == 5
    getattr(mod, reset)()
    assert all(v == 0 for v in getattr(mod, read)().values())
