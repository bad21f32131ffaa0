# %% [markdown]
# # 08 — GEMM: from the textbook loop to near-BLAS, the roofline, and the CUDA programming model
#
# **Interview questions this notebook answers** (question bank tags in the section headings):
# - [Q3] [Q51] *How do you make matrix multiplication fast (memory access, parallelism, SIMD)? Design a GEMM with
#   multi-level blocking, packing and a micro-kernel.* (§1–§3)
# - [Q5] *What is SIMD, how do you support several instruction sets (SSE/AVX2/AVX-512) in one binary?* (§3)
# - [Q77] *Build a simple instruction-level model of a kernel's upper-bound throughput (FMA, loads/stores,
#   bandwidth).* (§2, §4)
# - [Q50] *A roofline analysis: arithmetic intensity, bottleneck identification, performance prediction.* (§2)
# - [Q55] *Explain the CUDA programming model and memory hierarchy; how do you optimise a kernel
#   (tiling, registers, vector loads, occupancy)?* (§6) — Q7 (multi-stream concurrency) and Q23 (texture and
#   constant memory) need a GPU to measure and are not claimed here: this notebook runs no CUDA kernel.
# - [Q56] *What is memory coalescing? What are shared-memory bank conflicts and how does padding fix them?* (§7)
# - [Q226] [Q63] *Predict occupancy from registers / shared memory per block; what do PTX and nvcc -ptx give you?*
#   (§6, §8)
#
# Every number below is measured on this machine (timing cells are marked and their claims are conservative
# asserts); every GPU statement is labelled: the CUDA kernels are compiled to PTX here and only *run* on a GPU; their
# memory accesses are replayed on the CPU from the kernels' index arithmetic (§7); the Triton and numba-CUDA kernels
# run in their CPU interpreter/simulator — never timed as GPU results.

# %%
# %matplotlib inline
import os

# numba's CUDA simulator must be chosen before numba is imported (section 7); Triton's interpreter likewise.
os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
os.environ.setdefault("TRITON_INTERPRET", "1")

import tinylearn as tl  # noqa: E402 -- first: its short OpenMP spin-wait is set before torch loads libgomp (notebook 00)

# isort: split
import time  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from tinylearn import backends  # noqa: E402
from tinylearn.bench.roofline import roofline_plot  # noqa: E402
from tinylearn.testing import assert_close  # noqa: E402

G = backends.load_C("gemm")
FULL = os.environ.get("TINYLEARN_FULL") == "1"
rng = np.random.default_rng(0)
print("ladder:", tl.gemm.versions("cpp"))


def gflops(fn, n, repeat=3):  # best-of-repeat GFLOP/s of an n x n x n matmul
    fn()
    best = min(_timed(fn) for _ in range(repeat))
    return 2 * n**3 / best / 1e9


def _timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def best_times(fns, repeat=5):  # best-of-repeat seconds of each candidate, timed round-robin (after one warm-up)
    for fn in fns.values():
        fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeat):  # round-robin: a burst of load from another process hits every candidate alike
        for k_, fn in fns.items():
            best[k_] = min(best[k_], _timed(fn))
    return best


def gflops_rr(fns, n, repeat=5):  # GFLOP/s of n x n x n matmuls, timed round-robin
    return {k_: 2 * n**3 / t / 1e9 for k_, t in best_times(fns, repeat).items()}


# %% [markdown]
# ## 1. The ladder, one idea per rung [Q3] [Q51]
#
# `C[i,j] = Σ_k A[i,k]·B[k,j]` is 2·M·N·K FLOPs over only M·K + K·N + M·N numbers: each input is reused N (or M)
# times. Making GEMM fast is making that reuse happen in registers and caches instead of memory.
#
# | version | idea (cpp_src/gemm.cpp) |
# |---|---|
# | naive | i-j-k: the inner loop walks B down a column — a new cache line per FMA |
# | ikj | i-k-j: the inner loop streams a row of B into a row of C (unit stride → the compiler vectorises it) |
# | blocked | ikj over MC×KC blocks of A and KC×NC blocks of B so the B block stays in L2 |
# | packed | BLIS loops: copy blocks into MR-row / NR-column *micro-panels* (contiguous, zero-padded) + C++ kernel |
# | simd | same packing, hand-written 6×16 AVX2 (6×32 AVX-512) FMA micro-kernel, C tile in 12 vector registers |
# | parallel | simd + OpenMP: threads share each packed B panel and split the row blocks (macro-tiles) of C |
#
# First, correctness: every rung against an fp64 reference, on sizes that are not multiples of any tile, and on
# transposed / strided inputs (the packing routines read any strides, so `a.T` costs nothing extra).

# %%
ok = {}
for m, k, n in [(1, 1, 1), (7, 33, 5), (257, 129, 65)]:
    a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    for v in tl.gemm.versions("cpp"):
        expect = a.astype(np.float64) @ b
        assert_close(tl.gemm.matmul(a, b, backend="cpp", version=v), expect, dtype="float32", reduction_size=k)
        at = np.asfortranarray(a)  # column-major A: a transposed view in memory
        assert_close(tl.gemm.matmul(at, b[:, ::1], backend="cpp", version=v), expect, dtype="float32")
        ok[v] = True
print("every version matches fp64 numpy within the fp32 tolerance:", all(ok.values()), sorted(ok))

# %% [markdown]
# Now speed at n = 256 (one thread except `parallel`). `naive` is limited by the cache line it fetches for every
# FMA; `ikj` and `blocked` by loads and stores of C in the inner loop (one FMA needs a load of B, a load and a store
# of C); `packed` removes strided access; `simd` keeps the 6×16 tile of C in registers — per k, 12 vector FMAs for
# six broadcasts of A and two vector loads of B (8 load instructions, §2). All rungs are timed round-robin in one
# loop (best of 5 each), so a burst of load from another process on this shared machine hits every rung alike.

# %%
# NBVAL_IGNORE_OUTPUT
n = 256
a = rng.standard_normal((n, n), dtype=np.float32)
b = rng.standard_normal((n, n), dtype=np.float32)
cands = {v: (lambda v=v: tl.gemm.matmul(a, b, backend="cpp", version=v)) for v in tl.gemm.versions("cpp")}
with threadpool_limits(1):
    cands["numpy (1 thread)"] = lambda: a @ b
    ladder = gflops_rr(cands, n)
for k_, g in ladder.items():
    print(f"{k_:18s} {g:8.2f} GFLOP/s")
