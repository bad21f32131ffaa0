# %% [markdown]
# # 06 · All-reduce on real processes: ring, tree, recursive doubling, hierarchical
#
# Seed 003 questions **20, 25, 30, 61, 85, 94, 96, 122, 141, 160** — paraphrased, the questions this notebook
# answers with measurements instead of recollection:
#
# * Why does all-reduce dominate data-parallel training, and how many bytes does each GPU send per step?
# * How does ring all-reduce work step by step, and why is it bandwidth-optimal? What is its cost in the α-β model?
# * When does a tree / recursive doubling beat a ring? Where is the crossover, and how would a tuner (NCCL) choose?
# * What does a hierarchical (intra-node, then inter-node) all-reduce buy at 1024 GPUs?
# * How do DDP's gradient buckets and overlap with backward work, and does p-rank training equal 1-rank training?
# * How do top-k / int8 gradient compression and error feedback work — and how must compressed payloads be
#   reduced? (The seed answers summed compressed payloads without decompressing them; that is wrong: indices and
#   scales differ per rank.)
#
# Everything below runs on **real processes** (`tl.dist.launch` spawns ranks on 127.0.0.1, gloo transport) and the
# algorithms are built from `torch.distributed` point-to-point `isend`/`irecv` — the same code would run over NCCL.
# Process counts stay at 2–3 so the notebook is quick on a 2-core box.

# %%
import matplotlib
import numpy as np

import tinylearn as tl
from tinylearn.dist import cost_model, ddp, workers
from tinylearn.dist.plots import draw_ring_allreduce

matplotlib.rcParams["figure.dpi"] = 80
np.set_printoptions(precision=4, suppress=True)
print(tl.dist.ALGORITHMS)

# %% [markdown]
# ## 1. Why all-reduce dominates data parallelism
#
# Each of p replicas computes gradients on its slice of the global batch; before the optimizer step every replica
# needs the **sum** of all gradients. That is one all-reduce of the whole gradient (4 bytes/parameter in fp32) per
# step. With a ring, each rank sends and receives 2(p−1)/p · n bytes — almost 2n, independent of p. A 1B-parameter
# model therefore moves ~8 GB per rank per step; at 25 GB/s that is ~0.3 s, comparable to the compute of a step.

# %%
for params in (125e6, 1.3e9, 7e9):
    n = 4 * params
    t = cost_model.predict("ring", n, 64, alpha_s=5e-6, beta_s_per_byte=1 / 25e9)
    print(f"{params / 1e9:5.2f}B parameters: {n / 1e9:6.1f} GB gradient -> {t:6.3f} s per ring all-reduce", end="")
    print(" (64 ranks, 25 GB/s links)")

# %% [markdown]
# ## 2. Ring all-reduce, step by step
#
# Split the vector into p chunks. **Reduce-scatter** (p−1 steps): at step s rank r sends chunk (r−s) mod p to
# rank r+1 and adds the chunk (r−s−1) mod p it receives from r−1. After p−1 steps rank r holds the complete sum of
# chunk (r+1) mod p. **All-gather** (p−1 more steps): the finished chunks travel around the ring once more,
# overwriting. The figure replays `tl.dist.ring_schedule`: each cell counts how many ranks' data a copy holds.

# %%
fig = draw_ring_allreduce(4)
for s in range(6):
    print(f"step {s}: (send, recv) per rank =", [tl.dist.ring_schedule(r, s, 4) for r in range(4)])

# %% [markdown]
# The other schedules, for comparison (p = 8): binomial **tree** (reduce to rank 0 in ⌈log₂p⌉ rounds, then
# broadcast back) and **recursive doubling** (log₂p rounds of full-vector exchange with partner r XOR 2ᵏ).
# **Halving-doubling** (Rabenseifner) exchanges halves, then quarters… (reduce-scatter) and doubles back
# (all-gather): log-latency *and* ring-like bytes. For p not a power of two, the extra ranks first fold their data
# into the first ones.

# %%
for k in range(3):
    print(f"recursive doubling round {k}: partners", [tl.dist.recursive_doubling_partner(r, k, 8) for r in range(8)])
print(
    "p=6 folds ranks 4, 5 into 0, 1; core partners round 1:",
    [tl.dist.recursive_doubling_partner(r, 1, 6) for r in range(6)],
)

# %% [markdown]
# ## 3. Correctness on three real processes
#
# Every algorithm against `dist.all_reduce` (gloo) on 3 ranks — a world size that is not a power of two, with a
# length (1001) not divisible by 3. Integer-valued data must match **exactly**; random fp32 data differs only by
# summation order (a few ulps), and each algorithm gives bitwise-identical results on all ranks.
# (The full grid — sizes 0, 1, primes × 7 dtypes × ops × world sizes 1–4 — is `tests/test_dist.py`.)

