# %% [markdown]
# # 17 · Autotuning and profiling: measure where the time goes, then let the machine choose
#
# Every fast kernel in tinylearn was written with hand-picked parameters: the GEMM's cache blocks MC/KC/NC and
# micro-kernel, the conv and softmax versions, flash attention's block size, the int8 path, the thread count, the
# compiler's schedules. `backend=None` picked among them by fixed priorities. This notebook first **profiles**
# (`tl.profile()`: every op with its shapes, backend/version, time, FLOPs, bytes, arithmetic intensity; a table shaped
# like `torch.profiler`'s, a Chrome trace, hardware counters where this VM exposes them), then **tunes**: search spaces
# declared next to the kernels (`tinylearn.tunable`), a measurement harness that checks every candidate against the
# reference before timing it, records in SQLite keyed by the machine's fingerprint, searchers from grid to a learned
# XGBoost cost model, and tuned choices that `backend=None` dispatch uses without code changes
# (`TINYLEARN_TUNE=cached`).
#
# * **profiling**: a training step read from the table, beside torch.profiler; roofline placement; hardware counters;
#   a hot op that triggers re-tuning, §1–4;
# * **search**: the GEMM space and why most of it is bad; grid, random, annealing, evolution and TPE on one plot;
#   tuned dispatch; a UCB1 bandit over implementations, §5–8;
# * **learned cost models**: features, errors, Kendall τ, transfer to a new shape, model-guided search; clustering
#   new variants; run-time statistics choosing the next variant, §9–12;
# * **predictive models**: the next step's time from its history; concurrent-kernel interference; a pre-silicon
#   proxy (MODEL); how Triton, TVM/Ansor, tinygrad's BEAM and torch.compile's max-autotune do it, §13–16.
#
# Times are measured here, on a 2-core VM shared with other work: the bench harness warms up, repeats and takes the
# median or best, and every claim about speed is asserted with a margin (or only printed). Anything modelled is
# labelled MODEL. This VM has no GPU: GPU profilers and counters are described, not run.
#
# **Interview questions**: [Q62] GPU profiling tools and bottlenecks · [Q70] a performance-analysis system ·
# [Q80] run-time feedback choosing the implementation · [Q87] ML cost models for schedules · [Q110] counters as a
# bandit's reward · [Q123] an autoregressive predictor of the next batch · [Q129] proxy parameters before silicon ·
# [Q139] re-JIT of hot ops from counters · [Q212] run-time statistics choosing the instruction order · [Q228]
# concurrent-kernel interference · [Q236] clustering new variants.

# %%
import tinylearn as tl  # first: its short OpenMP spin-wait is set before torch loads libgomp (notebook 00)

# isort: split
import dataclasses
import functools
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import matplotlib.pyplot as plt
import numpy as np
import torch
from torch.profiler import ProfilerActivity
from torch.profiler import profile as torch_profile

from tinylearn import backends, tunable
from tinylearn._threads import limited_threads
from tinylearn.autograd import Tensor
from tinylearn.bench import measure, tinygrad_status
from tinylearn.bench.comparators import Comparison, tinygrad_jit
from tinylearn.bench.plots import plot_table
from tinylearn.bench.roofline import machine_peak, roofline_plot
from tinylearn.gemm import ops as gemm_ops
from tinylearn.profiler import (
    HotspotMonitor,
    counters_available,
    fastest_version_retune,
    profile,
    record_function,
    software_counters,
)
from tinylearn.profiler.counters import perf_event_paranoid
from tinylearn.tolerance import assert_close
from tinylearn.tune import ar_predict, interference, proxy_model
from tinylearn.tune.bandit import run_bandit
from tinylearn.tune.clustering import VariantClusters, time_config
from tinylearn.tune.cost_model import CostModel, ModelGuidedSearch, transfer
from tinylearn.tune.dispatch import tuned
from tinylearn.tune.measure import check_output, measure_config
from tinylearn.tune.records import RecordDB
from tinylearn.tune.searchers import SEARCHERS, RandomSearch, config_key
from tinylearn.tune.tpe import TPESearch
from tinylearn.tune.tuner import confirm, tune
from tinylearn.tune.variants import loop_stats, run_batches

# %% [markdown]
# ## 1. Profiling a training step: the op table and a Chrome trace [Q70]
#
# **Answer.** A profiler for a DL framework hooks the two places every op passes through — here the autograd
# `Function.apply` (forward), the autograd engine (backward) and `backends.dispatch` (the kernel a backend runs) —
# and records per call: name, start/end (`perf_counter_ns`), thread, input shapes/dtypes, backend/version, and its
# parent (a kernel dispatched inside a Function's forward is its child, so self time = total − children). User
# ranges (`record_function`, NVTX's role) nest around them. Aggregating by name gives torch.profiler's
# `key_averages().table()`; the same events written as Chrome-trace "X" events open in Perfetto. Adding a FLOP/byte
# model per op (from names and shapes) turns the table into achieved GFLOP/s and arithmetic intensity — the input of
# bottleneck analysis (§2). `memory=True` adds a per-op allocation peak (tracemalloc), `counters=True` hardware
# counters (§3).
#
# The same 784→512→10 MLP step runs under `tl.profile()` and under `torch.profiler`: in both the GEMMs (tinylearn's
# `Linear` / `LinearBackward`, torch's `aten::addmm` / `aten::mm`) take more self time together than any other op
# and most of the step's self time (the shares are printed; asserted: over half of tinylearn's, over a fifth of
# torch's, whose shorter step spends relatively more in its many small ops: log-softmax, nll_loss, copies).

# %%
# NBVAL_IGNORE_OUTPUT
pf_rng = np.random.default_rng(0)
pf_x_np = pf_rng.standard_normal((256, 784)).astype(np.float32)
pf_y_np = pf_rng.integers(0, 10, 256)
tl.manual_seed(0)
pf_model = tl.nn.Sequential(tl.nn.Linear(784, 512), tl.nn.ReLU(), tl.nn.Linear(512, 10))
pf_x, pf_y = tl.tensor(pf_x_np), tl.tensor(pf_y_np)


def pf_step() -> None:
    with record_function("train_step"):
        loss = tl.nn.functional.cross_entropy(pf_model(pf_x), pf_y)
        loss.backward()
        for p in pf_model.parameters():
            p.grad = None


pf_step()  # warm-up (first-call costs stay out of the table)
with profile() as pf_prof:
    for _ in range(3):
        pf_step()
print(pf_prof.table(sort_by="self_cpu_time_total", row_limit=10))

# %%
# NBVAL_IGNORE_OUTPUT
pf_tmodel = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
pf_tx, pf_ty = torch.from_numpy(pf_x_np), torch.from_numpy(pf_y_np)


def pf_tstep() -> None:
    torch.nn.functional.cross_entropy(pf_tmodel(pf_tx), pf_ty).backward()
    pf_tmodel.zero_grad(set_to_none=True)


pf_tstep()
with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True) as pf_tprof:
    for _ in range(3):
        pf_tstep()
pf_tavg = pf_tprof.key_averages()
print(pf_tavg.table(sort_by="self_cpu_time_total", row_limit=8))
print(
    "tinygrad:",
    "profiles through env vars (DEBUG=2 per-kernel times, PROFILE=1 a Perfetto trace), no op table API to compare"
    if tinygrad_status()[0]
    else tinygrad_status()[1],
)

# %%
# NBVAL_IGNORE_OUTPUT
PF_GEMM = ("linear", "addmm", "mm", "matmul", "bmm")


def pf_kind(name: str) -> str:
    n = name.lower().replace("aten::", "").replace("backward", "")
    return "gemm" if n in PF_GEMM else "other"


pf_ka = [r for r in pf_prof.key_averages() if r.kind != "user"]
pf_top_tl = [r.key for r in sorted(pf_ka, key=lambda r: -r.self_ns)[:3]]
pf_top_torch = [e.key for e in sorted(pf_tavg, key=lambda e: -e.self_cpu_time_total)[:3]]
print("top-3 tinylearn:", pf_top_tl, "| top-3 torch:", pf_top_torch)
pf_tl_self = {r.key: r.self_ns for r in pf_ka}
pf_t_self = {e.key: e.self_cpu_time_total for e in pf_tavg}
pf_gemm_share = sum(v for k, v in pf_tl_self.items() if pf_kind(k) == "gemm") / sum(pf_tl_self.values())
pf_tgemm_share = sum(v for k, v in pf_t_self.items() if pf_kind(k) == "gemm") / sum(pf_t_self.values())
print(f"GEMM share of self time: tinylearn {pf_gemm_share:.0%}, torch {pf_tgemm_share:.0%}")
# in both frameworks the GEMMs together take more self time than any other single op (a scheduler hiccup can
# reorder the top entries of a 3-step profile on a busy box, so the claim is made on the sums)
for pf_self in (pf_tl_self, pf_t_self):
    pf_g = sum(v for k, v in pf_self.items() if pf_kind(k) == "gemm")
    assert pf_g > max(v for k, v in pf_self.items() if pf_kind(k) != "gemm"), pf_self
assert pf_gemm_share > 0.5 and pf_tgemm_share > 0.2, (pf_gemm_share, pf_tgemm_share)

# %%
# NBVAL_IGNORE_OUTPUT
pf_lin = pf_prof.key_averages().row("Linear")
assert pf_lin.count == 6 and pf_lin.flops == 3 * 2 * 256 * (784 * 512 + 512 * 10)  # 2·M·K·N per layer per step
pf_dir = tempfile.mkdtemp()
pf_trace = pf_prof.export_chrome_trace(os.path.join(pf_dir, "train_step.json"))
with open(pf_trace) as pf_f:
    pf_tr = json.load(pf_f)["traceEvents"]
print(f"{len(pf_tr)} trace events -> {pf_trace} (open in https://ui.perfetto.dev)")
assert len(pf_tr) == len(pf_prof.events()) and all(e["ph"] == "X" for e in pf_tr)
assert sum(e["name"] == "train_step" for e in pf_tr) == 3

# %% [markdown]
# ## 2. Placing the profiled ops on the roofline [Q62]
#
# **Answer.** Bottleneck identification = put every hot op on the roofline: x = arithmetic intensity (FLOPs /
# bytes moved), y = achieved GFLOP/s; the roof is min(peak, intensity × bandwidth). Ops left of the ridge
# (element-wise, softmax, norms, ~0.1–1 FLOP/byte) are memory-bound: fuse them or cut bytes (lower precision); ops
# right of it (GEMMs, convs) are compute-bound: tile, vectorize, use tensor cores. The distance below the roof is
# the headroom; an op far below it at high time share is the one to optimise (or re-tune, §4). Roofs here are this
# CPU's measured FMA peak and STREAM bandwidth (`machine_peak()`); bytes are the compulsory-traffic MODEL
# (inputs + outputs once), so intensity is an upper bound. The bandwidth roof is DRAM's: an op whose working set
# stays in L2 (the 256×512 ReLU here, 512 KB) can run above it — a cache roof sits higher — and on this shared VM
# the measured roofs move with the load of other processes, so "fraction of roof" is read loosely.

# %%
# NBVAL_IGNORE_OUTPUT
pf_mp = machine_peak()
pf_roof = pf_prof.roofline()
for pf_r in sorted(pf_roof, key=lambda r: -r["self_ns"]):
    print(
        f"{pf_r['name']:24s} AI {pf_r['intensity']:7.2f} FLOP/B  {pf_r['gflops']:7.2f} GFLOP/s  roof "
        f"{pf_r['attainable_gflops']:7.1f}  {pf_r['bound']:7s} {pf_r['fraction']:.1%} of roof"
    )
