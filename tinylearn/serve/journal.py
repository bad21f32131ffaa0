"""KV journal [Q143]: an append-only, write-behind log of each sequence's KV *increments*, and crash recovery by replay.

A long-context sequence's KV cache is large, but each step only adds the K/V of its T new tokens. Instead of
re-dumping the whole cache, ``append(seq_id, start_pos, k, v)`` logs just the delta (k, v [L, T, Hkv, D]) and
returns at once: the caller copies the arrays into a bytes payload and enqueues it; a background writer thread
appends records to the file and fsyncs them in groups (group commit). ``recover(path)`` rebuilds every sequence's
full K/V by replaying the log; it is far cheaper than recomputing the K/V with a prefill forward pass.

File layout (little endian)::

    file header  b"TLKVJNL1" | n_layers u32 | n_kv_heads u32 | head_dim u32 | dtype str (8 bytes, NUL padded)
    record       b"KVR1" | seq_id i64 | start u32 | T u32 | payload_len u64 | crc32 u32  (32 bytes)
                 payload = K bytes then V bytes, each [L, T, Hkv, D] C-order, payload_len = 2*L*T*Hkv*D*itemsize
                 crc32 covers the first 28 header bytes and the payload (a corrupted seq_id/start is caught too)

Replay: a record with start == current length extends the sequence; start < length first truncates it (a rollback,
e.g. rejected speculative tokens, then rewritten); start > length cannot happen (``append`` refuses gaps).
Torn tail: a crash mid-write leaves a partial record. Recovery stops at the first record whose magic, length
(payload_len inconsistent with T, or running past end of file) or CRC is wrong: nothing after it is trusted,
``Recovery.dropped_bytes`` reports how much was discarded. Reopening a journal truncates such a tail first, so new
records are never appended behind garbage.

Durability contract: ``append`` returning means *queued*, not durable. A record is durable once its group was
fsynced (every ``fsync_every`` records, or when the queue runs empty) and always after ``flush()`` returns. A crash
therefore loses a suffix of the log, never a middle record, and recovery yields for each sequence a prefix of what
was appended. ``max_pending`` bounds the queue (memory): a full queue makes ``append`` wait (back-pressure, counted
in ``stats()['blocked_appends']``). An I/O error in the writer is re-raised by the next ``append``/``flush``.

``compact()`` is the checkpoint: it writes one record per live sequence (its full K/V, start 0) to a temporary file,
fsyncs it and atomically renames it over the log (``os.replace``), so a crash during compaction leaves either the old
or the new log. ``discard(seq_id)`` forgets a finished sequence so the next compaction drops it (recovery before that
compaction still returns it).
"""

from __future__ import annotations

import os
import queue
import struct
import threading
import time
import zlib
from typing import Any

import numpy as np

FILE_MAGIC = b"TLKVJNL1"
REC_MAGIC = b"KVR1"
_FILE_HDR = struct.Struct("<8sIII8s")
_REC_HDR = struct.Struct("<4sqIIQI")
_SEQ_MAX = 2**63 - 1
_U32_MAX = 2**32 - 1


