# %% [markdown]
# # 15 · Resilient training: checkpoints that survive crashes, erasure coding, elastic restart under torchrun
#
# Large training runs fail: with thousands of nodes the cluster's mean time between failures is hours, and every
# failure throws away the work since the last checkpoint. This notebook builds the machinery that makes a failure
# cost minutes instead of a restart from scratch, on real processes and the real launcher (`torch.distributed`,
# `torchrun`), with `tinylearn.resilience`:
#
# * **how often** to checkpoint (failure math, Young/Daly with the checkpoint cost *measured*), §1;
# * **what** a checkpoint is: per-rank shards + a manifest committed last, resharding to another world size, crash
#   consistency when the writer is killed at any byte, save/load time vs `torch.save`, torch DCP and tinygrad, §2–5;
# * **cheaper** checkpoints: asynchronous writes, versions and deltas, XOR-diffs, tier migration under updates, §6–9;
# * **surviving lost files**: Reed–Solomon erasure coding (a C++ GF(2^8) kernel) and peer replication, §10–13;
# * **elastic restart**: a rank SIGKILLed mid-step under `torchrun --max-restarts`, resumed bitwise; live resharding
#   vs restart, §14–17;
# * **failure-aware schedules**: stragglers and bounded staleness, pipeline replay after a stage failure,
#   risk-triggered migration, redundancy under a budget, §18–21.
#
# Everything labelled MODEL (synthetic failure traces, telemetry, the large-cluster MTBF) is a model; everything else
# is measured here. This VM has no power, frequency or cgroup controls, so nothing here throttles or caps a device.
#
# **Interview questions**: [Q109] pipeline stage failure and minimal replay · [Q120] incremental + asynchronous
# checkpoints · [Q134] re-sharding optimizer state when the world size changes · [Q157] k shards + r parity ·
# [Q177] risk-triggered proactive migration · [Q179] tier migration under live updates · [Q185] stale gradients ·
# [Q191] redundancy under a budget · [Q207] the checkpoint interval from the failure rate · [Q225] XOR-diff
# activation checkpoints.

# %%
import tinylearn  # noqa: F401 -- first: its short OpenMP spin-wait is set before torch loads libgomp (notebook 00)

# isort: split
import itertools
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch

from tinylearn import backends
from tinylearn.bench import measure, tinygrad_status
from tinylearn.bench.plots import plot_table
from tinylearn.dist import launch
from tinylearn.parallel.reshard import reshard_plan
from tinylearn.parallel.zero_sharding import shard_bounds
from tinylearn.resilience import (
    drills,
    ec_files,
    elastic,
    erasure,
    faults,
    incremental,
    replication_workers,
    risk,
    tier_log,
)
from tinylearn.resilience import elastic_workers as ew
from tinylearn.resilience import failure_math as fm
from tinylearn.resilience import pipeline_replay as pr
from tinylearn.resilience import redundancy as rd
from tinylearn.resilience import storage_workers as sw
from tinylearn.resilience import stragglers as st
from tinylearn.resilience.async_ckpt import AsyncCheckpointer, load_async, torch_versions
from tinylearn.resilience.atomic import CorruptCheckpoint
from tinylearn.resilience.bench_async import bench_async, delta_bytes, stall_ratio, xor_activation_ratios
from tinylearn.resilience.bench_storage import bench_save_load
from tinylearn.resilience.incremental import DeltaCheckpointer, XorChain, compact, restore, xor_apply
from tinylearn.resilience.sharded import (
    Shard,
    latest_checkpoint,
    list_checkpoints,
    load_sharded,
    read_manifest,
    save_sharded,
    step_dir,
)
from tinylearn.resilience.tier_log import TieredShard, apply_all

torch.set_num_threads(1)
t_start = time.perf_counter()
work = Path(tempfile.mkdtemp(prefix="tl15_elastic_"))

# %% [markdown]
# ## 1. How often a big cluster fails, and how often to checkpoint [Q207]
#
# **Answer.** With N nodes failing independently (exponential lifetimes, node MTBF M), the first failure is the
# minimum of N exponentials: the cluster's MTBF is M / N and a job of length T runs through without a failure with
# probability exp(−N·T/M). Checkpointing every τ seconds of work at a cost of δ seconds, each segment takes
# (M_c + R)·(e^((τ+δ)/M_c) − 1) in expectation (M_c the cluster MTBF, R the restart); minimising the cost per second of
# work gives Young's τ ≈ sqrt(2·δ·M_c) to first order, Daly's (2006) higher-order
# τ = sqrt(2δM)·[1 + ⅓·sqrt(δ/2M) + ⅑·δ/2M] − δ, and the exact root of e^((τ+δ)/M)·(τ/M − 1) + 1 = 0.
# `tl.resilience.failure_math` (reusing `parallel.checkpoint_interval`'s Young/Daly and simulator). The node MTBF
# (5 years) and cluster sizes are a **MODEL**; δ is **measured**: a real 32 MiB `atomic_write` (tmp, fsync, rename,
# fsync of the directory) on this machine's disk.

# %%
# NBVAL_IGNORE_OUTPUT
YEAR, DAY = 365 * 24 * 3600.0, 24 * 3600.0
ns = np.array([1, 8, 64, 512, 1024, 4096, 16384])
p24 = [fm.p_no_failure(DAY, int(n), 5 * YEAR) for n in ns]
for n, p in zip(ns, p24, strict=True):
    print(f"N={n:6d}  cluster MTBF {fm.cluster_mtbf(5 * YEAR, int(n)) / 3600:9.1f} h   P(no failure in 24 h) = {p:.4f}")
timing = fm.measure_checkpoint_cost(32 << 20, tempfile.gettempdir(), repeat=5)
C = timing.median
M16k = fm.cluster_mtbf(5 * YEAR, 16384)
print(f"measured checkpoint of 32 MiB: median {C * 1e3:.1f} ms (min {timing.min * 1e3:.1f})")
print(
    f"N=16384: Young {fm.young_interval(C, M16k):.1f} s, Daly {fm.daly_interval(C, M16k):.1f} s, "
    f"exact {fm.optimal_interval(C, M16k):.1f} s"
)
# Monte-Carlo on MODEL failure traces (Poisson), a flaky cluster M = 100·δ so the simulation is short
M = 100 * C
grid = np.geomspace(0.25, 4, 13) * fm.young_interval(C, M)
mc = fm.monte_carlo_waste(grid, C, M, 30 * M, n_traces=24, seed=1)
analytic = [1 - 30 * M / fm.expected_completion_time(30 * M, t, C, M) for t in grid]
best = grid[int(np.argmin(mc))]

fig, ax = plt.subplots(1, 2, figsize=(11, 3.6))
ax[0].semilogx(ns, p24, "o-")
ax[0].set(xlabel="nodes N", ylabel="P(no failure in 24 h)", title="MODEL: node MTBF 5 years")
ax[1].semilogx(grid / M, mc, "o", label="simulated waste (MODEL traces)")
ax[1].semilogx(grid / M, analytic, "-", label="analytic (M+R)(e^((τ+δ)/M)−1)")
for name, t, ls in (("Young", fm.young_interval(C, M), ":"), ("Daly", fm.daly_interval(C, M), "--")):
    ax[1].axvline(t / M, color="gray", ls=ls, label=name)
ax[1].set(xlabel="interval τ / M", ylabel="wasted fraction", title=f"δ measured ({C * 1e3:.0f} ms), M = 100·δ (MODEL)")
ax[1].legend(fontsize=8)
plt.show()
assert all(a > b for a, b in zip(p24, p24[1:], strict=False)) and p24[-1] < 1e-3  # 16k nodes: rarely a quiet day
exact = fm.optimal_interval(C, M)
assert abs(fm.daly_interval(C, M) - exact) < abs(fm.young_interval(C, M) - exact)
assert 2.6 * 3600 < M16k < 2.8 * 3600 and 1 < fm.young_interval(C, M16k) < 600  # ~2.7 h; seconds to minutes
assert 1 / 1.5 < best / fm.young_interval(C, M) < 1.5  # the simulated optimum sits at Young/Daly's
assert mc[0] > mc.min() < mc[-1]  # too frequent and too rare both waste more

