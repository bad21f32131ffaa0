# %% [markdown]
# # 10 · Parallel training: ZeRO 1/2/3, tensor parallelism, pipeline schedules, 3D planning — on real processes
#
# Question bank cluster M (distributed parallelism). The questions this notebook answers with code and
# measurements (paraphrased):
#
# * **[Q41]** What is ZeRO's core idea? Implement "shard the parameters + gather them back".
# * **[Q8] [Q25] [Q39]** How is a distributed training system built from data, tensor (model) and pipeline
#   parallelism — what does each communicate, and does the parallel run compute the *same* thing as one process?
# * **[Q48]** How does a pipeline-parallel runtime schedule microbatches (GPipe vs 1F1B vs interleaved), what is
#   the bubble, how much activation memory does each schedule hold?
# * **[Q48]** How does the microbatch count trade the bubble against activation memory?
# * **[Q150]** How can a learner (a bandit) pick the microbatch size online for a throughput/latency reward?
# * **[Q240]** Across nodes whose links differ, how deep must each stage boundary's microbatch buffer be, and what
#   does the depth cost in memory?
# * **[Q8]** How do MapReduce, Spark and Ray work, and how does SPMD training differ from them?
# * **[Q96] [Q75] [Q147]** How are (dp, tp, pp) chosen for a world size — search with a cost model (α-β
#   communication, memory formulas) and pruning?
# * **[Q134]** How is sharded optimizer state re-assembled so it can be re-sharded for another world size?
#
# Everything distributed runs on **real processes**: `tl.dist.launch` starts ranks joined by a gloo process group
# (127.0.0.1); the same code runs under `torchrun` with NCCL. This box has 2 cores, so a process launch costs
# seconds: the notebook launches **once** (2 ranks) and the tests (`tests/test_parallel_dist.py`) repeat the
# checks on 2 and 4 ranks.

# %%
import matplotlib
import matplotlib.pyplot as plt
import torch

import tinylearn as tl
import tinylearn.parallel as par
from tinylearn.parallel import plots, workers

matplotlib.rcParams["figure.dpi"] = 80
torch.manual_seed(0)
print(par.SCHEDULES)

# %% [markdown]
# ## 1. ZeRO memory: where the 16 bytes per parameter go [Q41]
#
# Mixed-precision Adam keeps, per parameter: a 16-bit weight (2 bytes), a 16-bit gradient (2 bytes) and
# K = 12 bytes of optimizer state (fp32 master weight, momentum, variance). Plain data parallelism replicates all
# 16 bytes on every rank. ZeRO (Rajbhandari et al. 2020) partitions them over the N data-parallel ranks:
#
# | stage | sharded | bytes per rank |
# |---|---|---|
# | DDP | nothing | (2 + 2 + K)Ψ |
# | 1 | optimizer state | 2Ψ + 2Ψ + KΨ/N |
# | 2 | + gradients (reduce-scatter instead of all-reduce) | 2Ψ + (2 + K)Ψ/N |
# | 3 | + parameters (all-gather before use, free after) | (2 + 2 + K)Ψ/N |
#
# The paper's example, Ψ = 7.5B on N = 64: 120 GB → 31.4 → 16.6 → 1.9 GB.

# %%
psi, n = 7_500_000_000, 64
mem = {s: par.zero_memory_per_rank(psi, s, n) for s in range(4)}
for s, d in mem.items():
    print(f"stage {s}: " + ", ".join(f"{k} {v / 1e9:6.2f} GB" for k, v in d.items()))
assert [round(mem[s]["total"] / 1e9, 1) for s in range(4)] == [120.0, 31.4, 16.6, 1.9]
ax = plots.memory_bars(psi, n)

# %% [markdown]
# Communication: stage 1 and 2 move the same volume as DDP (a reduce-scatter + all-gather *is* an all-reduce,
# 2(N−1)/N·Ψ ≈ 2Ψ *elements* sent per rank in a ring, times 2 bytes in bf16 or 4 in fp32); stage 3 adds one more
# all-gather of the parameters in backward: 1.5x DDP's volume.

# %%
ring = (n - 1) / n  # a ring reduce-scatter or all-gather of Ψ elements sends Ψ(N-1)/N per rank
volume = {"DDP": 2 * ring, "ZeRO-1": 2 * ring, "ZeRO-2": 2 * ring, "ZeRO-3": 3 * ring}  # x Ψ elements per rank
print({k: round(v, 3) for k, v in volume.items()})
assert volume["ZeRO-3"] / volume["DDP"] == 1.5

