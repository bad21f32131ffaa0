"""The serving engine's KV memory: PagedKVCache's opt-in free-cached-block mode (LRU), reserve/truncate, the
BlockManager's swap (exact bytes, fp32 and int8), its host store and its invariant checker."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tinylearn.inference.paged_cache import PagedKVCache
from tinylearn.serve.block_manager import BlockManager, HostStore


def _fill(cache: PagedKVCache, sid: int, n: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for layer in range(cache.n_layers):
        k, v = (rng.standard_normal((n, cache.n_kv_heads, cache.head_dim)).astype(np.float32) for _ in range(2))
        cache.append(sid, layer, k, v)


def test_default_mode_still_frees_indexed_blocks() -> None:
    c = PagedKVCache(1, 1, 4, num_blocks=4, block_size=2)
    sid = c.new_sequence()
    _fill(c, sid, 4)
    c.register_prefix(sid, [1, 2, 3, 4])
    c.free(sid)
    assert c.blocks_free == 4 and c.num_cached_blocks == 0 and c.stats()["indexed_blocks"] == 0


def test_keep_cached_blocks_stay_indexed_and_are_revived() -> None:
    c = PagedKVCache(1, 1, 4, num_blocks=4, block_size=2, keep_cached=True)
    sid = c.new_sequence()
    _fill(c, sid, 4)
    before = c.gather(sid, 0)
    c.register_prefix(sid, [1, 2, 3, 4])
    c.free(sid)
    # refcount 0, still indexed, and counted as free for allocation
    assert c.num_cached_blocks == 2 and c.blocks_free == 4 and c.stats()["indexed_blocks"] == 2
    new, hit = c.match_prefix([1, 2, 3, 4, 5])
    assert hit == 4 and c.num_cached_blocks == 0 and c.blocks_free == 2
    np.testing.assert_array_equal(c.gather(new, 0)[0], before[0])  # the cached K survived
    assert c.stats()["prefix_hit_tokens"] == 4


def test_lru_eviction_order_tail_first_and_least_recently_freed_first() -> None:
    c = PagedKVCache(1, 1, 4, num_blocks=4, block_size=2, keep_cached=True)
    a, b = c.new_sequence(), c.new_sequence()
    _fill(c, a, 4, 1)
    _fill(c, b, 4, 2)
    c.register_prefix(a, [1, 1, 1, 1])
    c.register_prefix(b, [2, 2, 2, 2])
    ta, tb = c.block_table(a), c.block_table(b)
    c.free(a)  # freed first: evicted first, its tail block before its head
    c.free(b)
    x = c.new_sequence()
    c.reserve(x, 2)
    assert c.block_table(x) == [ta[1]] and c.prefix_evictions == 1
    assert c.lookup_prefix([1, 1, 1, 1, 9]) == [ta[0]]  # head of a still cached; its tail is gone
    c.reserve(x, 4)
    assert c.block_table(x) == [ta[1], ta[0]]
    assert c.lookup_prefix([2, 2, 2, 2, 9]) == tb  # b untouched
    c.reserve(x, 6)
    assert c.block_table(x)[-1] == tb[1] and c.prefix_evictions == 3


def test_reserve_is_atomic_and_truncate_releases_tail() -> None:
    c = PagedKVCache(1, 1, 4, num_blocks=3, block_size=2)
    sid = c.new_sequence()
    c.reserve(sid, 5)
    assert len(c.block_table(sid)) == 3 and c.blocks_free == 0
    other = c.new_sequence()
    with pytest.raises(MemoryError, match="num_blocks=3"):
        c.reserve(other, 1)
    assert c.block_table(other) == []
    _fill(c, sid, 5)
    c.truncate(sid, 2)
    assert len(c.block_table(sid)) == 1 and c.length(sid) == 2 and c.blocks_free == 2
    with pytest.raises(ValueError, match="n: must be in"):
        c.truncate(sid, 3)


def test_reserve_copies_a_shared_block_on_write() -> None:
    c = PagedKVCache(1, 1, 4, num_blocks=4, block_size=4)
    a = c.new_sequence()
    _fill(c, a, 2)
    b = c.fork(a)
    c.reserve(b, 3)  # position 2 lies in the shared block -> b gets its own copy
    assert c.block_table(a) != c.block_table(b) and c.cow_copies == 1
    np.testing.assert_array_equal(c.gather(a, 0)[0], c.gather(b, 0)[0])


def _seq(rid: str) -> SimpleNamespace:
    return SimpleNamespace(
        request_id=rid, cache_id=None, num_computed=0, tokens=[], swapped_blocks=[], registered_blocks=0
    )


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_swap_out_and_in_restores_exact_bytes(dtype: str) -> None:
    bm = BlockManager(2, 2, 8, num_blocks=6, block_size=4, kv_dtype=dtype)
    s = _seq("r0")
    s.tokens = list(range(10))
    bm.admit(s)
    bm.reserve(s, 10)
    _fill(bm.cache, s.cache_id, 10, 3)
    s.num_computed = 10
    before = [bm.cache.gather(s.cache_id, layer) for layer in range(2)]
    raw = bm._raw[bm.cache.block_table(s.cache_id)].copy()
    assert bm.swap_out(s) == 3 and s.cache_id is None and bm.free_blocks == 6
    assert len(bm.host) == 3
    bm.check([], [s])
    # someone else takes the blocks meanwhile
    t = _seq("r1")
    t.tokens = [7] * 8
    bm.admit(t)
    bm.reserve(t, 8)
    bm.free(t)
    assert bm.swap_in(s) == 3 and len(bm.host) == 0 and bm.swapped_blocks_in == 3
    np.testing.assert_array_equal(bm._raw[bm.cache.block_table(s.cache_id)], raw)
    for layer in range(2):
        for x, y in zip(bm.cache.gather(s.cache_id, layer), before[layer]):
            np.testing.assert_array_equal(x, y)
    bm.check([s], [])


def test_host_store_interface() -> None:
    h = HostStore()
    x = np.arange(6, dtype=np.uint8)
    assert h.put("a", x) == "host" and "a" in h
    x[0] = 99  # the store holds a copy
    assert h.get("a")[0] == 0
    h.prefetch(["a"])
    np.testing.assert_array_equal(h.pop("a"), np.arange(6))
    assert "a" not in h
    h.discard("a")
    with pytest.raises(KeyError, match="'a'"):
        h.get("a")
    assert h.stats()["blocks"] == 0


def test_check_detects_corruption() -> None:
    bm = BlockManager(1, 1, 4, num_blocks=4, block_size=2)
    s = _seq("r")
    s.tokens = [1, 2, 3]
    bm.admit(s)
    bm.reserve(s, 3)
    _fill(bm.cache, s.cache_id, 3)
    s.num_computed = 3
    bm.check([s], [])
    b = bm.cache.block_table(s.cache_id)[0]
    bm.cache.refcount[b] += 1
    with pytest.raises(RuntimeError, match="refcount == owning sequences"):
        bm.check([s], [])
    bm.cache.refcount[b] -= 1
    with pytest.raises(RuntimeError, match="one cache sequence per running request"):
        bm.check([], [])  # the engine forgot a sequence: its blocks leak
    s.num_computed = 2
    with pytest.raises(RuntimeError, match="cache length == computed tokens"):
        bm.check([s], [])
