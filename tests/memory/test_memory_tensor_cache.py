"""tinylearn.memory.TensorCache: reference counts, LRU timestamps, TTL expiry under a byte budget."""

import numpy as np
import pytest

from tinylearn.memory import ManualClock, TensorCache


def arr(n_floats, fill=0.0):
    return np.full(n_floats, fill, dtype=np.float32)  # 4 * n_floats bytes


def test_hits_misses_and_get_or_compute():
    c = TensorCache(1024)
    calls = []

    def proj():
        calls.append(1)
        return arr(16, 1.0)

    a = c.get_or_compute("p", proj)
    b = c.get_or_compute("p", proj)
    assert len(calls) == 1 and a is b
    assert c.stats()["hits"] == 1 and c.stats()["misses"] == 1 and c.stats()["hit_rate"] == 0.5
    assert c.get("q") is None and c.stats()["misses"] == 2
    assert not a.flags.writeable
    with pytest.raises(ValueError):
        a[0] = 2.0


def test_lru_eviction_order_follows_last_use():
    clock = ManualClock()
    c = TensorCache(3 * 64, clock=clock)
    for k in "abc":
        assert c.put(k, arr(16))
        clock.advance(1)
    c.get("a")  # a is now the most recent
    clock.advance(1)
    assert c.keys() == ["b", "c", "a"]
    assert c.put("d", arr(32))  # needs 128 B: evicts b then c
    assert c.evicted == ["b", "c"] and c.keys() == ["a", "d"]
    assert c.bytes == 192 and c.stats()["peak_bytes"] == 192 and c.stats()["evictions"] == 2


def test_referenced_entries_are_never_evicted():
    clock = ManualClock()
    c = TensorCache(128, clock=clock)
    c.put("old", arr(16), pin=True)
    clock.advance(1)
    c.put("new", arr(16))
    clock.advance(1)
    assert c.put("x", arr(16))  # evicts "new" (unreferenced) although "old" is older
    assert c.evicted == ["new"] and "old" in c
    assert not c.put("huge", arr(17))  # 68 B > 128 - 64 pinned: rejected, nothing evicted
    assert c.stats()["rejected"] == 1 and c.evicted == ["new"] and "x" in c
    assert c.refcount("old") == 1 and c.release("old") == 0
    assert c.put("huge", arr(17)) and c.evicted == ["new", "old", "x"]  # 68 B needs both 64 B entries gone


def test_acquire_release_counts_and_errors():
    c = TensorCache(256)
    c.put("k", arr(4))
    assert c.acquire("k").shape == (4,) and c.acquire("k").shape == (4,)
    assert c.refcount("k") == 2 and c.stats()["pinned"] == 1
    assert c.release("k") == 1 and c.release("k") == 0
    with pytest.raises(ValueError, match="key"):
        c.release("k")
    with pytest.raises(ValueError, match="key"):
        c.acquire("missing")
    with pytest.raises(ValueError, match="key"):
        c.refcount([1])


def test_ttl_expiry_and_pinned_entries_do_not_expire():
    clock = ManualClock(10.0)
    c = TensorCache(1024, ttl=5.0, clock=clock)
    c.put("cold", arr(4))
    c.put("hot", arr(4))
    c.put("held", arr(4), pin=True)
    clock.advance(3)
    c.get("hot")
    clock.advance(3)  # cold idle 6 s > 5, hot idle 3 s, held pinned
    assert "cold" not in c and "hot" in c
    assert c.expire() == ["cold"] and c.expired == ["cold"]
    clock.advance(10)
    assert c.get("hot") is None and c.expired == ["cold", "hot"]
    assert "held" in c
    c.release("held")  # the TTL restarts at release
    clock.advance(4)
    assert "held" in c
    clock.advance(2)
    assert c.expire() == ["held"] and len(c) == 0 and c.bytes == 0
    c.put("z", arr(4))
    clock.advance(6)
    with pytest.raises(ValueError, match="expired"):
        c.acquire("z")


def test_put_replaces_and_keeps_refs_and_clear():
    c = TensorCache(256)
    c.put("k", arr(4), pin=True)
    assert c.put("k", arr(8, 2.0))
    assert c.refcount("k") == 1 and c.bytes == 32 and c.get("k")[0] == 2.0
    c.put("u", arr(4))
    c.clear()
    assert c.keys() == ["k"]
    big = TensorCache(64)
    big.put("p", arr(8), pin=True)
    assert not big.put("p", arr(32))  # too big even after dropping the old value: the pinned old value stays
    assert big.get("p").shape == (8,)


def test_uncacheable_value_is_still_returned():
    c = TensorCache(16)
    v = c.get_or_compute("big", lambda: arr(8, 3.0))
    assert v.shape == (8,) and not v.flags.writeable and "big" not in c and c.stats()["rejected"] == 1


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"capacity_bytes": 0}, "capacity_bytes"),
        ({"capacity_bytes": True}, "capacity_bytes"),
        ({"capacity_bytes": 1.5}, "capacity_bytes"),
        ({"capacity_bytes": 8, "ttl": 0}, "ttl"),
        ({"capacity_bytes": 8, "ttl": "1"}, "ttl"),
        ({"capacity_bytes": 8, "clock": 3}, "clock"),
    ],
)
def test_constructor_bad_input(kwargs, name):
    with pytest.raises(ValueError, match=name):
        TensorCache(**kwargs)


def test_bad_values_and_clock():
    c = TensorCache(64)
    with pytest.raises(ValueError, match="value"):
        c.put("k", [1.0, 2.0])
    with pytest.raises(ValueError, match="key"):
        c.put(["unhashable"], arr(1))
    with pytest.raises(ValueError, match="key"):
        c.get(["unhashable"])
    with pytest.raises(ValueError, match="key"):
        _ = ["unhashable"] in c
    with pytest.raises(ValueError, match="compute"):
        c.get_or_compute("k", 3)
    with pytest.raises(ValueError, match="compute"):
        c.get_or_compute("k", lambda: [1.0])
    with pytest.raises(ValueError, match="dt"):
        ManualClock().advance(-1)
    with pytest.raises(ValueError, match="start"):
        ManualClock(float("nan"))