pf_fig, pf_ax = plt.subplots(figsize=(6, 4))
roofline_plot(
    pf_ax,
    pf_mp["gflops_fp32"],
    pf_mp["bandwidth_gbs"],
    [(r["name"], r["intensity"], r["gflops"]) for r in pf_roof],
    labels="legend",
)
pf_ax.set_title("profiled MLP step on this CPU's roofline (bytes: MODEL, compulsory traffic)")
plt.show()
pf_by = {r["name"]: r for r in pf_roof}
assert pf_by["Linear"]["intensity"] > 10 * pf_by["autograd.relu"]["intensity"]
assert pf_by["autograd.relu"]["bound"] == "memory"
pf_over = [r["name"] for r in pf_roof if r["fraction"] > 1]
print("above the DRAM roof (working set in cache, or roofs measured under load):", pf_over or "none")
assert all(
    r["bound"] == ("memory" if r["intensity"] < pf_mp["gflops_fp32"] / pf_mp["bandwidth_gbs"] else "compute")
    for r in pf_roof
)

# %% [markdown]
# ## 3. Hardware counters: what this machine exposes, what a GPU profiler gives [Q62]
#
# **Answer.** Counters say *why* an op sits where it does on the roofline: instructions/cycle, cache misses,
# branch misses. On Linux they come from `perf_event_open` (what `perf stat` uses; `tl.profile(counters=True)` calls
# the syscall through ctypes). On a VM without a virtual PMU the hardware events fail (ENOENT) and only the
# kernel's software counters (task-clock, page faults, context switches) or `getrusage` remain — the reason below is
# the real one from this machine. On an NVIDIA GPU (**none here: described, not run**) the equivalents are: *Nsight
# Systems* (timeline: kernels, memcpys, NVTX ranges, CPU-GPU gaps), *Nsight Compute* `ncu` (per-kernel counters
# through CUPTI: SM throughput %, achieved occupancy, dram__bytes, l2 hit rate, warp stall reasons, its own roofline
# chart), `nvprof` (the pre-Volta tool Nsight replaced), and CUPTI itself (the library torch.profiler's CUDA
# activity uses). The method is the same: timeline → hot kernels → counters → bound (memory / compute / latency) →
# fix → re-measure.

# %%
# NBVAL_IGNORE_OUTPUT
pf_hw_ok, pf_hw_reason = counters_available()
print("hardware counters:", pf_hw_ok, "-", pf_hw_reason)
if not pf_hw_ok:
    assert "perf_event_open failed" in pf_hw_reason and f"perf_event_paranoid={perf_event_paranoid()}" in pf_hw_reason
with software_counters() as pf_sw:
    pf_step()
print("one training step:", pf_sw)
assert pf_sw["source"].startswith(("perf_event_open", "resource.getrusage"))
if "task-clock" in pf_sw:
    assert pf_sw["task-clock"] > 0

# %% [markdown]
# ## 4. Hot op → re-JIT / re-tune trigger [Q139]
#
# **Answer.** A runtime watches per-op counters (here: time share and achieved fraction of the roof from the
# profile; on a GPU: SM active %, instruction mix, L2 misses from CUPTI) and, when an op is both hot and far below
# its roof, hands its (op, shape) to a compiler/tuner — TVM's or Triton's autotuner — which generates or picks a
# better variant, checks it against the old output, times both and swaps it in only when faster. `HotspotMonitor`
# does this for `backends.dispatch` ops with a `retune(op, shapes)` callback. The callback here tries every
# registered version of the op and keeps the fastest correct one; the tuner (`tl.tune`) plugs into the same slot.
# Pinning `gemm.matmul` to the naive C++ loop makes it the hot spot: the monitor flags it and the re-tune picks a
# faster version.

# %%
# NBVAL_IGNORE_OUTPUT
pf_a = pf_rng.standard_normal((128, 128)).astype(np.float32)
pf_slow = ("cpp", "naive") if backends.runs_here(gemm_ops.OP, "cpp", "naive") else ("numpy", "default")
pf_mp1 = {"peak_gflops": pf_mp["gflops_fp32_1t"], "bandwidth_gbs": pf_mp["bandwidth_gbs"]}  # one-thread roofs
if not pf_mp1["peak_gflops"] > 0:  # no C++ extension: the all-core BLAS figure
    pf_mp1["peak_gflops"] = pf_mp["gflops_fp32"]
pf_mon = HotspotMonitor(threshold_fraction=0.3, min_calls=3, repeat=3, **pf_mp1)
pf_tried: dict = {}


def pf_retune(op: str, shapes: tuple):
    """Try every registered version of the op here, keep the fastest correct one (tl.tune plugs in here later)."""
    # triton runs in its CPU interpreter on this box (seconds per call): not a candidate here
    fn = fastest_version_retune(op, shapes, ("float32",) * len(shapes), repeat=3, exclude=[("triton", "tiled")])
    pf_tried.update(getattr(fn, "tried", {}))
    return fn


# one thread for BLAS, OpenMP and torch: an idle pool spinning (OpenBLAS vs the C++ kernels' OpenMP) would otherwise
# stall whichever kernel is timed next on this 2-core VM
with limited_threads(1, torch=True):
    with backends.use(gemm_ops.OP, backend=pf_slow[0], version=pf_slow[1]):
        with profile() as pf_hprof:
            for _ in range(4):
                gemm_ops.matmul(pf_a, pf_a)
    pf_decisions = pf_mon.check(pf_hprof, pf_retune)
    pf_t_torch = measure(lambda: torch.from_numpy(pf_a) @ torch.from_numpy(pf_a), warmup=2, repeat=7).min
    if pf_decisions and pf_decisions[0].action == "retuned":
        with backends.use(gemm_ops.OP, backend=pf_decisions[0].new_backend, version=pf_decisions[0].new_version):
            with profile() as pf_hprof2:
                for _ in range(4):
                    gemm_ops.matmul(pf_a, pf_a)
        pf_after = HotspotMonitor(threshold_fraction=0.3, min_calls=3, **pf_mp1).hot(pf_hprof2)
        print("hot after the swap:", [(d.op, f"{d.fraction:.1%}") for d in pf_after])
print("versions tried:", {k: (f"{v * 1e6:.0f} us" if isinstance(v, float) else v) for k, v in pf_tried.items()})
for pf_dd in pf_decisions:
    print(
        f"{pf_dd.op} {pf_dd.shapes} {pf_dd.backend}/{pf_dd.version}: {pf_dd.share:.0%} of time, "
        f"{pf_dd.fraction:.1%} of roof -> {pf_dd.action} {pf_dd.new_backend}/{pf_dd.new_version}: {pf_dd.note}"
    )
pf_tg = "has no runtime re-tune trigger (BEAM=n searches kernels ahead of time)"
print(
    f"torch.matmul same shape: {pf_t_torch * 1e6:.1f} us; tinygrad:",
    pf_tg if tinygrad_status()[0] else tinygrad_status()[1],
)
if pf_slow == ("cpp", "naive"):
    (pf_d,) = pf_decisions
    assert pf_d.action == "retuned" and pf_d.speedup > 2  # naive triple loop vs a tiled/BLAS version: >> 2x
    pf_fig, pf_ax = plt.subplots(figsize=(5, 3))
    pf_ax.bar(
        ["before (naive)", f"after ({pf_d.new_backend}/{pf_d.new_version})", "torch"],
        [pf_d.before_s * 1e6, pf_d.after_s * 1e6, pf_t_torch * 1e6],
    )
    pf_ax.set_ylabel("us per 128³ matmul (min, 1 thread)")
    pf_ax.set_yscale("log")
    plt.show()
    print(f"re-tune: {pf_d.speedup:.0f}x faster than the naive loop; after/torch = {pf_d.after_s / pf_t_torch:.1f}")

# %% [markdown]
# The same slot takes the tuner: `pf_tl_retune` turns the profiled shapes into the space's named shape
# (`space.shape_of`), runs `tl.tune.tune` on it (a random search of 12 configurations of `gemm.matmul`'s space, each
# checked against numpy before it is timed) and hands back the winning configuration's kernel; in a server the
# record would also go to the database so that `TINYLEARN_TUNE=cached` serves it from then on (§7).

# %%
# NBVAL_IGNORE_OUTPUT
pf_space = tunable.get(gemm_ops.OP)


def pf_tl_retune(op: str, shapes: tuple):
    """tl.tune in HotspotMonitor's retune slot: profiled shapes -> named shape -> tune -> the winner's kernel."""
    sp = tunable.get(op)
    named = sp.shape_of(*(np.empty(s, np.float32) for s in shapes))
    res = tl.tune.tune(op, named, searcher="random", budget=12, seed=0, store=False, repeat=3)
    fn = sp.build(res.best)
    fn.backend, fn.version = sp.backend, "tuned:" + ",".join(f"{k}={v}" for k, v in res.best.items())
    return fn


with limited_threads(1, torch=True):
    pf_tl_decisions = HotspotMonitor(threshold_fraction=0.3, min_calls=3, repeat=3, **pf_mp1).check(
        pf_hprof, pf_tl_retune
    )
for pf_dd in pf_tl_decisions:
    print(f"{pf_dd.op} {pf_dd.shapes}: {pf_dd.action} -> {pf_dd.new_version} ({pf_dd.speedup:.0f}x)")
if pf_slow == ("cpp", "naive"):
    assert pf_tl_decisions[0].action == "retuned", pf_tl_decisions  # swapped in only when measured faster

# %% [markdown]
# ## 5. The GEMM search space, and why most of it is bad
#
# `tinylearn.gemm.tuning` declares the knobs of `gemm.matmul` (a `tunable.Space`): the C++ rung (`simd`: one
# thread, `parallel`: OpenMP), the micro-kernel ISA, the GotoBLAS cache blocks `mc`/`kc`/`nc` and the thread count,
# with constraints (an ISA this CPU runs, `threads > 1` only for `parallel`, no block larger than the one covering
# its dimension). `tinylearn.tune.measure_config` runs one configuration, compares its output with numpy's under the
# DESIGN.md tolerance **before** timing it (a fast wrong kernel is reported, never chosen), then times it with
# warm-up, repeats, outlier rejection (median + 3 MAD) and a re-measurement when the spread is too wide.
#
# **Answer.** A random sample of the space at 256³ fp32 is mostly slow: well under half of it lands within 10 % of
# the best, and the slow tail has one thing in common, the scalar micro-kernel (the printed median ratio to the
# vector ones; asserted above 4x: the ISA is worth more than every blocking choice together); among vector
# configurations the spread
# comes from threads and blocks. On this shared 2-core VM the 2-thread configurations are also the erratic ones:
# when another process holds a core, OpenMP's barrier waits for it, so their times swing from run to run (the
# per-knob medians printed below show it) -- which is why the harness rejects outliers and re-measures noisy runs.
# A tuner's job is to find the few good points cheaply, and never to trust one without checking its output.

# %%
# NBVAL_IGNORE_OUTPUT
# (how many configurations are valid depends on the micro-kernel ISAs this CPU runs)
sr_space = tunable.get("gemm.matmul")
sr_shape = {"M": 256, "N": 256, "K": 256}
sr_valid = list(sr_space.configs(sr_shape))
# a vector micro-kernel exists on every x86-64 CPU since Haswell; TINYLEARN_CPU_FEATURES=scalar leaves only the scalar
# one, and then the ISA comparisons below have nothing to compare (they are skipped, the rest still runs)
sr_has_vector = any(c["isa"] != "scalar" for c in sr_valid)
sr_args, sr_kwargs = sr_space.make_args(sr_shape, np.random.default_rng(0))
sr_expected = sr_args[0] @ sr_args[1]
print(f"{sr_space.size()} configurations in the grid, {len(sr_valid)} valid at {sr_shape}")
print("knobs:", {p.name: p.values for p in sr_space.params})
assert 0 < len(sr_valid) < sr_space.size() and all(c["threads"] == 1 or c["version"] == "parallel" for c in sr_valid)


def sr_measure(cfg):
    return measure_config(sr_space, cfg, sr_args, sr_kwargs, expected=sr_expected, warmup=0, repeat=3, retries=0)