# %% [markdown]
# ## 2. One launch: ZeRO, tensor parallel, pipeline and 3D timings on 2 processes [Q8] [Q25] [Q39]
#
# `workers.notebook_job` runs on both ranks:
#
# * ZeRO 1/2/3 (`tl.parallel.ZeroOptimizer(model, torch.optim.Adam, stage=s)`) against plain DDP (gradient
#   all-reduce with `tl.dist.all_reduce`, then `torch.optim.Adam`) for 2 steps on different data per rank;
#   per-rank bytes of parameters / gradients / optimizer state measured from the tensors each rank holds;
# * a Megatron attention + MLP layer against the dense layer;
# * a 2-stage pipeline (GPipe and 1F1B) against the single-process model, with measured event times;
# * a word count with `tl.parallel.map_reduce` (section 3);
# * the same MLP stack trained as pure DP, pure TP and pure PP, timed, with the calibration the planner needs.
# * tinylearn's ZeRO and TP timed next to torch's (section 6).

# %%
res = tl.dist.launch(workers.notebook_job, 2, timeout_s=300)
z, tpr, ppr, t3, mr = (res[0][k] for k in ("zero", "tp", "pp", "3d", "mr"))

# %% [markdown]
# ### ZeRO equals DDP, and the bytes match the formulas [Q41]
#
# Stage 1 averages gradients with the *same* ring all-reduce as the reference DDP, so parameters are **bitwise**
# equal. Stages 2/3 reduce-scatter each gradient (a different summation order): bitwise on 2 ranks because
# a + b = b + a, within fp32 rounding on 4 (tests). Memory is measured after `step()`: fp32 parameters need no
# master copy (K = 8); bf16 parameters with an fp32 master copy give the mixed-precision K = 12.

# %%
for s in (1, 2, 3):
    print(f"stage {s}: bitwise equal to DDP: {z[f'stage{s}_bitwise']}")
    print(f"  fp32 measured {z[f'stage{s}_memory']}")
    print(f"  bf16 measured {z[f'bf16_stage{s}_memory']}")
    assert z[f"stage{s}_bitwise"]
    assert z[f"stage{s}_memory"] == z[f"stage{s}_formula"]
    assert z[f"bf16_stage{s}_memory"] == z[f"bf16_stage{s}_formula"]
assert z["bf16_stage3_memory"]["total"] == (2 + 2 + 12) * 484 // 2  # Ψ = 484 params, N = 2: (2+2+K)Ψ/N

# %% [markdown]
# How stage 3 works here: each parameter is flattened and padded to a multiple of N; rank r owns slice r. A
# forward pre-hook on each module all-gathers its parameters, a forward hook frees them again (the storage is
# resized to 0 bytes, like FSDP, so the views autograd saved stay valid), a backward pre-hook gathers them once
# more, and a post-accumulate-grad hook reduce-scatters each gradient and frees the full gradient and parameter.
#
# ### Consolidated checkpoints and resharding [Q134]
#
# `state_dict()` all-gathers every shard of the optimizer state and returns it in the *plain* optimizer's format,
# so it loads into `torch.optim.Adam` directly (the ranks checked it against the reference Adam's state), and
# `load_state_dict` of a consolidated state slices out the shard for *any* world size: that is how a job moves
# from N to N' ranks (elastic resize) — consolidate, then re-shard.

# %%
for s in (1, 2, 3):
    assert z[f"stage{s}_state_steps_equal"] and z[f"stage{s}_state_maxdiff"] == 0.0
assert z["resume_bitwise"]  # plain Adam state -> ZeroOptimizer.load_state_dict -> identical next step
print("consolidated state == reference Adam state; resume from a plain checkpoint is bitwise: True")

# %% [markdown]
# ## 3. Tensor parallelism: the f and g operators [Q8] [Q39]
#
# Megatron splits an MLP as Column(fc1) → GeLU → Row(fc2): rank r holds fc1's output rows r and fc2's input
# columns r, so GeLU stays local and only fc2's partial sums need one all-reduce (**g**: all-reduce forward,
# identity backward). In backward the input gradient of fc1 is a partial sum on every rank: **f** (identity forward,
# all-reduce backward). Attention splits by heads: q/k/v column-parallel, the output projection row-parallel.
# Per transformer layer: 2 all-reduces forward + 2 backward, each of b·s·h elements.