# %%
res = tl.dist.launch(workers.compare_algorithms, 3, 1001, timeout_s=120)
for alg, r in res[0].items():
    print(
        f"{alg:20s} int-valued max err {r['int_err']:.0f}   randn max err {r['randn_err']:.1e}   "
        f"identical on all ranks: {bool(r['same_on_all_ranks'])}"
    )
    assert r["int_err"] == 0 and r["randn_err"] < 1e-5 and r["same_on_all_ranks"]

# %% [markdown]
# ## 4. The α-β(-γ) model
#
# A message of m bytes costs **α + mβ** (latency + inverse bandwidth); reducing m bytes costs **mγ**.
# Ring: 2(p−1) steps, each moving one chunk of n/p bytes in both directions at once, and p−1 of them reduce it:
#
# $$T_\text{ring} = 2(p-1)\,\alpha + 2\tfrac{p-1}{p}\,n\beta + \tfrac{p-1}{p}\,n\gamma$$
#
# Tree (binomial, whole vectors): $T = 2\lceil\log_2 p\rceil(\alpha + n\beta) + \lceil\log_2 p\rceil n\gamma$.
# Recursive doubling: $\log_2 p\,(\alpha + n\beta + n\gamma)$. Halving-doubling: $2\log_2 p\,\alpha +
# 2\frac{p-1}{p}n\beta + \frac{p-1}{p}n\gamma$. Hierarchical with k ranks/node and m nodes:
# $2(k-1)(\alpha + n\beta/k) + 2(m-1)(\alpha + n\beta/(km)) + \dots$ — ring's bytes, but 2(k+m−2) latencies.
#
# Small messages are latency-bound (fewest rounds wins), large ones bandwidth-bound (fewest bytes wins).
# The selector evaluates the formulas and reports where the best choice changes — NCCL's tuner does the same
# with measured constants. With NVLink-like constants on 64 ranks:

# %%
algs = ("ring", "tree", "recursive_doubling")
for n_bytes, new_best, old_best in [
    (n, b, a) for n, a, b in cost_model.crossover_points(64, 5e-6, 1 / 100e9, algorithms=algs)
]:
    print(f"crossover at {n_bytes / 1024:8.1f} KiB: {old_best} -> {new_best}")
print(
    "best at 4 KiB:",
    cost_model.select(4096, 64, 5e-6, 1 / 100e9, algorithms=algs),
    "| best at 64 MiB:",
    cost_model.select(64 << 20, 64, 5e-6, 1 / 100e9, algorithms=algs),
)

# %% [markdown]
# ### Measured vs predicted on this machine
#
# Fit α and β to a ping-pong between ranks 0 and 1 (one-way time vs size), γ to a local fp32 add, then predict
# each algorithm and compare with the measured median (2 processes here; `tinylearn bench dist` does 2 and 4 ranks,
# 4 KB–64 MB). Loopback TCP on a shared 2-core box is noisy — read the errors as "order of magnitude agreement".

# %%
# NBVAL_IGNORE_OUTPUT
sizes = [4 << 10, 64 << 10, 1 << 20, 8 << 20]
impls = ["gloo", "ring", "tree", "recursive_doubling"]
bench = tl.dist.launch(workers.bench_job, 2, sizes, impls, 3, True, timeout_s=300)[0]
alpha, beta = cost_model.fit_alpha_beta(bench["pp_sizes"], bench["pp_times"])
gamma = bench["gamma"]
assert alpha > 0 and beta > 0 and gamma > 0
print(f"alpha = {alpha * 1e6:.1f} us, 1/beta = {1 / beta / 1e9:.2f} GB/s, 1/gamma = {1 / gamma / 1e9:.1f} GB/s")
print(f"{'size':>8s} {'impl':20s} {'measured ms':>12s} {'predicted ms':>13s} {'err':>6s} {'busbw GB/s':>10s}")
for nb in sizes:
    for impl in impls:
        t = bench["times"][(nb, impl)]
        pr = cost_model.predict("ring" if impl == "gloo" else impl, nb, 2, alpha, beta, gamma)
        print(
            f"{nb >> 10:6d}KB {impl:20s} {t * 1e3:12.3f} {pr * 1e3:13.3f} {(t - pr) / pr:+6.0%} "
            f"{cost_model.bus_bandwidth(nb, t, 2) / 1e9:10.3f}"
        )

# %%
# NBVAL_IGNORE_OUTPUT
import matplotlib.pyplot as plt  # noqa: E402