if G.isa() != "scalar":  # with TINYLEARN_CPU_FEATURES=scalar the simd version runs the scalar micro-kernel
    assert ladder["simd"] > 3 * ladder["naive"]  # conservative: ~50-100x on an idle AVX2 core
assert ladder["packed"] > ladder["naive"]

# %% [markdown]
# ### 1b. Locality, counted: the loop orders in a cache simulator [Q11]
#
# A cache keeps recently used **lines** (64 bytes: 16 floats). **Spatial locality** — touching the neighbours of
# what you just touched — makes one miss serve 16 accesses; **temporal locality** — reusing data while it is still
# cached — makes one miss serve many reuses. The three loop orders of the same matmul differ only in that:
# `ijk` walks B down a column (a new line per access, and at n = 64 the row stride of 256 B maps every access of
# the column to the same few sets of the cache, so the lines evict each other: conflict misses); `ikj` streams rows
# of B and C (spatial: ~1 miss per 16 accesses); `tiled` runs ikj over 16 × 16 blocks that stay resident (temporal:
# a block of B is reused by 16 rows of A before it leaves). `tl.gemm.cache_sim` replays each order's exact address
# trace through an 8 KiB, 8-way, 64-byte-line LRU cache (a model, not a hardware counter); the timings of §1 are
# the same orders measured on this CPU, whose caches are larger, so its gaps are smaller.

# %%
from tinylearn.gemm import cache_sim  # noqa: E402

sim = {o: cache_sim.simulate_matmul(64, o, 8 << 10) for o in cache_sim.ORDERS}
floor = cache_sim.compulsory_misses(64)
for o, r in sim.items():
    acc, share, times = r["accesses"], r["miss_rate"], r["misses"] / floor
    print(f"{o:6s}: {r['misses']:7d} misses / {acc} accesses ({share:.2%}), {times:.1f}x the {floor} compulsory")
assert sim["ijk"]["misses"] > 10 * sim["ikj"]["misses"] > 50 * sim["tiled"]["misses"]  # spatial, then temporal
assert floor <= sim["tiled"]["misses"] < 4 * floor  # tiling gets within 4x of touching every line once
assert ladder["ikj"] > ladder["naive"]  # §1's measurement: the unit-stride order is faster on the real CPU too

# %% [markdown]
# ## 2. The roofline, and where each version sits [Q77] [Q50]
#
# `attainable = min(peak FLOP/s, intensity × bandwidth)`. The two roofs are measured: the compute roof by a
# register-only FMA loop (12 independent accumulator chains, no memory traffic: `_C.gemm.fma_peak`), the memory
# roof by STREAM triad. `tl.gemm.machine_peak()` measures both once per process.

# %%
# NBVAL_IGNORE_OUTPUT
peak = tl.gemm.machine_peak()
print({k_: (round(v, 1) if isinstance(v, float) else v) for k_, v in peak.items()})
# the STREAM triad (2 FLOP per 24 bytes) is memory-bound on this machine: its intensity is left of the ridge point
print(f"ridge point {peak['gflops_fp32'] / peak['bandwidth_gbs']:.1f} FLOP/byte; triad {2 / 24:.3f}")
assert 2 / 24 < peak["gflops_fp32"] / peak["bandwidth_gbs"]

# %% [markdown]
# A matmul's *compulsory* DRAM traffic is reading A and B once and writing C once — and with a write-back cache a
# normal store first reads the line it writes (*write-allocate*), so C is read and written: 16·n² bytes for 2·n³
# FLOPs, intensity n/8 FLOP/byte (n/6 only with non-temporal stores; `tl.gemm.matmul_traffic`). That is far right
# of the ridge point for any n worth discussing: GEMM is compute-bound *if* the reuse actually happens. At n = 256
# the three matrices take 768 KB and fit in this machine's last-level cache (checked in the plot cell where the OS
# reports the cache size), so every rung's DRAM traffic is about this compulsory minimum;
# what differs between rungs is the traffic between registers and L1, set by each rung's register blocking
# (`tl.gemm.tile_intensity`): naive keeps one C value in a register and loads an A and a B value per FMA (2 FLOP / 8 B
# = 1/4); `ikj`/`blocked` load B and load and store C per FMA (2 / 12 = 1/6); the packed kernels keep an MR×NR tile of
# C in registers and load MR + NR values per k (2·6·16 / (4·22) = 2.18 FLOP/B for 6×16).
#
# The instruction-level view (Q77) explains the gap: per FMA instruction a kernel issues loads/stores, and a core
# does at most 2 FMAs + 2–3 loads + 1 store per cycle.