# %% [markdown]
# Reading it: 16 384 nodes that each fail once in 5 years fail, as a cluster, every ~2.7 h; a day without a failure
# has probability below 10⁻³. With δ measured here, Young's interval for that cluster is seconds to minutes. The
# simulated waste curve is a flat-bottomed U whose minimum lies within a factor 1.5 of Young/Daly (asserted); Daly's
# correction matters only when δ is no longer tiny compared with M (here, as in the test, it is closer to the exact
# optimum than Young's).

# %% [markdown]
# ## 2. The checkpoint layout: every rank writes its own chunks, a manifest commits them
#
# **Answer.** A sharded checkpoint is a directory `step_{step:08d}/` with one `rank{r}.bin` per rank (that rank's
# chunks, raw bytes, 64-byte aligned, a CRC-32 per chunk), its index `rank{r}.json`, and `manifest.json`, written
# **last** by rank 0 after a barrier: the commit record. Each chunk records where it sits in the *global* tensor
# (`offsets` + `shape`, DCP's chunk idea), so the manifest describes the model independently of the layout that saved
# it: a ZeRO flat buffer split by ceil(n/N), a tensor-parallel weight split by rows or by columns, a replicated tensor
# (the same box from every rank, kept once), a whole tensor (rank 0 only) and plain objects (step, lr).
#
# `tl.resilience.save_sharded(state, path)` runs on each rank (`tl.dist.launch` starts 4 real processes, joined in one
# gloo group); below, the files it leaves and the manifest.

# %%
tmp = Path(tempfile.mkdtemp(prefix="ckpt-"))
ckpt = step_dir(tmp, 1)
both = launch(sw.save_and_reshard, 4, str(ckpt), 2, timeout_s=120)  # section 2 uses the 2-rank loads
saved = [b["saved"] for b in both]
man = read_manifest(ckpt)
files = sorted(p.name for p in ckpt.iterdir())
print(files)
short = {k: v for k, v in man.items() if k != "tensors"}
short["tensors"] = {"opt.flat": {**man["tensors"]["opt.flat"], "chunks": man["tensors"]["opt.flat"]["chunks"][:2]}}
print(json.dumps(short, indent=1)[:1500])
print({k: (t["shape"], len(t["chunks"]), t["sharded"]) for k, t in man["tensors"].items()})
assert files == ["manifest.json"] + [f"rank{r:05d}.{e}" for r in range(4) for e in ("bin", "json")]
assert all(s["committed"] for s in saved) and man["world_size"] == 4
assert len(man["tensors"]["opt.flat"]["chunks"]) == 4 and len(man["tensors"]["norm.weight"]["chunks"]) == 1
assert all(c["offset"] % 64 == 0 for t in man["tensors"].values() for c in t["chunks"])
assert man["objects"] == {"step": 7, "lr": 0.125}

# %% [markdown]
# ## 3. Resharding 4 → 2 ranks (and → 1): an intersection of boxes [Q134]
#
# **Answer.** To restart on N' ranks, each new rank computes its target box (by default dim 0 split by ceil(n/N'),
# ZeRO's flat layout; or a `template` — here the column split of `tp.col`) and reads, from every saved chunk that
# intersects it, exactly the intersection. No rank needs the whole model in memory, and the result is bitwise the
# same as the original. In the launch above, after the save, ranks 0-1 formed a new 2-rank process group and called
# `load_sharded(path, world_size=2, rank=r)` (`storage_workers.save_and_reshard`); then `load_sharded(path)` (whole
# tensors) in this process:

# %%
new = [b["loaded"] for b in both[:2]]
assert [b.get("sub_world") for b in both] == [2, 2, None, None]
g = sw.global_state()
for r, got in enumerate(new):
    lo, hi = shard_bounds(sw.FLAT_NUMEL, 2, r)
    (_, c0), (_, nc) = sw.col_box(sw.COL_SHAPE[1], 2, r, sw.COL_SHAPE[0])
    assert got["opt.flat"][0].tobytes() == g["opt.flat"][lo:hi].tobytes() and got["opt.flat"][1] == (lo,)
    assert got["tp.col"][0].tobytes() == np.ascontiguousarray(g["tp.col"][:, c0 : c0 + nc]).tobytes()
whole = load_sharded(ckpt)
assert all(whole[k].tobytes() == v.tobytes() for k, v in g.items() if isinstance(v, np.ndarray))
print("4 -> 2 ranks and 4 -> 1: bitwise equal")

fig, ax = plt.subplots(figsize=(7, 1.8))
for c in man["tensors"]["opt.flat"]["chunks"]:
    ax.barh(1, c["shape"][0], left=c["offsets"][0], edgecolor="k", label=None)
for r in range(2):
    lo, hi = shard_bounds(sw.FLAT_NUMEL, 2, r)
    ax.barh(0, hi - lo, left=lo, edgecolor="k", color=["#bbb", "#777"][r])
ax.set_yticks([0, 1], ["load on 2 ranks", "saved by 4 ranks"])
ax.set_xlabel("element of opt.flat (1001 elements, ceil split)")
ax.set_title("rank 0 of 2 reads chunks 0-1, rank 1 reads chunks 2-3 (intersections)")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 4. A writer killed at a random byte: the previous checkpoint is loaded
#
# **Answer.** Every file goes to a temporary name, is fsynced, atomically renamed, and the directory fsynced
# (`atomic_write`); the manifest is written after every rank file. A writer killed at *any* byte therefore leaves a
# step directory without `manifest.json` (and a `.tmp-*` file), which `latest_checkpoint` skips and
# `list_checkpoints` reports with its reason. The drill: step 1 is committed; a child process writes step 2 and the
# parent SIGKILLs it when its temporary rank file reaches a random byte offset.

# %%
torn_runs = [faults.torn_write_drill(tmp / "torn", s, nbytes=1 << 20, piece_bytes=1 << 15) for s in range(3)]
for d in torn_runs:
    print(
        f"seed {d['seed']}: kill at byte >= {d['offset']:>7} of {d['total']} (landed by then: "
        f"{d['offset'] <= d['killed_at']}) -> latest {d['latest'].name}, equal to step 1: {d['equal_step1']}"
    )
print(list_checkpoints(tmp / "torn")[-1][2])
assert all(d["killed"] and d["offset"] <= d["killed_at"] for d in torn_runs)
assert all(d["latest"] == step_dir(tmp / "torn", 1) and d["equal_step1"] for d in torn_runs)
assert "no manifest.json" in list_checkpoints(tmp / "torn")[-1][2]
full = faults.disk_full_rlimit(tmp / "full", nbytes=1 << 20, limit=1 << 19)
print(full["error"], "|", full["message"])
assert full["error"] == "DiskFull" and "EFBIG" in full["message"] and latest_checkpoint(tmp / "full").name.endswith("1")

# %% [markdown]
# A save is more than one file. For 2 ranks it is rank 0's data file (open, every write, fsync, rename, directory
# fsync), rank 0's index, the same for rank 1, then the manifest; the asynchronous writer (`AsyncCheckpointer`, its
# writer process or thread) and the delta writer (`DeltaCheckpointer`) write a data file then their manifest / index.
# `faults.torn_sequence_drill` SIGKILLs the writer at one chosen event of that sequence (`atomic.set_crash_point`
# stops the child there); below, at *every* event, for each writer: before the commit record's rename the previous
# checkpoint loads bitwise, after it the complete new one -- never a mix.

# %%
seq = {}
for w in faults.SEQUENCE_WRITERS:
    events = faults.sequence_events(w, tmp / "seq" / w)
    runs = [faults.torn_sequence_drill(tmp / "seq" / w, w, kill_at=k, events=events) for k in range(1, len(events) + 1)]
    seq[w] = runs
    loaded = "".join(str(r["loaded_step"]) for r in runs)
    print(f"{w:14s} {len(events):2d} kill points, commit record renamed at #{runs[0]['commit_at']}: loaded {loaded}")
    assert all(r["killed"] and r["equal"] and r["loaded_step"] == r["expected_step"] for r in runs)
    assert {r["loaded_step"] for r in runs} == {1, 2}
files = {name for _, name, _ in faults.sequence_events("sharded", tmp / "seq" / "sharded")}
assert {"rank00000.bin", "rank00000.json", "rank00001.bin", "rank00001.json", "manifest.json"} <= files