def sr_key(cfg):
    return tuple(sorted(cfg.items()))


# %%
# NBVAL_IGNORE_OUTPUT
sr_rng = np.random.default_rng(17)
sr_n = min(60, len(sr_valid))
sr_sample = [sr_valid[i] for i in sr_rng.choice(len(sr_valid), size=sr_n, replace=False)]
sr_t0 = time.perf_counter()
sr_table = {sr_key(c): sr_measure(c) for c in sr_sample}
print(f"measured {sr_n} random configurations in {time.perf_counter() - sr_t0:.1f} s")
sr_ok = {k: m.seconds for k, m in sr_table.items() if m.ok}
sr_errors = [m.error for m in sr_table.values() if not m.ok]
assert not sr_errors and len(sr_ok) == sr_n, sr_errors  # every configuration computes the right product
sr_best_s = min(sr_ok.values())
sr_rel = np.array([sr_ok[sr_key(c)] / sr_best_s for c in sr_sample])
sr_within = float(np.mean(sr_rel <= 1.10))
sr_scalar = np.array([c["isa"] == "scalar" for c in sr_sample])
sr_one = np.array([c["threads"] == 1 for c in sr_sample])
sr_slow = sr_rel > 2.0
print(f"best {sr_best_s * 1e3:.2f} ms; within 10% of best: {sr_within:.0%}; slower than 2x best: {sr_slow.mean():.0%}")
if sr_has_vector:
    print(
        f"among the >2x-slow: scalar {sr_scalar[sr_slow].mean():.0%}, one thread {sr_one[sr_slow].mean():.0%}, "
        f"either {(sr_scalar | sr_one)[sr_slow].mean():.0%} (of the whole sample: scalar {sr_scalar.mean():.0%}, "
        f"one thread {sr_one.mean():.0%})"
    )
    print(f"median scalar / median vector time: {np.median(sr_rel[sr_scalar]) / np.median(sr_rel[~sr_scalar]):.1f}x")
else:
    print("only the scalar micro-kernel runs on this CPU path: the ISA comparison is skipped")
for sr_k in ("isa", "version", "threads", "mc", "kc"):
    sr_groups = {
        v: float(np.median([r for c, r in zip(sr_sample, sr_rel) if c[sr_k] == v]))
        for v in sr_space.param(sr_k).values
        if any(c[sr_k] == v for c in sr_sample)
    }
    print(f"median time/best by {sr_k}:", {v: round(x, 2) for v, x in sr_groups.items()})
sr_fig, sr_ax = plt.subplots(figsize=(6, 3))
sr_ax.hist(sr_rel, bins=np.logspace(0, math.log10(sr_rel.max() * 1.05), 25), color="gray", label="all")
sr_ax.hist(sr_rel[sr_scalar], bins=np.logspace(0, math.log10(sr_rel.max() * 1.05), 25), color="C3", label="isa=scalar")
sr_ax.set_xscale("log")
sr_ax.set_xlabel("time / best time (256³ fp32)")
sr_ax.set_ylabel("configurations")
sr_ax.axvline(1.1, color="k", ls="--", lw=1)
sr_ax.legend()
sr_ax.set_title("random sample of the gemm.matmul space")
plt.show()
if sr_has_vector:
    assert sr_within < 0.5  # most of the space is not near the best
    assert np.median(sr_rel[sr_scalar]) > 4 * np.median(sr_rel[~sr_scalar])  # scalar: the slow tail, by far
    assert sr_sample[int(np.argmin(sr_rel))]["isa"] != "scalar" and sr_scalar[sr_slow].mean() > sr_scalar.mean()

# %% [markdown]
# ## 6. Searchers compared: grid, random, annealing, evolution, TPE, cost model [Q87]
#
# Every searcher speaks the same protocol (`ask()` a configuration, `tell(config, seconds)`; never the same
# configuration twice). §5's lessons are applied first: a constraint prunes the scalar ISA (where a vector one runs),
# and, on this shared 2-core VM, the 2-thread configurations whose times swing with the neighbours' load (a race on
# them would be a lottery); to compare the searchers on equal terms, all of them are measured once at 256³ (the
# sample above plus the rest) and each searcher is driven for 40 trials (half the space on a CPU path with fewer
# configurations) with times **looked up in that table**: every searcher sees the same measurements, and the
# exhaustive best is the line they race to. `grid` walks the space in
# its fixed order, `random` samples without replacement, `anneal` moves to neighbours with the Metropolis rule on
# log time, `evolution` breeds tournament winners, `tpe` is optuna's Parzen-estimator sampler, `model` the learned
# XGBoost cost model (its mechanism and accuracy are the cost-model section's).
#
# **Answer.** With 40 trials out of 72 configurations (on this Zen 5 EPYC) the guided searchers (anneal, evolution, TPE,
# the cost model) end within a few percent of the exhaustive best (the printed ratios; asserted: at least one within
# 10 %). Random is
# a strong baseline here because many points are near-best along the blocking knobs, and whether grid does well
# depends only on what its fixed enumeration order happens to visit first; the curves show how fast each one gets
# there, which is what matters when a trial costs seconds instead of microseconds.

# %%
# NBVAL_IGNORE_OUTPUT
# §5: the scalar micro-kernel is never competitive, and 2-thread timings on this shared VM are a lottery: prune both
sr_vspace = dataclasses.replace(
    sr_space,
    valid=lambda c, s: sr_space.is_valid(c, s) and (c["isa"] != "scalar" or not sr_has_vector) and c["threads"] == 1,
)
sr_vvalid = list(sr_vspace.configs(sr_shape))
sr_t0 = time.perf_counter()
for sr_c in sr_vvalid:
    if sr_key(sr_c) not in sr_table:
        sr_table[sr_key(sr_c)] = sr_measure(sr_c)
sr_all = {sr_key(c): sr_table[sr_key(c)].seconds for c in sr_vvalid if sr_table[sr_key(c)].ok}
sr_exh = min(sr_all.values())
print(
    f"exhaustive over the {len(sr_vvalid)} one-thread configurations: "
    f"{time.perf_counter() - sr_t0:.1f} s more; best {sr_exh * 1e3:.3f} ms"
)

sr_searchers = dict(SEARCHERS, tpe=TPESearch)
try:
    from tinylearn.tune.cost_model import ModelGuidedSearch

    sr_searchers["model"] = functools.partial(ModelGuidedSearch, batch=8)  # refit every 8 trials
except ImportError as sr_e:
    print("model searcher unavailable:", sr_e)
sr_budget = 40 if len(sr_all) > 60 else len(sr_all) // 2  # half the space on a CPU path with fewer configs
sr_curves = {}
for sr_name, sr_cls in sr_searchers.items():
    sr_s = sr_cls(sr_vspace, sr_shape, seed=0)
    sr_cur, sr_curve = math.inf, []
    while len(sr_curve) < sr_budget and (sr_c := sr_s.ask()) is not None:
        sr_t = sr_all.get(sr_key(sr_c))
        sr_s.tell(sr_c, sr_t)
        sr_cur = min(sr_cur, sr_t if sr_t is not None else math.inf)
        sr_curve.append(sr_cur)
    sr_curves[sr_name] = np.array(sr_curve) / sr_exh
    print(f"{sr_name:10s} best after {sr_budget}: {sr_curves[sr_name][-1]:.3f} x exhaustive best")
sr_fig, sr_ax = plt.subplots(figsize=(6.5, 3.4))
for sr_name, sr_curve in sr_curves.items():
    sr_ax.plot(np.arange(1, len(sr_curve) + 1), sr_curve, label=sr_name)
sr_ax.axhline(1.0, color="k", ls="--", lw=1, label=f"exhaustive ({len(sr_all)} configs)")
sr_ax.set_yscale("log")
sr_ax.set_xlabel("trials (measured configurations)")
sr_ax.set_ylabel("best found / exhaustive best")
sr_ax.legend(ncol=2, fontsize=8)
sr_ax.set_title("search progress, gemm.matmul 256³ fp32 (times from the measured table)")
plt.show()
sr_guided = [sr_curves[n][-1] for n in ("anneal", "evolution", "tpe") + (("model",) if "model" in sr_curves else ())]
assert min(sr_guided) <= 1.10  # some guided searcher gets within 10% of the exhaustive best in 40 trials
assert all(c[-1] >= 1.0 for c in sr_curves.values())  # nobody beats the exhaustive best (same table)
assert len(sr_all) > sr_budget  # the budget is a fraction of the space

# %% [markdown]
# ## 7. Tuned dispatch: `backend=None` runs the stored configuration [Q80]
#
# The tuner stores every measurement in a SQLite `RecordDB` tagged with the machine's fingerprint (CPU model,
# features, forced ISA level, library versions): records from another machine are ignored. `tuned("cached",
# db=...)` (or `TINYLEARN_TUNE=cached`) installs a provider that `backends.resolve` consults for calls naming no
# backend: the call's shape class (sizes rounded up to powers of two) -> the best stored configuration ->
# `space.build(config)`. `"search"` mode tunes a missing class on first use; a stored configuration that can no
# longer run here (an ISA the CPU lacks) is ignored with a warning.
#
# **Answer.** Feeding measured kernel times back into dispatch is a lookup: after one search per shape class,
# `tl.gemm.matmul(a, b)` with no backend runs the measured winner (here: the §5-§6 leaders re-measured interleaved,
# stored with this machine's fingerprint), with the same result (checked). The winner is only as good as the
# conditions it was measured in: on this shared 2-core VM a 2-thread configuration (the default, torch's matmul,
# possibly the winner) can stall whenever a neighbour holds a core, which the table's ratios show run to run; hence
# the confirmation pass, and in production a periodic re-check (or the bandit of §8 kept running).

# %%
# NBVAL_IGNORE_OUTPUT
# confirm before trusting: the 4 fastest of §5-§6 and the default, re-measured interleaved (3 passes), so a
# single lucky sample (taken while the neighbours were idle) cannot decide; tune(..., confirm_top=4) does the same
sr_top = sorted((m for m in sr_table.values() if m.ok), key=lambda m: m.seconds)[:4]
sr_default_cfg = sr_space.default(sr_shape)
sr_cands = [m.config for m in sr_top] + ([sr_default_cfg] if sr_default_cfg not in [m.config for m in sr_top] else [])
sr_confirmed = confirm(sr_space, sr_cands, sr_args, sr_kwargs, rounds=3, repeat=3)
sr_db = RecordDB(":memory:")
for sr_m in sr_confirmed:
    sr_first = sr_table.get(sr_key(sr_m.config))
    sr_note = f"search {sr_first.seconds * 1e3:.3f} ms" if sr_first is not None else "(default)"
    print(f"confirmed {sr_m.seconds * 1e3:8.3f} ms  {sr_note:18s} {sr_m.config}")
    sr_db.add("gemm.matmul", sr_shape, sr_m.config, sr_m)
sr_a, sr_b = sr_args
sr_default_choice = backends.resolve("gemm.matmul", args=(sr_a, sr_b))
with tuned("cached", db=sr_db):
    sr_tuned_choice = backends.resolve("gemm.matmul", args=(sr_a, sr_b))
    sr_out = tl.gemm.matmul(sr_a, sr_b)
# the tuner's own check: the DESIGN.md fp32 tolerance, atol scaled by the output's magnitude (|C| ~ sqrt(K) here)
assert check_output(sr_space, sr_out, sr_expected, sr_args, sr_kwargs) is None
assert_close(sr_out, sr_expected, atol=1e-5 * float(np.abs(sr_expected).max()))
print("default:", sr_default_choice[:2], "| tuned:", sr_tuned_choice[:2])
assert sr_tuned_choice[1].startswith("tuned:") and sr_default_choice[1] == "parallel"