# %%
print("all-reduces in forward:", tpr["fwd_allreduces"], "| forward + backward:", tpr["step_allreduces"])
assert tpr["fwd_allreduces"] == 2 and tpr["step_allreduces"] == par.allreduces_per_layer() == 4
assert tpr["standalone_counts"] == {"all_reduce": 2, "all_gather": 2}  # gather_output + scattered input variant
assert tpr["seeded_init_equal"]  # built after the same seed, a TP layer holds exactly a slice of nn.Linear

# %%
# NBVAL_IGNORE_OUTPUT
# (differences are fp32 summation order: the partial products are summed by the all-reduce)
for k in ("out_maxdiff", "xgrad_maxdiff", "wgrad_maxdiff"):
    print(f"TP vs dense {k}: {tpr[k]:.2e}")
    assert tpr[k] < 5e-6

# %% [markdown]
# ### MapReduce, Spark and Ray next to SPMD training [Q8]
#
# The frameworks the question names are built on one idea each. **MapReduce**: map every input split to (key,
# value) pairs, *shuffle* (route each key to the reducer that owns it: all-to-all), reduce per key; a failed task is
# re-run from its materialised input. **Spark** keeps the same shuffle but chains stages in memory as RDDs and
# recovers a lost partition from its *lineage* (the recorded transformations), not from a checkpoint. **Ray** has
# *tasks* — stateless remote functions returning futures, scheduled anywhere, retried on failure — and *actors* —
# stateful processes whose methods run one at a time (a parameter server, a replay buffer, an environment). Training
# as in this notebook is neither: SPMD, every rank runs the same program in lock-step and talks through collectives
# (all-reduce, all-gather, send/recv), which is why one slow or dead rank stalls the job.
#
# `tl.parallel.map_reduce` runs the MapReduce skeleton on the same gloo ranks: map each rank's lines, an optional
# map-side combiner (Hadoop's combiner, Spark's `reduceByKey`), a shuffle as one `scatter_object_list` per source
# rank with keys owned by CRC32(key) mod N (stable across processes, unlike Python's `hash`), reduce, all-gather.
# The word count equals `collections.Counter` of the whole corpus; the combiner sends fewer pairs, at most one per
# distinct word on each rank.

# %%
for r, out in enumerate(x["mr"] for x in res):
    print(f"rank {r}: plain {out['plain_stats']} | with combiner {out['combined_stats']}")
    assert out["plain_equal"] and out["combined_equal"]
    assert out["combined_stats"]["pairs_shuffled"] < out["plain_stats"]["pairs_shuffled"]
    assert out["combined_stats"]["pairs_shuffled"] <= out["distinct_words_here"]
assert sum(x["mr"]["plain_stats"]["keys_reduced"] for x in res) == mr["n_keys"]  # every key reduced on one rank
one = par.map_reduce(workers.CORPUS, lambda line: [(w, 1) for w in line.split()], lambda k, vs: sum(vs))
print(f"one process, same call: {len(one)} keys, 'the' counted {one['the']} times")
assert len(one) == mr["n_keys"] and one["the"] == sum(line.split().count("the") for line in workers.CORPUS)

# %% [markdown]
# ## 4. Pipeline schedules as data [Q48]
#
# `pipeline_schedule(name, p, m)` returns each stage's op list. GPipe runs all forwards then all backwards;
# 1F1B (PipeDream-flush) runs p − s − 1 warm-up forwards on stage s, then alternates. Both have the bubble
# (p − 1)/(m + p − 1): the ramp-up and ramp-down each cost p − 1 slots. What 1F1B buys is memory: stage s holds at
# most p − s microbatches of activations instead of m. The interleaved schedule (v model chunks per rank)
# shrinks the ramp slots by v: bubble (p − 1)/(v·m + p − 1), paid with more point-to-point messages: each
# microbatch crosses v·p − 1 stage boundaries per direction instead of p − 1.
# The simulator replays the dependencies (F(mb) after F(mb) on the previous stage, B(mb) after B(mb) on the next
# one, chunk hand-over from the last stage to the first) and must reproduce the formula. Interleaving's price in
# memory: stage 0 holds 5.5 microbatches' worth of activations instead of 4 (p = 4, v = 2, below).