# %% [markdown]
# ## 5. Save / load time: tinylearn vs torch.save vs torch DCP
#
# **Answer.** For one process the three write the same bytes (within a few KiB of index); what differs is the
# fsync: `save_sharded` and DCP (`sync_files=True`) make the data durable before they return, `torch.save` leaves it
# in the page cache: the like-for-like row for `torch.save` is "tinylearn (no fsync)". Loading checks a CRC-32 per
# chunk (the "no crc" row shows what that costs). Numbers from this machine (medians, `tinylearn.bench`):

# %%
# NBVAL_IGNORE_OUTPUT
table = bench_save_load([1 << 20, 4 << 20], repeat=3)
print(table.to_text())
ax = plot_table(table)
ax.set_title("checkpoint save/load, one process (median ms, log)")
plt.tight_layout()
plt.show()
saves = [r for r in table.rows if r.case.startswith("save")]
assert all(r.median_ms is not None for r in table.rows)
assert all(1.0 <= r.extra["bytes_on_disk"] / (int(float(r.case.split()[1]) * 2**20)) < 1.01 for r in saves)

# %% [markdown]
# tinygrad: `tinygrad.nn.state` has `safe_save` / `safe_load` (one safetensors file of a flat state dict) and
# `torch_load`; it has no sharded checkpoint, no resharding and no commit record.

# %%
ok, why = tinygrad_status()
if ok:
    from tinygrad.nn import state as tg_state

    assert hasattr(tg_state, "safe_save") and hasattr(tg_state, "safe_load")
    assert not [n for n in dir(tg_state) if "shard" in n.lower()]
print("tinygrad:", "checked" if ok else why)

# %% [markdown]
# ## 6. Asynchronous checkpoints: the training loop pays for a copy [Q120]
#
# **Answer.** `save` copies the state to host memory (the only time `save` itself blocks), hands the copy to one
# writer and returns; the writer writes the data file and commits with a manifest written last. A bounded queue
# (`max_pending`) gives back-pressure: if the writer is still busy with earlier snapshots, `save` waits (that wait is
# reported), so host memory never holds more than `max_pending + 1` copies. Two writers, the same files byte for
# byte: `writer="process"` (the default) copies into a reused shared-memory buffer and one long-lived writer process
# checksums it and writes the data file straight from it with `O_DIRECT`; `writer="thread"` copies into fresh arrays
# that a writer thread writes through the page cache.
#
# Below: a torch MLP with 8 MiB of parameters trains with SGD; every 24 steps it checkpoints (a long enough interval
# for the writer to usually finish between saves, as in real training where I is minutes; when it does not, the
# loop waits for it and that wait is part of the stall). **What the goal measures**: the training loop's extra time
# per checkpoint -- the time in the save call, plus how much slower the steps after it run while the writer works,
# plus any wait for the rest of the write -- divided by the same for a synchronous save. `bench_async` interleaves
# the modes cycle by cycle and times every save call and every step; the stall is built from medians per step
# position, so a step hit by unrelated load does not count. Timings depend on the machine and its load.

# %%
# NBVAL_IGNORE_OUTPUT
rows = bench_async(8.0, steps_between=24, repeat=3, cycles=3)
stall = {r.impl: r for r in rows if r.case.startswith("stall")}
writers = {"process": "tinylearn async", "thread": "tinylearn async (thread)"}
for r in rows:
    extra = {k: round(v, 1) for k, v in r.extra.items()}
    print(f"{r.case:24s} {r.impl:26s} {r.median_ms:8.1f} ms  {extra}")
sync_ms = stall["tinylearn sync"].median_ms
obs_sync = stall["tinylearn sync"].extra["observed_stall_ms"]
for w, name in writers.items():
    e = stall[name].extra
    ratio = stall[name].median_ms / sync_ms
    print(
        f"{w:7s} writer: save() blocked {e['observed_stall_ms']:.2f} ms ({e['observed_stall_ms'] / obs_sync:.0%} of "
        f"sync), writer CPU {e['write_cpu_ms']:.1f} ms/save; loop stall {stall[name].median_ms:.1f} ms = "
        f"{ratio:.2f} of sync (goal <= 0.10: {'met' if ratio <= 0.10 else 'not met'} here)"
    )
    # the caller pays for the copy only; the synchronous save also checksums, writes and fsyncs (a margin for a
    # fast disk and a loaded box)
    assert e["observed_stall_ms"] < 0.25 * obs_sync
    assert e["copy_ms"] <= e["observed_stall_ms"]  # save()'s time is the copy (+ any back-pressure, the message)
assert stall_ratio(rows) == stall["tinylearn async"].median_ms / sync_ms  # the goal's ratio: the default writer
fig, ax = plt.subplots(figsize=(7, 3.2))
names = list(stall)
ax.barh(names, [stall[n].median_ms for n in names], label="loop-time stall (in save + slower steps + rest of write)")
blocked = ["tinylearn sync", *writers.values()]
ax.barh(blocked, [stall[n].extra["observed_stall_ms"] for n in blocked], height=0.35, label="save() blocked")
ax.set_xlabel("ms per checkpoint (8 MiB state)")
ax.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# `save()`'s own measurement (`observed_stall_ms`) is the copy to host memory -- under a quarter of the synchronous
# save's for both writers (asserted with a margin: how long the synchronous fsync waits depends on the disk; the
# cell prints each writer's loop-stall fraction against the 10 % goal, not asserted). The loop stall is
# more than that copy: the writer still uses CPU and memory bandwidth while the next steps run
# (`steps_slowdown_ms`; `write_cpu_ms` is the writer's CPU time per save). With a free core that work overlaps the
# training; on this project's shared 2-core box other processes keep both cores busy, and the ratio moves with the
# load. There, the writer *thread*'s CPU time was dominated by the kernel's first touch of new page-cache pages (the
# VM backs guest memory lazily), not by the GIL (crc32, write and fsync release it); the writer *process* checksums
# its shared buffer and writes the data file from it with `O_DIRECT`, bypassing the page cache. What each part
# costs, and where the remaining stall goes (the copy, cache traffic, the fsyncs' journal commits), is measured in
# the docstrings of `async_ckpt.py` and `bench_async.py`: the 10 % goal lies within that bench's noise on this box
# and was met in some runs, not others. The writer waits for work under Linux's `SCHED_BATCH` policy, so that
# waking it does not take the core from the training thread that called `save`; a writer process that dies makes
# the next call raise an error naming its pid, never hang. Async hides the *waiting* (fsync, disk latency), not CPU
# work a busy core must do; torch DCP's `async_save` follows the same recipe (stage to CPU, write in a thread; it
# warns that no process group is initialised). `torch.save` is synchronous. tinygrad has `safe_save` only: no
# asynchronous or incremental checkpointing.

# %%
ok, why = tinygrad_status()
print("tinygrad:", "installed" if ok else f"not importable ({why})", "- nn.state.safe_save only, no async checkpoints")

# %% [markdown]
# **Versions: write only the shards that changed.** Every tensor has a version; a save copies and writes only the
# keys whose version differs from the last *successful* checkpoint and references the older file for the rest.
# torch already keeps such a counter (`tensor._version`, bumped by every in-place write such as `opt.step()`), so
# fine-tuning the head of a frozen network checkpoints the head only.

# %%
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
)
for p in model[:4].parameters():
    p.requires_grad_(False)  # fine-tuning: only the last layer trains
x, y = torch.randn(32, 512), torch.randint(0, 10, (32,))
with tempfile.TemporaryDirectory() as d, AsyncCheckpointer(d, full_every=100) as ck:
    for step in range(4):
        torch.nn.functional.cross_entropy(model(x), y).backward()
        with torch.no_grad():  # SGD on the head, in place as torch.optim.SGD (which imports torch._dynamo: ~4 s)
            for p in model[4].parameters():
                p.sub_(0.01 * p.grad)
                p.grad = None
        sd = model.state_dict()
        ck.save(sd, step, versions=torch_versions(sd))
    ck.wait()
    written = [(s["keys_written"], s["bytes_written"]) for s in ck.stats]
    back = load_async(d)
print("(keys written, bytes) per save:", written)
assert written[0][0] == 6 and all(k == 2 for k, _ in written[1:])  # after the first save: head weight + bias only
assert all(np.array_equal(back[k], v.numpy()) for k, v in model.state_dict().items())

