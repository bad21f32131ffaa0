"""The writers of ``AsyncCheckpointer`` (async_ckpt.py): writing one snapshot.

``write_checkpoint`` writes one snapshot -- the changed tensors into ``step_XXXXXXXX/data.bin`` (64-byte aligned,
crc32 each) with an atomic write (``atomic_write``, or ``write_direct`` from a shared buffer), then
``manifest.json`` last. The writer thread (``writer="thread"``) and the
writer process (``writer="process"``, async_process.py) both call it, so the on-disk format is the same byte for byte.

**O_DIRECT**: ``data.bin`` is the buffer's first bytes when every copied key is written (the caller lays the buffer
out as the file, gaps zeroed), so the child writes it from the buffer with ``O_DIRECT`` (``write_direct``): 0.35 ms
of CPU for 8 MiB + fsync, against 19 ms to write 8 MiB through the page cache into a new file on this project's VM
(the first touch of pages the hypervisor backs lazily; 1.2 ms when the freed pages of a deleted file are reused).

``set_policy``: the scheduling policies the writers wait and write under (see async_process.py).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import threading
import time
import zlib
from pathlib import Path
from typing import Any

from .atomic import TMP_PREFIX, CheckpointError, _point, atomic_write, discard, publish
from .manifest import step_dir

FORMAT = "tinylearn.async/1"
MANIFEST = "manifest.json"
ALIGN = 64  # tensors start at 64-byte offsets in data.bin (and in the shared-memory buffers)
POLICIES = ("normal", "batch", "idle")  # the writer process's scheduling while it writes (it waits under "batch")
DEFAULT_POLICY = "batch"

# one array of a snapshot: its bytes, dtype string (numpy's ``dtype.str``) and shape
ArrayBytes = tuple[memoryview, str, tuple[int, ...]]


class WriterDied(CheckpointError):
    """The writer process exited (killed, crashed) while snapshots were pending; the message names pid and code."""


def write_checkpoint(
    root: Path,
    step: int,
    versions: dict[str, int | None],
    arrays: dict[str, ArrayBytes],
    objects: dict[str, Any],
    meta: dict[str, Any],
    full: bool,
    since_full: int,
    committed: dict[str, dict[str, Any]],
    *,
    fsync: bool,
    full_every: int,
    direct: tuple[memoryview, dict[str, int]] | None = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Write one snapshot; return (the manifest's tensor entries, stats). ``committed``: the entries of the last
    successful checkpoint (unchanged keys reference them). Keys with version None are hashed (blake2b) unless every
    checkpoint is full; an unchanged digest references the older file.

    ``direct`` = (buffer, {key: offset in it}): the arrays lie in one page-aligned buffer at 64-byte aligned offsets
    with zeroed gaps. When every written key sits at the same offset in the buffer as in ``data.bin`` (nothing was
    skipped by its digest), the file is the buffer's first bytes and is written from it with ``O_DIRECT``
    (``write_direct``); otherwise, and without ``direct``, through the page cache (``atomic_write``)."""
    t0, c0 = time.perf_counter(), time.thread_time()
    d = step_dir(root, step)
    d.mkdir(parents=True, exist_ok=True)
    entries: dict[str, dict[str, Any]] = {}
    parts: list[bytes | memoryview] = []
    offset = nwritten = 0
    rel = f"{d.name}/data.bin"
    for k, ver in versions.items():
        old = committed.get(k)
        a = arrays.get(k)
        if a is None:  # version unchanged: reference the older file
            if old is None:
                raise CheckpointError(f"key {k!r}: not copied but absent from the last checkpoint")
            entries[k] = old
            continue
        buf, dtype, shape = a
        dig = hashlib.blake2b(buf, digest_size=16).hexdigest() if ver is None and full_every > 1 else None
        if dig is not None and not full and old is not None and old.get("blake2b") == dig:
            if old["dtype"] == dtype and tuple(old["shape"]) == tuple(shape):
                entries[k] = old
                continue
        pad = -offset % ALIGN
        if pad:
            parts.append(bytes(pad))
            offset += pad
        e = {"file": rel, "offset": offset, "dtype": dtype, "shape": list(shape), "nbytes": buf.nbytes}
        e.update(version=ver, crc32=zlib.crc32(buf))
        if dig is not None:
            e["blake2b"] = dig
        entries[k] = e
        parts.append(buf)
        offset += buf.nbytes
        nwritten += 1
    same = direct is not None and all(
        e["file"] != rel or direct[1].get(k) == e["offset"] for k, e in entries.items()
    )  # fmt: skip
    if not nwritten:
        written, how = 0, "none"
    elif same and direct is not None and _direct_ok(root):
        written, how = write_direct(root / rel, direct[0], offset, fsync=fsync), "direct"
    else:
        written, how = atomic_write(root / rel, parts, fsync=fsync), "buffered"
    del parts  # release the views of the snapshot's memory
    man = {
        "format": FORMAT,
        "step": step,
        "full": full,
        "since_full": since_full,
        "meta": meta,
        "objects": objects,
        "tensors": entries,
    }
    atomic_write(d / MANIFEST, json.dumps(man, indent=1).encode(), fsync=fsync)  # the commit, last
    t1 = time.perf_counter()
    stat = {"write_s": t1 - t0, "t_done": t1, "bytes_written": written, "keys_written": nwritten}
    stat["write_cpu_s"] = time.thread_time() - c0  # the writer's CPU time (user + kernel) for this snapshot
    stat["data_write"] = how
    stat["keys_referenced"] = len(entries) - nwritten
    return entries, stat