fig, ax = plt.subplots(figsize=(6, 3.5))
grid = np.geomspace(sizes[0], sizes[-1], 50)
for i, impl in enumerate(impls):
    ax.loglog(sizes, [bench["times"][(nb, impl)] * 1e3 for nb in sizes], "o", color=f"C{i}", label=f"{impl} measured")
    if impl != "gloo":
        ax.loglog(grid, [cost_model.predict(impl, n, 2, alpha, beta, gamma) * 1e3 for n in grid], "-", color=f"C{i}")
ax.set_xlabel("message bytes per rank")
ax.set_ylabel("ms")
ax.set_title("p=2: measured (dots) vs alpha-beta-gamma prediction (lines)")
ax.legend(fontsize=7)
fig.tight_layout()
assert len(ax.lines) == 2 * len(impls) - 1

# %% [markdown]
# ## 5. Simulated scaling to 1024 ranks on a two-level network
#
# `tl.dist.simulate` replays each algorithm's message schedule (every message, every rank) on a network; on
# uniform links it reproduces the closed forms exactly (tested). With a **two-level** topology — 8 ranks per node
# on NVLink-like links (150 GB/s, 2 µs), nodes on InfiniBand-like links (25 GB/s, 5 µs) — a flat ring is paced by
# its slowest hop at every step, while the hierarchical algorithm moves only 1/8 of the data between nodes and
# needs 2(k+m−2) instead of 2(p−1) latencies.

# %%
topo = tl.dist.TwoLevel(node_size=8)
ps = [8, 16, 32, 64, 128, 256, 512, 1024]
fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
for ax, nb in zip(axes, (64 << 10, 64 << 20)):
    for alg in ("ring", "tree", "halving_doubling", "hierarchical"):
        ts = [tl.dist.simulate(alg, p, nb, topology=topo) for p in ps]
        ax.loglog(ps, np.array(ts) * 1e3, "o-", label=alg)
    ax.set_xlabel("ranks (8 per node)")
    ax.set_ylabel("simulated ms")
    ax.set_title(f"all-reduce of {nb >> 10} KiB" if nb < 1 << 20 else f"all-reduce of {nb >> 20} MiB")
    ax.legend(fontsize=7)
fig.tight_layout()
for alg in ("ring", "hierarchical"):
    print(f"1024 ranks, 64 MiB, {alg:12s}: {tl.dist.simulate(alg, 1024, 64 << 20, topology=topo) * 1e3:8.2f} ms")
uniform = tl.dist.simulate("ring", 1024, 64 << 20, 5e-6, 1 / 25e9)
assert abs(uniform - cost_model.predict("ring", 64 << 20, 1024, 5e-6, 1 / 25e9)) < 1e-12

# %% [markdown]
# ## 6. Data parallelism: buckets, overlap, and equivalence with one process
#
# DDP does not all-reduce parameter by parameter (too many latencies) nor the whole model at once (no overlap).
# It packs gradients into size-capped **buckets in reverse layer order** — the last layer's gradient is ready
# first in backward — and launches each bucket's all-reduce as soon as it is complete, on a communication thread,
# while backward continues with earlier layers. Each rank divides its summed loss by the *global* batch, so the
# sum of local gradients is exactly the global-batch gradient: p-rank training must follow the 1-rank curve.

# %%
model = ddp.digits_model()
nbytes = [p.numel() * 4 for p in model.parameters()]
print("parameter bytes (registration order):", nbytes)
print("buckets (cap 16 KiB), parameter indices:", ddp.assign_buckets(nbytes, 16 << 10))

data = ddp.digits_data()
steps = 40
single = ddp.train_digits(steps=steps, data=data)
runs = {}
for overlap in (True, False):
    runs[overlap] = tl.dist.launch(
        ddp.train_digits, 2, steps, 96, 0.05, "ring", 16 << 10, overlap, None, 0.05, 0, 128, data, timeout_s=120
    )
for overlap, res in runs.items():
    diff = max(abs(a - b) for r in res for a, b in zip(r["losses"], single["losses"]))
    print(f"overlap={overlap}: max |loss(2 ranks) - loss(1 process)| over {steps} steps < 1e-4: {diff < 1e-4}")
    assert diff < 1e-4

# %%
# NBVAL_IGNORE_OUTPUT
# (the trained values depend on float summation order: BLAS kernels, SIMD width)
print("final loss", round(single["losses"][-1], 3), "train accuracy", round(single["accuracy"], 3))
assert single["losses"][-1] < single["losses"][0] and single["accuracy"] > 0.5