# %% [markdown]
# ## 7. Incremental checkpoints: changed blocks only
#
# **Answer.** Cut every tensor into fixed-size blocks (256 KiB), hash each (blake2b); a delta writes the blocks whose
# hash changed plus an index pointing at the older files for the rest; a full checkpoint every `full_every` bounds the
# chain; restore reads each block from where the tip's index says and checks its hash; `compact` folds a chain into
# one full checkpoint and deletes what no kept checkpoint references.

# %%
print(incremental.__doc__.split("\n\n")[1])
ft, adam = delta_bytes("finetune", size_mb=4.0, steps=2), delta_bytes("adam", size_mb=4.0, steps=2)
for r in (ft, adam):
    print(
        f"{r['pattern']:8s} full {r['full_bytes'] / 2**20:5.1f} MiB, delta {np.mean(r['delta_bytes']) / 2**20:5.1f} "
        f"MiB = {r['fraction']:.0%} of a full checkpoint"
    )
assert ft["fraction"] < 0.5  # fine-tuning the last layer: the other blocks are untouched
assert adam["fraction"] == 1.0  # Adam moves every weight and both moments: a delta is a full checkpoint + hashing

# %%
rng = np.random.default_rng(0)
state = {"w": rng.standard_normal((512, 512)).astype(np.float32), "step": 0}
with tempfile.TemporaryDirectory() as d:
    ck = DeltaCheckpointer(d, block_size=64 * 1024, full_every=4)
    saved = {}
    for s in range(1, 7):
        state["w"][rng.integers(512)] += 1.0  # one row changes per step
        state["step"] = s
        ck.save(state, s)
        saved[s] = state["w"].copy()
    kinds = [(h["kind"], h["blocks_written"]) for h in ck.history]
    exact = all(restore(d, s)["w"].tobytes() == saved[s].tobytes() for s in saved)
    folded = compact(d)
    after = restore(d)["w"].tobytes() == saved[6].tobytes()
print(kinds, "| compact deleted", folded["deleted"])
assert exact and after and all(n == 1 for k, n in kinds if k == "delta")

# %% [markdown]
# ## 8. XOR-diffs for activation checkpoints [Q225]
#
# **Answer.** A pipeline stage keeps micro-batch activations to replay after a failure. Between nearby steps the
# same micro-batch's activations barely change: `prev XOR new` is mostly zero bits, concentrated in the low mantissa
# bytes; byte-shuffling (all first bytes, then all second bytes, ...) turns the unchanged sign/exponent bytes into
# zero runs that zlib compresses well. A chain of diffs merges by XOR-accumulating them; every state is rebuilt
# bit-exactly. Measured on the first layer's activations (Linear + ReLU) of a small MLP, one SGD step apart, and
# against another micro-batch:

# %%
# NBVAL_IGNORE_OUTPUT
# (the activations come from a BLAS matmul: the compressed sizes move by a few bytes with the CPU's numeric path)
ratios = xor_activation_ratios()
print({k: round(v, 2) for k, v in ratios.items()})
assert ratios["nearby"] > 1.5 * ratios["unrelated"]  # nearby steps compress much better than unrelated data
assert ratios["nearby"] > ratios["nearby_no_shuffle"]  # the byte shuffle helps
chain_ = XorChain(np.zeros(1))  # a chain over 5 training steps of real activations
torch.manual_seed(1)
m = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
xb = torch.randn(64, 64)
acts = []
for _ in range(5):
    with torch.no_grad():
        acts.append(m[:2](xb).numpy().copy())
    torch.nn.functional.mse_loss(m(xb), torch.zeros(64, 1)).backward()
    with torch.no_grad():
        for p in m.parameters():
            p.sub_(1e-3 * p.grad)
            p.grad = None
chain_ = XorChain(acts[0])
for a in acts[1:]:
    chain_.append(a)
assert all(chain_.get(i).tobytes() == a.tobytes() for i, a in enumerate(acts))
assert xor_apply(acts[1], chain_.merge(1, 4)).tobytes() == acts[4].tobytes()  # one merged diff jumps 1 -> 4
print(
    f"chain of {len(acts)} states: {chain_.stored_bytes} bytes stored vs {chain_.raw_bytes} raw "
    f"({chain_.raw_bytes / chain_.stored_bytes:.1f}x)"
)

# %% [markdown]
# ## 9. Moving a shard between tiers while it is updated [Q179]
#
# **Answer.** Give the shard a version number and, during the move, an append-only update log. Copy chunk by chunk
# (each chunk under a short lock, remembering the version it was copied at), replay the log entries newer than each
# chunk's copy, then switch tiers under the lock after replaying the last few entries. Every update is either in the
# copied bytes or replayed once: nothing lost, nothing applied twice -- checked bitwise against applying all updates
# in order.

# %%
# NBVAL_IGNORE_OUTPUT
# (how many updates arrive during a migration depends on thread scheduling)
print(tier_log.__doc__.split("\n\n")[1])
rng = np.random.default_rng(1)
n = 100_000
x0 = rng.standard_normal(n).astype(np.float32)
ups = [(slice(int(a), int(a) + 2000), np.float32(rng.standard_normal())) for a in rng.integers(0, n - 2000, 600)]
with tempfile.TemporaryDirectory() as d:
    shard = TieredShard(x0, f"{d}/cold.npy", chunk_elems=4096)
    done = threading.Event()

    def updater() -> None:
        for index, delta in ups:
            shard.update(index, delta)
            time.sleep(0)
        done.set()

    t = threading.Thread(target=updater)
    t.start()
    moves = []
    while not done.is_set() and len(moves) < 10:  # hot -> cold -> hot ... while updates arrive
        moves.append(shard.migrate("cold" if shard.tier == "hot" else "hot"))
    t.join(30)
    same = shard.values().tobytes() == apply_all(x0, ups).tobytes()
print(
    f"{len(moves)} migrations, {sum(m_['logged'] for m_ in moves)} updates logged during them, "
    f"longest lock hold {shard.max_hold_s * 1e3:.2f} ms; final state equals in-order replay: {same}"
)
assert same and shard.version == len(ups)

# %% [markdown]
# ## 10. Erasure-coded checkpoints: any r lost files of k + r rebuilt bit-exactly [Q157]
#
# **Answer.** Keep the k rank files of a checkpoint as they are and add r *parity* files computed with a
# Reed–Solomon code over GF(2^8): bytes are field elements (addition = XOR, multiplication by log/exp tables, every
# non-zero byte invertible), parity file i is $p_i = \sum_j P_{ij}\, d_j$ byte by byte. With $P$ a Cauchy matrix
# every k x k choice of rows of $[I_k; P]$ is invertible, so **any** k surviving files give the data back (Gauss–
# Jordan inversion of that k x k matrix, then one more matrix-times-regions product). The first parity row is scaled
# to all ones, so r = 1 is exactly RAID-5 XOR parity; r = 2 generalises RAID-6. Storage cost: r/k of the data,
# against r full copies for replication that survives the same r losses.
#
# `tl.resilience.protect(ckpt_dir, r)` writes `parity{j}.bin` + `ec.json` (k, r, sizes, CRC-32 of every file) with
# atomic writes; `repair(ckpt_dir)` finds missing / CRC-corrupt files and rebuilds up to r of them. Below: a 4-rank
# checkpoint written by `save_sharded`, r = 2, and **every** pair of the 6 files deleted in turn.

# %%
K, R = 4, 2
rng = np.random.default_rng(0)
weights = rng.standard_normal(40_000).astype(np.float32)
bounds = np.linspace(0, weights.size, K + 1).astype(int)
tmp = Path(tempfile.mkdtemp(prefix="ec-"))
ckpt = tmp / "step_00000100"
for rank in range(K):
    chunk = weights[bounds[rank] : bounds[rank + 1]]
    save_sharded({"w": Shard(chunk, (int(bounds[rank]),), weights.shape)}, ckpt, rank=rank, world_size=K, step=100)
meta = ec_files.protect(ckpt, r=R)
files = [e["file"] for e in meta["data"] + meta["parity"]]
original = {f: (ckpt / f).read_bytes() for f in files}
print("files:", files, "| parity bytes:", sum(e["size"] for e in meta["parity"]))

pairs = list(itertools.combinations(files, R))
for lost in pairs:
    for f in lost:
        (ckpt / f).unlink()
    rebuilt = ec_files.repair(ckpt)
    assert sorted(p.name for p in rebuilt) == sorted(lost)
    assert all((ckpt / f).read_bytes() == original[f] for f in files)  # bit-exact