# %%
# stable-output: instruction counts and model intensities of a fixed 100 GFLOP/s / 10 GB/s machine
mr, nr = 6, 16
mem_ops_simd = (mr + 2) / (mr * nr // 8)
print(
    f"simd micro-kernel: {mr} broadcasts of A + {nr // 8} loads of B = {mr + 2} load instructions per {mr * nr // 8} "
    f"FMAs = {mem_ops_simd:.2f} loads/FMA"
)
print("ikj inner loop: 3 memory instructions per FMA; naive: 2 loads per scalar FMA (1/8 of the vector FLOPs)")
assert mem_ops_simd < 1  # the FMA units, not the load ports, are the bottleneck: compute-bound in the core

flops, nbytes = tl.gemm.matmul_traffic(n, n, n)
r = tl.gemm.roofline(flops, nbytes, peak_gflops=100.0, bandwidth_gbs=10.0)
print(
    f"n={n}: intensity {r['intensity']:.1f} FLOP/B, ridge of a 100 GFLOP/s / 10 GB/s machine {r['ridge']:.0f}:",
    r["bound"],
)
assert r["bound"] == "compute" and r["intensity"] == n / 8 and nbytes == 16 * n**2
assert tl.gemm.matmul_traffic(n, n, n, write_allocate=False)[1] == 12 * n**2  # n/6: streaming stores only
rung_ai = {"naive": tl.gemm.tile_intensity(1, 1), "ikj": tl.gemm.tile_intensity(1, 16, c_in_registers=False)}
rung_ai["6x16 tile"] = tl.gemm.tile_intensity(6, 16)
print("register<->L1 intensity (FLOP/B):", {k_: round(v, 3) for k_, v in rung_ai.items()})
assert rung_ai == {"naive": 0.25, "ikj": 2 / 12, "6x16 tile": 192 / 88}
l1_ridge = (2 * 8 * 2) / (2 * 32)  # AVX2 core per cycle: 2 FMA x 8 lanes x 2 FLOP over 2 loads x 32 B
assert rung_ai["naive"] < rung_ai["6x16 tile"] and rung_ai["ikj"] < l1_ridge == 0.5 < rung_ai["6x16 tile"]

# %%
# NBVAL_IGNORE_OUTPUT
from pathlib import Path  # noqa: E402


def rung_intensity(v):  # register<->L1 intensity of each rung from its blocking (packed ones: their MR x NR tile)
    if v == "naive":
        return tl.gemm.tile_intensity(1, 1)
    if v in ("ikj", "blocked"):
        return tl.gemm.tile_intensity(1, 1, c_in_registers=False)
    shape = G.kernel_shape("packed" if v == "packed" else "simd", "auto", "float32")
    return tl.gemm.tile_intensity(shape["MR"], shape["NR"])


fig, ax = plt.subplots(figsize=(7, 4.5))
pts = [(k_, rung_intensity(k_), g) for k_, g in ladder.items() if k_ in tl.gemm.versions("cpp")]  # not OpenBLAS
pts.append(("triad (memory)", 2 / 24, peak["bandwidth_gbs"] * 2 / 24))
roofline_plot(ax, peak["gflops_fp32"], peak["bandwidth_gbs"], pts)
ax.axvline(n / 8, color="tab:red", ls="--", lw=1)
ax.text(n / 8, 1, " compulsory DRAM n/8", fontsize=8, color="tab:red", rotation=90)
ax.set_title(f"ladder at n={n}, each rung at its register<->L1 intensity; roofs: FMA loop, DRAM (STREAM)")
plt.show()
caches = Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size")
llc = max(
    (int(p_.read_text().strip()[:-1]) << (20 if p_.read_text().strip()[-1] == "M" else 10) for p_ in caches), default=0
)
print(f"last-level cache {llc >> 10} KB (0: not reported); A, B, C at n={n}: {3 * n * n * 4 >> 10} KB")
assert llc == 0 or llc >= 3 * n * n * 4
dram_roof_ikj = rung_intensity("ikj") * peak["bandwidth_gbs"]
print(f"ikj: {ladder['ikj']:.1f} GFLOP/s measured vs {dram_roof_ikj:.1f} if its loads and stores went to DRAM")
# above the DRAM roof at their own intensity: their operands are served by caches
assert ladder["ikj"] > dram_roof_ikj and ladder["blocked"] > dram_roof_ikj

# %% [markdown]
# **What to optimise next [Q50].** `tl.gemm.roofline(..., achieved_gflops=)` adds an `advice` field: a memory-bound
# kernel should *raise arithmetic intensity* (cache or register blocking, fusion); a compute-bound one below half of
# the compute roof leaves the FMA units idle and should *vectorise / add ILP* (register blocking, independent
# accumulators); at or above half it is *at the roof*. Each single-thread rung is judged at its register↔L1 intensity
# against the one-core FMA roof and an L1 roof that is a **model** (2 loads × 32 B per cycle: the ridge of 0.5
# FLOP/B asserted above), with its §1 rate as the achieved one. The `packed` rung's verdict depends on the compiler:
# its micro-kernel is plain C++ loops, which gcc vectorises only in part for AVX2 (advice: vectorise — and the
# hand-written `simd` kernel then runs over 1.5x faster, asserted), but with `-march=native` on an AVX-512 CPU turns
# into zmm FMAs that already reach the roof (then both rungs are asserted *at the roof*).

# %%
# NBVAL_IGNORE_OUTPUT
from tinylearn.gemm.roofline import ADVICE  # noqa: E402

peak_1t = peak["gflops_fp32_1t"]
l1_bw = peak_1t / l1_ridge  # GB/s that puts the ridge at 0.5 FLOP/B (model of the L1 load ports, not measured)
advice = {}
for v in ("naive", "ikj", "blocked", "packed", "simd"):
    fl = 2.0 * n**3
    rv = tl.gemm.roofline(fl, fl / rung_intensity(v), peak_1t, l1_bw, achieved_gflops=ladder[v])
    advice[v] = rv["advice"]
    print(f"{v:8s} {rv['bound'] + '-bound':14s} {ladder[v] / peak_1t:4.0%} of the 1-core FMA roof -> {rv['advice']}")
assert all(advice[v] == ADVICE["memory"] for v in ("naive", "ikj", "blocked"))  # below the L1 ridge: intensity
if G.isa() != "scalar":  # (forced scalar: the roof is the scalar FMA loop's, which the vectorised packed rung reaches)
    if advice["packed"] == ADVICE["compute"]:  # the compiler vectorised packed's plain 6x16 loops only in part
        assert ladder["simd"] > 1.5 * ladder["packed"]  # the advice, followed: a hand-vectorised micro-kernel
    else:  # a -march=native build on an AVX-512 CPU: gcc turns those loops into zmm FMAs, packed is at the roof
        assert advice["packed"] == ADVICE["roof"] and advice["simd"] == ADVICE["roof"]

# %% [markdown]
# Read the plot as a *hierarchical* roofline. The memory roof drawn is DRAM (STREAM); a rung whose operands come
# from L1/L2 can sit above it at its own intensity, and `ikj` and `blocked` do (asserted above): their loads are
# served by caches. The FMA roof needs a register-level intensity past the *L1* ridge: an AVX2 core loads at most
# 2 × 32 B per cycle while it does 2 × 8 FMAs = 32 FLOP, a ridge of 0.5 FLOP/B, which only the MR×NR-tiled rungs
# pass (2.18 for 6×16; naive 0.25 and ikj 0.17 do not: asserted in the cell before the plot).
#
# ## 3. The micro-kernel, SIMD and run-time ISA dispatch [Q5]
#
# One binary holds three micro-kernels: scalar (auto-vectorisation switched off), AVX2+FMA (`__m256`, 8 floats) and
# AVX-512 (`__m512`, 16 floats), each compiled with `__attribute__((target("...")))` so a portable build still
# contains them. At run time `__builtin_cpu_supports` picks the best; `TINYLEARN_CPU_FEATURES=scalar|avx2|avx512`
# forces one (a ValueError if this CPU lacks it). Register budget of the AVX2 6×16 kernel: 12 accumulators + 2 B
# vectors + 1 broadcast = 15 of 16 ymm registers.
#
# The default path below is the very kernel of §1's `simd` rung. Timed in separate cells with best-of-3, the two
# differed by about a fifth in an earlier run of this notebook: nothing in the kernel differs, the machine does — it
# is a 2-core box shared with other jobs, so a burst of load (or a clock change) during one cell's few calls moves
# that cell alone. Timing candidates round-robin in one loop (`gflops_rr`, best of 20 here) exposes them to the same
# load. Order matters too: with the 30-ms scalar kernel in the same round-robin, the call timed right after it was
# consistently the slowest of identical AVX2 calls in trial runs (a clock/power-state or scheduling effect after a
# long scalar stretch; not separated further here), so the cell times the default path and the `simd` rung as a pair,
# and the other paths afterwards. It asserts the pair agrees within a factor 1.6; the printed ratio to §1's separate
# measurement is the cell-to-cell spread of this run.

# %%
# NBVAL_IGNORE_OUTPUT
print("micro-kernel paths on this CPU:", G.isa_paths(), "| default:", G.isa())
print("tile and cache blocks:", G.kernel_shape("simd", "auto", "float32"))
assert "scalar" in G.isa_paths()

# %%
# NBVAL_IGNORE_OUTPUT
pair = {G.isa(): lambda: G.matmul(a, b, "simd", G.isa())}  # the default path, explicitly ...
pair["simd rung (default path)"] = lambda: tl.gemm.matmul(a, b, backend="cpp", version="simd")  # ... and via §1's API
by_isa = gflops_rr(pair, n, repeat=20)
for p in G.isa_paths():  # the other paths on their own, after the pair (see the text on ordering)
    by_isa.setdefault(p, gflops(lambda p=p: G.matmul(a, b, "simd", p), n))
print({p: round(g, 1) for p, g in by_isa.items()}, f"| the simd rung in §1: {ladder['simd']:.1f}")
if "avx2" in by_isa:
    assert by_isa["avx2"] > 2 * by_isa["scalar"]  # 8 lanes + FMA vs one FLOP per instruction
same = by_isa[G.isa()] / by_isa["simd rung (default path)"]  # one kernel reached two ways, timed round-robin
print(
    f"default path / simd rung timed together: {same:.2f}; vs §1's separate measurement: "
    f"{by_isa[G.isa()] / ladder['simd']:.2f}"
)
assert 1 / 1.6 < same < 1.6

# %% [markdown]
# ## 4. GFLOP/s vs size, threads, and the BLAS comparison [Q3]
#
# Small matrices cannot amortise packing and loop overhead; large ones fall out of cache unless blocked. The design
# goal for `simd` (1 thread) and `parallel` (all cores): ≥ 80 % of OpenBLAS sgemm at 1024³ and ≥ 60 % of the FMA
# peak. The cell measures every size up to 1024 round-robin (best of 5), prints both ratios at 1024 and whether
# this run met the goal; the asserts are floors a loaded CI box still clears (1 thread > 40 %, 2 threads > 25 % of
# OpenBLAS), not the goal itself. Either ratio can miss in one run of this shared 2-core box: the 1-thread one when
# another job lands on the core during the simd calls more than during the OpenBLAS ones; the 2-thread one more
# easily, since any other process takes half of what `parallel` and OpenBLAS compete for, `parallel` synchronises its
# threads twice per KC step (after packing each B panel, and before repacking it), and its peak share divides by the
# all-core FMA peak of §2, itself measured under whatever load there was. `tinylearn bench gemm` reports the same
# ratios as a median of 5.

# %%
# NBVAL_IGNORE_OUTPUT
sizes = [64, 128, 256, 512, 1024] + ([2048] if FULL else [])
curves = {"simd (1 thread)": [], "packed (1 thread)": [], "numpy (1 thread)": [], "parallel": [], "numpy": []}


for s in sizes:  # round-robin within the 1-thread group (BLAS limited to 1 thread) and within the all-core group
    x = rng.standard_normal((s, s), dtype=np.float32)
    y = rng.standard_normal((s, s), dtype=np.float32)
    with threadpool_limits(1):
        got = gflops_rr(
            {
                "simd (1 thread)": lambda x=x, y=y: G.matmul(x, y, "simd"),
                "packed (1 thread)": lambda x=x, y=y: G.matmul(x, y, "packed"),
                "numpy (1 thread)": lambda x=x, y=y: x @ y,
            },
            s,
        )
    got |= gflops_rr({"parallel": lambda x=x, y=y: G.matmul(x, y, "parallel"), "numpy": lambda x=x, y=y: x @ y}, s)
    for k_, g in got.items():
        curves[k_].append(g)
fig, ax = plt.subplots(figsize=(7, 4))
for k_, v in curves.items():
    ax.plot(sizes, v, "o-", label=k_)
ax.axhline(peak["gflops_fp32_1t"], color="gray", ls=":", label="FMA peak, 1 thread")
ax.set_xscale("log", base=2)
ax.set_xlabel("n (n x n x n)")
ax.set_ylabel("GFLOP/s")
ax.legend(fontsize=8)
plt.show()
i1k = sizes.index(1024)
r1 = curves["simd (1 thread)"][i1k] / curves["numpy (1 thread)"][i1k]
r2 = curves["parallel"][i1k] / curves["numpy"][i1k]
p1 = curves["simd (1 thread)"][i1k] / peak["gflops_fp32_1t"]
p2 = curves["parallel"][i1k] / peak["gflops_fp32"]
met1, met2 = r1 >= 0.8 and p1 >= 0.6, r2 >= 0.8 and p2 >= 0.6
print(f"n=1024, 1 thread : simd / OpenBLAS {r1:.2f}, of FMA peak {p1:.2f}  -> goal (0.80, 0.60) met: {met1}")
print(f"n=1024, {peak['cores']} threads: parallel / OpenBLAS {r2:.2f}, of FMA peak {p2:.2f}  -> goal met: {met2}")
if G.isa() != "scalar":  # the forced-scalar run of the suite has no SIMD micro-kernel to compare
    assert r1 > 0.4 and r2 > 0.25  # floors for a loaded 2-core box; the goal itself is printed, not asserted
    # small sizes cannot amortise packing: simd at 64 is below its best at n >= 256 (measured ~2x on an idle core)
    assert curves["simd (1 thread)"][0] < max(curves["simd (1 thread)"][sizes.index(256) :])

# %% [markdown]
# ## 5. Side by side: numpy, torch, tinygrad — and what tinygrad's code generator writes
#
# tinygrad does not call a BLAS: it *generates* a C kernel for the matmul and compiles it with clang. Below is the
# start of that kernel (captured with `DEBUG=4`): an accumulator tile `buf0[16]` (4×4 outputs, upcast), float4
# loads, the reduction loop unrolled by 4 — register blocking chosen by tinygrad's *hand-coded* heuristics
# (`codegen/opt/heuristic.py: hand_coded_optimizations`; its beam search over "opts" only runs when `BEAM=n` is set,
# and it is not set here: asserted), no packing and no explicit FMA intrinsics: our `simd` rung by other means.
#
# Each un-jitted `(a @ b).realize()` call also pays tinygrad's Python scheduling and launch cost. To see which one
# its low GFLOP/s reflects, the cell times a tiny 8×8 call (≈ pure per-call overhead), subtracts it from the 256 and
# 512 calls, and reports the kernel's own rate: in the committed run the overhead is a sizeable share of the 256
# call (asserted ≥ 20 %), and the kernel itself, overhead removed, still runs at under half of our 1-thread `simd`
# rung at 512 (timed in the same round-robin loop; asserted) — so it is both, and at 512 mostly kernel (overhead
# under half of that call: asserted). The bar chart after the cell puts them side by side at n = 256, tinygrad twice:
# per call as a user sees it, and its kernel alone (the 8×8 call's time removed). Each library is timed best of 20.
# The multi-threaded bars (tinylearn parallel, numpy, torch) are fragile on this 2-core box: a 256³ call is about a
# millisecond of work, and while other jobs hold the cores each of its thread barriers can wait a whole scheduler
# time slice for a descheduled thread, which divides its rate many times over (a multi-threaded bar below the
# 1-thread one is that). So the chart also has our 1-thread `simd` rung, and per call tinygrad runs at under half of
# it (asserted).

# %%
# NBVAL_IGNORE_OUTPUT
import subprocess  # noqa: E402
import sys  # noqa: E402

from tinylearn.bench import import_tinygrad, tinygrad_status  # noqa: E402

ta, tb = torch.from_numpy(a), torch.from_numpy(b)
side_fns = {"tinylearn parallel": lambda: tl.gemm.matmul(a, b), "numpy": lambda: a @ b, "torch": lambda: ta @ tb}
side_fns["tinylearn simd (1 thread)"] = lambda: G.matmul(a, b, "simd")  # immune to the other core being busy
ok_tg, why = tinygrad_status()
if ok_tg:
    tg = import_tinygrad()
    ga, gb = tg.Tensor(a).realize(), tg.Tensor(b).realize()
    side_fns["tinygrad"] = lambda: (ga @ gb).realize()
side = {k_: gflops(fn, n, repeat=20) for k_, fn in side_fns.items()}  # best of 20: calls of ~1-10 ms (see text)
if ok_tg:
    assert tg.helpers.BEAM.value == 0  # no search: the hand-coded heuristics pick the opts

    xs = {s_: tg.Tensor(rng.standard_normal((s_, s_), dtype=np.float32)).realize() for s_ in (8, 256, 512)}
    a512 = rng.standard_normal((512, 512), dtype=np.float32)
    fns = {s_: (lambda x_=x_: (x_ @ x_).realize()) for s_, x_ in xs.items()}
    t_ = best_times(fns | {"simd": lambda: G.matmul(a512, a512, "simd")})  # our 1-thread rung in the same loop
    overhead = t_[8]
    kernel_rate = {s_: 2 * s_**3 / (t_[s_] - overhead) / 1e9 for s_ in (256, 512)}
    simd512 = 2 * 512**3 / t_["simd"] / 1e9
    print(
        f"tinygrad per-call overhead (8x8 call) {overhead * 1e3:.1f} ms = {overhead / t_[256]:.0%} of the 256 call, "
        f"{overhead / t_[512]:.0%} of the 512 call; kernel alone: {kernel_rate[256]:.1f} GFLOP/s at 256, "
        f"{kernel_rate[512]:.1f} at 512 (our simd rung at 512, 1 thread: {simd512:.1f})"
    )
    assert overhead / t_[256] >= 0.2 and overhead / t_[512] < 0.5
    if G.isa() != "scalar":  # forced-scalar runs have no SIMD micro-kernel to compare with
        assert kernel_rate[512] < 0.5 * simd512
    code = (
        "import numpy as np; from tinygrad import Tensor; "
        "x = Tensor(np.ones((64, 64), np.float32)).realize(); (x @ x).realize()"
    )
    env = dict(os.environ, DEBUG="4", DEV="CPU")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    lines = out.stdout.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith("void r_")), 0)
    body = [ln for ln in lines[start:] if "\x1b" not in ln and (not ln.strip().startswith("*(buf0+") or "+0)" in ln)]
    print("\n".join(body[:32]) + "\n  ... (trimmed: 15 of the 16 accumulator lines per statement dropped)")
