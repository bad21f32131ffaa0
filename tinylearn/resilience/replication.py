"""Peer replication of checkpoint shards in host memory: rank r keeps a copy of rank (r-1) % N's shard.

Writing a checkpoint to shared storage costs seconds to minutes; a copy in a neighbour's RAM costs one
point-to-point transfer (Gemini, SOSP'23; CheckFreq keeps the in-memory snapshot locally). ``replicate(payload)``
is called by every rank of the group with its own shard (bytes, or an array taken as raw bytes): each rank sends
its shard to rank (r+1) % N and receives rank (r-1) % N's (a ring: isend / irecv posted together, so no rank waits
on another's send). A header [nbytes, step, crc32] goes first; the received bytes are checked against the CRC.

When one rank fails and is replaced while the others keep running (torchft-style in-place recovery), its shard is
still in memory on rank (r+1) % N: every rank calls ``recover(lost_rank)``; the holder sends its copy, the
restarted rank receives it and restores without reading storage. One failure per neighbour pair is survivable
(rank r and r+1 failing together lose r's shard: that is what erasure-coded files on storage are for). A restart of
the whole job (torchrun's default) loses every copy: this layer complements storage checkpoints, never replaces them.

Failures never hang: every wait is bounded by ``timeout_s`` (and by the process group's own timeout, which
``tinylearn.dist.launch`` sets), and a failed or timed-out exchange raises RuntimeError naming this rank, the
operation and the peer rank (``tinylearn.dist.group.peer_failure``). gloo closes a connection whose operation timed
out, so pass a dedicated group (``dist.new_group(timeout=...)``) when the default group must stay usable after a
peer failure.

    rep = PeerReplicator(timeout_s=10)           # inside a rank function (tinylearn.dist.launch)
    rep.replicate(shard_bytes)                   # every rank, each step it wants protected
    ...                                          # rank 1 dies, a replacement starts with an empty replicator
    data = rep.recover(1)                        # every rank: rank 1 gets its bytes back from rank 2
"""

from __future__ import annotations

import time
import zlib
from datetime import timedelta
from typing import Any

import numpy as np

from .._inputs import is_real

__all__ = ["PeerReplicator"]


def _as_u8(payload: Any) -> np.ndarray:
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return np.frombuffer(payload, dtype=np.uint8)
    if isinstance(payload, np.ndarray):
        return np.ascontiguousarray(payload).reshape(-1).view(np.uint8)
    raise TypeError(f"payload: expected bytes or a numpy array, got {type(payload).__name__}")


