"""``tinylearn bench resilience``: checkpoint save/load, the training stall of sync vs async checkpoints, erasure
coding vs replication, and recovery after a SIGKILL under torchrun.

Four tables, every timing through the shared harness (warm-up, median of repeats):

    save / load        one process's state (four fp32 tensors): tinylearn ``save_sharded`` / ``load_sharded`` (with
                       and without fsync / crc) vs ``torch.save`` / ``torch.load`` vs torch DCP vs tinygrad's
                       ``safe_save`` / ``safe_load`` (bench_storage.py); bytes on disk in each save row's extra.
    checkpoint stall   a training cycle (one save + SGD steps) of a torch MLP: no checkpoint, torch.save,
                       tinylearn sync, tinylearn async (the writer process), tinylearn async (thread), torch DCP
                       ``async_save`` (bench_async.py). Stall = the training loop's extra time per checkpoint (in the
                       save call + the slower steps after it + the wait for the rest of the write). Goal of issue 43:
                       the async stall <= 10 % of a synchronous save's; a note gives the measured ratio and whether
                       the goal was met (reported, not asserted). Measured on the shared 2-core VM (8 MiB): 0.15-0.40
                       with the writer process, 0.06-0.45 with the thread, the bench's noise (+-2 ms) as large as the
                       goal; the remaining stall is the copy (~0.5 ms) and the writer's CPU (2.7-4 ms per save: crc32,
                       O_DIRECT write, fsyncs) and cache traffic competing with training on busy cores.
    erasure coding     Reed–Solomon encode / decode throughput (C++ split-nibble kernel vs numpy) and the file-level
                       protect / repair beside replication: r full copies of every file and their restore (time,
                       bytes written / read), and PeerReplicator's in-memory copy to a neighbour (2 processes);
                       the notes give the storage overhead of r parity files vs r full replicas.
    recovery           torchrun kill-and-resume (2 ranks, rank 1 SIGKILLed mid-step): kill -> first step after the
                       restart, and its parts; the measured checkpoint cost C.

tinygrad has a flat safetensors save/load and nothing else here (no sharding, async writes, erasure coding or
elastic restart): its rows appear in the save/load table only, and the other tables say so in a note.
Default sizes run in about a minute on 2 cores; ``full=True`` uses larger states and more repeats.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any

from ..bench import Table
from ..bench.table import Row

TINYGRAD_NA = "tinygrad: n/a (no sharded, async or erasure-coded checkpoints, no elastic restart; only safe_save)"


def sizes(full: bool = False) -> dict[str, Any]:
    """Default (or full) sizes; every key can be overridden in the table functions."""
    if full:
        return dict(save_bytes=(1 << 20, 16 << 20, 64 << 20), save_repeat=7, async_mb=64.0, async_repeat=5,
                    async_steps=24, ec_bytes=32 << 20, ec_k=8, ec_r=3, ec_repeat=7, ec_peer=True,
                    recovery_repeats=3)  # fmt: skip
    return dict(save_bytes=(1 << 20, 16 << 20), save_repeat=3, async_mb=8.0, async_repeat=3, async_steps=24,
                ec_bytes=8 << 20, ec_k=4, ec_r=2, ec_repeat=5, ec_peer=True, recovery_repeats=1)  # fmt: skip


def _say(progress: Callable[[str], None] | None, msg: str) -> None:
    if progress is not None:
        progress(msg)


def save_load_table(full: bool = False, progress: Callable[[str], None] | None = None, **kw: Any) -> Table:
    from .bench_storage import bench_save_load

    s = {**sizes(full), **kw}
    _say(progress, "resilience: save/load")
    return bench_save_load(tuple(s["save_bytes"]), repeat=s["save_repeat"])


def stall_table(full: bool = False, progress: Callable[[str], None] | None = None, **kw: Any) -> Table:
    from .bench_async import bench_async

    s = {**sizes(full), **kw}
    _say(progress, "resilience: checkpoint stall")
    from .bench_async import stall_ratio

    t = Table(f"training stall per checkpoint ({s['async_mb']:g} MiB MLP state)", baseline="no checkpoint")
    rows = bench_async(s["async_mb"], steps_between=s["async_steps"], repeat=s["async_repeat"])
    for r in rows:
        t.add(r)
    ratio = stall_ratio(rows)
    t.notes.append(
        f"goal: async stall <= 10% of the synchronous save's; measured {ratio:.0%} "
        f"({'met' if ratio <= 0.10 else 'not met'} on this run: the writer's CPU work competes with training on "
        "busy cores)"
    )
    t.notes.append(TINYGRAD_NA)
    return t


def erasure_table(full: bool = False, progress: Callable[[str], None] | None = None, **kw: Any) -> Table:
    from .ec_files import bench_erasure, overhead_rows

    s = {**sizes(full), **kw}
    _say(progress, "resilience: erasure coding")
    n, k, r = s["ec_bytes"], s["ec_k"], s["ec_r"]
    t = Table(f"Reed-Solomon k={k} r={r} over {n / 2**20:g} MiB vs replication", baseline="numpy")
    rows = bench_erasure(n, k=k, r=r, repeat=s["ec_repeat"])
    base = {row["what"]: row["seconds"] for row in rows if row["backend"] == "numpy"}
    ec_files = {
        row["what"]: row["seconds"] for row in rows if "bytes_written" in row and row["backend"] != "replication"
    }
    for row in rows:
        ratio = row["seconds"] / base[row["what"]] if row["what"] in base else None
        extra = {key: row[key] for key in ("bytes_written", "bytes_read") if key in row}
        if row["backend"] == "replication" and row["what"] in ec_files:
            extra["time_vs_erasure_coding"] = row["seconds"] / ec_files[row["what"]]
        t.add(Row(row["what"], row["backend"], row["seconds"] * 1e3, ratio=ratio, gbps=row["MB_s"] / 1e3,
                  note="GB/s of data", extra=extra))  # fmt: skip
    if s["ec_peer"]:
        t.add(_peer_row(-(-n // k), s["ec_repeat"]))
    for o in overhead_rows(n, k, tuple(range(1, r + 1))):
        t.notes.append(
            f"survive {o['tolerated']} lost file(s): erasure coding stores {o['ec_overhead']:.0%} extra, "
            f"replication {o['replication_overhead']:.0%}"
        )
    t.notes.append(
        "file rows: bytes_written / bytes_read per protect or repair; replication = r full copies of every file "
        "(atomic_write, fsync, as protect writes parity); a repair by replication copies the lost files back"
    )
    t.notes.append(TINYGRAD_NA)
    return t


def _peer_row(shard_bytes: int, repeat: int) -> Row:
    """In-memory peer replication (PeerReplicator's ring, 2 processes over gloo): one rank's shard to its
    neighbour, median seconds of an exchange (process start-up not included)."""
    from ..dist.launch import launch
    from .replication_workers import replicate_timed

    res = launch(replicate_timed, 2, shard_bytes, repeat, timeout_s=120)
    if not all(r["held_ok"] for r in res):
        raise RuntimeError("peer replication: a rank holds bytes that are not its neighbour's shard")
    sec = max(r["seconds"] for r in res)
    return Row(f"replicate 1 shard to a peer ({shard_bytes / 2**20:.2g} MiB)", "PeerReplicator (gloo, 2 ranks)",
               sec * 1e3, gbps=shard_bytes / sec / 1e9, note="GB/s of shard; host memory, no storage",
               extra={"bytes_sent_per_rank": shard_bytes})  # fmt: skip


def recovery_table(full: bool = False, progress: Callable[[str], None] | None = None, **kw: Any) -> Table:
    from .drills import bench_recovery

    s = {**sizes(full), **kw}
    _say(progress, "resilience: recovery after SIGKILL (torchrun)")
    t = Table("recovery after a SIGKILL under torchrun (ms)", baseline="recovery: kill -> first step after restart")
    with tempfile.TemporaryDirectory(prefix="tl-bench-recovery-") as wd:
        for row in bench_recovery(wd, repeats=s["recovery_repeats"]):
            t.add(row)
    t.notes.append(TINYGRAD_NA)
    return t


def run(full: bool = False, progress: Callable[[str], None] | None = None) -> list[Table]:
    return [
        save_load_table(full, progress),
        stall_table(full, progress),
        erasure_table(full, progress),
        recovery_table(full, progress),
    ]
