# %% [markdown]
# # 08 — GEMM: from the textbook loop to near-BLAS, the roofline, and the CUDA programming model
#
# **Interview questions this notebook answers** (question bank tags in the section headings):
# - [Q3] [Q51] *How do you make matrix multiplication fast (memory access, parallelism, SIMD)? Design a GEMM with
#   multi-level blocking, packing and a micro-kernel.* (§1–§3)
# - [Q5] [Q13] *What is SIMD, how do you support several instruction sets (SSE/AVX2/AVX-512) in one binary?* (§3)
# - [Q77] *Build a simple instruction-level model of a kernel's upper-bound throughput (FMA, loads/stores,
#   bandwidth).* (§2, §4)
# - [Q7] [Q23] [Q55] *Explain the CUDA programming model and memory hierarchy; how do you optimise a kernel
#   (tiling, registers, vector loads, occupancy)?* (§6)
# - [Q56] *What is memory coalescing? What are shared-memory bank conflicts and how does padding fix them?* (§7)
# - [Q226] [Q63] *Predict occupancy from registers / shared memory per block; what do PTX and nvcc -ptx give you?*
#   (§6, §8)
#
# Every number below is measured on this machine (timing cells are marked and their claims are conservative
# asserts); every GPU statement is labelled: the CUDA kernels are compiled to PTX here and only *run* on a GPU; the
# Triton and numba-CUDA kernels run in their CPU interpreter/simulator — never timed as GPU results.

# %%
# %matplotlib inline
import os

# numba's CUDA simulator must be chosen before numba is imported (section 7); Triton's interpreter likewise.
os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
os.environ.setdefault("TRITON_INTERPRET", "1")

import time  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

import tinylearn as tl  # noqa: E402
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
# of C); `packed` removes strided access; `simd` keeps the 6×16 tile of C in registers — 12 FMAs per k for one
# broadcast and two loads.

# %%
# NBVAL_IGNORE_OUTPUT
n = 256
a = rng.standard_normal((n, n), dtype=np.float32)
b = rng.standard_normal((n, n), dtype=np.float32)
ladder = {v: gflops(lambda v=v: tl.gemm.matmul(a, b, backend="cpp", version=v), n) for v in tl.gemm.versions("cpp")}
with threadpool_limits(1):
    ladder["numpy (1 thread)"] = gflops(lambda: a @ b, n)
for k_, g in ladder.items():
    print(f"{k_:18s} {g:8.2f} GFLOP/s")
if G.isa() != "scalar":  # with TINYLEARN_CPU_FEATURES=scalar the simd version runs the scalar micro-kernel
    assert ladder["simd"] > 3 * ladder["naive"]  # conservative: ~50-100x on an idle AVX2 core
assert ladder["packed"] > ladder["naive"]

# %% [markdown]
# ## 2. The roofline, and where each version sits [Q77]
#
# `attainable = min(peak FLOP/s, intensity × bandwidth)`. The two roofs are measured: the compute roof by a
# register-only FMA loop (12 independent accumulator chains, no memory traffic: `_C.gemm.fma_peak`), the memory
# roof by STREAM triad. `tl.gemm.machine_peak()` measures both once per process.

# %%
# NBVAL_IGNORE_OUTPUT
peak = tl.gemm.machine_peak()
print({k_: (round(v, 1) if isinstance(v, float) else v) for k_, v in peak.items()})
assert peak["gflops_fp32"] > 0 and peak["bandwidth_gbs"] > 0

# %% [markdown]
# A matmul's *compulsory* traffic is reading A and B and writing C once: 12·n² bytes for 2·n³ FLOPs, intensity
# n/6 FLOP/byte — far right of the ridge point for any n worth discussing. So GEMM is compute-bound *if* the
# reuse actually happens; every version is placed at this intensity and the vertical gap to the roof is the
# inefficiency the ladder removes.
#
# The instruction-level view (Q77) explains the gap: per FMA instruction a kernel issues loads/stores, and a core
# does at most 2 FMAs + 2–3 loads + 1 store per cycle.

