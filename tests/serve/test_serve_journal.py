"""KVJournal [Q143]: replay equals what was appended, torn/corrupt tails are cut, append never waits on the disk."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from tinylearn.inference import TinyGPT
from tinylearn.serve.journal import FILE_MAGIC, KVJournal, kv_from_dense_cache, recover

L, H, D = 2, 2, 4


def _kv(rng: np.random.Generator, t: int) -> tuple[np.ndarray, np.ndarray]:
    return (rng.standard_normal((L, t, H, D)).astype(np.float32), rng.standard_normal((L, t, H, D)).astype(np.float32))


def _journal(path, **kw) -> KVJournal:
    return KVJournal(path, n_layers=L, n_kv_heads=H, head_dim=D, **kw)


def _write_interleaved(path, seed: int = 0) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    full: dict[int, list] = {s: [[], []] for s in (3, 7, 11)}
    with _journal(path, fsync_every=3) as j:
        for _ in range(6):
            for s in rng.permutation(list(full)):
                t = int(rng.integers(1, 5))
                k, v = _kv(rng, t)
                j.append(int(s), sum(a.shape[1] for a in full[s][0]), k, v)
                full[s][0].append(k)
                full[s][1].append(v)
    return {s: (np.concatenate(a, 1), np.concatenate(b, 1)) for s, (a, b) in full.items()}


def test_recover_is_bytes_exact_for_interleaved_sequences(tmp_path):
    p = tmp_path / "kv.log"
    want = _write_interleaved(p)
    rec = recover(p)
    assert set(rec) == set(want) and rec.records == 18 and rec.dropped_bytes == 0 and rec.reason == "eof"
    for s, (k, v) in want.items():
        assert rec[s][0].tobytes() == k.tobytes() and rec[s][1].tobytes() == v.tobytes()


def test_torn_tail_at_every_offset_recovers_the_complete_prefix(tmp_path):
    p = tmp_path / "kv.log"
    rng = np.random.default_rng(1)
    recs = [(0, 0, *_kv(rng, 2)), (1, 0, *_kv(rng, 1)), (0, 2, *_kv(rng, 1))]
    with _journal(p) as j:
        for r in recs[:2]:
            j.append(*r)
        j.flush()
        prefix_end = os.path.getsize(p)
        j.append(*recs[2])
    data = p.read_bytes()
    assert len(data) == prefix_end + 32 + 2 * L * H * D * 4
    cut = tmp_path / "cut.log"
    for off in range(prefix_end, len(data)):
        cut.write_bytes(data[:off])
        rec = recover(cut)
        assert rec.records == 2 and rec.valid_bytes == prefix_end and rec.dropped_bytes == off - prefix_end
        assert rec[0][0].tobytes() == recs[0][2].tobytes() and rec[1][1].tobytes() == recs[1][3].tobytes()
        assert rec[0][0].shape[1] == 2
    # reopening a torn journal cuts the tail, so a new record lands where replay can reach it
    cut.write_bytes(data[: prefix_end + 40])
    with _journal(cut) as j:
        assert j.recovered_dropped_bytes == 40 and j.lengths() == {0: 2, 1: 1}
        j.append(*recs[2])
    rec = recover(cut)
    assert rec.records == 3 and rec.dropped_bytes == 0
    assert np.array_equal(rec[0][0], np.concatenate([recs[0][2], recs[2][2]], 1))


@pytest.mark.parametrize("where", ["payload", "seq_id", "length"])
def test_corruption_is_detected_and_nothing_after_it_is_trusted(tmp_path, where):
    p = tmp_path / "kv.log"
    rng = np.random.default_rng(2)
    with _journal(p) as j:
        for i in range(3):
            j.append(0, i, *_kv(rng, 1))
    data = bytearray(p.read_bytes())
    rec_len = 32 + 2 * L * H * D * 4
    second = len(FILE_MAGIC) + 12 + 8 + rec_len  # file header (28 bytes) + first record
    offset = {"payload": second + 32 + 5, "seq_id": second + 4, "length": second + 16}[where]
    data[offset] ^= 0x10
    p.write_bytes(bytes(data))
    rec = recover(p)
    assert rec.records == 1 and rec.valid_bytes == second and rec.dropped_bytes == 2 * rec_len
    assert rec.reason == ("bad length" if where == "length" else "crc mismatch")
    assert rec[0][0].shape[1] == 1


def test_rollback_rewrite_and_compaction(tmp_path):
    p = tmp_path / "kv.log"
    rng = np.random.default_rng(3)
    a, b, c = _kv(rng, 4), _kv(rng, 2), _kv(rng, 3)
    with _journal(p) as j:
        j.append(5, 0, *a)
        j.append(5, 4, *b)
        j.append(5, 3, *c)  # speculative tokens 3..5 rejected, rewritten as c
        j.append(6, 0, *b)
        j.flush()
        before = os.path.getsize(p)
        want_k = np.concatenate([a[0][:, :3], c[0]], 1)
        assert np.array_equal(recover(p)[5][0], want_k)
        j.discard(6)
        after = j.compact()
        assert after < before
        j.append(5, 6, *b)
    rec = recover(p)
    assert set(rec) == {5} and rec.records == 2
    assert np.array_equal(rec[5][0], np.concatenate([want_k, b[0]], 1))


def test_append_does_not_wait_for_the_disk(tmp_path):
    """A stalled writer (its I/O lock held, as a slow disk would) does not block append: records just queue."""
    p = tmp_path / "kv.log"
    rng = np.random.default_rng(4)
    with _journal(p, fsync_every=4) as j:
        with j._io_lock:
            for i in range(50):
                j.append(0, i, *_kv(rng, 1))
            time.sleep(0.05)
            assert j.stats()["records"] <= 1  # at most the first record was taken before the stall
        j.flush()
        st = j.stats()
    assert st["records"] == 50 and st["fsyncs"] >= 50 // 4
    assert recover(p)[0][0].shape[1] == 50
    # the timing side (reported, not asserted: fsync cost depends on the filesystem)
    print(f"mean append {st['mean_append_s'] * 1e6:.1f} us, write {st['mean_write_s'] * 1e6:.1f} us")


def test_backpressure_when_queue_is_full(tmp_path):
    rng = np.random.default_rng(5)
    with _journal(tmp_path / "kv.log", max_pending=2) as j:
        for i in range(40):
            j.append(0, i, *_kv(rng, 1))
        j.flush()
        assert j.stats()["records"] == 40


def test_recover_equals_tinygpt_prefill_kv(tmp_path):
    model = TinyGPT(vocab_size=64, d_model=32, n_heads=4, n_layers=2, max_seq_len=64, n_kv_heads=2)
    ids = np.random.default_rng(6).integers(0, 64, (1, 24))
    cache = model.new_cache()
    model.logits_last(ids[:, :16], cache)  # prefill
    k0, v0 = kv_from_dense_cache(cache)
    p = tmp_path / "gpt.log"
    with KVJournal(p, n_layers=2, n_kv_heads=2, head_dim=8) as j:
        j.append(0, 0, k0, v0)
        for s in range(16, 24):  # decode steps journal only their new token
            model.logits_last(ids[:, s : s + 1], cache)
            k, v = kv_from_dense_cache(cache)
            j.append(0, s, k[:, s : s + 1], v[:, s : s + 1])
    full = model.new_cache()
    model.logits_last(ids, full)  # recomputing instead: one prefill over all 24 tokens
    rk, rv = recover(p)[0]
    fk, fv = kv_from_dense_cache(full)
    assert rk.tobytes() == kv_from_dense_cache(cache)[0].tobytes()
    np.testing.assert_allclose(rk, fk, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rv, fv, rtol=1e-5, atol=1e-6)


def test_bad_arguments_name_themselves(tmp_path):
    with pytest.raises(ValueError, match="n_layers"):
        KVJournal(tmp_path / "a", n_layers=0, n_kv_heads=1, head_dim=1)
    with pytest.raises(TypeError, match="dtype"):
        KVJournal(tmp_path / "a", n_layers=1, n_kv_heads=1, head_dim=1, dtype=np.int32)
    with pytest.raises(ValueError, match="fsync_every"):
        KVJournal(tmp_path / "a", n_layers=1, n_kv_heads=1, head_dim=1, fsync_every=0)
    rng = np.random.default_rng(7)
    with _journal(tmp_path / "b") as j:
        with pytest.raises(ValueError, match="seq_id"):
            j.append(-1, 0, *_kv(rng, 1))
        with pytest.raises(ValueError, match="start_pos"):
            j.append(0, 3, *_kv(rng, 1))  # gap
        with pytest.raises(ValueError, match="k:"):
            j.append(0, 0, np.zeros((L, 1, H, D + 1)), np.zeros((L, 1, H, D + 1)))
        with pytest.raises(ValueError, match="v:"):
            j.append(0, 0, np.zeros((L, 1, H, D)), np.zeros((L, 2, H, D)))
        with pytest.raises(KeyError, match="seq_id"):
            j.discard(9)
    with pytest.raises(ValueError, match="layout"):
        KVJournal(tmp_path / "b", n_layers=L, n_kv_heads=H, head_dim=D + 2)
    with pytest.raises(FileNotFoundError, match="path"):
        recover(tmp_path / "missing")
    (tmp_path / "junk").write_bytes(b"x" * 64)
    with pytest.raises(ValueError, match="not a KV journal"):
        recover(tmp_path / "junk")
    j = _journal(tmp_path / "c")
    j.close()
    with pytest.raises(RuntimeError, match="closed"):
        j.append(0, 0, *_kv(rng, 1))