assert np.array_equal(load_sharded(ckpt)["w"], weights)
print(f"all {len(pairs)} ways to lose {R} of {K + R} files repaired bit-exactly; the checkpoint loads")

for f in files[:3]:  # one loss too many
    (ckpt / f).unlink()
try:
    ec_files.repair(ckpt)
    raise AssertionError("3 losses with r = 2 must not be repairable")
except CorruptCheckpoint as e:
    print("3 lost:", str(e).split(": ", 1)[1])
assert len(pairs) == 15

# %% [markdown]
# The r = 1 case is plain XOR parity, and the code is MDS: every 4 x 4 sub-matrix of the generator inverts.

# %%
data = [rng.integers(0, 256, 1000, dtype=np.uint8) for _ in range(K)]
assert np.array_equal(erasure.encode(data, 1)[0], np.bitwise_xor.reduce(np.stack(data)))
G = np.concatenate([np.eye(K, dtype=np.uint8), erasure.cauchy_parity_matrix(K, R)])
print("parity matrix P (row 0 = all ones):\n", erasure.cauchy_parity_matrix(K, R))
n_inv = 0
for rows in itertools.combinations(range(K + R), K):
    inv = erasure.gf_mat_inv(G[list(rows)])  # raises ValueError if singular
    n_inv += np.array_equal(erasure.gf_mat_mul(G[list(rows)], inv), np.eye(K, dtype=np.uint8))
assert n_inv == 15  # all C(6, 4) row choices invertible: any 4 surviving files suffice

# %% [markdown]
# ## 11. The GF(2^8) kernel: split-nibble shuffles [Q157]
#
# **Answer.** Multiplying a region by a constant c is a 256-entry table lookup per byte, which a scalar loop does one
# byte at a time. SIMD trick (ISA-L, Jerasure): $c\cdot x = c\cdot(x \,\&\, 15) \oplus c\cdot(x \,\&\, \mathtt{0xf0})$
# (multiplication distributes over XOR), and each half has only 16 values: two 16-byte tables per coefficient,
# looked up 32 (AVX2) or 64 (AVX-512BW) bytes at a time by `vpshufb`. `cpp_src/resilience_gf256.cpp` computes one
# parity row from all k sources in one pass (op `resilience.gf256_matmul`); every path is tested bit-exactly against
# the numpy reference (a 256 x 256 product table gathered per coefficient).

# %%
# NBVAL_IGNORE_OUTPUT
k, r = 8, 3
srcs = [rng.integers(0, 256, 1 << 19, dtype=np.uint8) for _ in range(k)]
P = erasure.cauchy_parity_matrix(k, r)
mb = k * srcs[0].size / 1e6
ref = erasure.gf256_matmul(P, srcs, backend="numpy")
rates = {"numpy": mb / measure(lambda: erasure.gf256_matmul(P, srcs, backend="numpy"), repeat=3).median}
if backends.C_available("resilience"):
    for v in ("scalar", "simd"):
        assert np.array_equal(erasure.gf256_matmul(P, srcs, backend="cpp", version=v), ref)
        name = "C++ " + (erasure.gf256_path(v) if v == "simd" else v)
        rates[name] = mb / measure(lambda v=v: erasure.gf256_matmul(P, srcs, backend="cpp", version=v), repeat=5).median
for name, v in rates.items():
    print(f"{name:12s} encode k={k} r={r}: {v:8.0f} MB/s of data")
plt.figure(figsize=(6, 2.5))
plt.barh(list(rates), list(rates.values()))
plt.xscale("log")
plt.xlabel("MB/s of data encoded (1 thread, log scale)")
plt.title(f"Reed-Solomon encode, k={k}, r={r}, 4 MiB")
plt.tight_layout()
plt.show()
assert all(v > 0 for v in rates.values())
if "C++ scalar" in rates:
    assert max(rates.values()) > rates["numpy"]

# %% [markdown]
# ## 12. Storage overhead: erasure coding vs replication [Q157]
#
# **Answer.** To survive f lost files of k, replication stores f extra copies of everything (overhead f), a
# Reed–Solomon code f parity files of one shard each (overhead f / k). The price is CPU (measured above: GB/s with
# SIMD, so negligible next to storage bandwidth) and repair reads k files instead of 1.

# %%
ckpt_bytes = 8 << 30  # a MODEL: an 8 GiB checkpoint in k = 8 rank files
rows = ec_files.overhead_rows(ckpt_bytes, k=8, rs=(1, 2, 3, 4))
print(f"{'lost files tolerated':>22s} {'EC extra GiB':>13s} {'replication extra GiB':>22s}")
for row in rows:
    print(f"{row['tolerated']:22d} {row['ec_bytes'] / 2**30:13.2f} {row['replication_bytes'] / 2**30:22.2f}")
    assert row["ec_overhead"] == row["tolerated"] / 8 and row["replication_overhead"] == row["tolerated"]
x = np.arange(len(rows))
plt.figure(figsize=(6, 2.8))
plt.bar(x - 0.2, [rw["ec_bytes"] / 2**30 for rw in rows], 0.4, label="Reed-Solomon (k=8)")
plt.bar(x + 0.2, [rw["replication_bytes"] / 2**30 for rw in rows], 0.4, label="full replication")
plt.xticks(x, [str(rw["tolerated"]) for rw in rows])
plt.xlabel("lost files tolerated")
plt.ylabel("extra GiB")
plt.title("MODEL: extra storage for an 8 GiB checkpoint")
plt.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 13. Peer replication: restore a restarted rank from a neighbour's memory
#
# **Answer.** A copy in a neighbour's RAM costs one point-to-point transfer instead of a write to storage: each rank
# sends its shard to rank (r+1) % N and keeps rank (r-1) % N's (`PeerReplicator.replicate`). When a rank is
# replaced while the others keep running, `recover(lost_rank)` sends it its shard back from the holder, no storage
# read. A dead or stuck peer is a RuntimeError naming the rank within the timeout, never a hang. Two neighbours failing
# together, or a whole-job restart, lose the copies: peer memory complements the erasure-coded files, it does not
# replace them. Three real processes (`tinylearn.dist.launch`), rank 1 "restarts" with an empty replicator:

# %%
# NBVAL_IGNORE_OUTPUT
out = launch(replication_workers.replicate_and_restore, 3, 1 << 16, 1, 10.0, timeout_s=60)
for res in out:
    print(
        f"rank {res['rank']}: holds {res['held_bytes']} B of rank {(res['rank'] - 1) % 3}; "
        f"replicate {res['replicate_s'] * 1e3:.1f} ms, recover {res['recover_s'] * 1e3:.1f} ms"
    )
assert all(res["held_crc"] == res["expected_prev_crc"] for res in out)
assert out[1]["recovered_crc"] == out[1]["mine_crc"]  # rank 1 got its own shard back from rank 2

# %% [markdown]
# tinygrad has no checkpointing beyond safetensors files: no erasure coding or peer replication to compare with.

# %% [markdown]
# ## 14. Elastic restart: kill a rank mid-step, torchrun restarts, training resumes bitwise
#
# **Answer.** A job survives a dead rank when (a) every step's state can be rebuilt from the last *committed*
# checkpoint at whatever world size comes back, (b) the data a step sees depends on the step number only, not on
# which process is which, and (c) something restarts the processes. `tl.resilience.run` does (a) and (b);
# `torchrun --max-restarts` does (c). The mechanism, from `elastic.py`'s docstring:

# %%
print(elastic.__doc__.split("\n\n", 1)[1][:1600])

# %% [markdown]
# The drill: two ranks train four copies of a tiny MLP in lock-step (DDP, ZeRO-1, ZeRO-2, ZeRO-3), checkpointing
# every 2 steps. On the first attempt rank 1 `SIGKILL`s itself at step 3 after the first backward -- half-way
# through a step, after the checkpoint of step 1. Rank 0's next all-reduce fails ("connection closed"), torchrun's
# agent stops the group and starts a new one, which loads step 1's checkpoint and replays steps 2-4. The reference is
# the same code run without a kill on 2 processes of `tl.dist.launch`.

