# ruff: noqa: E501  (markdown table rows cannot wrap; code lines are kept to 120 by ruff format)
# %% [markdown]
# # 00 — Tour: the machine, the tools, and why BLAS matters
#
# **Interview questions this notebook answers** (seed 003, warm-ups for every topic):
# - *What limits a kernel: compute or memory bandwidth? How do you tell?* — the roofline model, measured here.
# - *Why is a library matmul 100x faster than a triple loop?* — cache blocking, SIMD and threads; we measure the
#   gap between a textbook C++ loop, a loop-order fix, numpy/torch BLAS and tinygrad's generated code.
# - *How do you benchmark honestly?* — warm-up, median of N, everything side by side in one process, ratios to torch.
#
# Everything below is the `tinylearn` library (`import tinylearn`), not notebook glue: the harness used here is
# the one every later notebook and `tinylearn bench` use.

# %%
# %matplotlib inline
import subprocess
import sys

import matplotlib.pyplot as plt
import numpy as np

import tinylearn as tl
from tinylearn.backends import load_C
from tinylearn.bench import matmul, plot_table, roofline
from tinylearn.testing import assert_close

_C = load_C()  # the compiled extension, through the one loader (RuntimeError with the build command if missing)
print("tinylearn", tl.__version__, "| _C has the machine kernels:", hasattr(_C, "machine"))

# %% [markdown]
# ## What is on this machine
# Versions, CPU features (the C++ kernels dispatch on them at run time), compilers and devices. tinygrad runs on
# its `CPU` device, which needs `clang`; CUDA kernels in `cuda_src/` compile with `nvcc` but only run on a GPU.

# %%
# NBVAL_IGNORE_OUTPUT
info = subprocess.run([sys.executable, "-m", "tinylearn", "info"], capture_output=True, text=True).stdout
print(info)
assert "tinylearn" in info and "numpy" in info

# %% [markdown]
# ### Import order and OpenBLAS's spinning workers
# `import numpy` before `import tinylearn` is the usual order in a script (and in this notebook). numpy's OpenBLAS
# then starts its worker threads with its default spin-wait: after every BLAS call they busy-wait 2^28 cycles
# (~0.1 s) for the next one, and on a 2-core machine that spinning worker takes a core from the next OpenMP kernel,
# tinylearn's or torch's. `import tinylearn` sets `OPENBLAS_THREAD_TIMEOUT=16` (~25 µs) and, when numpy came first,
# asks that OpenBLAS to re-read it and restart its idle workers (`tinylearn/_blas_timeout.py`); a value you set
# yourself is kept, and `tinylearn info` above prints the one in effect. Measured below in two fresh processes that
# both import numpy first: the share of a core the process burns while its only Python thread sleeps 50 ms right
# after a matmul.

# %%
# NBVAL_IGNORE_OUTPUT
# (timings)
from tinylearn import cpu  # noqa: E402

print("this kernel:", cpu.blas_thread_timeout())
spin_numpy, spin_tl = cpu.openblas_spin(import_tinylearn=False), cpu.openblas_spin(import_tinylearn=True)
print(f"numpy only: {spin_numpy:.2f} of a core spinning while idle | numpy, then tinylearn: {spin_tl:.2f}")
assert spin_numpy > 0.08 and spin_tl < 0.05  # the default spins; after import tinylearn nothing does

# %% [markdown]
# ### The other direction: OpenMP's spinning workers
# tinylearn's C++ kernels, the code `tl.compile` generates and torch's intra-op threads share one libgomp, whose
# workers busy-wait ~300,000 iterations (~7 ms here) after every parallel region. A numpy matmul that follows then
# shares a core with a spinning worker; worse, on a **busy** machine (another process on one of the 2 cores) the
# worker spinning at the end of a region holds the core its own master thread needs, so every parallel region costs
# the whole spin (measured: a [512, 128] softmax 8 ms per call instead of 0.02 ms). `import tinylearn` sets
# `GOMP_SPINCOUNT=1000` (~35 µs) — but libgomp reads it once, when it loads, and `import torch` loads it: **import
# tinylearn before torch** in your own scripts (`tinylearn info` says whether it applied). Every notebook here
# does: its first import is `import tinylearn`, kept apart from the sorted imports by an `# isort: split` line.
# Measured below in two fresh processes: the share of a core burned while the only Python thread sleeps 50 ms
# right after one 2-thread tinylearn kernel, with libgomp loaded first (as `import torch` does) and with tinylearn
# first.

# %%
# NBVAL_IGNORE_OUTPUT
# (timings)
print("this kernel:", cpu.omp_spin_count())
omp_default, omp_tl = cpu.openmp_spin(import_tinylearn_first=False), cpu.openmp_spin(import_tinylearn_first=True)
print(f"libgomp loaded first: {omp_default:.3f} of a core spinning while idle | tinylearn first: {omp_tl:.3f}")
assert omp_default > 0.03 and omp_tl < omp_default / 3  # ~0.14 vs ~0.004 on a quiet box