sr_ta, sr_tb = torch.from_numpy(sr_a), torch.from_numpy(sr_b)
sr_cmp = Comparison("gemm.matmul 256³ fp32: default vs tuned dispatch", baseline="torch", repeat=5)
with sr_cmp.case("256³", flops=2 * 256**3) as sr_case:
    sr_case.add("tinylearn default", lambda: tl.gemm.matmul(sr_a, sr_b))
    with tuned("cached", db=sr_db):
        sr_case.add("tinylearn tuned", lambda: tl.gemm.matmul(sr_a, sr_b))
    sr_case.add("torch", lambda: torch.matmul(sr_ta, sr_tb))
    sr_case.add_tinygrad(
        "tinygrad",
        lambda tg: (lambda f, x, y: lambda: f(x, y))(
            tinygrad_jit(lambda x, y: x.matmul(y)), tg.Tensor(sr_a).realize(), tg.Tensor(sr_b).realize()
        ),
    )
print(sr_cmp.table)
print("tinygrad:", "ok" if tinygrad_status()[0] else tinygrad_status()[1])
plot_table(sr_cmp.table, metric="gflops", log=False)
plt.show()
sr_def_row = sr_cmp.table.get("256³", "tinylearn default")
sr_tun_row = sr_cmp.table.get("256³", "tinylearn tuned")
sr_torch_row = sr_cmp.table.get("256³", "torch")
print(
    f"tuned / default: {sr_tun_row.median_ms / sr_def_row.median_ms:.2f}x time; "
    f"tuned / torch: {sr_tun_row.median_ms / sr_torch_row.median_ms:.2f}x time"
)

# %% [markdown]
# Reading the table: at 256³ on this CPU the default blocking (`kernel_shape`'s MC/KC/NC, hand-picked for this
# kind of core) is already in the fastest group, so tuned and default differ by the printed ratio, within the
# run-to-run noise of 2-thread timings here, and both sit near torch (printed). What the search adds at this shape
# is the evidence that nothing in the space is clearly faster; the shapes and CPU paths where the defaults are off
# are in `tinylearn bench tune`. tinygrad's TinyJit matmul (generated C loops without a packed micro-kernel) is
# the slowest row where a vector micro-kernel runs (printed; on the forced scalar path tinylearn's scalar kernel is
# the slow one).

# %% [markdown]
# The same mechanism tunes the fused kernels' **row chunking**. `kernels.softmax` and `kernels.layer_norm` declare
# `version × grain`: `grain` is the number of elements each thread gets at least (`threads_for(R*C, grain)` in
# `cpp_src/kernels_math.h`), so it decides whether a medium input wakes the second thread and how many rows each
# thread's chunk holds. Only the threaded rungs read it (the space's `valid` keeps the others at the default
# grain, so no two configurations are the same code). A grid over the whole space at a 64×1024 softmax (64 K
# elements: the default grain gives 2 threads) checks every candidate against the numpy reference, stores it, and
# dispatch then runs the winner.

# %%
# NBVAL_IGNORE_OUTPUT
sm_shape = {"R": 64, "C": 1024}
sm_db = RecordDB(":memory:")
sm_res = tune("kernels.softmax", sm_shape, searcher="grid", budget=100, db=sm_db, repeat=9)
sm_space = tunable.get("kernels.softmax")
sm_valid = list(sm_space.configs(sm_shape))
for sm_m in sorted(sm_res.history, key=lambda m: m.seconds)[:6]:
    print(f"{sm_m.seconds * 1e6:7.1f} us  {sm_m.config}")
print(
    f"{len(sm_res.history)} of {sm_space.size()} configurations valid and measured, {len(sm_res.rejected)} rejected;"
    f" best {sm_res.best} ({sm_res.speedup:.2f}x the default's time)"
)
assert len(sm_res.history) == len(sm_valid) < sm_space.size() and not sm_res.rejected
assert {m.config["grain"] for m in sm_res.history if m.config["version"] == "simd_omp"} == set(
    sm_space.param("grain").values
)
sm_x = np.random.default_rng(3).standard_normal((64, 1024)).astype(np.float32)
with tuned("cached", db=sm_db):
    sm_choice = backends.resolve("kernels.softmax", args=(sm_x,))
    sm_y = tl.kernels.softmax(sm_x)
print("tuned dispatch runs:", sm_choice[1], sm_choice[2].__name__)
assert sm_choice[2].__name__ == f"softmax_cpp_{sm_res.best['version']}_g{sm_res.best['grain']}"
assert_close(sm_y, torch.softmax(torch.from_numpy(sm_x), -1).numpy(), np.float32)

# %% [markdown]
# Which grain wins depends on the machine and its load, which is why it is measured and not fixed: a large grain
# keeps this 256 KiB input on one thread, a small one splits it over both cores, and on a busy 2-core VM a
# descheduled OpenMP thread stalls the whole team, so the one-thread configurations can win by a wide margin
# (printed, not asserted; on a quiet machine the 2-thread default is close to the best). The tuned record makes
# that choice per shape class without a code change; `tinylearn bench tune` tunes softmax and LayerNorm at
# 512×1024 beside the other spaces.

# %% [markdown]
# **`tl.compile`'s kernels are tuned the same way.** Topic 12's compiler generates C++ for every fused kernel with
# `default_schedule` (vectorise the innermost loops, thread the outermost one above a work threshold).
# `tune_compiled(cf)` takes a compiled function that has run once, finds its distinct kernels (by pattern hash and
# shape class: the identical LayerNorm kernels of a deep stack are searched once) and searches each one's schedule
# space (`compiler.tuning.kernel_space`: tile × parallel × vectorize × unroll over the lowered loop nest), every
# candidate compiled and checked against the IR's numpy evaluation before it is timed. Compiled again with tuning on
# (`TINYLEARN_TUNE=cached`, or `tuned(...)` here), the code generator asks `tunable.tuned_config` for each kernel and
# emits the stored schedule; the kernel cache keys compiled code by its source, so tuned and default code never mix.

# %%
# NBVAL_IGNORE_OUTPUT
from tinylearn.compiler.api import show_code  # noqa: E402
from tinylearn.tune.compiled import tune_compiled  # noqa: E402


def cs_fn(x, w, b, r):
    return tl.nn.functional.gelu(tl.nn.functional.layer_norm(x, (x.shape[-1],), w, b)) + r


cs_rng = np.random.default_rng(5)
cs_args = tuple(
    tl.Tensor(cs_rng.standard_normal(s).astype(np.float32)) for s in ((256, 1024), (1024,), (1024,), (256, 1024))
)
cs_plain = tl.compile(cs_fn)
cs_plain(*cs_args)
cs_db = RecordDB(":memory:")
cs_res = tune_compiled(cs_plain, searcher="random", budget=8, db=cs_db, repeat=5)
for cs_r in cs_res:
    print(
        f"{cs_r.op[-16:]} {cs_r.shape}: default {cs_r.default_s * 1e3:.3f} ms {cs_r.default} | "
        f"best {cs_r.best_s * 1e3:.3f} ms {cs_r.best} ({len(cs_r.history)} measured, {len(cs_r.rejected)} rejected)"
    )
with tuned("cached", db=cs_db):
    cs_fast = tl.compile(cs_fn)
    cs_out = cs_fast(*cs_args)
assert_close(cs_out.numpy(), cs_fn(*cs_args).numpy(), np.float32, reduction_size=1024)
assert cs_res and all(not r.rejected and r.best_s is not None for r in cs_res)
cs_quiet = open(os.devnull, "w")  # noqa: SIM115
cs_changed = any(r.best != r.default for r in cs_res)
assert (show_code(cs_fast, file=cs_quiet) != show_code(cs_plain, file=cs_quiet)) == cs_changed
print("the tuned compile emitted", "the stored non-default schedules" if cs_changed else "the default schedules")

# %% [markdown]
# The bench harness compares the two compiles on three fused functions, beside eager tinylearn, torch and tinygrad
# (`tinylearn bench tune` runs the same table with a larger search at 1024×1024):

# %%
# NBVAL_IGNORE_OUTPUT
# (timings)
from tinylearn.tune.bench import compiled_table  # noqa: E402

cs_table = compiled_table(compiled_shape=(256, 1024), compiled_budget=6, repeat=5, warmup=2)
print(cs_table)
plot_table(cs_table)
plt.show()
cs_ms = {(r.case, r.impl): r.median_ms for r in cs_table.rows if r.median_ms is not None}
for cs_case in cs_table.cases():
    cs_d, cs_t = cs_ms[cs_case, "tl.compile default"], cs_ms[cs_case, "tl.compile tuned"]
    cs_tg = cs_ms.get((cs_case, "tinygrad"))
    print(
        f"{cs_case}: tuned/default {cs_t / cs_d:.2f}x time; default/torch {cs_d / cs_ms[cs_case, 'torch']:.2f}x, "
        f"eager/torch {cs_ms[cs_case, 'tl eager'] / cs_ms[cs_case, 'torch']:.2f}x"
        + (f", tinygrad/torch {cs_tg / cs_ms[cs_case, 'torch']:.1f}x" if cs_tg else "")
    )

# %% [markdown]
# Reading it (ratios printed, not asserted: a shared 2-core VM moves them run to run): the goal is tuned
# compiled kernels faster than the default ones on every row. Where the default schedule is already the best one
# in the sampled space (the common case here: the default vectorises and threads exactly the loops a point-wise
# or row kernel needs), tuned equals default up to noise, and the search's value is the evidence that nothing in
# the space is clearly faster; where a tile or a single thread wins (small rows, a busy neighbour holding a core),
# the tuned row shows it. `bench tune --full` records the answer for this machine in the closing table.

# %% [markdown]
# ## 8. A UCB1 bandit over implementations [Q110]
#
# A bandit chooses on every call and learns while serving. `tinylearn.tune.bandit.run_bandit` pulls arms =
# configurations (here: single-thread GEMM micro-kernel ISAs and blocks), one timed call per pull, reward
# `t_ref / t` (the fastest call so far over this one; earlier rewards are rescored when a faster call arrives, so a
# first round slowed by a busy neighbour does not fix the scale); `UCB1` plays the arm maximising
# `mean + sqrt(2 ln N / n)`. `reward="cycles"` asks for the call's CPU cycles from the hardware counters
# (`tinylearn.profiler.counters`: immune to clock changes and to time spent descheduled); where the VM exposes no
# PMU it falls back to time and says so (printed below).
# Afterwards every arm is measured carefully and the regret of each round is the fraction of a best call's time
# lost to exploring.
#
# **Answer.** UCB1 plays every arm once, then concentrates on the fast arms: a clearly slower arm (the scalar one,
# where a vector ISA runs) is retried ever more rarely (pulls grow like log N / gap²), so cumulative regret
# flattens, and the arm it settles on is never a clear loser (asserted within 2x of the best arm; usually the best
# itself, printed). Arms a few percent apart share the pulls:
# at N = 800 the confidence width sqrt(2 ln N / n) is wider than their gap, which costs almost nothing, since regret
# is proportional to the gap. (Expected pulls of an arm with reward gap 0.7: about 2 ln N / 0.7² = 27 of 800, 3%;
# at N = 300 it was 23 of 300, 8%, too close to the 10% asserted below once load narrows the gap.)

# %%
# NBVAL_IGNORE_OUTPUT
sr_bshape = {"M": 128, "N": 128, "K": 128}
sr_base = sr_space.default(sr_bshape)
sr_arms = [
    dict(sr_base, version="simd", threads=1),
    dict(sr_base, version="simd", isa="scalar", threads=1),
    dict(sr_base, version="simd", isa="avx2", threads=1),
    dict(sr_base, version="simd", threads=1, mc=24, kc=64),
]
sr_arms = [c for i, c in enumerate(sr_arms) if sr_space.is_valid(c, sr_bshape) and c not in sr_arms[:i]]
sr_bandit = run_bandit(sr_space, sr_bshape, sr_arms, rounds=800, reward="cycles", seed=0)
print("reward:", sr_bandit.reward_source)
for sr_i, sr_c in enumerate(sr_arms):
    print(
        f"arm {sr_i} {sr_c['version']:8s} {sr_c['isa']:6s} t={sr_c['threads']} mc={sr_c['mc']:3d} kc={sr_c['kc']:3d}: "
        f"{sr_bandit.counts[sr_i]:3d} pulls, measured {sr_bandit.seconds[sr_i] * 1e6:7.1f} us"
    )