# %%
p, m = 4, 8
print("1F1B stage 0:", par.pipeline_schedule("1f1b", p, m)[0])
fig, axes = plt.subplots(3, 1, figsize=(11, 6.5), sharex=True)
for ax, (name, v) in zip(axes, [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2)], strict=True):
    sched = par.pipeline_schedule(name, p, m, v)
    sim = par.simulate(sched, t_f=1.0, t_b=2.0, n_chunks=v)
    plots.gantt(plots.simulated_rows(sim, p), title=f"{name} (v={v}): bubble {sim['bubble']:.3f}", ax=ax)
    assert abs(sim["bubble"] - par.bubble_fraction(name, p, m, v)) < 1e-12
    held = sim["peak_in_flight"]  # in microbatch-chunks; a chunk holds 1/v of the stage's layers
    print(f"{name:17s} v={v}: bubble {sim['bubble']:.3f}, peak activations per stage {[h / v for h in held]}")
fig.tight_layout()
assert [par.peak_in_flight(o) for o in par.pipeline_schedule("1f1b", p, m)] == [4, 3, 2, 1]
assert par.peak_in_flight(par.pipeline_schedule("interleaved_1f1b", p, m, 2)[0]) / 2 == 5.5


def boundary_crossings(sched: list) -> int:
    # every forward except those of virtual stage 0 (stage 0, chunk 0) receives its input from another rank
    return sum(1 for ops in sched for op in ops if op[0] == "F") - m


assert boundary_crossings(par.pipeline_schedule("1f1b", p, m)) == m * (p - 1)
assert boundary_crossings(par.pipeline_schedule("interleaved_1f1b", p, m, 2)) == m * (2 * p - 1)

# %% [markdown]
# Microbatch count: more microbatches shrink the bubble but each one is smaller (lower arithmetic intensity) and
# GPipe's activation memory grows with m, while 1F1B's stays at p microbatches.

# %%
for mm in (4, 8, 16, 32, 64):
    b1 = par.bubble_fraction("1f1b", 4, mm)
    bi = par.bubble_fraction("interleaved_1f1b", 4, mm, 4)
    print(f"m={mm:3d}: bubble 1F1B {b1:.3f}, interleaved v=4 {bi:.3f} | peak acts GPipe {mm}, 1F1B 4")
assert par.bubble_fraction("1f1b", 4, 32) < 0.1 < par.bubble_fraction("1f1b", 4, 16)
assert all(par.bubble_fraction("1f1b", pp, 4 * pp) < 0.2 for pp in range(2, 65))  # m >= 4p: bubble < 20%

# %% [markdown]
# ### Choosing the microbatch size online: a bandit [Q150]
#
# The microbatch size b trades two costs: a step of G samples in m = G/b microbatches through p stages takes
# (m + p − 1)(t_fixed + b·t_sample) — small b pays the fixed per-microbatch cost m times, large b pays the bubble —
# and 1F1B holds min(p, m)·b samples of activations. `tl.parallel.tune_microbatch` treats the sizes that fit the
# memory budget as the arms of a bandit (the one-state case of reinforcement learning): every training step it
# plays one size (ε-greedy, ε = 1/√step), observes a noisy step, and learns the mean reward throughput −
# w·latency, latency being one microbatch's trip through the p stages. With G = 64, p = 4, t_fixed = 2 ms,
# t_sample = 1 ms, 50 MB of activations per sample and 2 GB of memory (16 and 32 do not fit), it settles on b = 8
# for throughput alone and on b = 2 when latency weighs heavily (w = 3·10⁴) — the noise-free optimum both times.

# %%
for weight in (0.0, 3e4):
    bandit = par.tune_microbatch(
        64, [1, 2, 4, 8, 16, 32], 4, 2e-3, 1e-3, act_bytes_per_sample=50e6, memory_budget=2e9, latency_weight=weight
    )
    print(
        f"w={weight:g}: plays per size {bandit['counts']}, choice b={bandit['choice']}, excluded {bandit['infeasible']}"
    )
    assert bandit["choice"] == bandit["best"] == (8 if weight == 0 else 2) and bandit["infeasible"] == [16, 32]