# %% [markdown]
# ### A step's temporaries and page faults
# A training step allocates and frees the same arrays every time. glibc serves requests of 128 KiB and more with a
# fresh `mmap` until its adaptive threshold has risen past them, and returns the freed top of the heap to the OS
# once more than twice that threshold is free — so a step whose temporaries add up to more than that gets new memory
# every time and pays one page fault per 4 KiB page when it writes it. `import tinylearn` raises the mmap
# threshold to 32 MiB and the trim threshold to 64 MiB (`mallopt`, `tinylearn/_malloc_tuning.py`; up to 64 MiB of
# freed memory stays resident; `TINYLEARN_MALLOC=default` opts out). Measured in two fresh processes: page faults
# per step of four 1 MiB arrays written and freed.

# %%
# NBVAL_IGNORE_OUTPUT
# (measured counts)
faults_glibc, faults_tl = cpu.alloc_page_faults(import_tinylearn=False), cpu.alloc_page_faults(import_tinylearn=True)
print("malloc here:", cpu.malloc_settings())
print(
    f"page faults per step: glibc defaults {faults_glibc:.0f} (of 1024 pages), after import tinylearn {faults_tl:.0f}"
)
assert faults_glibc > 500 and faults_tl < 20  # the defaults fault the step's pages in again; tinylearn's reuse them

# %% [markdown]
# ## The roofline: two numbers that bound every kernel
#
# A kernel doing $F$ FLOPs while moving $B$ bytes has arithmetic intensity $I = F/B$. It cannot run faster than
# $\min(P_{peak},\; I \cdot BW)$. We measure $P_{peak}$ as the best SGEMM throughput (numpy and torch) and $BW$ with
# STREAM's triad `a = b + s*c` (24 bytes per element, arrays far larger than cache). The theoretical peak from the
# CPU flags (cores × GHz × 2 FMA units × SIMD lanes × 2) is an upper bound the measurement should stay below.
#
# Which GHz? `/proc/cpuinfo` reports the *nominal* clock, but cloud CPUs turbo well above it, so a bound built from
# it can sit below a real SGEMM measurement. We therefore also **measure** the clock: `_C.machine.add_chain(n)` times
# a chain of $n$ dependent integer adds (each needs the previous result, 1 cycle each), so $n/t$ is the clock in Hz;
# the best of 25 runs of about 1 ms is the least-disturbed one. The bound uses max(nominal, measured): turbo raises
# it, and a pre-empted (slow) measurement never lowers it below nominal.

# %%
# NBVAL_IGNORE_OUTPUT
peak = roofline.peak_gflops(n=1024, repeat=3)
theory = roofline.theoretical_peak_gflops()
bw = roofline.stream_bandwidth(n=10_000_000, repeat=3)
nominal, clock = theory.details["nominal_ghz"], theory.details["measured_ghz"]
print(f"clock             : nominal {nominal:.2f} GHz (/proc/cpuinfo), measured {clock:.2f} GHz (add chain)")
print(f"measured fp32 peak: {peak.gflops:7.1f} GFLOP/s  ({peak.source}; {peak.details})")
print(f"theoretical bound : {theory.gflops:7.1f} GFLOP/s  ({theory.source})")
print(f"STREAM triad      : {bw:7.1f} GB/s  -> ridge point {peak.gflops / bw:.1f} FLOP/byte")
print(f"SGEMM reaches {peak.gflops / theory.gflops:.0%} of the bound")
assert 0.5 < clock < 7.0  # a real clock: a folded add chain would read as thousands of GHz
assert theory.details["ghz"] == max(g for g in (nominal, clock) if g == g)  # the bound uses the higher clock
assert 0 < peak.gflops <= 1.05 * theory.gflops and bw > 0  # the measurement stays below the bound

# %% [markdown]
# ## First side-by-side benchmark: matmul
#
# Before timing anything, check it is right: the C++ loops must agree with numpy within the fp32 tolerance.

# %%
rng = np.random.default_rng(0)
a = rng.standard_normal((96, 80), dtype=np.float32)
b = rng.standard_normal((80, 72), dtype=np.float32)
assert_close(_C.machine.matmul_naive(a, b), a @ b)
assert_close(_C.machine.matmul_ikj(a, b), a @ b)
print("C++ naive and i-k-j matmul match numpy (fp32 tolerance)")

# %% [markdown]
# Now the same product at growing sizes: numpy and torch (BLAS, 2 threads), tinygrad (TinyJit-compiled clang
# kernels, after two warm-up calls), and the two single-threaded C++ loops. Median of 7 after warm-up; the
# ratio column is time / torch (below 1 = faster than torch).

# %%
# NBVAL_IGNORE_OUTPUT
from tqdm.auto import tqdm  # noqa: E402

with tqdm(desc="matmul benchmark", unit="row") as bar:
    (table,) = matmul.run(
        sizes=[64, 128, 256, 512], progress=lambda msg: (bar.set_postfix_str(msg, refresh=False), bar.update(1))
    )
