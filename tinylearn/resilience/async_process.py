"""The writer process of ``AsyncCheckpointer(writer="process")`` (async_ckpt.py): shared-memory snapshots, one
long-lived child that writes them with ``async_writer.write_checkpoint``.

**The writer process** (``ProcessWriter`` on the caller's side, ``child_main`` in the child): one long-lived child
started with ``subprocess`` (``python -m tinylearn.resilience.async_process FD``: a fresh interpreter that imports
numpy and this package's standard-library-only checkpoint modules, never torch; no ``fork`` of a process whose
torch/OpenMP threads may hold locks, and no re-import of the caller's ``__main__`` as multiprocessing's "spawn"
does). It talks over a Unix socket pair (``multiprocessing.connection.Connection`` framing). ``save`` copies the
changed tensors into a **shared-memory buffer** (a file in ``/dev/shm`` mapped by both processes, ``MAP_POPULATE``d
when created) and sends a small message: the step, ``key -> (offset, nbytes, dtype, shape)``, the versions and the
manifest's objects as JSON. A pool of ``max_pending`` buffers is reused (a snapshot is copied only after a slot is
free, so ``max_pending`` suffice); a buffer too small for a grown state is replaced by a larger one (1/8 headroom),
so steady-state saves write into pages that are already mapped -- no page faults in the copy. The child maps each
buffer read-only once, checksums and writes straight from it, and replies ``(write_s, bytes, entries | error)``;
a reader thread in the child takes the messages off the socket as they come.

The caller reads the replies in ``save``/``wait``/``close`` (no thread on the caller's side); a blocking wait polls
the socket with a 50 ms timeout and checks that the child is alive, so a writer that died (SIGKILL, OOM) raises
``WriterDied`` naming its pid and exit code instead of hanging; the next ``save`` starts a new writer, which resumes
from the newest manifest on disk. An error in the child is pickled back (its traceback added as a note) and raised
by the next call, as with the thread; the child drops every snapshot of the failed *epoch* (those submitted before
the caller saw the error). A child whose caller died (its socket reads EOF) unlinks the buffers and exits.

**Priority**: the child waits for work and writes under ``SCHED_BATCH`` (``DEFAULT_POLICY``; "normal" and "idle"
were measured too, see async_ckpt.py): woken by ``save`` or by an I/O completion it does not preempt the training
thread. With "idle", a caller that must wait for the writer raises it to the normal policy (``boost``).

**Fault drills**: a crash point installed in the caller (``atomic.set_crash_point``) when the writer starts is
forwarded: the child sends each event to the caller, which runs the hook (a drill SIGKILLs itself) and answers; a
child whose caller died there exits at once, as if killed at the same point.

"""

from __future__ import annotations

import collections
import errno
import json
import mmap
import os
import pickle
import queue
import select
import socket
import struct
import subprocess
import sys
import threading
import traceback
import uuid
from collections.abc import Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from . import atomic
from .async_writer import (
    DEFAULT_POLICY,
    POLICIES,
    ArrayBytes,
    WriterDied,
    _idle_reversible,
    _layout,
    _picklable,
    set_policy,
    write_checkpoint,
)
from .atomic import CheckpointError, _unlink_quiet

POLL_S = 0.05  # a blocking wait checks the child's liveness this often


def _shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else _tempdir()


def _tempdir() -> str:
    import tempfile

    return tempfile.gettempdir()