# %% [markdown]
# ### Buffer depth per edge over heterogeneous links: Little's law [Q240]
#
# Across nodes the stage boundaries sit on different links. With credit-based flow control (stage i may start a
# microbatch only when edge i has a free slot; the slot comes back an acknowledgement a_i after stage i + 1 starts
# it), a slot circulates through W_i = t_i + d_i + a_i: compute, transfer d_i = α_i + β_i·bytes, acknowledgement.
# Little's law (slots in use = rate × time each is held) at the bottleneck rate 1/max t gives the smallest depth
# that never stalls the pipeline, B_i = ⌈W_i / max t⌉; the steady-state period is max(max t_i, max W_i / B_i).
# `tl.parallel.simulate_stream` replays the recurrences. Below, 4 stages of 1.0 / 1.2 / 0.8 / 1.0 ms and 8 MB
# activations over NVLink-, InfiniBand- and Ethernet-class links (ack = α): the slow edge needs the deepest buffer,
# one slot fewer on it costs throughput, and when that link halves its rate later in the run, a controller that
# re-derives B_i from the transfer times it observed (every 20 microbatches) restores the full rate.

# %%
t_ms = [1.0, 1.2, 0.8, 1.0]
links = [(0.005, 1 / 100e6), (0.02, 1 / 12.5e6), (0.05, 1 / 2.5e6)]  # (alpha ms, beta ms per byte)
act = 8_000_000
d_ms = [al + be * act for al, be in links]
ack = [al for al, _ in links]
depth = par.buffer_depths(t_ms, d_ms, ack)
print("transfer ms per edge:", [round(x, 3) for x in d_ms], "| depths B_i:", depth)
print("buffer memory per edge (MB):", [b * act / 1e6 for b in depth])
assert depth == [1, 2, 4]  # the Ethernet-class edge needs the deepest buffer


def close(a: float, b: float) -> bool:
    return abs(a - b) < 1e-9 * b


assert close(par.simulate_stream(t_ms, d_ms, depth, 400, ack)["period"], max(t_ms))
short = par.simulate_stream(t_ms, d_ms, [1, 2, 3], 400, ack)["period"]
print(f"period with B = {depth}: {max(t_ms)} ms; with one slot fewer on the last edge: {short:.3f} ms")
assert close(short, par.stream_period(t_ms, d_ms, [1, 2, 3], ack)) and short > 1.1 * max(t_ms)
slowdown = lambda k: d_ms if k < 200 else [d_ms[0], d_ms[1], 2 * d_ms[2]]  # noqa: E731 - the link halves its rate
fixed = par.simulate_stream(t_ms, slowdown, depth, 600, ack)
adaptive = par.simulate_stream(t_ms, slowdown, depth, 600, ack, adapt_every=20)
print(f"after the slowdown: fixed B {fixed['period']:.3f} ms/mb, adaptive {adaptive['period']:.3f} ms/mb,")
print("  adaptive depths at the end:", adaptive["depths"][-1])
assert fixed["period"] > 1.5 * max(t_ms) and close(adaptive["period"], max(t_ms))

# %% [markdown]
# ### The real pipeline: 2 processes, send/recv of activations and gradients
#
# `PipelineParallel(stage_module, "1f1b", n_microbatches=4)` ran on both ranks (stage 0 = the first block, stage 1
# the second). Loss and every parameter gradient equal the single-process model (fp32 summation order). The Gantt
# chart below is drawn from the *measured* event times of the timed 1F1B step in section 5 (MLP stack).

# %%
for sched in ("gpipe", "1f1b"):
    assert ppr[f"{sched}_loss_diff"] < 1e-6 and ppr[f"{sched}_grad_maxdiff"] < 1e-6
print("peak microbatches held on stage 0: gpipe", ppr["gpipe_peak_held"], "| 1f1b", ppr["1f1b_peak_held"])
assert ppr["gpipe_peak_held"] == 4 and ppr["1f1b_peak_held"] == 2

# %%
# NBVAL_IGNORE_OUTPUT
# (measured times)
rows = [[(k, mb, s * 1e3, e * 1e3) for k, mb, s, e in ev] for ev in (t3["pp_events"], res[1]["3d"]["pp_events"])]
ax = plots.gantt(rows, title="measured 1F1B step, 2 processes, 4 microbatches", unit="ms")
for stage, row in enumerate(rows):  # each rank ran exactly 1F1B's op order for its stage
    assert [(k, mb) for k, mb, _, _ in row] == par.pipeline_schedule("1f1b", 2, 4)[stage]