sr_fig, sr_ax = plt.subplots(1, 2, figsize=(9, 3))
sr_ax[0].plot(sr_bandit.regret)
sr_ax[0].set_xlabel("round")
sr_ax[0].set_ylabel("cumulative regret (best-call times)")
sr_ax[0].set_title("UCB1 regret")
sr_ax[1].bar(
    range(len(sr_arms)),
    sr_bandit.counts,
    color=["C2" if i == sr_bandit.best_arm else "C0" for i in range(len(sr_arms))],
)
sr_ax[1].set_xlabel("arm")
sr_ax[1].set_ylabel("pulls")
sr_ax[1].set_title("pulls per arm (green: measured best)")
plt.show()
sr_settled = sr_bandit.settled_arm
print(f"settled on arm {sr_settled}, measured best arm {sr_bandit.best_arm}")
assert sr_bandit.seconds[sr_settled] <= 2 * min(sr_bandit.seconds)  # never settles on a clear loser
sr_bad = [i for i, t in enumerate(sr_bandit.seconds) if t > 2 * min(sr_bandit.seconds)]
print(f"pulls of the arms slower than 2x best: {sum(sr_bandit.counts[i] for i in sr_bad)} of {sum(sr_bandit.counts)}")
if sr_has_vector:  # the scalar arm is a clear loser wherever a vector micro-kernel runs: pulled rarely
    assert sr_bad and sum(sr_bandit.counts[i] for i in sr_bad) < 0.1 * sum(sr_bandit.counts)
sr_half = len(sr_bandit.regret) // 2
if sr_has_vector:  # with a clear loser the cumulative regret flattens (near-tied arms add noise-sized regret forever)
    assert sr_bandit.regret[-1] - sr_bandit.regret[sr_half] < sr_bandit.regret[sr_half] + 1e-9

# %% [markdown]
# ## 9. A learned cost model: features, training data, errors, Kendall tau [Q87]
#
# `tinylearn.tune.CostModel(space)` learns which configurations of a `tunable.Space` run faster. Its pipeline:
#
# * **features** (`space.features(config, shape)`): log2 of the operator's sizes (M, N, K) and of every integer
#   knob (cache blocks `mc`/`kc`/`nc`, threads), one-hot categories (rung, micro-kernel ISA), and the space's
#   derived features: arithmetic intensity 2MNK / (4(MK + KN + MN)) flop/byte, the bytes of the packed A block
#   (mc·kc·4) and B panel (kc·nc·4) against the caches, blocks per thread (the parallelism measure);
# * **data**: every valid configuration of the GEMM space at 128³ fp32 (cheap: microseconds each), timed as the
#   best of 3 in three interleaved passes; of the single-thread ones (a 2-thread time on this shared 2-core box
#   depends on the other jobs) two thirds train the model, one third is held out;
# * **model**: `xgboost.XGBRanker` with `rank:pairwise` (one query group per shape: it learns the *order* of
#   configurations, which is all a search needs) or `kind="regress"`, an `XGBRegressor` on log time (it also
#   predicts *how much* faster, so its errors can be plotted in seconds);
# * **metric**: Kendall's tau between predicted scores and measured times on the held-out configurations (1: every
#   pair ordered right; 0: chance).
#
# **Answer.** Features that carry the mechanism (ISA, threads, block bytes vs caches, intensity) are enough for a
# small gradient-boosted model to order unseen configurations well: the ranker's held-out Kendall tau measured below
# is above 0.5 (asserted where more than one micro-kernel ISA runs; the log-time regressor's is printed beside it),
# and the regressor's predicted times scatter along the diagonal except where two configurations differ by less than
# the run-to-run noise (on the forced scalar path they all do, and tau is only printed).

# %%
# NBVAL_IGNORE_OUTPUT
cm_space = tunable.get("gemm.matmul")
cm_shape = {"M": 128, "N": 128, "K": 128}


def cm_table(shape, seed=0, passes=3, one_thread=False):
    """Every valid configuration of ``shape`` (``one_thread``: those at threads=1) and its best time over
    interleaved passes of best-of-3 (a burst of load from other processes then spoils one pass, not all)."""
    configs = [c for c in cm_space.configs(shape) if not one_thread or c["threads"] == 1]
    (a, b), _ = cm_space.make_args(shape, np.random.default_rng(seed))
    fns = [cm_space.build(c) for c in configs]
    times = np.full(len(configs), np.inf)
    for _ in range(passes):
        for i, fn in enumerate(fns):
            t = measure(lambda fn=fn: fn(a, b), warmup=1, repeat=3, warmup_s=0.001).times
            times[i] = min(times[i], min(t))
    return configs, times


