"""Asynchronous checkpoints: the training thread pays only for a copy to host memory; a writer process (or thread)
writes.

``AsyncCheckpointer.save(state, step)`` does three things in the caller's thread and returns:

1. **back-pressure**: when ``max_pending`` snapshots are already queued or being written, it waits for the oldest
   to finish (the wait is measured and reported in ``stats``; the queue never grows without bound, so host memory
   holds at most ``max_pending + 1`` snapshots);
2. **snapshot**: it copies every tensor whose *version* changed (numpy, torch and ``tl.Tensor`` values are copied,
   so training may overwrite them at once) -- this copy is the stall;
3. it hands the snapshot to the writer.

The writer writes the changed tensors into ``step_XXXXXXXX/data.bin`` (64-byte aligned, crc32 each) with an atomic
write (temporary name, fsync, rename, fsync of the directory) and writes ``manifest.json`` **last**: only a
directory whose manifest exists is a checkpoint, so a crash mid-write leaves the previous checkpoint the newest valid
one. Both writers call the same ``async_writer.write_checkpoint``: the files are the same, byte for byte.

**Writers** (``writer=``). ``"process"`` (the default; async_process.py): ``save`` copies into a reused
shared-memory buffer and sends a small message to one long-lived writer process (a fresh interpreter that never
imports torch), which checksums the buffer and writes ``data.bin`` straight from it with ``O_DIRECT`` (no page-cache
copy; buffered where the filesystem refuses it, e.g. tmpfs). ``"thread"``: ``save`` copies into fresh numpy arrays
and a writer thread writes them through the page cache. Measured on this project's shared 2-core Zen 4 VM (8 MiB MLP
state, ``bench_async``): the thread's writes cost 5-18 ms of CPU per save (usually 15-18), almost all of it the
kernel's first touch of the new page-cache pages (this VM backs guest memory lazily: writing 8 MiB into a new file
costs 19 ms of CPU, 1.2 ms when the pages of a just-deleted file are reused), the process's 2.7-4 ms (crc32 1.2 ms,
the O_DIRECT write and four fsyncs ~0.5 ms, the manifest). The GIL was not the cost: crc32, write and fsync release
it. With a free core (load average ~1) the two stall the training loop alike: 2.3-3.6 ms (process) and 1.8-3.3 ms
(thread) vs 9-13 ms for the synchronous save over three runs, within the bench's noise of about +-2 ms; with the box
loaded (load average 2.4-3) the process stalled less (3.9-5.4 ms vs 4.7-9.6 ms over 60 interleaved rounds; in
``bench_async`` at load 2.7, medians 2.9 vs 10.1 ms) and it always takes 4x less CPU from the other processes. The
process writer costs 0.1-0.2 ms more in ``save`` (the reply of the previous write, the message).

**Versions** [Q120]: ``save(state, step, versions={key: int})`` -- the caller bumps a key's version when that shard
changes (a frozen layer never does). A key whose version equals the one of the last *successful* checkpoint is not
copied and not written: the new manifest references the older file. Keys without a version are hashed (blake2b) by
the writer, which skips the write when the digest is unchanged (the copy is still paid). Every ``full_every``-th
checkpoint writes everything, so old files stop being referenced and ``prune`` can delete them.

**Scheduling** (Linux): the writer waits for work under ``SCHED_BATCH``. A thread woken from ``SCHED_BATCH`` does
not preempt the thread that woke it, so ``save`` hands the snapshot over and returns without losing its core to the
writer -- on a box whose cores are all busy, a normal-policy writer woken by ``save`` took the core and the training
thread waited behind it and the other runnable tasks (measured: the training loop spent a median 3-7.5 ms in
``save`` for an 8 MiB state, 0.5-0.7 ms with the writer waiting under ``SCHED_BATCH``). The writer *thread* writes
under the normal policy (under ``SCHED_BATCH`` it was descheduled while holding the GIL and the training steps
waited for it). The writer *process* holds no GIL of ours and writes under ``SCHED_BATCH`` too: over three
interleaved runs its loop stall was 2.2-3.2 ms vs 3.0-6.5 ms writing under the normal policy (the I/O completions
no longer preempt the training) and 2.2-6.0 ms under ``SCHED_IDLE``, which runs the writer only on an idle core
(a write then took ~60 ms and waited for the next save on a busy box; ``SCHED_IDLE`` also cannot be left again
without privileges). Waiting at nice 19 under the normal policy lost the core on wake-up as the normal policy does
(0.9-7.6 ms in ``save``). Elsewhere: unchanged.

**Errors** in the writer are never lost: the writer drops snapshots queued after a failed one (they may reference
files that failed to appear), and the next ``save``/``wait``/``close`` raises the error (``CheckpointError``
chaining the writer's exception; the process writer's traceback is attached as a note); the next save then compares
versions against the last successful checkpoint again. A writer process that dies (SIGKILL, OOM) makes the next
call raise ``WriterDied`` naming its pid and exit code -- the caller polls with a timeout and checks the child, so
it never hangs -- and the next save starts a new writer that references what is on disk.
"""