else:
    print("tinygrad unavailable:", why)
print({k_: round(v, 1) for k_, v in side.items()})  # all cores: on a shared 2-core box these move the most

# %%
# NBVAL_IGNORE_OUTPUT
bars = dict(side)
if ok_tg:
    bars["tinygrad kernel only"] = kernel_rate[256]  # the 8x8 call's per-call overhead removed
fig, ax = plt.subplots(figsize=(7, 3))
colors = ["tab:blue", "tab:gray", "tab:orange", "tab:cyan", "tab:green", "tab:olive"]
ax.barh(list(bars), list(bars.values()), color=colors[: len(bars)])
for i_, g_ in enumerate(bars.values()):
    ax.text(g_, i_, f" {g_:.1f}", va="center", fontsize=8)
ax.invert_yaxis()
ax.set_xlim(0, 1.15 * max(bars.values()))
ax.set_xlabel(f"GFLOP/s, {n}x{n}x{n} fp32 (each library's default threads)")
ax.set_title("side by side: tinylearn, numpy, torch, tinygrad")
plt.tight_layout()
plt.show()
if ok_tg and G.isa() != "scalar":  # tinygrad per call: under half the rate of our 1-thread simd rung
    assert side["tinygrad"] < 0.5 * side["tinylearn simd (1 thread)"]