_DIRECT_BLOCK = 4096  # O_DIRECT: buffer address, length and file offset multiples of the logical block size
_direct_refused: set[str] = set()  # directories whose filesystem refused O_DIRECT (tmpfs): buffered from then on


def _direct_ok(root: Path) -> bool:
    return hasattr(os, "O_DIRECT") and os.fspath(root) not in _direct_refused


def write_direct(path: Path, buf: memoryview, nbytes: int, *, fsync: bool = True) -> int:
    """``atomic_write`` of ``buf[:nbytes]`` with ``O_DIRECT``: the device reads the (page-aligned) buffer itself,
    no page-cache copy (the length is rounded up to 4 KiB and the file truncated back to ``nbytes``). Same crash
    consistency: a temporary name, fsync (the file's size and the disk's cache), rename, fsync of the directory.
    A filesystem that refuses O_DIRECT (EINVAL at open: tmpfs) gets ``atomic_write`` instead, now and later."""
    if nbytes > buf.nbytes:
        raise ValueError(f"nbytes {nbytes} exceeds the buffer's {buf.nbytes} bytes")
    padded = min(-(-nbytes // _DIRECT_BLOCK) * _DIRECT_BLOCK, buf.nbytes)
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}.direct")
    try:
        _point("open", tmp, 0)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        _direct_refused.add(os.fspath(path.parent.parent))
        return atomic_write(path, buf[:nbytes], fsync=fsync)
    written = 0
    try:
        try:
            while written < padded:
                written += os.write(fd, buf[written:padded])
            os.ftruncate(fd, nbytes)
            _point("write", tmp, nbytes)
            if fsync:
                _point("fsync", tmp, nbytes)
                os.fsync(fd)
        finally:
            os.close(fd)
        publish(tmp, path, nbytes, fsync=fsync)
    except BaseException as e:
        discard(tmp, path, written, e)
    return nbytes


def set_policy(policy: str, pid: int = 0) -> bool:
    """Scheduling of thread ``pid`` (0: the caller): "normal" (SCHED_OTHER), "batch" (SCHED_BATCH: no wake-up
    preemption of the running task) or "idle" (SCHED_IDLE: runs when a core has nothing else to run). Linux only;
    returns False where unsupported or refused."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    if not hasattr(os, "SCHED_BATCH"):
        return False
    pol = {"batch": os.SCHED_BATCH, "idle": getattr(os, "SCHED_IDLE", os.SCHED_BATCH)}.get(policy, os.SCHED_OTHER)
    try:
        os.sched_setscheduler(pid, pol, os.sched_param(0))
    except OSError:
        return False
    return True


def _idle_reversible() -> bool:
    """Whether this process may leave SCHED_IDLE again (root, or RLIMIT_NICE allows nice 0), tried in a
    throwaway thread (the policy is per thread)."""
    ok = []
    t = threading.Thread(target=lambda: ok.append(set_policy("idle") and set_policy("normal")))
    t.start()
    t.join()
    return bool(ok and ok[0])


def _layout(sizes: list[int]) -> tuple[list[int], int]:
    """64-byte aligned offsets of consecutive arrays of ``sizes`` bytes, and the total."""
    offs, off = [], 0
    for n in sizes:
        off += -off % ALIGN
        offs.append(off)
        off += n
    return offs, off


def _picklable(e: BaseException) -> bytes:
    try:
        data = pickle.dumps(e)
        pickle.loads(data)
        return data
    except Exception:  # noqa: BLE001 - an exception that does not survive pickling: its repr does
        return pickle.dumps(RuntimeError(f"{type(e).__name__}: {e}"))


def decode_error(reply: dict[str, Any], pid: int | None) -> BaseException:
    """The child's exception from a reply, its traceback attached as a note."""
    err: BaseException = pickle.loads(reply["error"])
    if hasattr(err, "add_note"):
        err.add_note(f"in the checkpoint writer process (pid {pid}):\n{reply.get('traceback', '')}")
    return err