def _pos_int(name: str, v: Any, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < minimum:
        raise ValueError(f"{name}: must be an int >= {minimum}, got {v!r}")
    return int(v)


def _dtype(dtype: Any) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise TypeError(f"dtype: expected a numpy float dtype, got {dtype!r}") from e
    if dt.kind != "f" or len(dt.str) > 8:
        raise TypeError(f"dtype: expected a numpy float dtype, got {dt}")
    return dt.newbyteorder("<")


class Recovery(dict):
    """``recover``'s result: {seq_id: (k, v)} with k, v [L, S, Hkv, D], plus what the replay saw.

    records: complete records replayed; valid_bytes: length of the trusted prefix of the file; dropped_bytes: bytes
    after it (a torn or corrupted tail); reason: why the replay stopped ("eof", "torn header", "bad magic",
    "bad length", "truncated payload", "crc mismatch")."""

    records: int = 0
    valid_bytes: int = 0
    dropped_bytes: int = 0
    reason: str = "eof"
    layout: tuple[int, int, int, np.dtype] | None = None


def _read_file_header(buf: bytes | memoryview, path: str) -> tuple[int, int, int, np.dtype]:
    if len(buf) < _FILE_HDR.size:
        raise ValueError(f"path: {path!r} is too short to be a KV journal ({len(buf)} bytes)")
    magic, n_layers, n_kv_heads, head_dim, dts = _FILE_HDR.unpack_from(buf, 0)
    if magic != FILE_MAGIC:
        raise ValueError(f"path: {path!r} is not a KV journal (magic {magic!r})")
    return n_layers, n_kv_heads, head_dim, np.dtype(dts.rstrip(b"\0").decode())


def _scan(path: str) -> Recovery:
    with open(path, "rb") as f:
        buf = f.read()
    n_layers, n_kv_heads, head_dim, dt = _read_file_header(buf, path)
    per_token = 2 * n_layers * n_kv_heads * head_dim * dt.itemsize
    mv = memoryview(buf)
    chunks: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    lens: dict[int, int] = {}
    out = Recovery()
    out.layout = (n_layers, n_kv_heads, head_dim, dt)
    pos, n_rec, reason = _FILE_HDR.size, 0, "eof"
    while pos < len(buf):
        if pos + _REC_HDR.size > len(buf):
            reason = "torn header"
            break
        magic, seq, start, t, plen, crc = _REC_HDR.unpack_from(buf, pos)
        if magic != REC_MAGIC:
            reason = "bad magic"
            break
        if plen != t * per_token:
            reason = "bad length"
            break
        body = pos + _REC_HDR.size
        if body + plen > len(buf):
            reason = "truncated payload"
            break
        if zlib.crc32(mv[body : body + plen], zlib.crc32(mv[pos : pos + _REC_HDR.size - 4])) != crc:
            reason = "crc mismatch"
            break
        cur = lens.get(seq, 0)
        if start > cur:  # only a forged record can do this (append refuses gaps): untrusted from here on
            reason = "gap"
            break
        arr = np.frombuffer(buf, dtype=dt, count=plen // dt.itemsize, offset=body).reshape(
            2, n_layers, t, n_kv_heads, head_dim
        )
        lst = chunks.setdefault(seq, [])
        if start < cur:  # rollback: cut the chunks back to ``start`` tokens
            kept, acc = [], 0
            for k, v in lst:
                if acc >= start:
                    break
                take = min(k.shape[1], start - acc)
                kept.append((k[:, :take], v[:, :take]))
                acc += take
            lst[:] = kept
        lst.append((arr[0], arr[1]))
        lens[seq] = start + t
        pos = body + plen
        n_rec += 1
    for seq, lst in chunks.items():
        empty = np.zeros((n_layers, 0, n_kv_heads, head_dim), dt)
        k = np.concatenate([c[0] for c in lst], axis=1) if lst else empty
        v = np.concatenate([c[1] for c in lst], axis=1) if lst else empty.copy()
        out[seq] = (k, v)
    out.records, out.valid_bytes, out.dropped_bytes, out.reason = n_rec, pos, len(buf) - pos, reason
    return out


def recover(path: str | os.PathLike) -> Recovery:
    """Replay the journal at ``path``: {seq_id: (k, v)} (full K/V [L, S, Hkv, D] per sequence); see ``Recovery``."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"path: no journal file at {path!r}")
    return _scan(path)


class KVJournal:
    """Write-behind append-only KV log; see the module docstring. Use as a context manager or call ``close()``."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        dtype: Any = np.float32,
        fsync_every: int = 8,
        max_pending: int = 1024,
    ) -> None:
        self.n_layers = _pos_int("n_layers", n_layers)
        self.n_kv_heads = _pos_int("n_kv_heads", n_kv_heads)
        self.head_dim = _pos_int("head_dim", head_dim)
        self.dtype = _dtype(dtype)
        self.fsync_every = _pos_int("fsync_every", fsync_every)
        max_pending = _pos_int("max_pending", max_pending)
        self.path = os.fspath(path)
        self._lens: dict[int, int] = {}
        if os.path.exists(self.path) and os.path.getsize(self.path) > 0:
            rec = _scan(self.path)
            want = (self.n_layers, self.n_kv_heads, self.head_dim, self.dtype)
            if rec.layout != want:
                raise ValueError(f"path: journal {self.path!r} has layout {rec.layout}, expected {want}")
            with open(self.path, "r+b") as f:  # cut a torn tail so new records are reachable
                f.truncate(rec.valid_bytes)
                f.flush()
                os.fsync(f.fileno())
            self._lens = {s: k.shape[1] for s, (k, _) in rec.items()}
            self.recovered_dropped_bytes = rec.dropped_bytes
        else:
            with open(self.path, "wb") as f:
                f.write(self._file_header())
                f.flush()
                os.fsync(f.fileno())
            self.recovered_dropped_bytes = 0
        self._f = open(self.path, "ab")  # noqa: SIM115 -- owned by the writer thread until close()
        self._q: queue.Queue = queue.Queue(maxsize=max_pending)
        self._io_lock = threading.Lock()
        self._err: BaseException | None = None
        self._closed = False
        self._st = dict(records=0, bytes=0, fsyncs=0, append_s=0.0, write_s=0.0, fsync_s=0.0, blocked_appends=0)
        self._thread = threading.Thread(target=self._writer, name="kv-journal-writer", daemon=True)
        self._thread.start()

    def _file_header(self) -> bytes:
        return _FILE_HDR.pack(FILE_MAGIC, self.n_layers, self.n_kv_heads, self.head_dim, self.dtype.str.encode())

    # -- caller side ---------------------------------------------------------------------------------------------
    def _check(self) -> None:
        if self._err is not None:
            raise RuntimeError(f"KVJournal: the writer thread failed: {self._err!r}") from self._err
        if self._closed:
            raise RuntimeError(f"KVJournal: {self.path!r} is closed")

    def append(self, seq_id: int, start_pos: int, k: np.ndarray, v: np.ndarray) -> None:
        """Log the K/V of the T new tokens at positions [start_pos, start_pos + T) of ``seq_id``; returns once queued.

        k, v: [L, T, Hkv, D]. ``start_pos`` may be <= the sequence's logged length (a rewrite after rollback) but not
        beyond it (a gap would make the log unreplayable)."""
        t0 = time.perf_counter()
        self._check()
        if isinstance(seq_id, bool) or not isinstance(seq_id, int | np.integer) or not 0 <= seq_id <= _SEQ_MAX:
            raise ValueError(f"seq_id: must be an int in [0, 2**63), got {seq_id!r}")
        start_pos = _pos_int("start_pos", start_pos, minimum=0)
        seq_id = int(seq_id)
        cur = self._lens.get(seq_id, 0)
        if start_pos > cur:
            raise ValueError(f"start_pos: {start_pos} leaves a gap after the {cur} logged tokens of seq {seq_id}")
        k, v = np.asarray(k), np.asarray(v)
        lay = (self.n_layers, self.n_kv_heads, self.head_dim)
        for name, a in (("k", k), ("v", v)):
            if a.ndim != 4 or (a.shape[0], a.shape[2], a.shape[3]) != lay or a.shape[1] < 1:
                raise ValueError(f"{name}: expected [L={lay[0]}, T>=1, Hkv={lay[1]}, D={lay[2]}], got {a.shape}")
            if a.dtype.kind not in "fiu":
                raise TypeError(f"{name}: expected a numeric array, got dtype {a.dtype}")
        if k.shape != v.shape:
            raise ValueError(f"v: shape {v.shape} differs from k's {k.shape}")
        t = k.shape[1]
        if start_pos + t > _U32_MAX:
            raise ValueError(f"start_pos: {start_pos} + {t} tokens overflow the u32 position field")
        payload = np.ascontiguousarray(k, self.dtype).tobytes() + np.ascontiguousarray(v, self.dtype).tobytes()
        self._lens[seq_id] = start_pos + t
        item = (seq_id, start_pos, t, payload)
        try:
            self._q.put_nowait(item)
        except queue.Full:
            self._st["blocked_appends"] += 1
            self._q.put(item)
        self._st["append_s"] += time.perf_counter() - t0

    def flush(self) -> None:
        """Block until every record appended so far is written and fsynced."""
        self._check()
        done = threading.Event()
        self._q.put(done)
        done.wait()
        self._check()

    def discard(self, seq_id: int) -> None:
        """Forget ``seq_id`` (finished): the next ``compact()`` drops its records."""
        if self._lens.pop(seq_id, None) is None:
            raise KeyError(f"seq_id: {seq_id!r} is not in the journal")

    def lengths(self) -> dict[int, int]:
        """{seq_id: logged tokens} as seen by the caller (queued records included)."""
        return dict(self._lens)

    def compact(self) -> int:
        """Checkpoint: rewrite the log as one record per live sequence (atomic rename). Returns the new file size."""
        self.flush()
        with self._io_lock:
            state = _scan(self.path)
            tmp = self.path + ".compact"
            with open(tmp, "wb") as f:
                f.write(self._file_header())
                for seq in sorted(self._lens):
                    k, v = state[seq]
                    f.write(self._record(seq, 0, k.shape[1], k.tobytes() + v.tobytes()))
                f.flush()
                os.fsync(f.fileno())
            self._f.close()
            os.replace(tmp, self.path)
            dfd = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY)
            try:
                os.fsync(dfd)  # make the rename itself durable
            finally:
                os.close(dfd)
            self._f = open(self.path, "ab")  # noqa: SIM115
            return os.path.getsize(self.path)

    def stats(self) -> dict[str, float]:
        """records, bytes, fsyncs, blocked_appends; mean_append_s (caller, per append) vs mean_write_s (writer thread,
        per record: CRC + header + write) and mean_fsync_s; records_per_fsync."""
        s = self._st
        n = max(s["records"], 1)
        return dict(
            records=s["records"],
            bytes=s["bytes"],
            fsyncs=s["fsyncs"],
            blocked_appends=s["blocked_appends"],
            mean_append_s=s["append_s"] / n,
            mean_write_s=s["write_s"] / n,
            mean_fsync_s=s["fsync_s"] / max(s["fsyncs"], 1),
            records_per_fsync=s["records"] / max(s["fsyncs"], 1),
        )

    def close(self) -> None:
        if self._closed:
            return
        try:
            if self._err is None:
                self.flush()
        finally:
            self._closed = True
            self._q.put(None)
            self._thread.join()
            self._f.close()
        if self._err is not None:
            raise RuntimeError(f"KVJournal: the writer thread failed: {self._err!r}") from self._err

    def __enter__(self) -> KVJournal:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- writer thread -------------------------------------------------------------------------------------------
    @staticmethod
    def _record(seq: int, start: int, t: int, payload: bytes) -> bytes:
        head = _REC_HDR.pack(REC_MAGIC, seq, start, t, len(payload), 0)[:-4]
        return head + struct.pack("<I", zlib.crc32(payload, zlib.crc32(head))) + payload

    def _sync(self) -> None:
        t0 = time.perf_counter()
        self._f.flush()
        os.fsync(self._f.fileno())
        self._st["fsync_s"] += time.perf_counter() - t0
        self._st["fsyncs"] += 1

    def _writer(self) -> None:
        unsynced, stop = 0, False
        while not stop:
            batch = [self._q.get()]
            while True:  # drain what is queued: one group commit
                try:
                    batch.append(self._q.get_nowait())
                except queue.Empty:
                    break
            waiters = []
            with self._io_lock:
                for item in batch:
                    if item is None:
                        stop = True
                    elif isinstance(item, threading.Event):
                        waiters.append(item)
                    elif self._err is None:
                        try:
                            t0 = time.perf_counter()
                            rec = self._record(*item)
                            self._f.write(rec)
                            self._st["write_s"] += time.perf_counter() - t0
                            self._st["records"] += 1
                            self._st["bytes"] += len(rec)
                            unsynced += 1
                            if unsynced >= self.fsync_every:
                                self._sync()
                                unsynced = 0
                        except BaseException as e:  # surfaced to the caller by _check()
                            self._err = e
                if unsynced and self._err is None and (waiters or self._q.empty()):
                    try:
                        self._sync()
                        unsynced = 0
                    except BaseException as e:
                        self._err = e
            for w in waiters:
                w.set()


def kv_from_dense_cache(cache: Any, length: int | None = None, batch: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """TinyGPT's DenseKVCache (per layer [B, Hkv, S_max, D]) -> the journal layout k, v [L, S, Hkv, D]."""
    n = cache.length if length is None else _pos_int("length", length, minimum=0)
    k = np.stack([a[batch, :, :n] for a in cache.k]).transpose(0, 2, 1, 3)
    v = np.stack([a[batch, :, :n] for a in cache.v]).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(k), np.ascontiguousarray(v)