from __future__ import annotations

import os
import queue
import shutil
import threading
import time
import weakref
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .async_process import ProcessWriter
from .async_writer import ALIGN as ALIGN  # re-exported: the data.bin alignment
from .async_writer import FORMAT, MANIFEST, WriterDied, decode_error, set_policy, write_checkpoint
from .atomic import CheckpointError, CorruptCheckpoint, IncompleteCheckpoint, read_commit_record
from .manifest import step_dir  # the same step_NNNNNNNN directory names as save_sharded

WRITERS = ("process", "thread")
DEFAULT_WRITER = "process"


def to_host(value: Any) -> np.ndarray | None:
    """A private host copy of a numpy / torch / tl tensor (None when ``value`` is not a tensor)."""
    view = host_view(value)
    return None if view is None else np.array(view, copy=True, order="C")


def host_view(value: Any) -> np.ndarray | None:
    """A numpy view (no copy when the value is already in host memory) of a numpy / torch / tl tensor; None when
    ``value`` is not a tensor. The process writer copies it into shared memory itself."""
    if isinstance(value, np.ndarray):
        return value
    mod = type(value).__module__
    if mod.startswith("torch"):
        import torch

        if isinstance(value, torch.Tensor):
            t = value.detach()
            if t.dtype == torch.bfloat16:
                raise TypeError("bfloat16 tensors are not supported: numpy has no bfloat16; cast first")
            if t.device.type != "cpu":
                t = t.to("cpu")
            return t.resolve_conj().resolve_neg().numpy()
    if mod.startswith("tinylearn") and isinstance(getattr(value, "data", None), np.ndarray):
        return value.data
    return None


def flatten(state: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts flattened with ``.`` keys (as torch DCP)."""
    out: dict[str, Any] = {}
    for k, v in state.items():
        if not isinstance(k, str):
            raise TypeError(f"state keys must be str, got {k!r}")
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def torch_versions(state: Mapping[str, Any]) -> dict[str, int]:
    """``{key: tensor._version}`` for the torch tensors of ``state`` (flattened keys).

    torch bumps a tensor's version counter on every in-place write (``opt.step()`` updates parameters in place;
    ``detach()`` and ``state_dict()`` share the counter), so this is the caller's version map for free: a frozen
    layer's version never moves."""
    import torch

    return {k: int(v._version) for k, v in flatten(state).items() if isinstance(v, torch.Tensor)}


@dataclass
class _Snapshot:
    step: int
    arrays: dict[str, np.ndarray]  # copied (changed) keys
    versions: dict[str, int | None]  # every tensor key: its version (None: hash it)
    objects: dict[str, Any]
    full: bool
    since_full: int
    meta: dict[str, Any]
    seq: int = 0
    stat: dict[str, Any] = field(default_factory=dict)