# %%
mr, nr = 6, 16
mem_ops_simd = (mr + 2) / (mr * nr // 8)
print(f"simd micro-kernel: {mr + 2} load instructions per {mr * nr // 8} FMAs = {mem_ops_simd:.2f} loads/FMA")
print("ikj inner loop: 3 memory instructions per FMA; naive: 2 loads per scalar FMA (1/8 of the vector FLOPs)")
assert mem_ops_simd < 1  # the FMA units, not the load ports, are the bottleneck: compute-bound in the core

flops, nbytes = tl.gemm.matmul_traffic(n, n, n)
r = tl.gemm.roofline(flops, nbytes, peak_gflops=100.0, bandwidth_gbs=10.0)
print(
    f"n={n}: intensity {r['intensity']:.1f} FLOP/B, ridge of a 100 GFLOP/s / 10 GB/s machine {r['ridge']:.0f}:",
    r["bound"],
)
assert r["bound"] == "compute" and r["intensity"] == n / 6

# %%
# NBVAL_IGNORE_OUTPUT
fig, ax = plt.subplots(figsize=(7, 4.5))
pts = [(k_, tl.gemm.roofline(flops, nbytes)["intensity"], g) for k_, g in ladder.items()]
pts.append(("triad (memory)", 2 / 24, peak["bandwidth_gbs"] * 2 / 24))
roofline_plot(ax, peak["gflops_fp32"], peak["bandwidth_gbs"], pts)
ax.set_title(f"roofline of this machine; ladder at n={n} (compulsory intensity n/6)")
plt.show()

# %% [markdown]
# ## 3. The micro-kernel, SIMD and run-time ISA dispatch [Q5] [Q13]
#
# One binary holds three micro-kernels: scalar (auto-vectorisation switched off), AVX2+FMA (`__m256`, 8 floats) and
# AVX-512 (`__m512`, 16 floats), each compiled with `__attribute__((target("...")))` so a portable build still
# contains them. At run time `__builtin_cpu_supports` picks the best; `TINYLEARN_CPU_FEATURES=scalar|avx2|avx512`
# forces one (a ValueError if this CPU lacks it). Register budget of the AVX2 6×16 kernel: 12 accumulators + 2 B
# vectors + 1 broadcast = 15 of 16 ymm registers.

# %%
# NBVAL_IGNORE_OUTPUT
print("micro-kernel paths on this CPU:", G.isa_paths(), "| default:", G.isa())
print("tile and cache blocks:", G.kernel_shape("simd", "auto", "float32"))
assert "scalar" in G.isa_paths()

# %%
# NBVAL_IGNORE_OUTPUT
by_isa = {p: gflops(lambda p=p: G.matmul(a, b, "simd", p), n) for p in G.isa_paths()}
print({p: round(g, 1) for p, g in by_isa.items()})
if "avx2" in by_isa:
    assert by_isa["avx2"] > 2 * by_isa["scalar"]  # 8 lanes + FMA vs one FLOP per instruction

# %% [markdown]
# ## 4. GFLOP/s vs size, threads, and the BLAS comparison [Q3]
#
# Small matrices cannot amortise packing and loop overhead; large ones fall out of cache unless blocked. The goal
# for `simd`/`parallel`: ≥ 80 % of OpenBLAS sgemm at 1024³ and ≥ 60 % of the FMA peak, with 1 and 2 threads
# (`TINYLEARN_FULL=1` runs 1024 here; `tinylearn bench gemm` always does). On a shared machine timings move a lot.

# %%
# NBVAL_IGNORE_OUTPUT
sizes = [64, 128, 256, 512] + ([1024] if FULL else [])
curves = {"simd (1 thread)": [], "packed (1 thread)": [], "numpy (1 thread)": [], "parallel": [], "numpy": []}
for s in sizes:
    x = rng.standard_normal((s, s), dtype=np.float32)
    y = rng.standard_normal((s, s), dtype=np.float32)
    curves["simd (1 thread)"].append(gflops(lambda x=x, y=y: G.matmul(x, y, "simd"), s))
    curves["packed (1 thread)"].append(gflops(lambda x=x, y=y: G.matmul(x, y, "packed"), s))
    curves["parallel"].append(gflops(lambda x=x, y=y: G.matmul(x, y, "parallel"), s))
    with threadpool_limits(1):
        curves["numpy (1 thread)"].append(gflops(lambda x=x, y=y: x @ y, s))
    curves["numpy"].append(gflops(lambda x=x, y=y: x @ y, s))
fig, ax = plt.subplots(figsize=(7, 4))
for k_, v in curves.items():
    ax.plot(sizes, v, "o-", label=k_)
ax.axhline(peak["gflops_fp32_1t"], color="gray", ls=":", label="FMA peak, 1 thread")
ax.set_xscale("log", base=2)
ax.set_xlabel("n (n x n x n)")
ax.set_ylabel("GFLOP/s")
ax.legend(fontsize=8)
plt.show()
ratio = curves["simd (1 thread)"][-1] / curves["numpy (1 thread)"][-1]
print(
    f"simd / OpenBLAS (1 thread) at n={sizes[-1]}: {ratio:.2f}; "
    f"of FMA peak: {curves['simd (1 thread)'][-1] / peak['gflops_fp32_1t']:.2f}"
)
assert curves["simd (1 thread)"][-1] > curves["simd (1 thread)"][0] * 0.5  # measured, no speed claim

# %% [markdown]
# ## 5. Side by side: numpy, torch, tinygrad — and what tinygrad's code generator writes
#
# tinygrad does not call a BLAS: it *generates* a C kernel for the matmul and compiles it with clang. Below is the
# start of that kernel (captured with `DEBUG=4`): an accumulator tile `buf0[16]` (4×4 outputs, upcast), float4
# loads, the reduction loop unrolled by 4 — register blocking found by its search over "opts", no packing and no
# explicit FMA intrinsics: our `simd` rung by other means.

# %%
# NBVAL_IGNORE_OUTPUT
import subprocess  # noqa: E402
import sys  # noqa: E402

from tinylearn.bench import import_tinygrad, tinygrad_status  # noqa: E402

side = {"tinylearn parallel": gflops(lambda: tl.gemm.matmul(a, b), n), "numpy": gflops(lambda: a @ b, n)}
ta, tb = torch.from_numpy(a), torch.from_numpy(b)
side["torch"] = gflops(lambda: ta @ tb, n)
ok_tg, why = tinygrad_status()
if ok_tg:
    tg = import_tinygrad()
    ga, gb = tg.Tensor(a).realize(), tg.Tensor(b).realize()
    side["tinygrad"] = gflops(lambda: (ga @ gb).realize(), n)
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
print({k_: round(v, 1) for k_, v in side.items()})
assert all(v > 0 for v in side.values())

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
                "import numpy as np; from tinylearn._C import gemm; a=np.ones((256,256),np.float32); "
                f"gemm.matmul(a, a, '{v}')"
            )
            r_ = subprocess.run(
                ["perf", "stat", "-x,", "-e", "cache-misses,cache-references", sys.executable, "-c", code],
                capture_output=True,
                text=True,
            )
            print(v, [ln.split(",")[0] + " " + ln.split(",")[2] for ln in r_.stderr.strip().splitlines()[-2:]])