# %%
# NBVAL_IGNORE_OUTPUT
STEPS, MODES = 5, "ddp,zero1,zero2,zero3"
ref_argv = drills.drill_argv(work / "ref" / "ckpt", work / "ref.npz", STEPS, MODES, 2)
ref_report = launch(drills.drill_job, 2, ref_argv, timeout_s=60)[0]
kill_argv = drills.drill_argv(work / "run" / "ckpt", work / "run.npz", STEPS, MODES, 2, kill=(1, 3))
t0 = time.perf_counter()
res = drills.torchrun(kill_argv, nproc=2, max_restarts=3, timeout_s=60)  # a subprocess with a timeout
wall = time.perf_counter() - t0
print("\n".join(line for line in res.stdout.splitlines() if "[drill]" in line or "exitcode" in line))
report = json.loads(Path(f"{work / 'run.npz'}.json").read_text())
same = drills.bitwise_equal(drills.load_params(work / "run.npz"), drills.load_params(work / "ref.npz"))
recovery = report["kill_to_first_step_s"]
in_process = report["recovery_s"]
print(f"torchrun wall {wall:.1f} s; restarts {report['restart_count']}; resumed from step {report['resumed_from']}")
print(
    f"recovery (kill -> first step after the restart) {recovery:.2f} s, of which load + first step inside run() "
    f"{in_process:.3f} s (load {report['load_s'] * 1e3:.1f} ms); "
    f"checkpoint cost C {report['checkpoint_s'] * 1e3:.1f} ms"
)
print("final parameters bitwise equal to the uninterrupted run:", same)
if report["proc_start_wall"] is not None:  # Linux: when the restarted rank 0 process was created
    parts = {
        "detect + agent restart (kill -> new process)": report["proc_start_wall"] - report["t_kill"],
        "interpreter + imports (process -> main)": report["main_wall"] - report["proc_start_wall"],
        "group init (rendezvous with the peer)": report["group_wall"] - report["main_wall"],
        "build models + optimizers (torch.optim imports torch._dynamo)": report["built_wall"] - report["group_wall"],
        "run(): agree, load, first step": report["first_step_wall"] - report["built_wall"],
    }
    for k, v in parts.items():
        print(f"  {k:62s} {v:7.3f} s")
    assert abs(sum(parts.values()) - recovery) < 1e-6
assert res.returncode == 0 and report["restart_count"] == 1 and report["resumed_from"] == 1
assert same  # DDP and ZeRO-1/2/3 alike
assert recovery > in_process > 0  # the restart is dominated by starting processes (imports), not by the load

# %% [markdown]
# What the recovery time is made of: detecting the death (the peer's collective fails at once -- "connection
# closed"; a *hung* peer would take the group timeout), the agent's restart (new processes, `import torch`, a new
# rendezvous, group init; on this torch the first `torch.optim` constructor also imports `torch._dynamo`, seconds),
# then `run`'s part -- reading the checkpoint, one step. The last part is milliseconds here; the rest is process
# start-up, which is why live resharding (section 3) exists.

# %% [markdown]
# ## 15. Resharding a ZeRO state 4 -> 2 ranks through the checkpoint
#
# **Answer.** Save each rank's own slice of the flat ceil(numel/N) layout (no gather); a reader at N' ranks reads,
# for its new slice, exactly the saved chunks that intersect it. The 4-rank checkpoint of a 72-element parameter has
# 4 chunks of 18; a 2-rank reader's slice of 36 elements comes from 2 of them:

# %%
res42 = launch(ew.zero_roundtrip_job, 4, str(work / "zero"), (2,), (4, 2), 2, timeout_s=60)[0]
man = read_manifest(work / "zero" / "s2_float32_n4")
chunks = [(c["offsets"][0], c["shape"][0]) for c in man["tensors"]["zero.param.0"]["chunks"]]
plan = reshard_plan(72, 4, 2)
print("saved chunks (offset, length):", chunks)
print("new rank <- old rank pieces:", [(t.dst_rank, t.src_rank, t.length) for t in plan])
print("state_dict() after N -> N' equals the original, bitwise:", res42)
assert chunks == [(0, 18), (18, 18), (36, 18), (54, 18)]
assert [(t.dst_rank, t.src_rank) for t in plan] == [(0, 0), (0, 1), (1, 2), (1, 3)]
assert res42 == {(2, 4, 4): True, (2, 4, 2): True, (2, 2, 4): True, (2, 2, 2): True}

# %% [markdown]
# ## 16. Live resharding vs restart from a checkpoint [Q134]
#
# **Answer.** When a node leaves *gracefully* (pre-emption notice, scale-down), the survivors can move the state
# among themselves: `parallel.reshard.reshard_zero` sends each element once over point-to-point messages, no disk,
# no new processes. A restart pays the checkpoint write, new processes (imports, rendezvous) and the read. After a
# *crash* the dead rank's shard is gone from memory, so only a checkpoint (or a peer replica) can restore it. Both
# paths below shrink a ZeRO-1 job 2 -> 1 and continue one step; they agree bitwise.

# %%
# NBVAL_IGNORE_OUTPUT
q = drills.live_vs_restart(work / "q134", steps=2, timeout_s=60)
print(f"live reshard_zero: {q['live_s'] * 1e3:.2f} ms ({q['moved_bytes']} bytes moved)")
print(
    f"restart: save {q['save_s'] * 1e3:.1f} ms + new 1-rank job that loads and steps {q['restart_s'] * 1e3:.0f} ms "
    f"(load {q['load_s'] * 1e3:.1f} ms)"
)
assert q["bitwise_equal"]
assert q["restart_total_s"] > q["live_s"]  # a new process alone costs more than moving a few KB between live ones

# %% [markdown]
# ## 17. What the ecosystem offers

# %%
tg_ok, tg_why = tinygrad_status()
rows = [
    (
        "tinylearn",
        "run(): resume from the newest committed sharded checkpoint, reshard N -> N', data order by step, "
        "Young/Daly interval from measured C; drills under torchrun; live reshard_zero",
    ),
    (
        "torch",
        "torch.distributed.checkpoint (DCP: sharded save/load with resharding by planners) + torchrun "
        "--max-restarts / --nnodes=min:max (elastic agent restarts the group); no interval policy, data order is yours",
    ),
    ("tinygrad", f"no elastic or multi-process training (status here: {'ok' if tg_ok else tg_why})"),
]
for name, what in rows:
    print(f"{name:10s} {what}")

# %%
# NBVAL_IGNORE_OUTPUT
kept = latest_checkpoint(work / "run" / "ckpt")
print(f"notebook so far {time.perf_counter() - t_start:.1f} s; checkpoint kept: {kept}")
assert kept is not None and kept.name == "step_00000004"
shutil.rmtree(work, ignore_errors=True)

# %% [markdown]
# ## 18. Stragglers: detect from step times, tolerate with bounded staleness [Q185]
#
# **Answer.** Detect: each rank reports its step's compute time; divide by the step's median over ranks (a global
# slowdown cancels), and score each rank against its peers' recent values with a robust z-score,
# (t − median)/(1.4826·MAD); flag after k consecutive slow steps (one GC pause is not a straggler). Tolerate:
# asynchronous SGD with a parameter server that rejects gradients staler than s and scales accepted ones by
# 1/(1 + τ) (`parallel.staleness` weights): the slow worker no longer stalls the others. Below, 2 real processes
# (`tl.dist.launch`), rank 1 doing 4× the matmuls; then 4 real threads vs synchronous SGD on least squares.