class PeerReplicator:
    """Ring replication of one shard per rank in peer memory over ``torch.distributed`` (gloo)."""

    def __init__(self, group: Any = None, timeout_s: float = 30.0) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError("PeerReplicator: torch.distributed is not initialised (run under tinylearn.dist.launch)")
        if not is_real(timeout_s) or not timeout_s > 0:
            raise ValueError(f"timeout_s: expected a positive number of seconds, got {timeout_s!r}")
        self.group = group
        self.timeout_s = float(timeout_s)
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        if self.world_size < 2:
            raise ValueError(f"group: peer replication needs >= 2 ranks, got world size {self.world_size}")
        self.step = 0  # replicate() calls made by this replicator
        self.held: bytes | None = None  # the copy of rank (rank - 1) % N's shard
        self.held_step = -1  # its step number (the sender's count)

    @property
    def next_rank(self) -> int:
        return (self.rank + 1) % self.world_size

    @property
    def prev_rank(self) -> int:
        return (self.rank - 1) % self.world_size

    def _global(self, r: int) -> int:
        import torch.distributed as dist

        return r if self.group is None else dist.get_global_rank(self.group, r)

    def _wait(self, works: list[tuple[Any, str, int]], what: str, deadline: float) -> None:
        from ..dist.group import peer_failure

        for w, verb, peer in works:
            left = max(deadline - time.monotonic(), 1e-3)
            try:
                ok = w.wait(timedelta(seconds=left))
            except RuntimeError as e:
                raise peer_failure(f"{what}: {verb} rank {peer}", f"rank {self.rank}", e) from e
            if ok is False:
                raise RuntimeError(f"rank {self.rank}: {what}: {verb} rank {peer} timed out after {self.timeout_s} s")

    def _exchange(
        self, send: tuple[int, Any] | None, recv_from: int | None, header: np.ndarray | None, what: str
    ) -> tuple[np.ndarray | None, bytes | None]:
        """Post a header send/recv, wait, then the payload send/recv; returns (header, bytes) received."""
        import torch
        import torch.distributed as dist

        deadline = time.monotonic() + self.timeout_s
        works, hdr_in = [], None
        if recv_from is not None:
            hdr_in = torch.zeros(3, dtype=torch.int64)
            works.append((dist.irecv(hdr_in, self._global(recv_from), group=self.group), "receive from", recv_from))
        if send is not None:
            works.append(
                (dist.isend(torch.from_numpy(header), self._global(send[0]), group=self.group), "send to", send[0])
            )
        self._wait(works, what, deadline)
        works, buf = [], None
        if recv_from is not None and int(hdr_in[0]) > 0:
            buf = torch.empty(int(hdr_in[0]), dtype=torch.uint8)
            works.append((dist.irecv(buf, self._global(recv_from), group=self.group), "receive from", recv_from))
        if send is not None and int(header[0]) > 0:
            works.append((dist.isend(send[1], self._global(send[0]), group=self.group), "send to", send[0]))
        self._wait(works, what, deadline)
        if hdr_in is None:
            return None, None
        got = b"" if buf is None else buf.numpy().tobytes()
        if int(hdr_in[0]) >= 0 and zlib.crc32(got) != int(hdr_in[2]):
            raise RuntimeError(f"rank {self.rank}: {what}: the bytes received from rank {recv_from} fail their CRC-32")
        return hdr_in.numpy(), got

    def replicate(self, payload: bytes | bytearray | memoryview | np.ndarray) -> int:
        """Send this rank's shard to rank (r+1) % N, keep the one from rank (r-1) % N; every rank of the group calls
        it. Returns the number of bytes now held for the previous rank."""
        import torch

        a = _as_u8(payload)
        self.step += 1
        header = np.array([a.size, self.step, zlib.crc32(memoryview(a))], dtype=np.int64)
        data = torch.from_numpy(a.copy())
        hdr, got = self._exchange((self.next_rank, data), self.prev_rank, header, "replicate")
        self.held, self.held_step = got, int(hdr[1])
        return len(got)

    def recover(self, lost_rank: int) -> bytes | None:
        """Every rank calls it after ``lost_rank`` restarted: the holder (lost_rank + 1) % N sends its copy, which
        ``lost_rank`` returns; the holder returns it too, other ranks return None. RuntimeError if the holder has no
        copy or the peer fails / times out."""
        if not isinstance(lost_rank, (int, np.integer)) or not 0 <= int(lost_rank) < self.world_size:
            raise ValueError(f"lost_rank: expected a rank in 0..{self.world_size - 1}, got {lost_rank!r}")
        lost = int(lost_rank)
        holder = (lost + 1) % self.world_size
        if self.rank == holder:
            import torch

            held = self.held if self.held is not None else b""
            n = len(held) if self.held is not None else -1
            header = np.array([n, self.held_step, zlib.crc32(held)], dtype=np.int64)
            data = torch.from_numpy(np.frombuffer(held, dtype=np.uint8).copy())
            self._exchange((lost, data), None, header, f"recover rank {lost}")
            if self.held is None:
                raise RuntimeError(f"rank {self.rank}: recover: holds no copy of rank {lost} (replicate never ran)")
            return self.held
        if self.rank == lost:
            hdr, got = self._exchange(None, holder, None, f"recover rank {lost}")
            if int(hdr[0]) < 0:
                raise RuntimeError(f"rank {self.rank}: recover: rank {holder} holds no copy of rank {lost}")
            return got
        return None