# %% [markdown]
# ## 6. GEMM on a GPU: the CUDA ladder, PTX and occupancy [Q7] [Q23] [Q55] [Q63] [Q226]
#
# The model: a *grid* of *blocks*, each block up to 1024 threads running on one SM, executed in *warps* of 32
# threads in lock-step. Memory: registers (per thread) → shared memory (per block, ~100 TB/s aggregate, 32 banks)
# → L2 → HBM (~2–3 TB/s). The same reuse argument as on the CPU, one level per rung (`cuda_src/gemm_*.cu`):
#
# | kernel | idea | global loads per FMA |
# |---|---|---|
# | gemm_naive | one thread per C element, threadIdx.x along a row (coalesced B, broadcast A) | 2 |
# | gemm_smem | 32×32 tiles of A and B staged in shared memory, `__syncthreads()` | 2/32 |
# | gemm_regtile | 64×64 block tile, each thread a 4×4 register tile (outer product per k) | 2/64, fewer shared loads |
# | gemm_vec4 | regtile + `float4` (128-bit) global loads/stores and shared reads | same bytes, ¼ of the instructions |
#
# They are compiled to PTX (the virtual ISA; the driver JIT-compiles it to the GPU's SASS) here with `nvcc -ptx
# -arch=sm_80`; cupy's `RawModule` compiles and runs them when a GPU is present (`backend="cuda"`).