# %% [markdown]
# Hardware counters: with `perf stat` one can count cache misses per version (naive misses on nearly every B
# access; packed/simd on almost none). This needs a kernel that exposes the PMU to the process.

# %%
# NBVAL_IGNORE_OUTPUT
import shutil  # noqa: E402

if shutil.which("perf") is None:
    print("skipped: perf is not installed")
else:
    out = subprocess.run(["perf", "stat", "-x,", "-e", "cache-misses", "true"], capture_output=True, text=True)
    if "<not supported>" in out.stderr or out.returncode != 0:
        print(
            "skipped: perf cannot read hardware cache counters here (virtual machine / perf_event_paranoid):",
            out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode,
        )
    else:
        for v in ("naive", "blocked", "simd"):
            code = (
                "import numpy as np; from tinylearn.backends import load_C; a=np.ones((256,256),np.float32); "
                f"load_C('gemm').matmul(a, a, '{v}')"
            )
            r_ = subprocess.run(
                ["perf", "stat", "-x,", "-e", "cache-misses,cache-references", sys.executable, "-c", code],
                capture_output=True,
                text=True,
            )
            print(v, [ln.split(",")[0] + " " + ln.split(",")[2] for ln in r_.stderr.strip().splitlines()[-2:]])

# %% [markdown]
# ## 6. GEMM on a GPU: the CUDA ladder, PTX and occupancy [Q55] [Q63] [Q226]
#
# The model: a *grid* of *blocks*, each block up to 1024 threads running on one SM, scheduled in *warps* of 32
# threads that issue one instruction together. Warps are not lock-step since Volta: with *independent thread
# scheduling* every thread has its own program counter, a diverged warp runs its paths interleaved and need not
# reconverge by itself, so code that exchanges data between the lanes of a warp synchronises them explicitly
# (`__syncwarp()`, or the `*_sync` shuffles and votes with a lane mask). Memory: registers (per thread) → shared
# memory (per block, 32 banks of 4 bytes, 128 B per clock per SM) → L2 → HBM (2.0 TB/s on an A100 80 GB, 3.35 TB/s
# on an H100 SXM). Aggregate shared-memory bandwidth is SMs × 128 B/clk × clock (cell below): about 19.5 TB/s on
# an A100, about 33 TB/s on an H100 SXM — roughly 10× HBM, not 100×. The same reuse argument as on the CPU, one
# level per rung (`cuda_src/gemm_*.cu`):
#
# | kernel | idea | global loads per FMA |
# |---|---|---|
# | gemm_naive | one thread per C element, threadIdx.x along a row (coalesced B, broadcast A) | 2 |
# | gemm_smem | 32×32 tiles of A and B staged in shared memory, `__syncthreads()` | 2/32 |
# | gemm_regtile | 64×64 block, a 4×4 register tile per thread; A stored transposed, rows padded by 2 | 2/64 |
# | gemm_vec4 | regtile + `float4` global loads/stores, shared reads; A's store XOR-swizzled | 2/64, ¼ the loads |
#
# They are compiled to PTX (the virtual ISA; the driver JIT-compiles it to the GPU's SASS) here with `nvcc -ptx
# -arch=sm_80`; cupy's `RawModule` compiles and runs them when a GPU is present (`backend="cuda"`).