class _ShmBuffer:
    """A shared-memory file (``/dev/shm``) mapped read-write, its pages populated at creation."""

    def __init__(self, size: int) -> None:
        self.size = max(mmap.PAGESIZE, -(-size // mmap.PAGESIZE) * mmap.PAGESIZE)
        self.path = os.path.join(_shm_dir(), f"tl-async-ckpt-{os.getpid()}-{uuid.uuid4().hex[:12]}")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, self.size)
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            self.mm = mmap.mmap(fd, self.size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            _unlink_quiet(self.path)
            raise
        finally:
            os.close(fd)

    def close(self) -> None:
        _unlink_quiet(self.path)
        try:
            self.mm.close()
        except BufferError:  # a view still exists somewhere: the mapping goes when it does
            pass


class _Channel:
    """The caller's end of the socket pair, in ``multiprocessing.connection.Connection``'s framing (a big-endian
    int32 length, or -1 and a uint64 one, then a pickle) as the child's ``Connection`` expects. Non-blocking: one
    ``recv`` reads the replies that are there; a send that would block reads replies meanwhile, so a large message
    (many keys) never deadlocks against a child blocked sending its reply."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.setblocking(False)
        self.poller = select.poll()
        self.poller.register(sock.fileno(), select.POLLIN)
        self.buf = bytearray()
        self.msgs: collections.deque[Any] = collections.deque()

    def send(self, obj: Any, alive: Any) -> None:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        n = len(data)
        head = struct.pack("!i", n) if n <= 0x7FFFFFFF else struct.pack("!iQ", -1, n)
        view = memoryview(head + data)
        while view.nbytes:
            try:
                view = view[self.sock.send(view) :]
            except BlockingIOError:
                self._fill()  # the child may be blocked sending us a reply
                select.select([], [self.sock], [], POLL_S)
                if not alive():
                    raise BrokenPipeError(errno.EPIPE, "the writer process exited") from None

    def _fill(self) -> None:
        """Read what is there (EOFError at the end of the stream) and unpickle the complete messages."""
        while True:
            try:
                chunk = self.sock.recv(1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                raise EOFError("the writer process closed its end")
            self.buf += chunk
            if len(chunk) < 1 << 16:
                break
        while len(self.buf) >= 4:
            (n,) = struct.unpack_from("!i", self.buf)
            head = 4
            if n == -1:
                if len(self.buf) < 12:
                    break
                (n,) = struct.unpack_from("!Q", self.buf, 4)
                head = 12
            if len(self.buf) < head + n:
                break
            self.msgs.append(pickle.loads(memoryview(self.buf)[head : head + n]))
            del self.buf[: head + n]

    def get(self, timeout: float) -> Any:
        """The next message, waiting up to ``timeout`` s; None when there is none."""
        if not self.msgs:
            self._fill()
            if not self.msgs and timeout > 0 and self.poller.poll(timeout * 1e3):
                self._fill()
        return self.msgs.popleft() if self.msgs else None

    def close(self) -> None:
        self.sock.close()


class ProcessWriter:
    """The caller's side of the writer process: shared-memory buffers, the socket, the replies in flight."""

    def __init__(
        self, root: Path, *, fsync: bool, full_every: int, max_pending: int, policy: str | None = None
    ) -> None:
        policy = DEFAULT_POLICY if policy is None else policy
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        self.root, self.fsync, self.full_every, self.policy = root, fsync, full_every, policy
        self.max_pending = max_pending
        self.proc: subprocess.Popen[bytes] | None = None
        self.conn: _Channel | None = None
        self.pool: list[_ShmBuffer | None] = [None] * max_pending
        self.busy = [False] * max_pending
        self.inflight: dict[int, tuple[dict[str, Any], int | None]] = {}  # seq -> (stat, buffer slot)
        self.epoch = 0
        self.seq = 0

    # -- process lifetime ----------------------------------------------------------------------------------------
    def start(self, committed: dict[str, dict[str, Any]]) -> None:
        """Start the child (a fresh interpreter); it resumes from ``committed`` (the last successful checkpoint)."""
        parent, child = socket.socketpair()
        pkg_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("OMP_NUM_THREADS", "1")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tinylearn.resilience.async_process", str(child.fileno())],
                pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, env=env, start_new_session=True,
            )  # fmt: skip
        finally:
            child.close()
        self.conn = _Channel(parent)
        init = {"root": str(self.root), "fsync": self.fsync, "full_every": self.full_every, "policy": self.policy}
        init["crash_points"] = atomic._crash_point is not None  # a fault drill: forward them (see _forward_point)
        self.conn.send({**init, "committed": committed}, self._alive)

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def close(self, timeout: float = 60.0) -> None:
        """Stop the child (after the writes it has: call ``drain`` first) and free the buffers."""
        try:
            if self.proc is not None and self.proc.poll() is None and self.conn is not None:
                try:
                    self.conn.send(None, self._alive)
                except OSError:
                    pass
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        finally:
            if self.conn is not None:
                self.conn.close()
            self.proc, self.conn = None, None
            for b in self.pool:
                if b is not None:
                    b.close()
            self.pool = [None] * self.max_pending
            self.busy = [False] * self.max_pending

    def _died(self) -> WriterDied:
        """The child is gone: forget what was in flight (marked dropped), free the buffers, return the error."""
        proc = self.proc
        rc = None
        if proc is not None:
            try:
                rc = proc.wait(5.0)
            except subprocess.TimeoutExpired:  # its socket broke but it lives on: end it
                proc.kill()
                rc = proc.wait()
        how = f"killed by signal {-rc}" if rc is not None and rc < 0 else f"exit code {rc}"
        pending = sorted(s["step"] for s, _ in self.inflight.values())
        for stat, _ in self.inflight.values():
            stat["dropped"] = True
        self.inflight.clear()
        pid = proc.pid if proc is not None else None
        self.proc = None  # close() below must not talk to it
        self.close()
        return WriterDied(
            f"{self.root}: the checkpoint writer process (pid {pid}) died ({how}, exit code {rc}); "
            f"snapshots of steps {pending} may not have been written; the next save starts a new writer"
        )

    # -- snapshots -----------------------------------------------------------------------------------------------
    def buffer_for(self, nbytes: int) -> tuple[int, _ShmBuffer]:
        """A free buffer slot of >= ``nbytes`` bytes (replaced by a larger one when too small)."""
        free = [i for i in range(self.max_pending) if not self.busy[i]]
        if not free:
            raise RuntimeError("no free snapshot buffer: a slot must be acquired before the copy")
        fits = [i for i in free if self.pool[i] is not None and self.pool[i].size >= nbytes]  # type: ignore[union-attr]
        if fits:
            i = min(fits, key=lambda j: self.pool[j].size)  # type: ignore[union-attr]
        else:
            i = free[0]
            if self.pool[i] is not None:
                self.pool[i].close()  # type: ignore[union-attr]
                self.pool[i] = None
            self.pool[i] = _ShmBuffer(nbytes + nbytes // 8)
        return i, self.pool[i]  # type: ignore[return-value]

    def snapshot(
        self,
        arrays: dict[str, np.ndarray],
        vers: dict[str, int | None],
        objects: dict[str, Any],
        meta: Mapping[str, Any] | None,
        step: int,
        full: bool,
        since: int,
    ) -> tuple[dict[str, Any], int | None]:
        """Copy the changed arrays into a free shared-memory buffer; the message for the writer process."""
        offs, total = _layout([a.nbytes for a in arrays.values()])
        layout: dict[str, tuple[int, int, str, list[int]]] = {}
        slot = None
        if arrays:
            slot, buf = self.buffer_for(total)
            end = 0
            for (k, a), off in zip(arrays.items(), offs, strict=True):
                if off > end:  # the 64-byte alignment gap: zeros, as in data.bin (the writer may write the buffer)
                    buf.mm[end:off] = bytes(off - end)
                if a.nbytes:
                    np.copyto(np.ndarray(a.shape, a.dtype, buffer=buf.mm, offset=off), a, casting="no")
                layout[k] = (off, a.nbytes, a.dtype.str, list(a.shape))
                end = off + a.nbytes
        msg: dict[str, Any] = {"step": step, "versions": vers, "arrays": layout, "full": full, "since_full": since}
        try:  # the manifest's JSON part; a value JSON cannot hold fails the write, as in the writer thread
            msg["json"] = json.dumps({"objects": objects, "meta": dict(meta or {})})
        except (TypeError, ValueError) as e:
            msg["fail"] = e
        return msg, slot

    def submit(self, msg: dict[str, Any], stat: dict[str, Any], slot: int | None) -> None:
        """Send one snapshot (its arrays already copied into buffer ``slot``). Raises WriterDied if the child is
        gone (the snapshot is then not in flight)."""
        self.seq += 1
        msg.update(seq=self.seq, epoch=self.epoch)
        if slot is not None:
            b = self.pool[slot]
            msg["buf"] = (slot, b.path, b.size)  # type: ignore[union-attr]
            self.busy[slot] = True
        self.inflight[self.seq] = (stat, slot)
        try:
            assert self.conn is not None
            self.conn.send(msg, self._alive)
        except OSError:
            raise self._died() from None

    def _forward_point(self, point: tuple[str, str, int]) -> None:
        """A crash point of the child's atomic writes, run here (a drill's hook SIGKILLs this process: the child
        then reads EOF and exits at once, as if killed at the same point). The child waits for the answer."""
        answer: dict[str, Any] = {"ack": True}
        try:
            atomic._point(point[0], Path(point[1]), point[2])
        except Exception as e:  # noqa: BLE001 - the child raises it in its write
            answer["raise"] = f"{type(e).__name__}: {e}"
        assert self.conn is not None
        self.conn.send(answer, self._alive)

    def _alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def boost(self) -> bool:
        """Let the writer run under the normal policy until its current snapshot is written."""
        return self.proc is not None and set_policy("normal", self.proc.pid)

    def poll(self, block_until_below: int | None, on_reply: Any) -> WriterDied | None:
        """Read the replies that are there; with ``block_until_below`` = n, wait until fewer than n snapshots are
        in flight. ``on_reply(reply, stat)`` handles each. Returns WriterDied when the child is gone."""
        boosted = False
        idle = not self.inflight
        while True:
            if not self.inflight:  # nothing (more) pending; a writer that died idle is still reported
                dead = idle and self.proc is not None and self.proc.poll() is not None
                return self._died() if dead else None
            must_wait = block_until_below is not None and len(self.inflight) >= block_until_below
            assert self.conn is not None and self.proc is not None
            if must_wait and self.policy == "idle" and not boosted:
                boosted = self.boost()  # the caller waits for the writer: it may not wait for idle cores
            try:
                reply = self.conn.get(POLL_S if must_wait else 0)
                if reply is None:
                    boosted = False  # re-assert after each timeout (the child resets its policy per snapshot)
                    if must_wait and not self._alive() and self.conn.get(0) is None:
                        return self._died()
                    if not must_wait:
                        return None
                    continue
                if "point" in reply:
                    self._forward_point(reply["point"])
                    continue
            except (OSError, EOFError):
                return self._died()
            stat, slot = self.inflight.pop(reply["seq"])
            if slot is not None:
                self.busy[slot] = False
            on_reply(reply, stat)


# -- the child -----------------------------------------------------------------------------------------------------
def child_main(fd: int) -> None:
    """The writer process: receive snapshots, write them (``write_checkpoint``), reply; exit on None or EOF."""
    conn = Connection(fd)
    try:
        init = conn.recv()
    except EOFError:
        return
    root, fsync, full_every = Path(init["root"]), init["fsync"], init["full_every"]
    committed: dict[str, dict[str, Any]] = init["committed"]
    policy = init["policy"]
    if policy == "idle" and not _idle_reversible():
        policy = "normal"  # a writer stuck in SCHED_IDLE could starve while the caller waits for it
    maps: dict[int, tuple[str, mmap.mmap]] = {}  # buffer slot -> (path, read-only mapping)
    failed_epoch: int | None = None
    orphaned = False
    inbox: queue.Queue[Any] = queue.Queue()
    acks: queue.Queue[Any] = queue.Queue()  # answers to forwarded crash points
    eof = object()

    def reader() -> None:
        """Receive messages as they come, so the caller's send never waits for a write to finish (a caller blocked
        in send while the writer is blocked sending it a reply would deadlock)."""
        set_policy("batch")  # woken by save() under SCHED_BATCH: the training thread keeps its core
        while True:
            try:
                m = conn.recv()
            except (EOFError, OSError):
                acks.put(eof)
                inbox.put(eof)
                return
            (acks if isinstance(m, dict) and "ack" in m else inbox).put(m)
            if m is None:
                return

    threading.Thread(target=reader, name="tl-async-ckpt-reader", daemon=True).start()
    if init.get("crash_points"):

        def forward(event: str, path: Path, n: int) -> None:
            conn.send({"point": (event, os.fspath(path), int(n))})
            answer = acks.get()
            if answer is eof:  # the caller died at this point (a drill's SIGKILL): so does the writer
                for buf_path, _ in maps.values():
                    _unlink_quiet(buf_path)
                os._exit(1)
            if "raise" in answer:
                raise CheckpointError(f"crash point {event}: {answer['raise']}")

        atomic.set_crash_point(forward)
    while True:
        set_policy("batch")
        msg = inbox.get()
        if msg is eof:
            orphaned = True  # the caller died without close(): nobody else will unlink the buffers
            break
        set_policy(policy)  # write under it (the caller raises a waited-for "idle" writer to "normal": boost())
        if msg is None:
            break
        reply: dict[str, Any] = {"seq": msg["seq"], "stat": {}}
        if msg["epoch"] == failed_epoch:  # submitted before the caller saw the failure: may reference its files
            reply["dropped"] = True
            conn.send(reply)
            continue
        try:
            if "fail" in msg:
                raise msg["fail"]
            arrays: dict[str, ArrayBytes] = {}
            direct = None
            if msg.get("buf") is not None:
                slot, path, size = msg["buf"]
                if slot not in maps or maps[slot][0] != path:
                    if slot in maps:
                        _close_map(maps.pop(slot)[1])
                    with open(path, "rb") as f:
                        maps[slot] = (path, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ))
                view = memoryview(maps[slot][1])
                for k, (off, n, dtype, shape) in msg["arrays"].items():
                    arrays[k] = (view[off : off + n], dtype, tuple(shape))
                direct = (view, {k: a[0] for k, a in msg["arrays"].items()})
            extra = json.loads(msg["json"])
            entries, stat = write_checkpoint(
                root, msg["step"], msg["versions"], arrays, extra["objects"], extra["meta"], msg["full"],
                msg["since_full"], committed, fsync=fsync, full_every=full_every, direct=direct,
            )  # fmt: skip
            arrays.clear()
            view = direct = None  # type: ignore[assignment]
            committed = entries
            stat["policy"] = policy
            reply.update(stat=stat, entries=entries)
        except BaseException as e:  # noqa: BLE001 - sent to the caller, raised there
            failed_epoch = msg["epoch"]
            reply["error"] = _picklable(e)
            reply["traceback"] = traceback.format_exc()
        try:
            conn.send(reply)
        except OSError:
            orphaned = True
            break
    for path, mm in maps.values():
        if orphaned:
            _unlink_quiet(path)
        _close_map(mm)


def _close_map(mm: mmap.mmap) -> None:
    try:
        mm.close()
    except BufferError:
        pass


if __name__ == "__main__":
    child_main(int(sys.argv[1]))