# %%
# NBVAL_IGNORE_OUTPUT
steps = 30
res = launch(st.straggler_rank_fn, 2, steps, 1, 64, timeout_s=120)  # 64 matmuls a step: ms-long steps, so a
# scheduler hiccup on rank 0 cannot out-score rank 1's 4x work
times = np.asarray(res[0]).reshape(steps, 2)
det = st.detect_stragglers(times, patience=3)
print(f"median step time per rank (ms): {np.median(times, axis=0) * 1e3}; flagged {det['flagged']}")
sync = st.run_sync_sgd(n_workers=4, updates=100, lr=0.05)
asy = st.run_async_sgd(n_workers=4, updates=400, lr=0.05, staleness_bound=4, slow_worker_reps=3)
print(f"async: staleness histogram {np.bincount(asy['staleness'])}, rejected {asy['rejected']}")
print(f"final excess loss: sync {sync['excess'][-1]:.2e} (400 gradients), async {asy['excess'][-1]:.2e}")
fig, ax = plt.subplots(1, 2, figsize=(11, 3.4))
ax[0].plot(det["z"][:, 0], label="rank 0")
ax[0].plot(det["z"][:, 1], label="rank 1 (4x work)")
ax[0].axhline(3.5, color="gray", ls="--")
ax[0].set(xlabel="step", ylabel="robust z", title="straggler score, real processes")
ax[0].legend()
ax[1].semilogy(np.arange(1, 101) * 4, sync["excess"], label="sync (4 grads / update)")
ax[1].semilogy(np.arange(1, 401), asy["excess"], label="async, s = 4, η/(1+τ)")
ax[1].set(xlabel="gradients computed", ylabel="loss − optimum", title="least squares, 4 threads")
ax[1].legend()
plt.show()
# the claim, robust to a busy box (a descheduled rank 0 can look slow for a few steps): rank 1 is flagged, and it is
# the persistent outlier -- its median z over the run is above the threshold, rank 0's is not
assert 1 in det["flagged"] and np.median(det["z"][:, 1]) > 3.5 > np.median(det["z"][:, 0])
assert max(asy["staleness"]) <= 4
assert asy["excess"][-1] < 1e-2 * asy["initial_excess"] and sync["excess"][-1] < 1e-2 * sync["initial_excess"]
assert asy["excess"][-1] < 10 * sync["excess"][-1] + 1e-4 * sync["initial_excess"]  # converges like sync

# %% [markdown]
# ## 19. A failed pipeline stage replays only its own lost work [Q109]
#
# **Answer.** Write the step as a DAG of ops (stage, micro-batch, F/B): F(s,m) ← F(s−1,m), B(s,m) ← B(s+1,m) and
# F(s,m), plus each stage's program (GPipe: all forwards then all backwards; 1F1B: warm-up, alternate, drain). Keep
# what crosses stage boundaries (input activations, output gradients) at their sender until the step ends —
# micro-batch activation checkpoints. When stage s dies, only its internal state is lost (stashed activations,
# accumulated weight gradients): replay its completed forwards and backwards from the kept boundaries, without
# re-sending; no other stage redoes anything. Executed on a real numpy pipeline, a failure injected every 4 ops.

# %%
S, MB = 4, 8
sched = {k: pr.build_schedule(S, MB, k) for k in ("gpipe", "1f1b")}
for k, sc in sched.items():
    print(f"{k}: makespan {sc.makespan:.0f} (F=1, B=2), bubble {sc.bubble:.2f}, peak stash per stage {sc.peak_stash}")
ex = pr.PipelineExecutor(S, 16, seed=0)
rng = np.random.default_rng(0)
x, y = rng.standard_normal((32, 16)), rng.standard_normal((32, 16))
sc = sched["1f1b"]
ref = ex.run(sc, x, y)
replayed, restart, equal = [], [], True
for k in range(0, len(sc.ops), 4):
    out = ex.run(sc, x, y, fail_stage=1, fail_after=k)
    equal &= all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(out["grads"], ref["grads"]))
    replayed.append(out["replayed"])
    restart.append(out["restart_replayed"])
print(f"stage 1 fails after k ops: replayed {replayed}\n  full restart would redo {restart}")
fig, ax = plt.subplots(figsize=(10, 2.4))
for op in sc.ops:
    ax.barh(op.stage, sc.end[op] - sc.start[op], left=sc.start[op], color="C0" if op.kind == "F" else "C1")
    ax.text(sc.start[op] + 0.1, op.stage, f"{op.kind}{op.micro}", va="center", fontsize=6)
ax.set(xlabel="time (F = 1, B = 2)", ylabel="stage", title="1F1B, 4 stages x 8 micro-batches")
ax.invert_yaxis()
plt.show()
assert equal  # bitwise the no-failure gradients, at every failure point tried
assert all(r <= k for r, k in zip(replayed, restart, strict=True))
assert 0.65 * S < sum(restart) / sum(replayed) < 1.35 * S  # about 1/S of a full restart's replay
assert sched["1f1b"].peak_stash == [4, 3, 2, 1] and sched["gpipe"].peak_stash == [8] * 4
assert abs(sched["gpipe"].bubble - 3 / 11) < 1e-12 and abs(sched["1f1b"].bubble - 3 / 11) < 1e-12

# %% [markdown]
# ## 20. Predicting a failure and migrating before it [Q177]
#
# **Answer.** Per node and signal (temperature, corrected-error rate) keep an EWMA, fit a line to its last window,
# extrapolate a horizon ahead and compare with a limit; arm above `on`, disarm below `off` (hysteresis), migrate the
# node's shard on the rising edge. The traces are a **MODEL** (`risk.synthetic_fleet`: noise, transient heat spikes
# on healthy nodes, a ramp before each failure). Lost work counts, per failure, the work since the last checkpoint
# plus the restart; a caught failure costs only the migration (30 steps), every false alarm a migration.

# %%
fleet = risk.synthetic_fleet(seed=0)
rows = {}
for name, kw in {
    "EWMA + trend + hysteresis": {},
    "no trend": {"horizon": 0},
    "raw threshold": {"alpha": 1.0, "horizon": 0, "off": 1.0},
}.items():
    r = risk.evaluate_migration(fleet, risk.RiskPredictor(64, **kw))
    rows[name] = r
    print(
        f"{name:26s} precision {r['precision']:.2f} recall {r['recall']:.2f} false alarms {r['fp']:3d}  "
        f"lost work {r['lost_with']:6.0f} steps (no migration: {r['lost_without']:.0f})"
    )
numel = 1_000_000_000  # MODEL: 1 B parameters, fp32 master + 2 Adam moments = 12 bytes each, over 8 ranks
spare, shrink = risk.migration_bytes(numel, 8, 3, 12), risk.migration_bytes(numel, 8, 3, 12, mode="shrink")
print(f"evacuating rank 3 of 8: to a hot spare {spare / 2**30:.1f} GiB, shrinking to 7 ranks {shrink / 2**30:.1f} GiB")
i = int(np.flatnonzero(fleet["fail_step"] >= 0)[0])
fig, ax = plt.subplots(figsize=(10, 3))
ax.plot(fleet["temp"][i], lw=0.8, label=f"node {i} temperature (MODEL)")
ax.axvline(fleet["fail_step"][i], color="k", label="failure")
for node, t in rows["EWMA + trend + hysteresis"]["triggers"]:
    if node == i:
        ax.axvline(t, color="C2", ls="--", label="migration trigger")
ax.set(xlabel="step", ylabel="°C", title="MODEL telemetry: a failing node")
ax.legend(fontsize=8)
plt.show()
ours, raw = rows["EWMA + trend + hysteresis"], rows["raw threshold"]
assert ours["precision"] == 1.0 and ours["recall"] == 1.0 and ours["lost_with"] < 0.5 * ours["lost_without"]
assert rows["no trend"]["recall"] < ours["recall"]
assert raw["fp"] > 50 and raw["lost_with"] > raw["lost_without"]  # a naive threshold is worse than doing nothing
assert shrink > 2 * spare

# %% [markdown]
# ## 21. Which layers to protect with redundancy [Q191]
#
# **Answer.** Layer l's activation, lost with probability p_l, costs c_l to recompute; protecting it (a duplicate copy
# or a redundant execution) costs w_l of a budget (bytes or seconds). Minimising Σ_(unprotected) p_l·c_l under the
# budget is a 0/1 knapsack: exact by DP over the budget, greedy by p_l·c_l / w_l is a ½-approximation; both checked by
# brute force. c_l: a torch MLP's layers timed with `tinylearn.bench.measure`; w_l: their activation bytes; p_l: a
# **MODEL** (rate × bytes × time the activation stays live).