# %%
smem_tbs = {  # SMs x 128 B per clock per SM x boost clock (GHz): datasheet factors
    "A100 (sm_80)": 108 * 128 * 1.41e9 / 1e12,
    "H100 SXM (sm_90)": 132 * 128 * 1.98e9 / 1e12,
}
hbm_tbs = {"A100 (sm_80)": 2.0, "H100 SXM (sm_90)": 3.35}
for gpu, bw in smem_tbs.items():
    print(f"{gpu:17s} shared memory {bw:5.1f} TB/s aggregate = {bw / hbm_tbs[gpu]:4.1f}x its HBM ({hbm_tbs[gpu]} TB/s)")
assert round(smem_tbs["A100 (sm_80)"], 1) == 19.5 and round(smem_tbs["H100 SXM (sm_90)"]) == 33
assert all(8 < smem_tbs[g] / hbm_tbs[g] < 12 for g in smem_tbs)  # ~10x HBM, nowhere near 100 TB/s

# %%
# NBVAL_IGNORE_OUTPUT
import re  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from tinylearn.gemm import cuda as gemm_cuda  # noqa: E402
from tinylearn.testing import nvcc_available  # noqa: E402

CU = Path(tl.__file__).resolve().parents[1] / "cuda_src"
# registers / shared bytes per kernel as ptxas (nvcc 13, -arch=sm_80) reports them; the occupancy table below uses
# this committed copy so it is exact without nvcc, and this cell re-derives it live whenever nvcc exists
PTXAS = {"naive": (32, 0), "smem": (32, 8192), "regtile": (64, 8320), "vec4": (64, 8192)}
resources = {}
if nvcc_available():
    with tempfile.TemporaryDirectory() as tmp:
        for v, (src, _, _) in gemm_cuda.LAUNCH.items():
            ptx = subprocess.run(
                ["nvcc", "-ptx", "-arch=sm_80", "-o", f"{tmp}/{src}.ptx", str(CU / f"{src}.cu")],
                capture_output=True,
                text=True,
            )
            text = Path(f"{tmp}/{src}.ptx").read_text()
            info = subprocess.run(
                [
                    "nvcc",
                    "-cubin",
                    "-arch=sm_80",
                    "--resource-usage",
                    "-o",
                    f"{tmp}/{src}.cubin",
                    str(CU / f"{src}.cu"),
                ],
                capture_output=True,
                text=True,
            ).stderr
            regs = int(re.search(r"Used (\d+) registers", info).group(1))
            smem = int(m_.group(1)) if (m_ := re.search(r"(\d+) bytes smem", info)) else 0
            resources[v] = (regs, smem)
            print(
                f"{v:8s} PTX lines {len(text.splitlines()):4d}, ld.global.v4 {text.count('ld.global.nc.v4.f32'):2d},"
                f" fma {text.count('fma.rn.f32'):3d} | ptxas: {regs} registers, {smem} B shared"
            )
    assert gemm_cuda.LAUNCH.keys() == resources.keys()
    release = re.search(
        r"release (\d+)\.", subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
    )
    if release and release.group(1) == "13":  # the compiler the committed table came from: it must agree exactly
        assert resources == PTXAS, f"ptxas now reports {resources}; update PTXAS (and the occupancy asserts)"
        print("ptxas --resource-usage == the committed PTXAS table used below:", resources == PTXAS)
    else:  # another nvcc allocates registers differently; show the difference instead of failing on it
        print(
            "nvcc",
            release and release.group(1),
            "(table from nvcc 13): differs on",
            {k_: v for k_, v in resources.items() if v != PTXAS[k_]},
        )