class AsyncCheckpointer:
    """Snapshot to host memory in ``save``, write in the background (a writer process or thread); see the module
    docstring. ``writer``: "process" (shared-memory snapshots, one writer process) or "thread"."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        max_pending: int = 1,
        full_every: int = 8,
        fsync: bool = True,
        synchronous: bool = False,
        writer: str = DEFAULT_WRITER,
    ) -> None:
        if not isinstance(max_pending, int) or max_pending < 1:
            raise ValueError(f"max_pending must be an int >= 1, got {max_pending!r}")
        if not isinstance(full_every, int) or full_every < 1:
            raise ValueError(f"full_every must be an int >= 1, got {full_every!r}")
        if writer not in WRITERS:
            raise ValueError(f"writer must be one of {WRITERS}, got {writer!r}")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_pending, self.full_every, self.fsync, self.synchronous = max_pending, full_every, fsync, synchronous
        self.writer = writer
        self.stats: list[dict[str, Any]] = []  # one dict per save: step, wait_s, copy_s, stall_s, write_s, ...
        self._committed: dict[str, dict[str, Any]] = {}  # key -> manifest entry of the last successful checkpoint
        self._submitted: dict[str, int | None] = {}  # key -> version in the last submitted snapshot
        self._since_full = full_every  # first save is full
        self._last_step: int | None = None
        latest = latest_async_checkpoint(self.root)
        if latest is not None:  # resume: reference what is on disk
            man = read_async_manifest(latest)
            self._committed = dict(man["tensors"])
            self._submitted = {k: e.get("version") for k, e in self._committed.items()}
            self._last_step = man["step"]
            self._since_full = man.get("since_full", 0)
        self._error: BaseException | None = None
        self._slots = threading.Semaphore(max_pending)
        self._q: queue.Queue[_Snapshot | None] = queue.Queue()
        self._lock = threading.Lock()
        self._closed = False
        self._seq = self._drop_upto = 0
        self._thread: threading.Thread | None = None
        self._writer_tid: int | None = None  # the writer thread's native id (Linux scheduling, tests)
        self._pw: ProcessWriter | None = None
        if not synchronous and writer == "thread":
            self._thread = threading.Thread(target=self._writer, name="tl-async-ckpt", daemon=True)
            self._thread.start()
        elif not synchronous:
            self._pw = ProcessWriter(self.root, fsync=fsync, full_every=full_every, max_pending=max_pending)
            self._pw.start(self._committed)
            self._finalizer = weakref.finalize(self, self._pw.close)  # never closed: stop the child at GC / exit

    @property
    def writer_pid(self) -> int | None:
        """The writer process's pid (None with the thread writer, or before a restarted writer's first save)."""
        return None if self._pw is None else self._pw.pid

    # -- caller side ---------------------------------------------------------------------------------------------
    def save(
        self,
        state: Mapping[str, Any],
        step: int,
        *,
        versions: Mapping[str, int] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Snapshot ``state`` and queue its write; returns this save's stats dict (filled in by the writer)."""
        if self._closed:
            raise CheckpointError(f"{self.root}: checkpointer is closed")
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        step = int(step)
        if self._last_step is not None and step <= self._last_step:
            raise ValueError(f"step {step} is not newer than the last checkpoint step {self._last_step}")
        pw = self._pw
        t0 = time.perf_counter()
        if pw is not None:
            self._poll(self.max_pending)  # back-pressure: at most max_pending snapshots in flight
        else:
            self._slots.acquire()
        t1 = time.perf_counter()
        release = self._slots.release if pw is None else _nothing
        try:
            self._raise_error()
        except BaseException:
            release()
            raise
        if pw is not None and pw.proc is None:
            pw.start(self._committed)  # the writer died (that error was raised): a new one, resuming from disk
        flat = flatten(state)
        full = self._since_full + 1 >= self.full_every
        arrays, vers, objects = {}, {}, {}
        host = to_host if pw is None else host_view  # the process writer copies into shared memory below
        for k, v in flat.items():
            ver = None if versions is None else versions.get(k)
            if ver is not None and (isinstance(ver, bool) or not isinstance(ver, (int, np.integer))):
                release()
                raise TypeError(f"versions[{k!r}] must be an int, got {ver!r}")
            unchanged = ver is not None and not full and k in self._committed and self._submitted.get(k) == ver
            if unchanged:
                vers[k] = int(ver)
                continue
            a = host(v)
            if a is None:
                objects[k] = v
                continue
            arrays[k], vers[k] = a, None if ver is None else int(ver)
        since = 0 if full else self._since_full + 1
        if pw is not None:
            msg, slot = pw.snapshot(arrays, vers, objects, meta, step, full, since)
        t2 = time.perf_counter()
        stat = {"step": step, "wait_s": t1 - t0, "copy_s": t2 - t1, "stall_s": t2 - t0, "full": full, "t_snap": t1}
        stat["copied_bytes"] = int(sum(a.nbytes for a in arrays.values()))
        if pw is not None:
            try:
                pw.submit(msg, stat, slot)
            except WriterDied as e:
                self._died(e)
                self._raise_error()
        elif self.synchronous:
            snap = _Snapshot(step, arrays, vers, objects, full, since, dict(meta or {}), stat=stat)
            try:
                self._write(snap)
            finally:
                self._slots.release()
            stat["stall_s"] = time.perf_counter() - t0
        else:
            snap = _Snapshot(step, arrays, vers, objects, full, since, dict(meta or {}), stat=stat)
            with self._lock:  # check-and-submit atomically: a failure after this drops the snapshot (seq <= drop)
                failed = self._error is not None
                if not failed:
                    self._seq += 1
                    snap.seq = self._seq
                    self._q.put(snap)
            if failed:
                self._slots.release()
                self._raise_error()
        if not self.synchronous:
            stat["stall_s"] = time.perf_counter() - t0  # the hand-over to the writer included
        self._submitted, self._last_step, self._since_full = dict(vers), step, since
        self.stats.append(stat)
        return stat

    def wait(self) -> None:
        """Block until every queued snapshot is written; raise the writer's error if one failed."""
        if self._pw is not None:
            self._poll(1)
        else:
            for _ in range(self.max_pending):
                self._slots.acquire()
            for _ in range(self.max_pending):
                self._slots.release()
        self._raise_error()

    def close(self) -> None:
        """Finish pending writes, stop the writer (thread or process), raise a pending error."""
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._closed = True
            if self._thread is not None:
                self._q.put(None)
                self._thread.join()
            if self._pw is not None:
                self._finalizer()  # ProcessWriter.close, once

    def __enter__(self) -> AsyncCheckpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _raise_error(self) -> None:
        with self._lock:
            err, self._error = self._error, None
        if err is not None:
            if self._pw is not None:
                self._pw.epoch += 1  # snapshots submitted before now are dropped by the writer (they may reference
                # the failed one's files); later ones are written
            # compare the next save's versions against what is really on disk
            self._submitted = {k: e.get("version") for k, e in self._committed.items()}
            self._last_step = max((s for s in _committed_steps(self.root)), default=None)
            if isinstance(err, WriterDied):
                raise err
            raise CheckpointError(f"{self.root}: an asynchronous checkpoint write failed: {err!r}") from err

    # -- the writer process's replies ----------------------------------------------------------------------------
    def _poll(self, below: int | None) -> None:
        """Handle the writer process's replies; with ``below``, wait until fewer than that are in flight."""
        assert self._pw is not None
        died = self._pw.poll(below, self._on_reply)
        if died is not None:
            self._died(died)

    def _on_reply(self, reply: dict[str, Any], stat: dict[str, Any]) -> None:
        stat.update(reply["stat"])
        if reply.get("dropped"):
            stat["dropped"] = True
        elif "error" in reply:
            err = decode_error(reply, self.writer_pid)
            stat["error"] = repr(err)
            with self._lock:
                self._error = err
        else:
            self._committed = reply["entries"]

    def _died(self, err: WriterDied) -> None:
        """The writer process is gone: the next call raises ``err``; the next save starts a new writer, which
        references what is on disk (the dead one may have committed a checkpoint it did not report)."""
        with self._lock:
            if self._error is not None and hasattr(err, "add_note"):
                err.add_note(f"an earlier write had failed: {self._error!r}")
            self._error = err
        latest = latest_async_checkpoint(self.root)
        self._committed = dict(read_async_manifest(latest)["tensors"]) if latest is not None else {}

    # -- writer thread -------------------------------------------------------------------------------------------
    def _writer(self) -> None:
        self._writer_tid = threading.get_native_id()
        while True:
            set_policy("batch")  # woken by save(): do not preempt it (see the module docstring)
            snap = self._q.get()
            set_policy("normal")
            if snap is None:
                return
            try:
                with self._lock:
                    drop = snap.seq <= self._drop_upto
                if drop:  # submitted before an earlier snapshot failed: it may reference that one's files
                    snap.stat["dropped"] = True
                else:
                    self._write(snap)
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                snap.stat["error"] = repr(e)
                with self._lock:
                    self._error = e
                    self._drop_upto = self._seq
            finally:
                self._slots.release()

    def _write(self, snap: _Snapshot) -> None:
        arrays = {
            k: (memoryview(a.reshape(-1)).cast("B") if a.size else memoryview(b""), a.dtype.str, a.shape)
            for k, a in snap.arrays.items()
        }
        entries, stat = write_checkpoint(
            self.root, snap.step, snap.versions, arrays, snap.objects, snap.meta, snap.full, snap.since_full,
            self._committed, fsync=self.fsync, full_every=self.full_every,
        )  # fmt: skip
        self._committed = entries
        snap.stat.update(stat)

    def prune(self, keep_last: int = 2) -> list[Path]:
        """Delete checkpoint directories older than the newest ``keep_last`` whose files no kept manifest
        references; return what was deleted. Call after ``wait``."""
        if not isinstance(keep_last, int) or keep_last < 1:
            raise ValueError(f"keep_last must be an int >= 1, got {keep_last!r}")
        self.wait()
        steps = sorted(_committed_steps(self.root))
        kept = steps[-keep_last:]
        needed = set()
        for s in kept:
            for e in read_async_manifest(step_dir(self.root, s))["tensors"].values():
                needed.add(e["file"].split("/")[0])
        gone = []
        for s in steps[:-keep_last]:
            d = step_dir(self.root, s)
            if d.name not in needed:
                shutil.rmtree(d)
                gone.append(d)
        return gone