# %%
# NBVAL_IGNORE_OUTPUT
import re  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from tinylearn.gemm import cuda as gemm_cuda  # noqa: E402
from tinylearn.testing import nvcc_available  # noqa: E402

CU = Path(tl.__file__).resolve().parents[1] / "cuda_src"
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
    print(
        "same as the table below:",
        resources == {"naive": (32, 0), "smem": (32, 8192), "regtile": (56, 8192), "vec4": (55, 8192)},
    )
else:
    print("nvcc not found: PTX compile skipped")

# %% [markdown]
# **Occupancy** = resident warps / 64 per SM. Each block's registers (allocated per warp in units of 256, from four
# 16 K-register sub-partitions), shared memory (+1 KB reserved per block, at the 164 KB maximum carveout on sm_80,
# 228 KB on sm_90), its warp count and the 32-blocks cap each bound the number of resident blocks
# (`tl.gemm.occupancy`, the rules of CUDA's occupancy calculator). High occupancy hides memory latency, but the
# register-tiled kernels deliberately trade occupancy for reuse (ILP within a thread).

# %%
threads = {"naive": 256, "smem": 1024, "regtile": 256, "vec4": 256}
# registers / shared bytes as ptxas reported them for these sources (cell above; fixed here so the table is exact)
fixed = {"naive": (32, 0), "smem": (32, 8192), "regtile": (56, 8192), "vec4": (55, 8192)}
print(
    f"{'kernel':8s} {'thr':>5s} {'regs':>4s} {'smem':>6s} | {'sm_80 blk':>9s} {'occ':>5s} {'limiter':>9s} "
    f"| {'sm_90 occ':>9s}"
)
occ_rows = {}
for v, (regs, smem) in fixed.items():
    o80 = tl.gemm.occupancy(threads[v], regs, smem, "sm_80")
    o90 = tl.gemm.occupancy(threads[v], regs, smem, "sm_90")
    occ_rows[v] = o80
    print(
        f"{v:8s} {threads[v]:5d} {regs:4d} {smem:6d} | {o80['blocks_per_sm']:9d} {o80['occupancy']:5.2f} "
        f"{o80['limiter']:>9s} | {o90['occupancy']:9.2f}"
    )
assert occ_rows["naive"]["occupancy"] == 1.0
assert occ_rows["smem"]["occupancy"] == 1.0  # 2 blocks of 1024 threads x 32 registers fill the SM
assert occ_rows["regtile"]["limiter"] == "registers" and occ_rows["regtile"]["occupancy"] == 0.5  # 56 regs/thread
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
# ## 7. Warps, coalescing and bank conflicts, measured in the CUDA simulator [Q56] [Q23]
#
# numba's CUDA simulator runs `@cuda.jit` kernels on the CPU (every thread a Python thread, barriers and shared
# memory real). First the tiled GEMM itself, then two kernels that *record* the addresses each thread of a warp
# touches; `tl.gemm.gpu_model` turns those into memory transactions (distinct 128-byte segments / 32-byte sectors)
# and shared-memory bank conflicts (bank = word index mod 32; a bank serving k distinct words takes k passes).