# %% [markdown]
# ## 5. Choosing (dp, tp, pp): the planner against measurements [Q96] [Q75] [Q147]
#
# `plan_3d` enumerates every factorisation world = dp·tp·pp, prunes what does not divide (tp | hidden, pp ≤
# layers, dp·b | batch) or does not fit (ZeRO model states + 1F1B activations), and ranks the rest by an
# estimated step time: pipeline (m + pp − 1)·T_microbatch with T = 6·Ψ·b·s/(tp·pp)/FLOP/s (forward *and* backward:
# 2Ψ + 4Ψ FLOPs per token) + k TP all-reduces per layer (α-β ring) + p2p, plus the DP gradient all-reduce of
# Ψ/(tp·pp) elements and, optionally, the optimizer step. Two parameters describe the job: `tp_allreduces_per_layer`
# k (default 4 — a Megatron transformer layer, attention + MLP, one all-reduce each way per block; an MLP-only
# block has 2) and `dtype_bytes` (default 2, bf16 activations and gradients; 4 for an fp32 job). For a 7B model
# on 64 GPUs with 32 GB each:

# %%
link = {"alpha_s": 5e-6, "beta_s_per_byte": 1 / 50e9}
plans = par.plan_3d(64, 7_000_000_000, 32, 4096, 2048, 256, 32e9, link, flops_per_s=150e12)
for pl in plans[:5]:
    print(f"dp={pl.dp:2d} tp={pl.tp} pp={pl.pp}: {pl.est_step_s:6.2f} s, {pl.est_bytes / 1e9:5.1f} GB")
assert all(pl.tp * pl.pp > 1 for pl in plans)  # with 32 GB per rank, pure DP (38 GB) is pruned

# %% [markdown]
# On this machine: the same 4-block MLP stack (hidden 256, ffn 1024, fp32, 4 sequences of 32 tokens per step,
# one sequence per microbatch everywhere: PP runs 1F1B, DP and TP accumulate gradients over their microbatches)
# trained as pure DP, pure TP and pure PP on 2 ranks, against `plan_3d` with the job's own parameters — k = 2
# (`ParallelMLP` does one all-reduce forward, one backward), `dtype_bytes=4`, ZeRO stage 0 (the DP run is plain
# DDP: every rank runs Adam on all Ψ) — and calibrated in the same job, interleaved with the timed steps: the
# forward + backward of one block on one microbatch (→ FLOP/s), the Adam step (→ seconds per parameter) and α, β
# fitted to the ring all-reduce the jobs really run (rather than to a one-way ping-pong). Times are medians of 5
# interleaved steps of the slowest rank.
#
# The claim checked: `plan_3d` orders the configurations as the measurement does, and every estimate is within a
# factor 3 of its measurement (the model leaves out Python and autograd overheads, and other jobs on these 2
# cores slow the message-heavy configurations most). Two configurations within 15% of each other count as tied —
# in the measurement or in the estimate — so the assert is: no pair that the measurement separates by more than
# 15% is ordered the other way by `plan_3d` by more than 15%.

# %%
# NBVAL_IGNORE_OUTPUT
# (timings)
names = {(2, 1, 1): "dp", (1, 2, 1): "tp", (1, 1, 2): "pp"}
meas = {names[c]: ms for c, ms in t3["times"].items()}
psi, layer_s = t3["n_params"], t3["layer_ms"][(2, 1, 1)] / 1e3  # one whole block, one microbatch, fwd + bwd
job = {  # this job's parameters, calibrated in the same launch
    "flops_per_s": 6 * (psi / 4) * 32 / layer_s,  # 6·Ψ_block·tokens already counts forward + backward
    "zero_stage": 0,  # the DP run is plain DDP + Adam: every rank updates all Ψ
    "tp_allreduces_per_layer": 2,  # ParallelMLP: one all-reduce forward (g), one backward (f)
    "dtype_bytes": 4,  # fp32
    "optimizer_s_per_param": t3["adam_ms"][(2, 1, 1)] / 1e3 / psi,
}
link_here = {"alpha_s": t3["alpha_s"], "beta_s_per_byte": t3["beta_s_per_byte"]}
here = par.plan_3d(2, psi, 4, 256, 32, 4, 1e12, link_here, **job)  # 4 sequences of 32 tokens, 1 per microbatch
pred = {names[(pl.dp, pl.tp, pl.pp)]: pl.est_step_s * 1e3 for pl in here}
bw = 1 / t3["beta_s_per_byte"] / 1e9 if t3["beta_s_per_byte"] > 0 else float("inf")  # a noisy fit may give 0
print(f"all-reduce link: alpha {t3['alpha_s'] * 1e6:.0f} us, 1/beta {bw:.2f} GB/s; block {layer_s * 1e3:.1f} ms")
for k in ("dp", "tp", "pp"):
    print(f"{k}: measured {meas[k]:7.1f} ms, plan_3d estimate {pred[k]:7.1f} ms, ratio {meas[k] / pred[k]:.2f}")