else:
    print("nvcc not found: PTX compile and the live ptxas check skipped; the table below uses the committed PTXAS")

# %% [markdown]
# **Occupancy** = resident warps / 64 per SM. Each block's registers (allocated per warp in units of 256, from four
# 16 K-register sub-partitions), shared memory (+1 KB reserved per block, at the 164 KB maximum carveout on sm_80,
# 228 KB on sm_90), its warp count and the 32-blocks cap each bound the number of resident blocks
# (`tl.gemm.occupancy`, the rules of CUDA's occupancy calculator). High occupancy hides memory latency, but the
# register-tiled kernels deliberately trade occupancy for reuse (ILP within a thread).

# %%
threads = {"naive": 256, "smem": 1024, "regtile": 256, "vec4": 256}
print(
    f"{'kernel':8s} {'thr':>5s} {'regs':>4s} {'smem':>6s} | {'sm_80 blk':>9s} {'occ':>5s} {'limiter':>9s} "
    f"| {'sm_90 occ':>9s}"
)
occ_rows = {}
for v, (regs, smem) in PTXAS.items():
    o80 = tl.gemm.occupancy(threads[v], regs, smem, "sm_80")
    o90 = tl.gemm.occupancy(threads[v], regs, smem, "sm_90")
    occ_rows[v] = o80
    print(
        f"{v:8s} {threads[v]:5d} {regs:4d} {smem:6d} | {o80['blocks_per_sm']:9d} {o80['occupancy']:5.2f} "
        f"{o80['limiter']:>9s} | {o90['occupancy']:9.2f}"
    )
assert occ_rows["naive"]["occupancy"] == 1.0
assert occ_rows["smem"]["occupancy"] == 1.0  # 2 blocks of 1024 threads x 32 registers fill the SM
assert occ_rows["regtile"]["limiter"] == "registers" and occ_rows["regtile"]["occupancy"] == 0.5  # 64 regs/thread
assert occ_rows["vec4"]["limiter"] == "registers" and occ_rows["vec4"]["occupancy"] == 0.5
print(
    "register cliff, 128 threads:", [(r_, tl.gemm.occupancy(128, r_, 0)["occupancy"]) for r_ in (32, 33, 64, 65, 128)]
)
assert tl.gemm.occupancy(128, 33, 0)["occupancy"] == 0.75  # 33 regs round up to 40/thread (1280 per warp)

# %% [markdown]
# The Triton version of the tiled kernel (one program per 16×16 tile of C, `tl.dot` on tiles, masked edges) runs
# here in Triton's CPU interpreter — a correctness check, never a timing.

# %%
x = rng.uniform(-1, 1, (33, 20)).astype(np.float32)
y = rng.uniform(-1, 1, (20, 17)).astype(np.float32)
assert_close(tl.gemm.matmul(x, y, backend="triton"), x.astype(np.float64) @ y, dtype="float32")
print("triton (interpreter) tiled matmul matches numpy:", True)

# %% [markdown]
# ## 7. Coalescing and bank conflicts of the CUDA ladder, replayed from the kernels' index arithmetic [Q56]
#
# Two memory rules decide what a warp's access costs (`tl.gemm.gpu_model`). Global memory is served in 32-byte
# sectors: `transactions` counts the distinct sectors (and 128-byte segments) the warp's byte addresses touch.
# Shared memory has 32 banks of 4-byte words (bank = word mod 32); a bank that must deliver k *distinct* words takes
# k passes (the same word to many threads is a broadcast); 128-bit accesses are served 8 threads per phase.
#
# No GPU here, so the kernels are not run: `tl.gemm.cuda_trace` replays, for every thread of every warp of a block,
# the index expression of each shared/global access of `cuda_src/gemm_*.cu` — each entry carries the source line it
# mirrors, and the cell checks that every such line occurs verbatim in the current .cu file. The same index
# functions drive a numpy emulation of `gemm_regtile` and `gemm_vec4` (block by block, the shared arrays as flat
# word arrays) that must reproduce `a @ b`: a wrong index in the replay would fail it. `fixed=False` replays the
# layouts these kernels had before this section's fixes.

# %%
from tinylearn.gemm import cuda_trace, gpu_model  # noqa: E402

for kern in cuda_trace.KERNELS:
    assert all(cuda_trace.source_lines_present(kern).values()), kern  # the replay mirrors the current sources
x = rng.uniform(-1, 1, (70, 36)).astype(np.float32)
y = rng.uniform(-1, 1, (36, 68)).astype(np.float32)
for kern in ("regtile", "vec4"):
    for fixed_ in (False, True):  # edge blocks included: 70 x 68 is not a multiple of the 64 x 64 tile
        assert_close(cuda_trace.emulate(kern, x, y, fixed_), x.astype(np.float64) @ y, dtype="float32")
print("emulated regtile / vec4 (old and new layouts) match numpy")

before = {k_: cuda_trace.trace(k_, fixed=False) for k_ in cuda_trace.KERNELS}
after = {k_: cuda_trace.trace(k_, fixed=True) for k_ in cuda_trace.KERNELS}
print(f"{'kernel':8s} {'access':9s} {'before':>7s} {'after':>7s}   source line (current)")
for kern in cuda_trace.KERNELS:
    for acc, row in after[kern].items():
        key, unit = ("degree", "-way") if row["space"] == "shared" else ("sectors", " sec")
        print(f"{kern:8s} {acc:9s} {before[kern][acc][key]:3d}{unit} {row[key]:3d}{unit}   {row['source']}")
assert before["regtile"]["As store"]["degree"] == 16 and after["regtile"]["As store"]["degree"] == 1
assert before["regtile"]["Bs read"]["degree"] == 2 and after["regtile"]["Bs read"]["degree"] == 1
assert before["vec4"]["As store"]["degree"] == 4 and after["vec4"]["As store"]["degree"] == 1
assert (before["regtile"]["C store"]["sectors"], before["regtile"]["C store"]["efficiency"]) == (16, 0.25)
assert (after["regtile"]["C store"]["sectors"], after["regtile"]["C store"]["efficiency"]) == (4, 1.0)
assert all(after["smem"][a_]["sectors"] == 4 and after["smem"][a_]["efficiency"] == 1 for a_ in ("A load", "B load"))
assert all(r["degree"] == 1 for k_ in cuda_trace.KERNELS for r in after[k_].values() if r["space"] == "shared")
assert (after["naive"]["A load"]["sectors"], after["naive"]["A load"]["efficiency"]) == (2, 0.125)
assert (after["naive"]["B load"]["sectors"], after["naive"]["B load"]["efficiency"]) == (2, 1.0)