# %%
# NBVAL_IGNORE_OUTPUT
torch.manual_seed(0)
widths = [256, 1024, 256, 512, 128, 768, 64]
layers = [m for a, b in zip(widths, widths[1:], strict=False) for m in (torch.nn.Linear(a, b), torch.nn.GELU())]
costs, nbytes = rd.measure_layers(layers, torch.randn(64, widths[0]), repeat=5)
probs = rd.failure_probabilities(costs, nbytes, rate_per_byte_s=1e-3)
fracs = [0.1, 0.2, 0.3, 0.4, 0.6, 0.8]
ex_c, gr_c = [], []
for f in fracs:
    b = int(f * sum(nbytes))
    ex_r, gr_r = (rd.choose_redundant(costs, probs, nbytes, b, m) for m in ("exact", "greedy"))
    bf_r = rd.choose_redundant(costs, probs, nbytes, b, "brute")
    assert abs(ex_r["saved"] - bf_r["saved"]) <= 1e-12 * max(bf_r["saved"], 1e-30)  # DP = brute force
    ex_c.append(ex_r["cost_after"] / ex_r["cost_before"])
    gr_c.append(gr_r["cost_after"] / gr_r["cost_before"])
print("per-layer forward (us):", [round(c * 1e6, 1) for c in costs])
print("exact  remaining expected recompute:", np.round(ex_c, 3))
print("greedy remaining expected recompute:", np.round(gr_c, 3))
plt.figure(figsize=(6, 3))
plt.plot(fracs, ex_c, "o-", label="exact (DP)")
plt.plot(fracs, gr_c, "x--", label="greedy by ratio")
plt.xlabel("memory budget (fraction of activation bytes)")
plt.ylabel("expected recompute left")
plt.title("measured c_l, MODEL p_l")
plt.legend()
plt.show()
assert all(e <= g + 1e-12 for e, g in zip(ex_c, gr_c, strict=True))
# where greedy loses: a slightly denser heavy layer blocks two lighter ones that together are worth more
bad_v, bad_w = [6.6, 5.0, 5.0], [6, 5, 5]
print("greedy", rd.greedy_by_ratio(bad_v, bad_w, 10), "exact", rd.knapsack_exact(bad_v, bad_w, 10))
assert rd.greedy_by_ratio(bad_v, bad_w, 10)[0] == 6.6 < rd.knapsack_exact(bad_v, bad_w, 10)[0] == 10.0
assert all(a >= b - 1e-12 for a, b in zip(ex_c, ex_c[1:], strict=False)) and ex_c[-1] < ex_c[0]

# %% [markdown]
# tinygrad has no checkpoint/failure or pipeline-recovery machinery to compare with:

# %%
# NBVAL_IGNORE_OUTPUT
have_tinygrad, why = tinygrad_status()
print(f"tinygrad importable: {have_tinygrad} {why}".strip())

# %% [markdown]
# ## Recap: interview answers
#
# - [Q134] A sharded checkpoint = per-rank files of chunks located in the *global* tensor + a manifest (shapes, dtypes,
#   CRCs, fingerprint) written last; restarting on N' ranks reads, for each new rank, the intersections of its box
#   with the saved chunks — bitwise equal, no rank holds the whole model.
# - Crash consistency: temp file + fsync + atomic rename + fsync dir, manifest last; a writer killed at any byte
#   leaves no manifest, so the previous step is loaded. A full disk is an error naming the path, nothing overwritten.
# - Interoperability: `to_dcp` / `from_dcp` go through DCP's own `FileSystemWriter`/`Reader` (whole tensors and
#   objects; not the manifest's meta or CRCs).
# - **[Q120]** Asynchronous checkpoint = snapshot to host memory (the stall) + a writer process (shared-memory
#   buffer, `O_DIRECT` write) or thread + a bounded queue for back-pressure + a manifest written last; errors from
#   the writer (or its death) surface on the next call. Measured here: `save` blocked under a quarter of a
#   synchronous save of the same 8 MiB state with either writer; the loop stall ratio is printed against the 10 %
#   goal. Version numbers (torch's `_version` for free) let a save copy and write only changed tensors and reference
#   older files for the rest.
# - **Incremental checkpoints**: hashed fixed-size blocks, deltas + periodic full, compaction that never deletes
#   what a live chain references. They pay for fine-tuning (a fraction of the bytes) and not for Adam on every layer
#   (every block changes: a delta is a full checkpoint).
# - **[Q225]** XOR-diff + byte shuffle + zlib for activation checkpoints: nearby steps compress several times
#   better than unrelated data, merges by XOR, bit-exact.
# - **[Q179]** Tier migration under updates: version + append-only log, chunked copy, replay newer entries, switch
#   under a short lock; equal bitwise to applying every update in order.
# - **Erasure-coded checkpoints [Q157]**: k rank files + r parity files of a systematic Reed–Solomon code over
#   GF(2^8) (Cauchy parity matrix, first row all ones so r = 1 is XOR parity); any r lost or corrupt files (found by
#   CRC-32) are rebuilt bit-exactly by inverting the k x k sub-matrix of the surviving rows (Gauss–Jordan); r + 1
#   losses are reported, not guessed. Checked here on all 15 ways to lose 2 of 6 files.
# - **Cost [Q157]**: f/k extra storage against f x for replication (8 GiB in 8 files, 2 losses: 2 GiB vs 16 GiB);
#   CPU is GB/s with split-nibble `vpshufb` tables, far above the numpy reference; repair reads k files.
# - **Peer replication [Q157]**: a ring copy of each shard in the next rank's memory restores a replaced rank in one
#   transfer, bounded by a timeout that names the failed peer; it does not survive adjacent or whole-job failures.
# - **Elastic restart**: checkpoint = each rank's own shard + a manifest committed last; on restart load the newest
#   committed one, resharded to the new world size, and replay from saved step + 1; data chosen by (step, sample
#   index) makes the replay bitwise at the same world size (checked above for DDP and ZeRO-1/2/3 under torchrun).
# - **Shrink**: after a whole-job failure restart with fewer ranks: the same checkpoint loads at N' (tests: 2 -> 1
#   bitwise equal to the same world-size sequence without a failure).
# - **Recovery time** = detection + process restart + load + first step; the restart (imports, rendezvous)
#   dominates on a small model, the load is milliseconds.
# - **[Q134] Live resize vs restart**: live resharding moves only the elements whose owner changes, in memory, no
#   new processes -- for graceful leaves; a crash loses the shard in memory, so a checkpoint (or replica) is needed.
# - [Q207] N independent nodes: cluster MTBF = M/N, P(no failure in T) = e^(−NT/M); checkpoint every
#   τ ≈ sqrt(2δM_c) (Young), Daly's higher-order correction for larger δ/M; expected time per segment
#   (M + R)(e^((τ+δ)/M) − 1). Verified by simulation with a measured δ.
# - [Q185] Straggler = persistently high robust z-score vs peers (median/MAD, k consecutive steps); tolerate with
#   bounded-staleness async SGD, η/(1+τ), converging like sync in gradients computed.
# - [Q109] Pipeline DAG + boundary (micro-batch) checkpoints: a failed stage replays only its completed F/B ops, no
#   other stage redoes anything; gradients bitwise equal; ~1/S of a full restart's replay.
# - [Q177] EWMA + trend extrapolation + hysteresis on telemetry, migrate on the rising edge: fewer false alarms than a
#   raw threshold, earlier than no trend; a hot spare moves one shard, shrinking re-slices everything.
# - [Q191] Protecting layers under a budget is a 0/1 knapsack on p_l·c_l: exact DP, greedy ½-approximation.

# %% [markdown]
# ## Exercises
#
# `exercises/15_resilient_training/` (check with `tinylearn check 15`): an atomic checkpoint write, XOR parity
# rebuild, the Young/Daly interval. Further work, one per part of this notebook:
#
# - (1) Make the torn-write drill kill between the last rank file and the manifest and show the step is
#   still skipped. (2) Add a `template` that reshards `tp.row` to a column split and check it against numpy slicing.
# - (1) make `AsyncCheckpointer` write through `save_sharded` so each rank writes its own shard; (2) add
#   a block-level dedup across keys (tied embeddings) to `DeltaCheckpointer`.
# - (1) make `protect` stream the files in fixed-size stripes so memory stays bounded for 100 GB
#   checkpoints; (2) place the k + r files on distinct failure domains (nodes, racks) and compute the probability of
#   losing more than r under independent node failures.
# - (1) make `interval="auto"` re-measure C at every checkpoint and watch I* follow a slowing disk;
#   (2) grow 1 -> 2 ranks from a checkpoint and check the same bitwise property.
# - (1) Let the restart fail too (Daly's M·e^(R/M)) and check the optimum τ does not move. (2) Replace
#   the layer-independent recompute cost with the cascade cost (recompute from the nearest protected layer) and solve
#   it by DP over layer prefixes.