print("measured fastest -> slowest:", sorted(meas, key=meas.get), "| plan_3d:", [names[p[:3]] for p in here])
clear = [(a, b) for a in meas for b in meas if meas[b] > 1.15 * meas[a]]  # a is clearly faster than b
print("measured more than 15% apart:", clear)
assert not [(a, b) for a, b in clear if pred[a] > 1.15 * pred[b]], (meas, pred)  # clearly reversed by plan_3d
assert all(1 / 3 < meas[k] / pred[k] < 3 for k in meas), (meas, pred)
four = par.plan_3d(4, psi, 4, 256, 32, 4, 1e12, link_here, **job)
assert {(2, 2, 1), (2, 1, 2), (1, 2, 2)} <= {p[:3] for p in four}

# %% [markdown]
# The model this replaced was far off on DP and ranked the configurations backwards; three errors, now fixed
# and tested (`tests/test_parallel.py`): it charged 4 TP all-reduces per layer where `ParallelMLP` does 2, it
# priced the DP all-reduce at bf16 bytes for an fp32 job, and it divided the measured FLOP/s by 3 although
# 6·Ψ·b·s already counts forward and backward. Its calibration (a ping-pong α, β and a bare matmul rate, measured
# once) also missed what a step really pays here: the optimizer step, and all-reduces on cores both ranks share.
#
# The title promises 3D, and the planner ranks the mixes too (for 4 ranks, with this calibration: dp·tp, dp·pp and
# tp·pp = 2·2 each, checked above); a measured dp = 2 × tp = 2 run needs 4 processes, which on this 2-core box
# (a) adds a second launch of 4 processes to a notebook that must stay under 90 s, and (b) runs two ranks per
# core, which the model does not describe (every step then waits on the OS scheduler). Timing it is left to a
# real cluster (`tl.dist.launch(workers.three_d_job, 4)` times dp = 4, tp = 4, pp = 4 and dp = 2 × tp = 2); that
# the 2 × 2 grid computes the right thing — every rank's gradient shard equals the slice of the single-process
# gradient — is checked on 4 processes by `tests/test_parallel_dist.py`. The procedure is the same everywhere:
# model, prune, then time the top few candidates, which is what auto-parallel planners do.
#
# ## 6. Side by side: tinylearn, torch, tinygrad
#
# The same launch timed one Adam step of a 4-layer MLP (256 wide, 32 samples per rank) under tinylearn's DDP and
# ZeRO 1/2/3 and under torch's DDP and `ZeroRedundancyOptimizer` (torch's ZeRO stage 1), and the forward + backward
# of a Megatron MLP (256 → 1024 → 256, 256 tokens) split by tinylearn's Column/Row layers, by torch's
# `torch.distributed.tensor.parallel` (DTensor on a CPU device mesh over gloo), and unsplit in one process. Medians
# of 3 steps of the slowest rank; tinygrad has no multi-process collectives or process groups, so it has no
# ZeRO or TP column to fill. torch's TP computes the same output as the dense MLP (fp32 rounding); tinylearn's
# ZeRO-3 is its slowest stage here, at least 1.5x ZeRO-1: it all-gathers every layer's parameters in forward and
# again in backward, many small latency-bound messages.

# %%
# NBVAL_IGNORE_OUTPUT
# (timings)
bz, bt = res[0]["bench"]["zero"], res[0]["bench"]["tp"]
table = [
    ("DDP + Adam step", bz["tl DDP (ring)"], bz["torch DDP + Adam"]),
    ("ZeRO-1 step", bz["tl ZeRO-1"], bz["torch ZeroRedundancyOptimizer"]),
    ("ZeRO-2 step", bz["tl ZeRO-2"], None),
    ("ZeRO-3 step", bz["tl ZeRO-3"], None),
    ("TP MLP fwd+bwd", bt["tl ColumnParallel/RowParallel"], bt.get("torch.distributed.tensor.parallel")),
    ("dense MLP, 1 process", bt["dense (every rank, no split)"], None),
]
print(f"{'workload (ms)':22s} {'tinylearn':>10s} {'torch':>10s}  tinygrad")
for name, mine, theirs in table:
    print(f"{name:22s} {mine:10.1f} {theirs if theirs is not None else float('nan'):10.1f}  n/a (no process groups)")