# %% [markdown]
# What the table shows (each claim asserted above):
#
# - `gemm_smem`: `As[ty][k]` is one word per warp (a broadcast) and `Bs[k][tx]` 32 consecutive words: conflict-free
#   without padding; its global loads are 4 sectors (128 B) per warp: fully coalesced.
# - `gemm_regtile` stored A transposed (`As[k][m]`) so a thread's 4 A values are contiguous — but the store was a
#   **16-way** conflict: a warp writes m ∈ {0, 1} × k ∈ 0..15 and with 64-word rows all 32 words fall in banks 0
#   and 1. Two padding words per row (`As[BK][BM + 2]`: bank = 2k + m) make it conflict-free. Its B reads
#   `Bs[k][4·tx + j]` were **2-way** (tx and tx + 8 share a bank); reading columns `tx + 16·j` instead is
#   conflict-free and also turns the C store from 16 sectors at 25 % efficiency into 4 sectors at 100 %.
# - `gemm_vec4`'s transposed store was **4-way**; padding would break the 16-byte alignment its `float4` reads need,
#   so the column is XOR-swizzled (`As[k][m ^ SWZ(k)]`, SWZ(k) a multiple of 8): 1-way, float4 reads unchanged.
# - `gemm_naive`: a warp spans 2 rows of a 16×16 block, so its A load is 2 sectors for 2 distinct floats (12.5 %
#   efficiency) while its B load is 2 fully used sectors.
#
# The classic column-read example, from the same model: a column of a 32×32 float tile lies in one bank, one
# padding column fixes it.

# %%
for width in (32, 33):
    col = gpu_model.column_words(32, pad=width - 32)
    print(f"float tile[32][{width}]: column read degree {gpu_model.bank_conflicts(col)['degree']}")
assert gpu_model.bank_conflicts(gpu_model.column_words(32, 0))["degree"] == 32
assert gpu_model.bank_conflicts(gpu_model.column_words(32, 1))["degree"] == 1

# %% [markdown]
# numba's CUDA simulator runs `@cuda.jit` kernels on the CPU (every thread a Python thread, barriers and shared
# memory real): a tiled GEMM written in numba.cuda (8×8 tiles, not one of the .cu kernels) runs there as a
# correctness check of the same staging pattern.

# %%
from tinylearn.gemm import numba_sim  # noqa: E402

assert numba_sim.SIMULATED
x = rng.uniform(-1, 1, (19, 13)).astype(np.float32)
y = rng.uniform(-1, 1, (13, 10)).astype(np.float32)
assert_close(numba_sim.tiled_matmul(x, y), x.astype(np.float64) @ y, dtype="float32")
print("numba.cuda tiled matmul (simulator, 8x8 tiles, shared memory) matches numpy")

# %% [markdown]
# ## 8. Recap — interview answers
#
# - **[Q3][Q51] Fast GEMM**: reuse. Loop order for unit stride (ikj), cache blocking (KC×NC of B in L2/L3, MC×KC
#   of A in L2), pack panels so the micro-kernel reads contiguous aligned memory, an MR×NR register-blocked
#   micro-kernel (6×16 on AVX2: 12 accumulators, 12 FMAs per 6 broadcasts + 2 loads), then threads over
#   macro-tiles sharing the B panel. Verify against an fp64 reference on odd sizes and strides; measure against the
#   FMA peak.
# - **[Q5] SIMD & multiple ISAs**: one instruction on 8 (AVX2) / 16 (AVX-512) floats; FMA doubles FLOPs per
#   instruction. Compile each kernel with `target("avx2,fma")` / `target("avx512f")`, dispatch at run time with
#   `cpuid` (`__builtin_cpu_supports`), keep a scalar fallback, let an env var force a path for testing.
# - **[Q77] Upper bound of a kernel**: count FMAs, loads/stores and bytes per iteration; bound by FMA ports
#   (2/cycle), load ports and bandwidth at each level; roofline = min(peak, intensity × bandwidth) with measured
#   roofs (FMA loop, STREAM).
# - **[Q50] Roofline analysis**: intensity per rung from its blocking (register↔L1: 1/4, 1/6, 2.18 FLOP/B),
#   compulsory DRAM intensity n/8 with the write-allocate read of C, bound = which side of the ridge; a point above
#   a roof means the data came from a faster level (hierarchical roofline).
# - **[Q55] CUDA optimisation**: coalesce global loads (threadIdx.x on the contiguous axis), tile in shared
#   memory, register-tile for ILP, vectorise to 128-bit accesses, avoid bank conflicts, size blocks for occupancy
#   but accept lower occupancy when each thread does more independent work.
# - **[Q56] Coalescing / banks**: a warp's access costs one transaction per distinct 32 B sector (128 B segment);
#   shared memory has 32 four-byte banks, conflicts serialise, same-word broadcasts are free; padding (+1 for a
#   column read, +2 for regtile's transposed store) or an XOR swizzle (when float4 alignment forbids padding) removes
#   them — found by replaying the kernels' real index arithmetic, not by hand-typed formulas.
# - **[Q226][Q63] Occupancy / PTX**: warps per SM = min over registers (256-register warp granularity, per
#   sub-partition), shared memory (+1 KB/block), 64 warps, 32 blocks; `nvcc -ptx` gives the virtual ISA the driver
#   JITs, `--resource-usage` the registers/shared bytes to feed the calculator.
#
# ## Exercises (`exercises/08_gemm/`)
#
# Run `pytest exercises/08_gemm` (your code in `stubs.py`; `--impl=reference` runs tinylearn's answers):
# 1. `blocked_matmul` — the (jc, pc, ic) loop nest with block products.
# 2. `pack_a` / `pack_b` — micro-panel packing with zero padding.
# 3. `roofline` — intensity, attainable GFLOP/s, memory vs compute bound.
# 4. `occupancy` — the sm_80 occupancy rules (registers, shared memory, warps, blocks).
#
# Benchmark: `tinylearn bench gemm` (every rung, numpy, torch, tinygrad; ratios to torch; `--full` adds 2048).
