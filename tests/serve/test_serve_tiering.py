"""tl.serve.tiering: the three-tier KV block store (fast arena, compressed RAM, mmap'd disk file) and its prefetch."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from tinylearn.serve.tiering import TieredKVStore, compress_block, decompress_block, measure_get_latency

SHAPE = (2, 4, 2, 8)  # [k/v, tokens, heads, head_dim]


def block(i: int, dtype=np.float32) -> np.ndarray:
    rng = np.random.default_rng(1000 + i)
    if np.dtype(dtype).kind == "i":
        return rng.integers(-128, 128, SHAPE).astype(dtype)
    b = (rng.standard_normal(SHAPE) * (i + 1)).astype(dtype)
    if i % 3 == 0:  # special values, and a NaN with a payload: the bytes, not the values, must come back
        flat = b.reshape(-1)
        flat[:3] = [np.inf, -0.0, np.nan]
        if b.dtype == np.float32:
            flat.view(np.uint32)[3] = 0x7FC01234
    return b


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8])
@pytest.mark.parametrize("codec", ["shuffle-zlib", "zlib"])
def test_round_trip_exact_in_every_tier(tmp_path, dtype, codec):
    with TieredKVStore(
        SHAPE, dtype, fast_blocks=2, slow_blocks=2, disk_path=tmp_path, disk_blocks=3, slow_codec=codec
    ) as s:
        ref = {i: block(i, dtype) for i in range(7)}
        for i, b in ref.items():
            assert s.put(i, b) == "fast"
        # puts in order 0..6: the 2 newest in fast, the next 2 in slow, the 3 oldest on disk
        assert [s.tier_of(i) for i in range(7)] == ["disk"] * 3 + ["slow"] * 2 + ["fast"] * 2
        st = s.stats()
        assert (st["fast"]["used"], st["slow"]["used"], st["disk"]["used"], len(s)) == (2, 2, 3, 7)
        assert st["demotions"] == 5 + 3  # 5 blocks left fast, 3 of them went on from slow to disk
        for i in range(7):  # every get promotes and demotes others: all blocks stay exact wherever they are
            got = s.get(i)
            assert same(got, ref[i]), i
            got[...] = 0  # a copy: the stored block is not touched
        for i in reversed(range(7)):
            assert same(s.get(i), ref[i])
        st = s.stats()
        assert st["fast"]["gets"] + st["slow"]["gets"] + st["disk"]["gets"] == 14
        assert st["slow"]["gets"] > 0 and st["disk"]["gets"] > 0
        assert same(s.pop(3), ref[3]) and 3 not in s and len(s) == 6
        s.discard(0)
        assert 0 not in s and all(same(s.get(i), ref[i]) for i in (1, 2, 4, 5, 6))


def test_codec_is_lossless_and_shuffle_helps_floats():
    b = np.random.default_rng(0).standard_normal((4096,)).astype(np.float32)
    raw, shuf = compress_block(b, "zlib"), compress_block(b, "shuffle-zlib")
    assert same(decompress_block(raw, b.shape, b.dtype, "zlib"), b)
    assert same(decompress_block(shuf, b.shape, b.dtype, "shuffle-zlib"), b)
    assert len(shuf) < len(raw) < b.nbytes  # exponent bytes grouped together compress better
    out = decompress_block(shuf, b.shape, b.dtype)
    out[0] = 1.0  # writable, owns its memory
    with pytest.raises(ValueError, match="codec"):
        compress_block(b, "lz4")


def test_lru_order_of_demotion(tmp_path):
    with TieredKVStore(SHAPE, fast_blocks=2, slow_blocks=2, disk_path=tmp_path, disk_blocks=4) as s:
        s.put("a", block(0))
        s.put("b", block(1))
        s.get("a")  # a is now more recent than b
        s.put("c", block(2))
        assert (s.tier_of("a"), s.tier_of("b"), s.tier_of("c")) == ("fast", "slow", "fast")
        s.put("d", block(3))  # fast holds c, d; a (LRU of fast) goes to slow, after b
        assert [s.tier_of(k) for k in "abcd"] == ["slow", "slow", "fast", "fast"]
        s.put("e", block(4))  # c demoted to slow; slow full -> its LRU, b, goes to disk
        assert [s.tier_of(k) for k in "abcde"] == ["slow", "disk", "slow", "fast", "fast"]
        s.get("b")  # promoted from disk; fast's LRU d -> slow; slow's LRU a -> disk
        assert [s.tier_of(k) for k in "abcde"] == ["disk", "fast", "slow", "slow", "fast"]
        s.put("e", block(5))  # replacing a key moves nothing else
        assert [s.tier_of(k) for k in "abcde"] == ["disk", "fast", "slow", "slow", "fast"]
        assert same(s.get("e"), block(5)) and same(s.get("a"), block(0))
        st = s.stats()
        assert st["promotions"] == 2 and st["disk"]["gets"] == 2  # b, then a at the end, from disk


def test_prefetch_makes_the_next_get_a_fast_hit(tmp_path):
    with TieredKVStore(SHAPE, fast_blocks=3, slow_blocks=2, disk_path=tmp_path, disk_blocks=4) as s:
        for i in range(8):
            s.put(i, block(i))
        assert s.tier_of(0) == "disk" and s.tier_of(3) == "slow"
        s.prefetch([0, 3, "missing"])  # a missing key is ignored
        assert s.wait_prefetch(timeout=30.0)
        assert s.tier_of(0) == "fast" and s.tier_of(3) == "fast"
        before = s.stats()
        assert before["prefetched"] == 2 and before["prefetch_hits"] == 0
        assert same(s.get(0), block(0)) and same(s.get(3), block(3))
        st = s.stats()
        assert st["hits"] - before["hits"] == 2 and st["misses"] == before["misses"]
        assert st["prefetch_hits"] == 2 and st["fast"]["mean_get_s"] > 0
        s.get(0)  # a second hit on the same block is a plain hit, not a prefetch hit
        assert s.stats()["prefetch_hits"] == 2
        s.prefetch([])
        assert s.wait_prefetch(timeout=30.0)
        assert all(same(s.get(i), block(i)) for i in range(8))


def test_concurrent_get_put_with_prefetch_keeps_blocks_exact(tmp_path):
    s = TieredKVStore(SHAPE, fast_blocks=4, slow_blocks=6, disk_path=tmp_path, disk_blocks=12, prefetch_threads=2)
    errors: list[BaseException] = []
    latest: dict[tuple[int, int], int] = {}  # key -> version; each key is written by one thread only

    def val(key: tuple[int, int], version: int) -> np.ndarray:
        return block(key[0] * 100 + key[1] * 10 + version % 7)

    def worker(t: int) -> None:
        rng = np.random.default_rng(t)
        try:
            for step in range(150):
                key = (t, int(rng.integers(0, 9)))
                op = rng.integers(0, 3)
                if op == 0 or key not in latest:
                    s.put(key, val(key, step))
                    latest[key] = step
                elif op == 1:
                    assert same(s.get(key), val(key, latest[key])), key
                elif rng.integers(0, 4) == 0:
                    assert same(s.pop(key), val(key, latest.pop(key))), key
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in (1, 2)]
    for th in threads:
        th.start()
    rng = np.random.default_rng(9)
    while any(th.is_alive() for th in threads):
        s.prefetch([(int(rng.integers(1, 3)), int(rng.integers(0, 9))) for _ in range(3)])
        s.wait_prefetch(timeout=30.0)
    for th in threads:
        th.join()
    assert not errors, errors
    assert s.wait_prefetch(timeout=30.0)
    assert len(s) == len(latest)
    for key, version in latest.items():
        assert same(s.get(key), val(key, version)), key
    assert s.stats()["demotions"] > 0  # up to 18 live keys in 4 fast blocks
    # whether the concurrent prefetches above found a key outside "fast" depends on thread timing (a CI run saw none):
    # prefetch one that is known to be in a slower tier, then it is counted and promoted
    slow = next(k for k in latest if s.tier_of(k) != "fast")
    s.prefetch([slow])
    assert s.wait_prefetch(timeout=30.0)
    assert s.stats()["prefetched"] > 0 and s.tier_of(slow) == "fast"
    assert same(s.get(slow), val(slow, latest[slow]))
    s.close()


def test_memory_error_when_every_tier_is_full(tmp_path):
    with TieredKVStore(SHAPE, fast_blocks=1, slow_blocks=1, disk_path=tmp_path, disk_blocks=1) as s:
        for i in range(3):
            s.put(i, block(i))
        with pytest.raises(MemoryError, match=r"fast=1, slow=1, disk=1"):
            s.put(3, block(3))
        assert len(s) == 3 and all(same(s.get(i), block(i)) for i in range(3))  # nothing lost by the failed put
        s.put(1, block(7))  # replacing a stored key needs no room
        assert same(s.get(1), block(7))
        s.discard(0)
        assert s.put(3, block(3)) == "fast" and same(s.get(2), block(2))
    with TieredKVStore(SHAPE, fast_blocks=1) as s:
        s.put("x", block(0))
        with pytest.raises(MemoryError, match="fast=1, slow=0, disk=0"):
            s.put("y", block(1))


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="fast_blocks"):
        TieredKVStore(SHAPE, fast_blocks=0)
    with pytest.raises(TypeError, match="fast_blocks"):
        TieredKVStore(SHAPE, fast_blocks=2.5)
    with pytest.raises(ValueError, match="slow_blocks"):
        TieredKVStore(SHAPE, fast_blocks=1, slow_blocks=-1)
    with pytest.raises(ValueError, match="disk_path"):
        TieredKVStore(SHAPE, fast_blocks=1, disk_blocks=2)
    with pytest.raises(ValueError, match="disk_blocks"):
        TieredKVStore(SHAPE, fast_blocks=1, disk_path=tmp_path)
    with pytest.raises(ValueError, match="block_shape"):
        TieredKVStore((2, 0), fast_blocks=1)
    with pytest.raises(ValueError, match="prefetch_threads"):
        TieredKVStore(SHAPE, fast_blocks=1, prefetch_threads=0)
    with pytest.raises(ValueError, match="slow_codec"):
        TieredKVStore(SHAPE, fast_blocks=1, slow_codec="gzip")
    with pytest.raises(TypeError, match="dtype"):
        TieredKVStore(SHAPE, object, fast_blocks=1)
    wrong = tmp_path / "wrong.bin"
    wrong.write_bytes(b"\0" * 10)
    with pytest.raises(ValueError, match="disk_path.*10 bytes"):
        TieredKVStore(SHAPE, fast_blocks=1, disk_path=wrong, disk_blocks=2)
    assert wrong.read_bytes() == b"\0" * 10  # not resized, not deleted
    with TieredKVStore(SHAPE, fast_blocks=2) as s:
        with pytest.raises(ValueError, match=r"block: expected shape \(2, 4, 2, 8\)"):
            s.put(0, np.zeros((2, 4, 2, 9), np.float32))
        with pytest.raises(ValueError, match="block: .*dtype float64"):
            s.put(0, np.zeros(SHAPE))
        with pytest.raises(TypeError, match="block"):
            s.put(0, [[0.0]])
        with pytest.raises(TypeError, match="unhashable"):
            s.put([1], block(0))
        for method in (s.get, s.pop, s.discard, s.tier_of):
            with pytest.raises(KeyError, match="'nope'"):
                method("nope")
        with pytest.raises(TypeError, match="keys"):
            s.prefetch("abc")
        with pytest.raises(TypeError, match=r"keys\[1\]"):
            s.prefetch([0, [1]])
        assert len(s) == 0
    with pytest.raises(RuntimeError, match="closed"):
        s.put(0, block(0))
    with pytest.raises(RuntimeError, match="closed"):
        s.get(0)


def test_disk_file_created_and_removed_on_close(tmp_path):
    d = tmp_path / "kv"
    d.mkdir()
    with TieredKVStore(SHAPE, fast_blocks=1, disk_path=d, disk_blocks=4) as s:
        (f,) = list(d.iterdir())  # a fresh file inside the directory
        assert s.disk_path == f and f.stat().st_size == 4 * s.block_nbytes
        s.put(0, block(0))
        s.put(1, block(1))
        assert s.tier_of(0) == "disk"
    assert list(d.iterdir()) == []
    s.close()  # idempotent
    named = tmp_path / "named.bin"
    s = TieredKVStore(SHAPE, fast_blocks=1, disk_path=named, disk_blocks=2)
    assert named.exists()
    s.close()
    assert not named.exists()
    # an existing file of the right size is reused, written through, and kept
    keep = tmp_path / "keep.bin"
    keep.write_bytes(b"\xff" * (2 * int(np.prod(SHAPE)) * 4))
    with TieredKVStore(SHAPE, fast_blocks=1, disk_path=keep, disk_blocks=2) as s:
        s.put(0, block(1))
        s.put(1, block(2))
        assert same(s.get(0), block(1))  # read back from disk
    assert keep.exists() and os.path.getsize(keep) == 2 * block(0).nbytes
    on_disk = np.fromfile(keep, np.float32).reshape(2, *SHAPE)
    assert any(same(on_disk[i], block(2)) for i in range(2))  # the block demoted last is in the file, flushed


def test_measure_get_latency_reports_each_tier(tmp_path):
    """A measurement, not a timing assertion: each tier's median is a positive number of seconds."""
    lat = measure_get_latency((2, 4, 2, 8), n=4, disk_dir=tmp_path)
    assert set(lat) == {"fast", "slow", "disk"} and all(0 < v < 60 for v in lat.values())