fig, ax = plt.subplots(figsize=(9, 3))
xs = range(len(table))
ax.bar([x - 0.2 for x in xs], [r[1] for r in table], 0.4, label="tinylearn")
ax.bar([x + 0.2 for x in xs], [r[2] or 0 for r in table], 0.4, label="torch")
ax.set_xticks(list(xs), [r[0] for r in table], rotation=15, fontsize=8)
ax.set_ylabel("ms (2 gloo ranks)")
ax.legend()
assert bt.get("torch_tp_maxdiff", 1.0) < 1e-5, bt.get("torch_tp_error")  # torch TP == dense MLP
assert bz["tl ZeRO-3"] == max(bz[f"tl ZeRO-{s}"] for s in (1, 2, 3)) and bz["tl ZeRO-3"] > 1.5 * bz["tl ZeRO-1"]

# ## Recap: interview answers
#
# * **[Q41] ZeRO** — DDP replicates 16 bytes/param (mixed-precision Adam). ZeRO shards optimizer state (stage 1:
#   4Ψ + 12Ψ/N), then gradients via reduce-scatter (2Ψ + 14Ψ/N), then parameters, all-gathered per layer just
#   before use and freed after (16Ψ/N). Same result as DDP (bitwise here for stage 1); stages 1-2 cost no extra
#   communication, stage 3 1.5x. Checkpoints: consolidate (all-gather) or save shards and re-slice.
# * **[Q8] [Q25] [Q39] 3 kinds of parallelism** — DP: replicas, ring all-reduce of the gradients: each rank
#   sends 2(N−1)/N·Ψ ≈ 2Ψ *elements* per step (×2 bytes in bf16, ×4 in fp32). TP
#   (Megatron): split matrices column-then-row, 2 all-reduces forward + 2 backward per layer on activations —
#   needs NVLink-class bandwidth, stays inside a node. PP: layers split into stages, only activations/gradients
#   at stage boundaries cross (point-to-point), at the cost of the bubble.
# * **[Q48] pipeline** — GPipe and 1F1B share the bubble (p−1)/(m+p−1); 1F1B caps in-flight
#   activations at p microbatches (GPipe: m), interleaving v chunks divides the bubble ramp by v. More
#   microbatches → smaller bubble but smaller GEMMs; m ≥ 4p keeps the bubble under ~20%.
# * **[Q150] microbatch size online** — a bandit over the sizes that fit memory, reward throughput − w·latency,
#   ε-greedy; it converges on the model's optimum (b trades the per-microbatch fixed cost against the bubble).
# * **[Q240] buffer depth per edge** — a credit on edge i circulates through t_i + d_i + a_i (compute, transfer,
#   acknowledgement); Little's law: B_i = ⌈(t_i + d_i + a_i)/max t⌉ keeps the bottleneck busy, and costs
#   B_i activations of memory; re-derive it from measured link times when a link changes.
# * **[Q8] MapReduce / Spark / Ray** — map, shuffle by key owner (all-to-all), reduce; Spark recomputes lost
#   partitions from lineage; Ray: stateless tasks vs stateful actors. DL training is SPMD over collectives.
# * **[Q96] [Q75] [Q147] choosing (dp, tp, pp)** — enumerate factorisations, prune by divisibility and memory
#   (ZeRO formula + activations), score by an α-β + FLOP model, keep tp within a node, pp across nodes, dp
#   outermost; validate the top candidates by measuring, as above.
# * **[Q134] resharding** — a consolidated (plain-format) optimizer state is world-size independent; each new rank
#   slices its shard out of it (`load_state_dict`).
#
# ## Exercises (`exercises/10_parallel_training/`)
#
# 1. `shard_bounds` / `shard_state` / `consolidate` — shard an optimizer state over N ranks and gather it back.
# 2. `zero_bytes_per_rank` — the ZeRO memory formulas.
# 3. `one_f_one_b(p, m)` — the 1F1B schedule generator; `bubble(p, m, v)`.
# 4. `column_parallel_forward` / `row_parallel_forward` — Megatron's split, simulated in one process.
#
# Run `pytest exercises/10_parallel_training` (your stubs) or `--impl=reference` (tinylearn's answers).