# %%
from tinylearn.gemm import gpu_model, numba_sim  # noqa: E402

assert numba_sim.SIMULATED
x = rng.uniform(-1, 1, (19, 13)).astype(np.float32)
y = rng.uniform(-1, 1, (13, 10)).astype(np.float32)
assert_close(numba_sim.tiled_matmul(x, y), x.astype(np.float64) @ y, dtype="float32")
print("numba.cuda tiled matmul (simulator, 8x8 tiles, shared memory) matches numpy")

rec = numba_sim.record_global(64, 3)  # [layout, operand, thread]: element indices; K = N = 64 floats
for name, idx in [
    ("B[k, tx]  (threadIdx.x along a row)", rec[0, 1]),
    ("A[k] broadcast", rec[0, 0]),
    ("A[tx, k]  (threadIdx.x along a column)", rec[1, 0]),
]:
    t_ = gpu_model.transactions(idx * 4)
    print(f"{name:40s} segments {t_['segments']:2d}  sectors {t_['sectors']:2d}  bytes moved {t_['bytes_moved']:4d}")
assert (
    gpu_model.transactions(rec[0, 1] * 4)["segments"] == 1 and gpu_model.transactions(rec[1, 0] * 4)["segments"] == 32
)

for width in (32, 33):
    w = numba_sim.record_shared(width)
    print(
        f"float tile[32][{width}]: row read degree {gpu_model.bank_conflicts(w[0])['degree']}, "
        f"column read degree {gpu_model.bank_conflicts(w[1])['degree']}"
    )
assert gpu_model.bank_conflicts(numba_sim.record_shared(32)[1])["degree"] == 32
assert gpu_model.bank_conflicts(numba_sim.record_shared(33)[1])["degree"] == 1

# %% [markdown]
# A column of a 32×32 float tile lies in one bank (word `t*32 + c` mod 32 = c): 32 threads → 32 passes. One padding
# column (`[32][33]`) shifts each row by a bank, so the column hits 32 different banks. In `gemm_smem` the reads
# `As[ty][k]` (one word for the whole warp: a broadcast) and `Bs[k][tx]` (a row) are conflict-free without padding;
# `gemm_regtile` stores A transposed for the same reason.
#
# ## 8. Recap — interview answers
#
# - **[Q3][Q51] Fast GEMM**: reuse. Loop order for unit stride (ikj), cache blocking (KC×NC of B in L2/L3, MC×KC
#   of A in L2), pack panels so the micro-kernel reads contiguous aligned memory, an MR×NR register-blocked
#   micro-kernel (6×16 on AVX2: 12 accumulators, 12 FMAs per 8 loads), then threads over macro-tiles sharing the B
#   panel. Verify against an fp64 reference on odd sizes and strides; measure against the FMA peak.
# - **[Q5][Q13] SIMD & multiple ISAs**: one instruction on 8 (AVX2) / 16 (AVX-512) floats; FMA doubles FLOPs per
#   instruction. Compile each kernel with `target("avx2,fma")` / `target("avx512f")`, dispatch at run time with
#   `cpuid` (`__builtin_cpu_supports`), keep a scalar fallback, let an env var force a path for testing.
# - **[Q77] Upper bound of a kernel**: count FMAs, loads/stores and bytes per iteration; bound by FMA ports
#   (2/cycle), load ports and bandwidth at each level; roofline = min(peak, intensity × bandwidth) with measured
#   roofs (FMA loop, STREAM).
# - **[Q7][Q23][Q55] CUDA optimisation**: coalesce global loads (threadIdx.x on the contiguous axis), tile in shared
#   memory, register-tile for ILP, vectorise to 128-bit accesses, avoid bank conflicts, size blocks for occupancy
#   but accept lower occupancy when each thread does more independent work.
# - **[Q56] Coalescing / banks**: a warp's access costs one transaction per distinct 32 B sector (128 B segment);
#   shared memory has 32 four-byte banks, conflicts serialise, same-word broadcasts are free, +1 padding fixes
#   column access.
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
