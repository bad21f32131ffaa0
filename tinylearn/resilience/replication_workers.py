"""Rank functions for ``tinylearn.dist.launch`` exercising PeerReplicator (importable: spawned ranks unpickle them).

Each returns plain data the parent checks: the tests (tests/resilience/test_replication.py) and notebook 15.
"""

from __future__ import annotations

import os
import time
import zlib
from datetime import timedelta
from typing import Any

import numpy as np

from .replication import PeerReplicator


def _shard(rank: int, nbytes: int) -> bytes:
    return np.random.default_rng(1000 + rank).integers(0, 256, nbytes + 17 * rank, dtype=np.uint8).tobytes()


def replicate_and_restore(nbytes: int, lost_rank: int, timeout_s: float = 10.0) -> dict[str, Any]:
    """Every rank replicates its shard; then ``lost_rank`` "restarts" (a fresh replicator, its shard forgotten) and
    gets it back from its peer. Returns crc32s and timings."""
    import torch.distributed as dist

    rank = dist.get_rank()
    mine = _shard(rank, nbytes)
    rep = PeerReplicator(timeout_s=timeout_s)
    t0 = time.perf_counter()
    held = rep.replicate(mine)
    t_rep = time.perf_counter() - t0
    held_crc = zlib.crc32(rep.held or b"")
    if rank == lost_rank:  # the restart: memory gone
        mine_crc = zlib.crc32(mine)
        del mine
        rep = PeerReplicator(timeout_s=timeout_s)
    else:
        mine_crc = zlib.crc32(mine)
    t0 = time.perf_counter()
    got = rep.recover(lost_rank)
    t_rec = time.perf_counter() - t0
    return {
        "rank": rank,
        "held_bytes": held,
        "held_crc": held_crc,
        "mine_crc": mine_crc,
        "expected_prev_crc": zlib.crc32(_shard((rank - 1) % dist.get_world_size(), nbytes)),
        "recovered_crc": None if got is None else zlib.crc32(got),
        "replicate_s": t_rep,
        "recover_s": t_rec,
    }


def replicate_with_silent_peer(silent_rank: int, timeout_s: float, mode: str = "hang") -> dict[str, Any]:
    """``silent_rank`` never joins the exchange (mode "hang": sleeps past the timeout, a stuck peer); the others
    must raise RuntimeError naming a rank within ``timeout_s``. Returns {rank, error, elapsed_s}."""
    import torch.distributed as dist

    rank = dist.get_rank()
    # a dedicated group: gloo closes a pair whose operation timed out, which must not break the default group
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    if rank == silent_rank:
        time.sleep(timeout_s + 1.0 if mode == "hang" else 0.0)
        return {"rank": rank, "error": None, "elapsed_s": 0.0}
    rep = PeerReplicator(group=group, timeout_s=timeout_s)
    t0 = time.monotonic()
    try:
        rep.replicate(_shard(rank, 1000))
        err = None
    except RuntimeError as e:
        err = str(e)
    return {"rank": rank, "error": err, "elapsed_s": time.monotonic() - t0}


def replicate_with_dead_peer(dead_rank: int, timeout_s: float) -> int:
    """``dead_rank`` dies (os._exit) before replicating; the others' replicate must fail, not hang."""
    import torch.distributed as dist

    if dist.get_rank() == dead_rank:
        os._exit(7)
    PeerReplicator(timeout_s=timeout_s).replicate(b"x" * 100)
    return dist.get_rank()


def replicate_timed(nbytes: int, repeat: int = 5, timeout_s: float = 30.0) -> dict[str, Any]:
    """Every rank replicates an ``nbytes`` shard to its ring neighbour ``repeat`` times (after one warm-up): the
    median seconds of one exchange on this rank, the bytes it sent and whether the copy it holds is its
    neighbour's shard (crc32)."""
    import statistics

    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    mine = np.random.default_rng(1000 + rank).integers(0, 256, nbytes, dtype=np.uint8).tobytes()
    rep = PeerReplicator(timeout_s=timeout_s)
    rep.replicate(mine)
    times = []
    for _ in range(repeat):
        dist.barrier()
        t0 = time.perf_counter()
        rep.replicate(mine)
        times.append(time.perf_counter() - t0)
    prev = np.random.default_rng(1000 + (rank - 1) % world).integers(0, 256, nbytes, dtype=np.uint8).tobytes()
    return {"seconds": statistics.median(times), "bytes_sent": nbytes, "held_ok": rep.held == prev}