cm_t0 = time.perf_counter()
cm_configs, cm_times = cm_table(cm_shape)
print(f"{len(cm_configs)} valid configurations at 128³ measured in {time.perf_counter() - cm_t0:.1f} s")
print("features:", cm_space.feature_names(cm_shape))
# the model is scored on the single-thread configurations: on this shared 2-core box a 2-thread time depends on
# what the other jobs do at that moment (the search below uses all of them)
cm_t1 = [i for i, c in enumerate(cm_configs) if c["threads"] == 1]
cm_idx = np.random.default_rng(1).permutation(cm_t1)
cm_train, cm_test = cm_idx[: 2 * len(cm_idx) // 3], cm_idx[2 * len(cm_idx) // 3 :]
cm_tau = {}
cm_models = {}
for cm_kind in ("xgboost", "regress"):
    cm_models[cm_kind] = CostModel(cm_space, cm_kind).fit(
        [cm_configs[i] for i in cm_train], cm_shape, cm_times[cm_train].tolist()
    )
    cm_tau[cm_kind] = cm_models[cm_kind].kendall_tau([cm_configs[i] for i in cm_test], cm_shape, cm_times[cm_test])
print({k: round(v, 2) for k, v in cm_tau.items()}, f"(held out: {len(cm_test)} configurations)")
# with one ISA (the forced scalar path) every configuration is within a few percent: the ranking is noise there
cm_multi_isa = len({c["isa"] for c in cm_configs}) > 1
if cm_multi_isa:
    assert cm_tau["xgboost"] > 0.5 and cm_tau["regress"] > 0.0
else:
    print("one micro-kernel ISA on this CPU path: the configurations differ by noise, tau is printed only")
cm_pred = np.exp(cm_models["regress"].predict([cm_configs[i] for i in cm_test], cm_shape))
cm_meas = cm_times[cm_test]
cm_relerr = np.abs(cm_pred - cm_meas) / cm_meas
print(f"regressor: median relative error of predicted time {np.median(cm_relerr):.1%} on held-out configurations")
fig, ax = plt.subplots(figsize=(4.5, 4))
cm_scalar = np.array([cm_configs[i]["isa"] == "scalar" for i in cm_test])
ax.loglog(cm_meas[~cm_scalar] * 1e6, cm_pred[~cm_scalar] * 1e6, "o", label="vector ISA")
ax.loglog(cm_meas[cm_scalar] * 1e6, cm_pred[cm_scalar] * 1e6, "s", label="scalar")
cm_lim = [cm_meas.min() * 1e6 / 1.5, cm_meas.max() * 1e6 * 1.5]
ax.plot(cm_lim, cm_lim, "k--", lw=1)
ax.set_xlabel("measured µs (held out)")
ax.set_ylabel("predicted µs (XGBRegressor, log time)")
ax.set_title(f"GEMM 128³: tau ranker {cm_tau['xgboost']:.2f}, regressor {cm_tau['regress']:.2f}")
ax.legend()
plt.show()

# %% [markdown]
# ## 10. Transfer to a new shape, and model-guided vs random search [Q87]
#
# `transfer(space, train, test)` fits on one shape's records and ranks another shape's configurations without
# measuring any of them (the features carry log2 of the sizes; what transfers is the ordering of the knobs).
# `ModelGuidedSearch` (searcher name `"model"`) measures a random batch, then each round refits the model on every
# measurement, scores the unseen valid configurations and measures the predicted top 4 (each swapped for a random
# one with probability 0.1). Both searchers below draw from the measured 128³ table (a lookup: the comparison is
# about *which* configurations they pick, not about timing noise); torch's matmul is the reference line.
#
# **Answer.** Fitted on 128³ alone, the model still orders the configurations of a 96×200×160 GEMM better than
# chance (tau printed below). Guided by the model, the search reaches within 10 % of the best configuration after a
# small fraction of the table (asserted: at most 60 % of it on average over seeds). Whether that beats uniform
# sampling depends on how many configurations are near-best: at 128³ a good share of the vector-ISA ones are, so
# random sampling is sometimes as quick; the best-so-far curves show both. tinygrad has no learned cost model: its
# BEAM search measures every candidate schedule.

# %%
# NBVAL_IGNORE_OUTPUT
cm_other = {"M": 96, "N": 160, "K": 200}
cm_oconfigs, cm_otimes = cm_table(cm_other, seed=1, passes=2, one_thread=True)
cm_c1, cm_s1 = [cm_configs[i] for i in cm_t1], cm_times[cm_t1].tolist()
_, cm_ttau = transfer(cm_space, (cm_c1, cm_shape, cm_s1), (cm_oconfigs, cm_other, cm_otimes.tolist()))
print(f"transfer 128³ -> 96x160x200: Kendall tau {cm_ttau:.2f} over {len(cm_oconfigs)} unmeasured configurations")
assert cm_ttau > 0.0 or not cm_multi_isa

cm_lookup = {config_key(c): t for c, t in zip(cm_configs, cm_times)}
cm_budget, cm_seeds = 24, range(3)


def cm_curve(searcher):
    best, out = np.inf, []
    for _ in range(cm_budget):
        cfg = searcher.ask()
        searcher.tell(cfg, cm_lookup[config_key(cfg)])
        best = min(best, cm_lookup[config_key(cfg)])
        out.append(best)
    return np.array(out) / cm_times.min()


cm_model_curves = np.array([cm_curve(ModelGuidedSearch(cm_space, cm_shape, seed=s, init=6)) for s in cm_seeds])
cm_rand_curves = np.array([cm_curve(RandomSearch(cm_space, cm_shape, seed=s)) for s in cm_seeds])


def cm_first_within(curves, tol=1.10):
    return [int(np.argmax(c <= tol)) + 1 if (c <= tol).any() else cm_budget + 1 for c in curves]


cm_hit_model, cm_hit_rand = cm_first_within(cm_model_curves), cm_first_within(cm_rand_curves)
print("trials to within 10% of the best: model", cm_hit_model, "| random", cm_hit_rand)
cm_a, cm_b = (torch.from_numpy(x) for x in cm_space.make_args(cm_shape, np.random.default_rng(0))[0])
cm_torch_threads = torch.get_num_threads()
torch.set_num_threads(1)  # one thread: two OpenMP runtimes spinning against each other on 2 cores distort both
cm_torch = min(measure(lambda: torch.matmul(cm_a, cm_b), warmup=2, repeat=7).times)
torch.set_num_threads(cm_torch_threads)
cm_default = cm_lookup.get(config_key(cm_space.default(cm_shape)), np.nan)
print(
    f"128³: best {cm_times.min() * 1e6:.0f} µs, default configuration {cm_default * 1e6:.0f} µs, "
    f"torch.matmul (1 thread) {cm_torch * 1e6:.0f} µs (best / torch {cm_times.min() / cm_torch:.2f}x); "
    "tinygrad: no learned cost model (BEAM measures every candidate)"
)
assert np.mean(cm_hit_model) <= 0.6 * len(cm_configs)
fig, ax = plt.subplots(figsize=(5, 3))
ax.plot(range(1, cm_budget + 1), cm_model_curves.mean(axis=0), label="model-guided (XGBRanker)")
ax.plot(range(1, cm_budget + 1), cm_rand_curves.mean(axis=0), label="random")
ax.axhline(1.1, color="k", ls="--", lw=1)
ax.set_yscale("log")
ax.set_xlabel("measurements")
ax.set_ylabel("best so far / best (mean of 3 seeds)")
ax.legend()
plt.show()

# %% [markdown]
# ## 11. Clustering new variants: reuse a representative's time [Q236]
#
# The variants here are schedules of one generated C++ kernel (`compiler.schedule`: bias + GELU over rows, the
# loop nest of topic 12 with tile × loop order × parallel × vectorize × unroll). `VariantClusters(space, k)`
# standardises the variants' features, runs k-means (scikit-learn), measures only each cluster's **medoid** (a real
# variant: the member nearest all others), and `estimate(config)` gives any variant, including one generated later,
# its cluster medoid's time: no compile, no run. The reuse error is checked here against measuring every variant
# (single-thread variants: on this shared 2-core box a parallel variant's time depends on the other jobs).
#
# **Answer.** Cluster the new variants on their schedule features and let each inherit its cluster
# representative's measured time: with k = 4 clusters of 12 existing variants only 4 are measured, and 4 new
# variants get estimates whose median error is printed below, with the sweep over k that picks the number of
# clusters (more clusters: more measurements, smaller error; asserted for 6-8 clusters against 2, within 5
# points). Where the estimates miss, the miss is a knob the features weight too little (a cliff inside a cluster,
# e.g. loop order), which is why a tuner uses the estimates to prune (the fastest cluster's medoid is close to the
# best variant: printed, asserted within 2x) rather than as final numbers.

# %%
# NBVAL_IGNORE_OUTPUT
cm_sspace = tunable.get("compiler.schedule")
cm_sshape = {"R": 256, "C": 2048}
cm_valid = [c for c in cm_sspace.configs(cm_sshape) if not c["parallel"]]  # one thread: no OpenMP contention
cm_pick = np.random.default_rng(5).choice(len(cm_valid), size=16, replace=False)
cm_existing, cm_new = [cm_valid[i] for i in cm_pick[:12]], [cm_valid[i] for i in cm_pick[12:]]
cm_t0 = time.perf_counter()
cm_timer = time_config(cm_sspace, cm_sshape)
cm_truth = {config_key(c): min(cm_timer(c) for _ in range(3)) for c in cm_existing + cm_new}  # best of 3: truth
print(f"compiled and timed {len(cm_truth)} schedule variants in {time.perf_counter() - cm_t0:.1f} s")
cm_clusters = VariantClusters(cm_sspace, 4, measure=lambda c: cm_truth[config_key(c)]).fit(cm_existing, cm_sshape)
cm_err_old = cm_clusters.reuse_error(cm_existing, [cm_truth[config_key(c)] for c in cm_existing])
cm_err_new = cm_clusters.reuse_error(cm_new, [cm_truth[config_key(c)] for c in cm_new])
for cl in cm_clusters.clusters:
    print(f"cluster of {len(cl.members):2d}: medoid {cl.medoid} -> {cl.seconds * 1e6:.0f} µs")
print(
    f"measured {cm_clusters.measured} of {len(cm_existing)}; median reuse error existing {np.median(cm_err_old):.0%}, "
    f"new (never measured by the clusters) {np.median(cm_err_new):.0%}"
)
cm_sweep = {}
for cm_k in range(2, 9):
    cm_vc = VariantClusters(cm_sspace, cm_k, measure=lambda c: cm_truth[config_key(c)]).fit(cm_existing, cm_sshape)
    cm_sweep[cm_k] = np.median(cm_vc.reuse_error(cm_new, [cm_truth[config_key(c)] for c in cm_new]))
print("median reuse error of the new variants by k:", {k: f"{v:.0%}" for k, v in cm_sweep.items()})
cm_best_truth = min(cm_truth.values())
print(f"best cluster medoid {cm_clusters.best().seconds * 1e6:.0f} µs vs best variant {cm_best_truth * 1e6:.0f} µs")
assert cm_clusters.measured <= 4 and np.median(cm_err_old) < 1.0
assert min(cm_sweep[k] for k in (6, 7, 8)) <= cm_sweep[2] + 0.05  # more clusters (more measured): no larger error
assert cm_clusters.best().seconds <= 2 * cm_best_truth  # the fastest cluster's medoid: near the best variant
fig, ax = plt.subplots(figsize=(4.5, 3.5))
cm_est_new = [cm_clusters.estimate(c) * 1e6 for c in cm_new]
cm_est_old = [cm_clusters.estimate(c) * 1e6 for c in cm_existing]
ax.loglog([cm_truth[config_key(c)] * 1e6 for c in cm_existing], cm_est_old, "o", label="existing")
ax.loglog([cm_truth[config_key(c)] * 1e6 for c in cm_new], cm_est_new, "s", label="new (estimated only)")
cm_l = [min(cm_truth.values()) * 1e6 / 1.5, max(cm_truth.values()) * 1e6 * 1.5]
ax.plot(cm_l, cm_l, "k--", lw=1)
ax.set_xlabel("measured µs")
ax.set_ylabel("cluster medoid µs")
ax.legend()
plt.show()

# %% [markdown]
# ## 12. Run-time statistics choose the next batch's variant [Q212]
#
# `run_batches(space, shape, variants, batches, policy=...)` serves a stream of batches; before each it picks a
# variant from the statistics collected so far (`VariantBandit`). Static statistics come from each variant's
# scheduled loop IR (`loop_stats`: loads, stores, arithmetic per element, the load/store mix, bytes per flop, the
# innermost stride, simd/parallel) and decide the order of the first tries; run-time statistics are the time per
# element of every batch (median, robust to a preempted batch) and, where the PMU is readable, instructions, cycles
# and IPC (`tinylearn.profiler.counters`; this container has no virtual PMU, so the line below says times only).
# UCB1 then balances the fastest median against variants tried too rarely.
#
# **Answer.** The instruction mix is identical across these variants (2 loads, 1 store, the same arithmetic per
# element): what differs is the *order* of the memory accesses (row order streams each row; column order strides by
# a row per access) and the loop annotations. Static statistics put the unit-stride variants first; the measured
# times then let UCB converge: the variant it ends on is within 2x of the best found by timing every variant offline
# (usually the same one; near-ties swap places under load), and in the last half of the batches its picks cost, in
# offline time (best of 3 passes), closer to the best than a uniform choice would (asserted when the variants differ
# by more than 1.5x; at this size they are within a few tens of percent of each other, so the bandit keeps sampling
# all of them and the printed ratios are close to 1: the choice matters little here, and the statistics say so).

# %%
# NBVAL_IGNORE_OUTPUT
cm_row = {"tile": 1, "order": "rows", "parallel": 0, "vectorize": 1, "unroll": 1}
cm_variants = [
    cm_row,
    dict(cm_row, vectorize=0, unroll=4),
    dict(cm_row, order="cols"),
    dict(cm_row, tile=64, order="cols", vectorize=0),
]  # one thread each: a parallel variant's time on this shared 2-core box depends on the other jobs (as in §11)
cm_stats = [loop_stats(cm_sspace, c, cm_sshape) for c in cm_variants]
for c, cm_st in zip(cm_variants, cm_stats):
    print(c, {k: cm_st[k] for k in ("loads", "stores", "load_store_ratio", "inner_stride", "simd", "parallel")})
assert len({(st["loads"], st["stores"]) for st in cm_stats}) == 1, cm_stats  # the same instruction mix
cm_run = run_batches(cm_sspace, cm_sshape, cm_variants, 60, policy="ucb")
cm_offline = [min(cm_timer(c) for _ in range(3)) for c in cm_variants]  # best of 3: a load spike spoils one pass
print(cm_run.counters)
print("picks:", "".join(str(p) for p in cm_run.picks))
print(
    f"bandit's best variant {cm_run.best} (share of the last 30 batches {cm_run.share_best_last_half:.0%}); "
    f"offline best {int(np.argmin(cm_offline))}; offline time of the bandit's choice / offline best: "
    f"{cm_offline[cm_run.best] / min(cm_offline):.2f}x"
)
cm_regret = np.mean([cm_offline[p] for p in cm_run.picks[30:]]) / min(cm_offline)
print(
    f"offline time of the last 30 picks / offline best: {cm_regret:.2f}x (uniform choice: "
    f"{np.mean(cm_offline) / min(cm_offline):.2f}x)"
)
assert cm_offline[cm_run.best] <= 2.0 * min(cm_offline), (cm_run.best, cm_offline)
cm_strided = [i for i, st in enumerate(cm_stats) if st["inner_stride"] > 1]
cm_first = {i: cm_run.picks.index(i) for i in range(len(cm_variants))}
assert cm_strided and min(cm_first[i] for i in cm_strided) > max(  # static stats: unit-stride variants tried first
    cm_first[i] for i in range(len(cm_variants)) if i not in cm_strided
), (cm_first, cm_strided)
if max(cm_offline) > 1.5 * min(cm_offline):  # a clear gap between variants (else they tie within noise)
    assert cm_regret <= 0.5 * (1 + np.mean(cm_offline) / min(cm_offline)), (cm_regret, cm_offline)  # vs uniform
fig, ax = plt.subplots(figsize=(5, 2.5))
ax.plot(range(1, 61), cm_run.picks, ".", ms=6)
ax.set_yticks(range(len(cm_variants)))
ax.set_xlabel("batch")
ax.set_ylabel("variant run")
plt.show()

# %% [markdown]
# ## 13. Predicting the next step's time from the batch history [Q123]
#
# A training loop whose batches change shape (dynamic batching, variable sequence lengths, a loss scaler that skips
# steps) wants to know the next step's time (or memory) *before* running it: to fit a time budget, to pick the next
# batch size, to spot a slow step. `tinylearn.tune.ar_predict` records real step times of a small tinylearn MLP
# trained with a batch size that random-walks over 16…256 (a dynamic loss scale is recorded too, but it trends
# upward between overflows and does not change the step's work, so it is left out of the models), then fits
# three predictors of step t from steps < t and the features of step t (known: the scheduler chose them):
# the **last value** baseline, an **ARX** model `y_t = c + Σ a_i y_{t-i} + Σ b_j x_{t,j}` by least squares,
# and an **LSTM** written with tinylearn autograd (one matmul for the four gates, checked against
# `torch.nn.LSTMCell` forward and backward in `tests/tune/test_ar_predict.py`) over the last 8 steps.
#
# **Answer.** Feed the model the history of step times *and* the next batch's features: the autoregressive part
# carries the slow drift of the machine (caches, clocks, neighbours), the exogenous part the effect of the batch.
# Here the batch size explains most of the variance, so both ARX and the LSTM beat "same as last step" by a wide
# margin (median error) on the steps where the batch size changed (where the baseline is worst); with ~150 steps
# the tiny LSTM is not reliably better than ARX. The fitted predictor then picks the largest batch whose predicted
# time fits a budget.

# %%
# NBVAL_IGNORE_OUTPUT
md_y, md_feats = ar_predict.collect_step_times(steps=200, width=256, seed=0)
md_preds = [
    ar_predict.LastValue(),
    ar_predict.ARPredictor(order=2, exog=("batch_size",)),
    ar_predict.LSTMPredictor(exog=("batch_size",), window=8, hidden=8, epochs=100),
]
md_rows = ar_predict.compare_predictors(md_preds, md_y, md_feats, train_fraction=0.6)
md_cut = int(len(md_y) * 0.6) + 8  # the first step every predictor forecasts
md_bs = md_feats["batch_size"]
md_changed = md_bs[md_cut:] != md_bs[md_cut - 1 : -1]
md_out = {}
for md_p in md_preds:
    md_x = np.stack([md_feats[k] for k in md_p.exog], 1) if md_p.exog else np.zeros((len(md_y), 0))
    md_out[md_p.name] = np.array([md_p.predict_next(md_y[:t], md_x[:t], md_x[t]) for t in range(md_cut, len(md_y))])
md_err = {k: np.abs(v - md_y[md_cut:]) / md_y[md_cut:] for k, v in md_out.items()}
for r in md_rows:
    e = md_err[r["predictor"]]
    print(f"{r['predictor']:38s} median |error| / time: {np.median(e):6.1%} overall, "
          f"{np.median(e[md_changed]):6.1%} on batch-size changes")  # fmt: skip
md_lv, md_arx, md_lstm = (md_err[p.name] for p in md_preds)
assert md_changed.sum() >= 10
# medians: a preempted step on this shared VM (10x slower) would dominate a mean
assert np.median(md_arx[md_changed]) < 0.7 * np.median(md_lv[md_changed])  # the batch feature the baseline lacks
assert np.median(md_lstm[md_changed]) < np.median(md_lv[md_changed])
fig, ax = plt.subplots(figsize=(8, 3))
md_t = np.arange(md_cut, len(md_y))
ax.plot(md_t, md_y[md_cut:] * 1e3, "k.", label="measured")
for md_name, md_v in md_out.items():
    ax.plot(md_t, md_v * 1e3, label=md_name, lw=1)
ax.set_xlabel("training step")
ax.set_ylabel("step time (ms)")
ax.legend(fontsize=7)
plt.show()

# %% [markdown]
# The fitted ARX model as a controller: the largest batch whose predicted next-step time fits a budget (here the
# median measured time of a batch of 64).

# %%
# NBVAL_IGNORE_OUTPUT
md_arx_p = md_preds[1]
md_budget = float(np.median(md_y[md_bs == 64]))
md_pick = ar_predict.pick_batch_size(md_arx_p, md_y, md_feats, [16, 32, 64, 128, 256], md_budget)
md_pred_pick = md_arx_p.predict_next(md_y, md_bs[:, None], [md_pick])
print(f"budget {md_budget * 1e3:.3f} ms -> batch {md_pick} (predicted {md_pred_pick * 1e3:.3f} ms)")
assert md_pick is not None and md_pred_pick <= md_budget

# %% [markdown]
# The LSTM cell itself, tinylearn vs torch vs tinygrad (one step, batch 64, 16 inputs, 64 hidden; same weights for
# tinylearn and torch, the outputs agree to float64 rounding). One thread each: on this shared 2-core VM a second
# BLAS / intra-op thread spinning for a busy core makes a 0.3 ms step take several ms.

# %%
# NBVAL_IGNORE_OUTPUT
torch.manual_seed(0)
md_tcell = torch.nn.LSTMCell(16, 64).double()
md_cell = ar_predict.LSTMCell.from_torch(md_tcell)
md_xs = np.random.default_rng(0).standard_normal((64, 16))
md_h0 = np.zeros((64, 64))
md_tl_h = md_cell(Tensor(md_xs), (Tensor(md_h0), Tensor(md_h0)))[0].numpy()
with torch.no_grad():
    md_th = md_tcell(torch.from_numpy(md_xs), (torch.from_numpy(md_h0), torch.from_numpy(md_h0)))[0].numpy()
assert np.allclose(md_tl_h, md_th, rtol=1e-10, atol=1e-12)
md_cmp = Comparison(
    "LSTM cell step, batch 64, 16 -> 64, one thread (float64; tinygrad float32)", baseline="torch", repeat=5
)
with limited_threads(1, torch=True):
    with md_cmp.case("LSTMCell") as md_case:
        md_case.add("tinylearn", lambda: md_cell(Tensor(md_xs), (Tensor(md_h0), Tensor(md_h0))))
        md_tx, md_th0 = torch.from_numpy(md_xs), torch.from_numpy(md_h0)
        md_case.add("torch", lambda: md_tcell(md_tx, (md_th0, md_th0)))
        md_case.add_tinygrad(
            "tinygrad",
            lambda tg: (lambda f, x: lambda: f(x))(
                tinygrad_jit(tg.nn.LSTMCell(16, 64)), tg.Tensor(md_xs.astype(np.float32)).realize()
            ),
            note="TinyJit, float32",
        )
print(md_cmp.table)
print("tinygrad:", "ok" if tinygrad_status()[0] else tinygrad_status()[1])
plot_table(md_cmp.table)
plt.show()
md_ratio = md_cmp.table.get("LSTMCell", "tinylearn").ratio
print(f"tinylearn / torch time: {md_ratio:.2f}x (tinylearn runs ~12 numpy ops per step, each a Function with autograd")
print("bookkeeping; at this size every framework is dominated by per-op overhead, so the ratio is mostly dispatch)")

# %% [markdown]
# ## 14. Concurrent kernels interfere: measure, model, schedule [Q228]
#
# Two jobs co-located on two cores share the last-level cache (LLC) and the DRAM bandwidth (on a GPU: L2, HBM and
# the SMs). `tinylearn.tune.interference` measures what a scheduler co-locating two jobs sees: two worker
# **processes** (`PairWorkers`: forked, each pinned to its own CPU, one BLAS / OpenMP thread each), each building the
# kernels once and then serving "run kernel i for N reps after a barrier, return the seconds" over a pipe (every
# receive has a timeout; the context manager stops the workers). Two threads of one process would also queue on the
# GIL and on the process's page-fault lock (softmax allocates its output on every call), an artefact no two separate
# jobs share. Each of 3 rounds times every kernel alone in each worker (the other idle), then every pair at once; a
# pair's **slowdown** is the mean over its two sides of the median over rounds of t_pair / t_alone. The times are the
# workers' CPU seconds (`time.process_time`): a core stalled on the shared LLC or on DRAM still burns CPU time, a
# worker the OS parks while another agent's job runs on this shared VM does not, which removes most of the
# background noise from the ratios (at a price: while one worker is parked the other runs alone, so the overlap, and
# with it the measured slowdown, can only shrink).
#
# The kernels: GEMM 192 (compute bound, fits L2), GEMM 64 (cached), softmax over a 1024x2048 matrix (its working
# set spills L2; its bandwidth demand is printed), a 2 MiB copy (runs from the LLC) and a 32 MiB copy (streams from
# DRAM). A pair is described by three physical features, few because 15 pairs cannot support more: the product of
# the two kernels' bandwidth demands (bytes moved / alone time / the measured streaming-copy bandwidth, clipped to
# 1; 0 when the working set fits the private L2, whose size is printed), whether both working sets spill L2, and
# whether, both spilling, they together exceed the LLC. A ridge least-squares line maps the features to the
# slowdown (the **MODEL**), checked leave-one-out against predicting the mean of the other pairs;
# `order_by_interference` pairs kernels to minimise the summed predicted slowdown (an exact matching for <= 10
# kernels).
#
# **Answer.** Measure each kernel alone and each pair together as separate processes on separate cores, describe a
# pair by physical features of its kernels (bandwidth demand, working set against the private cache and the shared
# LLC), fit slowdown = w · features + b by least squares, check it leave-one-out against "predict the mean", and
# schedule by the predicted slowdown: the pairing that minimises the summed prediction, launched best pair first.
# What the data shows on this VM: the two vCPUs barely interfere, and how much depends on where the host places
# them. GEMM 64 beside itself stays close to 1x (asserted below 1.5x: the VM's neighbours still leak into CPU time);
# the streaming pairs (either copy or softmax beside the 32 MiB DRAM copy) are the only ones that can slow down, and
# whether they do varies between runs on this same VM, from no slowdown at all to a large one for two DRAM copies
# (the host gives the two vCPUs separate memory paths, or runs them by turns, or not). So the output says which case
# this run saw, and the assertions check only that every slowdown is a ratio of CPU times in a sane range. The sizes of
# the slowdowns are printed, and they are small: DRAM-bound pairs lose little here (the one-process streaming-copy
# bandwidth is printed beside them). With effects that small the leave-one-out error of the MODEL and that of
# predicting the mean are both printed, not asserted: on this VM the margin between them is within run-to-run noise.
# On a machine where one core can saturate DRAM, or on a GPU sharing L2 and HBM, the same features should separate
# the pairs more (not measured here).

# %%
# NBVAL_IGNORE_OUTPUT
md_kernels = interference.default_kernels()
md_names = [k.name for k in md_kernels]
md_pairs = interference.measure_pairs(md_kernels, target_s=0.02, repeat=3)  # CPU seconds, 2 pinned processes
md_slow = {(r["a"], r["b"]): r["slowdown"] for r in md_pairs}
md_cached = md_slow[(md_names[1], md_names[1])]  # gemm 64 (cached) beside itself
md_stream = max(md_slow[(md_names[i], md_names[4])] for i in (2, 3, 4))  # softmax / either copy + the DRAM copy
md_model, md_px, md_py = interference.fit_from_rows(md_kernels, md_pairs)
md_loo = interference.loo_error(md_px, md_py)
print(f"L2 {interference.l2_bytes() / 2**20:.0f} MiB per core, LLC {interference.llc_bytes() / 2**20:.0f} MiB")
print(f"streaming-copy bandwidth of one process (measured): {md_pairs[0]['dram_bw'] / 1e9:.1f} GB/s")
print("bandwidth demand alone (measured, 0 = fits L2):", {k.name: round(k.bw_demand, 2) for k in md_kernels})
for r, md_pred in zip(md_pairs, md_model.predict(md_px)):
    print(f"{r['a']:19s} + {r['b']:19s} measured {r['slowdown']:.2f}x ({r['slowdown_a']:.2f} / {r['slowdown_b']:.2f})"
          f"   MODEL {md_pred:.2f}x")  # fmt: skip
print(f"leave-one-out MAE: MODEL {md_loo['model_mae']:.3f} vs predicting the mean {md_loo['mean_baseline_mae']:.3f}")
md_sched = interference.order_by_interference([k for k in md_kernels if "cached" not in k.name], md_model)
print("co-schedule from the MODEL (best pair first):", [(a, b, round(s, 2)) for a, b, s in md_sched])
print("torch / tinygrad: not measured here (the method is framework-agnostic: any kernel run in its own process)")
assert len(md_pairs) == 15 and "cached" in md_names[1] and "DRAM" in md_names[4]
assert [k.bw_demand for k in md_kernels[:2]] == [0.0, 0.0]  # both GEMMs fit the private L2
md_case = "the streaming pairs interfere more" if md_stream > 1.1 * md_cached else "no interference to separate"
print(f"worst streaming pair {md_stream:.2f}x vs GEMM 64 beside itself {md_cached:.2f}x: {md_case}")
assert all(0.67 < r["slowdown"] < 4.0 for r in md_pairs), md_slow  # ratios of CPU times, not of noise
assert 0.67 < md_cached < 1.5, md_cached
assert len(md_sched) == 2 and all(p[1] for p in md_sched)
fig, ax = plt.subplots(figsize=(4, 4))
ax.scatter(md_py, md_model.predict(md_px))
md_lim = [min(md_py.min(), 0.95), max(md_py.max(), 1.1) * 1.02]
ax.plot(md_lim, md_lim, "k--", lw=1)
ax.set_xlabel("measured slowdown (CPU time, two processes)")
ax.set_ylabel("MODEL: linear fit (in-sample)")
plt.show()

# %% [markdown]
# ## 15. Proxy parameters before silicon: ranking schedules on a chip that does not exist yet [Q129] (MODEL)
#
# Before tape-out there is nothing to time, yet compiler teams must already choose schedules. `tinylearn.tune.
# proxy_model` describes a chip by **proxy parameters** (cycles per FMA per lane, vector lanes, micro-tile, memory
# latency as a distribution: mean and stddev cycles, bandwidth in bytes/cycle, outstanding misses, on-chip buffer
# size, per-block overheads) and costs a blocked GEMM schedule analytically: compute cycles from padded FMAs, bytes
# moved from the loop nest (A re-read per column block, C per K slice, B per row block when the blocks overflow the
# buffer), memory cycles = bytes / bandwidth + sampled latency / misses in flight, partial overlap. Everything it
# outputs is a MODEL. It is validated where we *can* measure: with this CPU's parameters, ranking configurations of
# the `gemm.matmul` space and comparing to measured times (Kendall tau).
#
# **Answer.** Describe the chip by a handful of proxy parameters, cost every candidate schedule with an analytic
# model that samples the latency distribution (giving a mean and a spread per schedule), validate the proxy's
# *ranking* (not its absolute numbers) on hardware you have, and use it to prune the search space for the new chip;
# the measured tuner takes over when silicon arrives. On this CPU the proxy ranks the measured configurations with a
# positive Kendall tau (it gets the big effects right: vector width; the block choices are within noise).

# %%
# NBVAL_IGNORE_OUTPUT
md_val = proxy_model.validate_on_cpu({"M": 128, "N": 128, "K": 128}, n=12, repeat=3)
print(f"MODEL vs measured on this CPU: Kendall tau {md_val['tau']:.2f} (p = {md_val['p_value']:.1e})")
assert md_val["tau"] > 0
fig, ax = plt.subplots(figsize=(4, 4))
for md_isa in ("avx512", "avx2", "scalar"):
    md_r = [r for r in md_val["rows"] if r["config"]["isa"] == md_isa]
    ax.scatter([r["measured_s"] * 1e3 for r in md_r], [r["model_s"] * 1e3 for r in md_r], label=md_isa)
ax.set_xscale("log")
ax.set_yscale("log")
ax.set_xlabel("measured ms (128³, 1 thread)")
ax.set_ylabel("MODEL ms")
ax.legend()
plt.show()

# %%
md_gspace = tunable.get("gemm.matmul")  # every (mc, kc, nc) of the space: the hypothetical chip has no ISA knob
md_configs = [
    {"mc": a, "kc": b, "nc": c}
    for a in md_gspace.param("mc").values
    for b in md_gspace.param("kc").values
    for c in md_gspace.param("nc").values
]
md_rank = proxy_model.rank_configs(md_configs, {"M": 1024, "N": 1024, "K": 1024}, proxy_model.HYPOTHETICAL)
print(f"MODEL, {proxy_model.HYPOTHETICAL.name}: 1024³ GEMM schedules, best and worst of {len(md_rank)}")
for md_c, md_e in md_rank[:3] + md_rank[-2:]:
    md_mib = md_e.bytes_moved / 2**20
    print(f"  mc={md_c['mc']:4d} kc={md_c['kc']:4d} nc={md_c['nc']:5d}: {md_e.cycles / 1e6:7.2f} ± "
          f"{md_e.cycles_std / 1e6:.2f} Mcycles ({md_e.bound} bound, {md_mib:.0f} MiB moved) [MODEL]")  # fmt: skip
assert all(a[1].cycles <= b[1].cycles for a, b in zip(md_rank, md_rank[1:]))
assert md_rank[0][1].label == "MODEL"

# %% [markdown]
# ## 16. How production autotuners choose configurations
#
# * **Triton's `@triton.autotune`**: the kernel author lists `triton.Config`s (block sizes, `num_warps`,
#   `num_stages`); on the first call for each value of the `key` arguments it benchmarks every config
#   (`do_bench`: warm-up, repeats, median) and caches the winner in memory; `prune_configs_by` and a
#   `perf_model` can drop configs before timing. Exhaustive over a short hand-written list.
# * **TVM / Ansor (auto-scheduler)**: generates a large space of schedules from the tensor program by rules
#   (tiling, fusion, parallel/vectorise/unroll annotations), samples and evolves them, and ranks candidates with a
#   learned **cost model** (XGBoost, later MLPs) trained online on the programs it measures on the device; only
#   the model's top candidates are compiled and timed each round (MetaSchedule keeps the same loop). This is
#   `ModelGuidedSearch` in `tinylearn.tune.cost_model`.
# * **tinygrad BEAM**: `BEAM=n` runs a beam search of width n over kernel optimisations (upcast, local, unroll,
#   group) for each kernel the first time it is compiled, timing every candidate on the device, and caches the
#   result on disk (`CACHELEVEL=0` disables the cache). Purely measured, no model.
# * **`torch.compile(mode="max-autotune")`**: Inductor benchmarks several Triton templates (and ATen/cuBLAS) for
#   each matmul/conv and picks the fastest per shape, plus CUDA graphs; on CPU it mostly changes C++/OpenMP code
#   generation choices. Exhaustive over templates, per shape, at compile time.
#
# One measured tinygrad BEAM=1 run on a small (32×32) matmul, in a fresh process with the BEAM cache off (first
# call = search + compile + run):

# %%
# NBVAL_IGNORE_OUTPUT
md_script = (
    "import time, numpy as np\nfrom tinygrad import Tensor\n"
    "a = Tensor(np.ones((32, 32), np.float32)).realize(); b = Tensor(np.ones((32, 32), np.float32)).realize()\n"
    "t = time.perf_counter(); (a @ b).realize(); first = time.perf_counter() - t\n"
    "ts = []\nfor _ in range(5):\n    t = time.perf_counter(); (a @ b).realize(); ts.append(time.perf_counter() - t)\n"
    "print(first, min(ts))\n"
)
md_beam = {}
if tinygrad_status()[0]:
    md_res = None
    md_env = {**os.environ, "DEV": "CPU", "BEAM": "1", "CACHELEVEL": "0", "IGNORE_BEAM_CACHE": "1"}
    try:
        md_res = subprocess.run([sys.executable, "-c", md_script], env=md_env, capture_output=True, text=True,
                                timeout=10)  # fmt: skip
    except subprocess.TimeoutExpired:
        print("BEAM=1: the search did not finish within 10 s here")
    if md_res is not None and md_res.returncode == 0:
        md_beam["1"] = tuple(float(v) for v in md_res.stdout.split())
        md_ns: dict = {}
        exec(md_script.replace("print(first, min(ts))", "out = (first, min(ts))"), md_ns)  # BEAM=0, this process
        md_beam["0"] = md_ns["out"]
        for md_b, md_v in sorted(md_beam.items()):
            print(f"BEAM={md_b}: first call {md_v[0]:.2f} s, steady {md_v[1] * 1e6:.0f} us")
        assert md_beam["1"][0] > md_beam["0"][0]  # the first BEAM call pays for the search
else:
    print("tinygrad BEAM run skipped:", tinygrad_status()[1])

# %% [markdown]
# ## Recap: interview answers
#
# - [Q70] A profiler hooks op entry points (autograd forward/backward, backend dispatch), records name, time, thread,
#   shapes, backend and parent per call, aggregates them (self vs total time) into a table and writes Chrome-trace
#   JSON for Perfetto; user ranges (NVTX / `record_function`) label phases; FLOP/byte models give GFLOP/s.
# - [Q62] Bottlenecks: place hot ops on the roofline — low intensity ops are memory-bound (fuse, fewer bytes), high
#   intensity ones compute-bound (tiling, SIMD, tensor cores); counters (perf / Nsight Compute via CUPTI: occupancy,
#   dram bytes, stall reasons) explain the distance to the roof.
# - [Q62] nvprof → Nsight Systems (timeline) + Nsight Compute (per-kernel counters, roofline); a VM without PMU
#   exposes only software counters, and the tool should say so with the reason (errno, perf_event_paranoid).
# - [Q139] Re-JIT trigger: hot (time share) × under-performing (fraction of roof, counters) → retune(op, shape) →
#   verify output, time old vs new, swap only when faster, record the decision.
#
# - [Q80] Runtime feedback for choosing implementations: declare the knobs (`tunable.Space`), measure candidates
#   (correctness against a reference first, then warm-up + repeats + outlier rejection), store the times with a
#   machine fingerprint, and let dispatch look up the winner per shape class (`TINYLEARN_TUNE=cached|search`); most of
#   a GEMM space is slow (scalar kernels, bad blocks), guided search finds the good corner in a few dozen trials.
# - [Q110] A UCB1 bandit over implementations picks `argmax mean + sqrt(2 ln N / n)`: each arm tried once, losers
#   retried logarithmically, regret flattens; the reward is cycles from the hardware counters where a PMU is
#   readable (cache misses or DRAM bytes could be weighed in the same way), else time, as on this VM.
#
# - [Q87] An ML cost model for kernel schedules: features that carry the mechanism (sizes, knobs, intensity, block
#   bytes vs caches, blocks per thread) -> measured (config, time) records -> XGBoost trained to *rank* (pairwise
#   loss per shape) or to regress log time -> checked by Kendall tau on held-out configurations (> 0.5 here) and on
#   a new shape (transfer) -> used to pick which configurations to measure next (model-guided search).
# - [Q236] New variants: k-means on their standardised schedule features, measure one medoid per cluster, estimate
#   every other (and every future) variant by its cluster's medoid; choose k by the reuse error against a measured
#   sample, and use the estimates to prune, then measure inside the best cluster.
# - [Q212] Run-time statistics drive the next batch's variant: static counts from the loop IR order the first
#   tries, per-batch times (and hardware counters where the PMU allows) feed a UCB / epsilon-greedy bandit that
#   converges on the fastest variant while still sampling the others now and then.
#
# - [Q123] Predict the next step from history *and* the next batch's features: ARX (least squares) captures the
#   batch effect and the drift; an LSTM over a window of (log time, features) is the sequence-model version. Both
#   beat "same as last step" exactly where it matters (batch changes); use the predictor to choose the largest batch
#   under a time budget.
# - [Q228] Measure pairs as two pinned processes (CPU time, alone vs together), describe a pair by the product of
#   its kernels' bandwidth demands, whether both spill L2 and whether together they exceed the LLC, fit a ridge line
#   of the slowdown (check it leave-one-out against the mean), and co-schedule by minimum predicted slowdown: pair
#   streaming kernels with cache-resident ones.
# - [Q129] Before silicon: proxy parameters (FMA throughput, lanes, latency distribution, bandwidth, buffer) + an
#   analytic cost with sampled latency rank schedules (MODEL); validate the *ranking* on hardware you have (Kendall
#   tau > 0 here), prune with it, then measure on the chip.
# - Triton autotune and torch max-autotune time a short list per shape; TVM/Ansor and MetaSchedule guide a large
#   search with a learned cost model; tinygrad BEAM times a beam of kernel optimisations and caches the winner.

# %% [markdown]
# ## Exercises
#
# - Profile the digits CNN training step and find the op with the lowest fraction of its roof; is it memory- or
#   compute-bound, and what would you fuse?
# - Make `HotspotMonitor` re-check periodically (every N steps) with hysteresis, so an op is re-tuned at most once
#   per shape class even when its fraction hovers around the threshold.
#
# - Make the bandit non-stationary (a discounted UCB or a sliding window) and change the load mid-run (start a
#   second process multiplying matrices): does it switch arms, and how fast?
# - Give `AnnealSearch` a restart schedule and compare it with evolution at budgets 10, 20, 40 over several seeds:
#   which wins at which budget?
#
# - Drop the derived features (`extra_features`) from the GEMM space and refit: how much Kendall tau is lost on
#   held-out configurations, and on the transfer shape?
# - Add a `tile_rows` knob (tile `i0` too) to `compiler.schedule` and check whether the clusters of section 11
#   still give a median reuse error below 20 % with the same k.
#
# - Add `overlap_ratio` (the share of a step spent in communication that overlaps compute) as a feature of the ARX
#   model on a two-process data-parallel loop and measure whether it lowers the error.
# - Replace the interference model's hand-picked features with hardware counters (LLC misses per second of each
#   kernel alone, from `tinylearn.profiler`) and compare the leave-one-out errors.