# %% [markdown]
# Time in communication with and without overlap (measured, machine-dependent). On this 2-core box the
# communication thread competes with backward for the same cores, so overlap may not pay off here; on GPUs the
# transfers run on NICs/copy engines while the SMs compute, which is where DDP's overlap wins.

# %%
# NBVAL_IGNORE_OUTPUT
for overlap, res in runs.items():
    r = res[0]
    print(
        f"overlap={overlap}: total {r['total_s']:.2f} s, in all-reduce {r['comm_s']:.2f} s, "
        f"sent {r['bytes_sent'] / 1e6:.1f} MB"
    )
assert runs[True][0]["bytes_sent"] == runs[False][0]["bytes_sent"]  # overlap changes when bytes move, not how many

# %% [markdown]
# ## 7. Gradient compression with error feedback
#
# **Top-k** sends the k largest |g| entries with their indices; **int8/QSGD** sends 8-bit codes and one scale.
# Different ranks pick different indices and scales, so payloads cannot be summed by a plain all-reduce: we
# all-gather every rank's payload and decompress each with its own metadata before summing. **Error feedback**
# keeps what was not sent (e ← g + e − D(C(g + e))) and adds it next step, so nothing is lost for good.

# %%
comp = {}
for name in ("topk", "int8"):
    comp[name] = tl.dist.launch(
        ddp.train_digits, 2, steps, 96, 0.05, "ring", 16 << 10, True, name, 0.05, 0, 128, data, timeout_s=120
    )[0]
dense_bytes = runs[True][0]["bytes_sent"]
print(f"dense ring: {dense_bytes / 1e6:.2f} MB sent per rank over {steps} steps")
for name, r in comp.items():
    print(f"{name:5s}: {r['bytes_sent'] / 1e6:.2f} MB ({r['bytes_sent'] / dense_bytes:.1%} of dense)")
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(single["losses"], label="1 process (reference)", lw=3, alpha=0.5)
ax.plot(runs[True][0]["losses"], "--", label="2 ranks, ring, buckets + overlap")
ax.plot(comp["topk"]["losses"], label="2 ranks, top-5% + error feedback")
ax.plot(comp["int8"]["losses"], label="2 ranks, int8 (stochastic) + error feedback")
ax.set_xlabel("step")
ax.set_ylabel("global-batch loss")
ax.legend(fontsize=7)
fig.tight_layout()

# %%
# NBVAL_IGNORE_OUTPUT
# (losses after training: machine-dependent float rounding; the claim is the assert)
for name, r in comp.items():
    print(f"{name:5s}: final loss {r['losses'][-1]:.2f} vs dense {single['losses'][-1]:.2f}")
    assert r["losses"][-1] < r["losses"][0]  # still trains with compressed gradients and error feedback
assert abs(comp["int8"]["losses"][-1] - single["losses"][-1]) < 0.1  # int8 + error feedback ~ dense

# %% [markdown]
# ## Closing note
#
# * Correctness: every algorithm equals `dist.all_reduce` exactly on integer-valued data (tests: sizes 0, 1,
#   primes; 7 dtypes; sum/max/min/avg; world sizes 1–4; sub-groups; a size mismatch raises on every rank).
# * Bandwidth: `tinylearn bench dist` prints algbw/busbw per algorithm vs gloo at 4 KB–64 MB on 2 and 4 ranks, with
#   the α-β prediction error. Our algorithms are built on gloo's *point-to-point* path; the "p2p ring floor" row
#   (the ring's messages with no arithmetic) shows that path alone. On 2 ranks the ring is within ~20% of gloo's
#   own all-reduce at 64 MB; on 4 processes sharing 2 cores it is up to ~2x slower, at the p2p floor — the gap is
#   the transport path, not the schedule. The α-β model fitted on a 2-rank ping-pong is within tens of percent for
#   large 2-rank messages and far off for small ones, where scheduler wake-ups (not the wire) set the latency.
# * At scale (simulated), hierarchy matters more than the choice between ring and tree.
#
# ## Exercises (`exercises/06_allreduce/`)
#
# 1. `ring_schedule(rank, step, p)` — which chunk goes where at step s.
# 2. `ring_cost` / `tree_cost` — the α-β costs; find the crossover size for p = 64.
# 3. `recursive_doubling_partner(rank, round, p)` — including the fold for non-powers of two.
# 4. `assign_buckets(param_nbytes, cap_bytes)` — DDP's reverse-order bucketing.
# 5. `topk_error_feedback(grad, residual, k)` — one step of top-k with error feedback.
#
# Run `pytest exercises/06_allreduce` (your stubs) or `--impl=reference` (tinylearn's answers).