def _nothing() -> None:
    pass


def _committed_steps(root: Path) -> list[int]:
    out = []
    for d in root.glob("step_*"):
        if (d / MANIFEST).is_file() and d.name[5:].isdigit():
            out.append(int(d.name[5:]))
    return out


def read_async_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of one checkpoint directory; IncompleteCheckpoint when it has none (a torn write)."""
    missing = f"{os.fspath(path)}: no {MANIFEST} (the write did not commit)"
    man = read_commit_record(Path(path) / MANIFEST, FORMAT, "manifest", missing)
    return man


def latest_async_checkpoint(root: str | os.PathLike[str]) -> Path | None:
    """The newest ``step_*`` directory with a manifest that parses; torn ones are skipped."""
    for s in sorted(_committed_steps(Path(root)), reverse=True):
        d = step_dir(root, s)
        try:
            read_async_manifest(d)
        except CheckpointError:
            continue
        return d
    return None


def load_async(root: str | os.PathLike[str], step: int | None = None, *, verify: bool = True) -> dict[str, Any]:
    """Tensors (numpy arrays) and objects of checkpoint ``step`` (default: the newest valid one)."""
    root = Path(root)
    if step is None:
        d = latest_async_checkpoint(root)
        if d is None:
            raise IncompleteCheckpoint(f"{root}: no committed checkpoint")
    else:
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        d = step_dir(root, int(step))
    man = read_async_manifest(d)
    out: dict[str, Any] = dict(man["objects"])
    files: dict[str, np.memmap] = {}
    for k, e in man["tensors"].items():
        f = root / e["file"]
        if e["file"] not in files:
            if not f.is_file():
                raise CorruptCheckpoint(f"{f}: missing (tensor {k!r} of {d.name})")
            files[e["file"]] = np.memmap(f, dtype=np.uint8, mode="r") if f.stat().st_size else np.zeros(0, np.uint8)
        raw = files[e["file"]][e["offset"] : e["offset"] + e["nbytes"]]
        if len(raw) != e["nbytes"] or (verify and zlib.crc32(raw) != e["crc32"]):
            raise CorruptCheckpoint(f"{f}: size or crc32 mismatch (tensor {k!r} of {d.name})")
        out[k] = np.frombuffer(raw.tobytes(), dtype=np.dtype(e["dtype"])).reshape(e["shape"])
    return out