print(table.to_text())
naive, ikj = table.get("n=256", "C++ naive ijk").median_ms, table.get("n=256", "C++ ikj loop").median_ms
fastest = min((r for r in table.rows if r.case == "n=512" and r.median_ms), key=lambda r: r.median_ms)
print(f"n=256: the i-k-j loop takes 1/{naive / ikj:.0f} of the naive loop's time (same arithmetic, same thread)")
print(f"n=512: fastest on this run is {fastest.impl} ({fastest.gflops:.0f} GFLOP/s; timings taken under load)")
assert naive > 2 * ikj  # loop order alone: unit-stride, vectorised inner loop vs a cache miss per multiply-add

# %%
# NBVAL_IGNORE_OUTPUT
fig, axes = plt.subplots(1, 2, figsize=(12, 4))
plot_table(table, metric="gflops", ax=axes[0])
pts = []
for r in table.rows:
    if r.gflops and r.impl in ("numpy", "C++ naive ijk", "tinygrad"):
        n = int(r.case.split("=")[1])
        pts.append((f"{r.impl} n={n}", 2 * n**3 / (3 * 4 * n * n), r.gflops))  # FLOPs / (A, B, C once each)
roof = max(peak.gflops, *(g for _, _, g in pts))  # the best throughput measured in this notebook
roofline.roofline_plot(axes[1], roof, bw, pts, labels="legend")
assert pts and all(intensity > 0 for _, intensity, _ in pts)
assert 2 * 512**3 / (12 * 512**2) > roof / bw  # n=512 (85 FLOP/byte) is right of the ridge point
fig.tight_layout()
plt.show()

# %% [markdown]
# **Reading the plot.** Matmul's intensity grows with $n$ ($2n^3$ FLOPs over $12n^2$ bytes), so large matmuls
# sit right of the ridge point (n=512 is, asserted): compute-bound. The roof drawn is the best throughput
# *measured* (BLAS), so the fastest point sits on it by construction (how far that is below the theoretical bound
# is printed in the roofline cell). The naive i-j-k loop is far below the roof even though its *intensity* is just as high — it strides down columns of B, so
# almost every load misses cache, and it uses one core without SIMD. Reordering to i-k-j makes the inner loop
# stream contiguous rows (the compiler vectorises it): more than 2x faster with no other change (asserted; the
# printed factor is typically far larger). The rest of the gap is blocking for cache/registers and threads —
# exactly what a BLAS does.
#
# ## The curriculum
#
# | topic | notebook | module | exercises | benchmark |
# |---|---|---|---|---|
# | autodiff | `01_autodiff` | `tinylearn.autograd`, `nn`, `optim`, `data` | `exercises/01_autodiff` | `tinylearn bench autodiff` |
# | im2col convolution | `02_im2col_conv` | `tinylearn.conv` | `exercises/02_im2col_conv` | `tinylearn bench conv` |
# | quantization | `03_quantization` | `tinylearn.quant` | `exercises/03_quantization` | `tinylearn bench quant` |
# | pruning & sparsity | `04_pruning` | `tinylearn.prune`, `sparse` | `exercises/04_pruning` | `tinylearn bench prune` |
# | fused kernels | `05_fused_kernels` | `tinylearn.kernels` | `exercises/05_fused_kernels` | `tinylearn bench kernels` |
# | all-reduce | `06_allreduce` | `tinylearn.dist` | `exercises/06_allreduce` | `tinylearn bench dist` |
# | memory pools | `07_memory_pools` | `tinylearn.memory` | `exercises/07_memory_pools` | `tinylearn bench memory` |
#
# ## Recap
#
# * *What limits a kernel?* Attainable GFLOP/s = min(peak, intensity × bandwidth). Measure both: best SGEMM for the
#   peak, STREAM triad for bandwidth; their ratio is the ridge point (printed above). Below it a kernel is
#   memory-bound — make it move fewer bytes (fusion, blocking); above it, compute-bound — use SIMD, FMA, threads.
# * *What is the theoretical peak?* cores × clock × FMA units × SIMD lanes × 2. Use the *measured* clock (a chain
#   of dependent adds, 1 cycle each): cloud CPUs turbo above the nominal `/proc/cpuinfo` clock, so the nominal
#   figure is not an upper bound. Measured SGEMM stays below the bound (asserted).
# * *Why is BLAS so much faster than a triple loop?* Loop order (unit stride, vectorisable: i-k-j beats i-j-k by
#   more than 2x, asserted), then cache/register blocking and threads.
# * *How to benchmark honestly?* Check correctness first, warm up, take the median of N, run every competitor in
#   the same process on the same inputs, report ratios to a baseline, and never assert a speed claim that a loaded
#   or different machine could flip.
# * *Why is my op 100x slower on a busy laptop?* Thread pools spin after each parallel region; with more runnable
#   threads than cores the spinner holds the core the next region needs. Short spins (`OPENBLAS_THREAD_TIMEOUT`,
#   `GOMP_SPINCOUNT`, set by `import tinylearn`) or fewer threads than cores fix it (measured above).
#
# ## Exercises
# The tour has none of its own. Start with `exercises/01_autodiff/stubs.py`, then run
# `tinylearn check autodiff` (or `pytest exercises/01_autodiff`) until it is green.
