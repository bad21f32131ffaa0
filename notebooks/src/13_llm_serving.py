# %% [markdown]
# # 13 · LLM serving: a continuous-batching engine, prefix caching, chunked prefill, preemption, KV tiers, a server
#
# Notebook 09 built the pieces of a decoder's inference path (KV caches, paged blocks, sampling, speculative decoding)
# and ended with a *simulated* server. Here the server is real: `tl.serve.Engine` schedules requests step by step over
# a paged KV cache, runs one batched forward per step, and an OpenAI-compatible HTTP server (FastAPI + uvicorn) in
# front of it is load-tested over loopback. Everything is measured on this CPU with a tiny randomly initialised
# TinyGPT: the *mechanisms* (scheduling, block sharing, preemption, tiers, admission) are what is measured, not text.
#
# **Interview questions this notebook answers**: [Q203] prefix deduplication with hashes and reference counts,
# [Q107] KV memory pressure (low-bit blocks, eviction, re-expansion), [Q133] dynamic batching with an SLA queue,
# [Q124] length bucketing vs ragged batches, [Q113] [Q244] tiered KV with prefetch, [Q137] a delta-compressed KV
# swap tier, [Q143] an append-only KV log, [Q193] [Q220] scored cache eviction, [Q162] shard prewarming, [Q259]
# [Q106] latency models and SLO admission, [Q261] autoscaling, [Q189] [Q198] stage pipelines and async
# preprocessing, [Q224] merging speculative branches, [Q183] choosing a decode strategy.

# %%
import tinylearn as tl  # first: its short OpenMP spin-wait is set before torch loads libgomp (notebook 00)

# isort: split
import gc
import itertools
import os
import queue
import shutil
import tempfile
import threading
import time

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.patches import Patch

from tinylearn._threads import limited_threads
from tinylearn.autograd import no_grad
from tinylearn.bench import measure
from tinylearn.inference import TinyGPT, form_batches, generate, padding_stats
from tinylearn.serve import ByteTokenizer, DeltaKVStore, Engine, SamplingParams
from tinylearn.serve.autoscale import Autoscaler, burst_knots, measure_cold_start, ramp_trace, simulate
from tinylearn.serve.beams import BranchSet, js_distance, tv_distance
from tinylearn.serve.checkpoint import tiny_model
from tinylearn.serve.eviction import (
    LFUScorer,
    LinearAccessPredictor,
    LRUScorer,
    SemanticDecayScorer,
    access_dataset,
    roc_auc,
    topic_drift_trace,
)
from tinylearn.serve.eviction import replay as replay_cache
from tinylearn.serve.journal import KVJournal, kv_from_dense_cache, recover
from tinylearn.serve.latency import AdmissionController, StepCostModel
from tinylearn.serve.parallel_choice import (
    DecodeCostModel,
    Strategy,
    calibrate_cpu,
    check_speculative,
    expected_tokens,
    perturbed_draft,
)
from tinylearn.serve.pipeline import (
    AsyncPreprocessor,
    Group,
    Pipeline,
    Stage,
    bottleneck_s,
    chat_requests,
    demo_stages,
    plan_rebalance,
    run_adaptive,
)
from tinylearn.serve.prewarm import LazyModel, MarkovPrewarmer, ShardedCheckpoint, markov_trace
from tinylearn.serve.prewarm import replay as replay_shards
from tinylearn.serve.tiering import TieredKVStore, compress_block

FULL = os.environ.get("TINYLEARN_FULL") == "1"
torch.manual_seed(0)
tok = ByteTokenizer()
model = tiny_model(seed=0)  # TinyGPT: byte vocabulary (258), d_model 128, 4 heads, 2 layers, context 512
print(model.config)
greedy = SamplingParams(temperature=0, max_tokens=8)
eng = Engine(model, tokenizer=tok)
out = eng.generate(["Hello, serving!", "KV caches"], greedy)
for o in out:
    print(o.request_id, o.prompt_len, "prompt tokens ->", o.token_ids, o.finish_reason)
# the engine's greedy tokens are exactly those of the plain KV-cached generate loop of notebook 09
for o, p in zip(out, ["Hello, serving!", "KV caches"]):
    assert o.token_ids == generate(model, tok.encode(p), 8, temperature=0)

# %% [markdown]
# ## 1. Prefill vs decode on the roofline: why decode is memory-bound and batching raises its intensity [Q106]
#
# A decode step reads every weight once to produce **one** token per sequence: $2P$ FLOPs per token against $4P$ bytes
# of fp32 weights, an intensity of about $B/2$ FLOP/byte for a batch of $B$ sequences — if weights were all it read.
# Each sequence also reads its own K/V ($2 \cdot L \cdot H_{kv} \cdot d_h \cdot 4$ bytes per cached token) for about
# half a FLOP per byte, so the intensity grows with $B$ but levels off at $2P/(S \cdot \text{K/V bytes per token}) +
# 0.5$ — the lower, the longer the context $S$. A lone decode sits far left of this machine's ridge (peak FLOP/s ÷
# bandwidth): memory-bound (on a tiny model that fits in cache: overhead-bound); a step's time grows far slower than
# $B$, because batching turns one matrix-vector product per token into one matrix product per step; and at long
# contexts decode stays on the memory side whatever the batch (the K/V reads), which is why KV size drives serving. A
# prefill of $T$ tokens is already a matrix product (intensity ∝ $T$). Below, the engine's own step log gives the time
# of decode-only steps for $B = 1 \dots 32$ running sequences (median of the steps after two warm-up steps) and of one
# prefill step. The tag's question (scheduling requests of different batch sizes by estimated occupancy and bandwidth)
# starts here: the intensity says which roof a step sits under; section 9 prices steps with a model fitted on
# measurements.

# %%
# NBVAL_IGNORE_OUTPUT
from tinylearn.bench.roofline import machine_roofs, roofline_plot  # noqa: E402

cfg = model.config
n_params = sum(int(np.prod(p.shape)) for name, p in model.named_parameters() if "tok_emb" not in name)
rng = np.random.default_rng(0)
PROMPT, STEPS = 64, 12


def decode_step_s(batch: int) -> float:
    """Median duration of the engine's decode-only steps with ``batch`` running sequences (2 warm-up steps)."""
    e = Engine(model, max_num_seqs=batch, enable_prefix_caching=False, max_num_batched_tokens=PROMPT * batch)
    sp = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True)
    e.generate([rng.integers(0, 256, PROMPT).tolist() for _ in range(batch)], sp)
    dec = [s["duration_s"] for s in e.step_log if s["num_prefill_tokens"] == 0 and s["num_seqs"] == batch]
    return float(np.median(dec[2:]))


def prefill_step_s(tokens: int, repeat: int = 5) -> float:
    """Median duration of a step that prefills one ``tokens``-token prompt (2 warm-up runs, fresh engines)."""
    times = []
    for _ in range(repeat + 2):
        e = Engine(model, max_num_seqs=1, enable_prefix_caching=False, max_num_batched_tokens=tokens)
        e.add_request(rng.integers(0, 256, tokens).tolist(), SamplingParams(temperature=0, max_tokens=1))
        e.step()
        times.append(e.step_log[0]["duration_s"])
    return float(np.median(times[2:]))


BATCHES = [1, 2, 4, 8, 16, 32]
with limited_threads(1, torch=True):
    step_s = {b: decode_step_s(b) for b in BATCHES}
    pre_s = prefill_step_s(256)
    peak, bw = machine_roofs(1)
kv_per_tok = cfg.kv_bytes_per_token()
ctx = PROMPT + STEPS // 2  # mean context length of the measured decode steps


def decode_cost(b: int) -> tuple[float, float]:
    flops = b * (2 * n_params + 4 * cfg.n_layers * ctx * cfg.d_model)  # weights + attention (q.k and p.v)
    nbytes = 4 * n_params + b * ctx * kv_per_tok  # weights once per step + every sequence's K/V
    return flops, nbytes


tput = {b: b / step_s[b] for b in BATCHES}
intensity = {b: decode_cost(b)[0] / decode_cost(b)[1] for b in BATCHES}
pre_flops, pre_bytes = 256 * 2 * n_params, 4 * n_params + 256 * kv_per_tok
print(f"machine (1 thread): {peak:.0f} GFLOP/s (SGEMM), {bw:.1f} GB/s (STREAM), ridge {peak / bw:.1f} FLOP/byte")
for b in BATCHES:
    print(
        f"decode B={b:2d}: step {step_s[b] * 1e3:6.2f} ms, {tput[b]:7.0f} tok/s, intensity {intensity[b]:5.2f} FLOP/B"
    )
print(
    f"prefill 256 tokens: {pre_s * 1e3:.2f} ms = {256 / pre_s:.0f} tok/s, intensity {pre_flops / pre_bytes:.1f} FLOP/B"
)
fig, ax = plt.subplots(1, 2, figsize=(12, 4))
pts = [(f"decode B={b}", intensity[b], decode_cost(b)[0] / step_s[b] / 1e9) for b in (1, 4, 32)]
pts.append(("prefill 256", pre_flops / pre_bytes, pre_flops / pre_s / 1e9))
roofline_plot(ax[0], peak, bw, pts)
ax[0].set_title("TinyGPT steps on this core's roofline")
ax[1].plot(BATCHES, [tput[b] for b in BATCHES], "o-", label="decode tokens/s")
ax[1].plot(BATCHES, [tput[1] * b for b in BATCHES], "k:", label="linear in B (ideal)")
ax[1].set(xscale="log", yscale="log", xlabel="running sequences B", ylabel="tokens/s", title="decode throughput")
ax[1].legend()
plt.show()


# intensity grows with B but less than B x (weights are read once per step, each sequence's K/V once per sequence):
# it levels off at 2P / (context x K/V bytes per token) + 0.5 FLOP/byte, lower the longer the context
def kv_limit(context: int) -> float:
    return 2 * n_params / (context * kv_per_tok) + 4 * cfg.n_layers * cfg.d_model / (2 * cfg.n_layers * cfg.d_model * 4)


print(f"ridge {peak / bw:.1f} FLOP/B; B -> inf limit: {kv_limit(ctx):.1f} at context {ctx}, {kv_limit(512):.1f} at 512")
assert all(intensity[b] < intensity[2 * b] < 2 * intensity[b] for b in BATCHES[:-1])
assert max(intensity.values()) < kv_limit(ctx) and kv_limit(512) < kv_limit(ctx)
# a lone decode step sits left of the ridge (memory side), a 256-token prefill right of it (compute side)
assert intensity[1] < peak / bw < pre_flops / pre_bytes
# measured: a 32-sequence decode step yields several times the tokens/s of a lone one (4.6-4.7x here; > 2.5x
# asserted): the step time grows ~8x for 32x the tokens
assert tput[32] > 2.5 * tput[1] and step_s[32] < 16 * step_s[1]
# a 256-token prefill step is a matrix product: far more tokens/s than a lone decode (15x here; > 5x asserted)
assert 256 / pre_s > 5 * tput[1]
print(f"32 sequences: {tput[32] / tput[1]:.1f}x the tokens/s of one; prefill {256 / pre_s / tput[1]:.0f}x")

# %% [markdown]
# ## 2. The engine step by step, and continuous vs static batching [Q133]
#
# One `Engine.step()` is the whole serving loop in miniature: (1) the scheduler takes the running requests first (one
# decode token each), then new prompts, under a **token budget** (`max_num_batched_tokens`) and `max_num_seqs`; a prompt
# that does not fit the budget is split into chunks (chunked prefill, section 4); (2) KV blocks are reserved for every
# scheduled token (a block table per sequence); (3) **one** forward runs over the ragged batch — all scheduled tokens
# concatenated, projections and MLP as one matrix product, attention per sequence over its own blocks; (4) every
# sequence whose prompt is complete samples a token; finished requests free their blocks at once. The trace below
# runs three prompts (40, 8 and 100 tokens) under a budget of 64 tokens.

# %%
e = Engine(model, max_num_batched_tokens=64, max_num_seqs=4, block_size=16, enable_prefix_caching=False)
lens = {"a": 40, "b": 8, "c": 100}
for rid, n in lens.items():
    e.add_request(rng.integers(0, 256, n).tolist(), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
                  request_id=rid)  # fmt: skip
print("step  prefill  decode  seqs  blocks used  tokens out")
trace = []
while e.has_unfinished():
    outs = e.step()
    log, st = e.step_log[-1], e.stats()
    trace.append((log["num_prefill_tokens"], log["num_decode_tokens"], st["kv_blocks_used"]))
    got = {o.request_id: o.new_token_ids for o in outs if o.new_token_ids}
    print(f"{len(trace):4d}  {log['num_prefill_tokens']:7d}  {log['num_decode_tokens']:6d}  {log['num_seqs']:4d}  "
          f"{st['kv_blocks_used']:11d}  {got}")  # fmt: skip
# step 1: the budget of 64 takes a (40) and b (8) whole and a 16-token chunk of c; step 2: a and b decode (2 tokens)
# and c continues with 64 - 2 = 62 of its remaining 84; the budget is never exceeded
assert trace[0][:2] == (64, 0) and trace[1][:2] == (62, 2)
assert all(p + d <= 64 for p, d, _ in trace)
# blocks: ceil(tokens / 16) per sequence; everything is freed when the requests finish
assert trace[0][2] == 3 + 1 + 1 and e.stats()["kv_blocks_used"] == 0

# %% [markdown]
# **Continuous vs static batching, against Hugging Face transformers.** Static batching forms a batch, runs it until
# its *longest* request is done, then forms the next: short requests idle in the batch and the queue waits. Continuous
# (iteration-level) batching admits and retires requests at every step. The oracle and baseline is transformers'
# `generate` on the same weights: a GPT-2-style TinyGPT (learned positions) converted with `tl.serve.hf.to_hf_gpt2`,
# batches of 8 with left padding and an attention mask. The engine runs the same 32 requests with at most 8 running
# sequences (the same concurrency). First the tokens are compared, then the clocks. tinygrad has no serving engine
# (no paged KV cache, no batching scheduler): it has no row here; its decode step is compared in notebook 09 §8.

# %%
# NBVAL_IGNORE_OUTPUT
from tinylearn.inference import GPTConfig  # noqa: E402
from tinylearn.serve.hf import to_hf_gpt2  # noqa: E402

gpt2_cfg = GPTConfig(vocab_size=258, d_model=128, n_heads=4, n_layers=2, max_seq_len=512, rope=False)
m2 = tiny_model(seed=1, config=gpt2_cfg)
hf = to_hf_gpt2(m2)
N_REQ, BATCH = 32, 8
wl = np.random.default_rng(5)
prompts = [wl.integers(0, 256, int(n)).tolist() for n in wl.integers(16, 65, N_REQ)]
out_lens = [int(n) for n in wl.integers(8, 97, N_REQ)]


def hf_static() -> tuple[list[list[int]], list[float], float]:
    """Static batches of BATCH in arrival order; returns tokens, per-request TPOT, wall time."""
    toks, tpots, t0 = [], [], time.perf_counter()
    for i in range(0, N_REQ, BATCH):
        ps, ns = prompts[i : i + BATCH], out_lens[i : i + BATCH]
        width = max(map(len, ps))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in ps])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ps])
        tb = time.perf_counter()
        with torch.no_grad():
            g = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max(ns), min_new_tokens=max(ns),
                            do_sample=False, pad_token_id=0)  # fmt: skip
        dt = time.perf_counter() - tb
        for row, n in zip(g[:, width:].tolist(), ns):
            toks.append(row[:n])
            tpots.append(dt / max(ns))  # every step of the batch serves every member, finished or not
    return toks, tpots, time.perf_counter() - t0


def engine_continuous() -> tuple[list[list[int]], list[float], float]:
    e = Engine(m2, max_num_seqs=BATCH, max_num_batched_tokens=256, enable_prefix_caching=False)
    t0 = time.perf_counter()
    outs = e.generate(prompts, [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in out_lens])
    wall = time.perf_counter() - t0
    tpots = [(o.metrics["finish_s"] - o.metrics["first_token_s"]) / max(1, len(o.token_ids) - 1) for o in outs]
    return [o.token_ids for o in outs], tpots, wall


with limited_threads(1, torch=True):
    hf_static(), engine_continuous()  # warm-up (first calls allocate and load kernels)
    runs = {"static (HF generate)": [], "continuous (tl.serve)": []}
    for _ in range(3):  # interleaved: a load change on the machine hits both alike
        runs["static (HF generate)"].append(hf_static())
        runs["continuous (tl.serve)"].append(engine_continuous())
useful = sum(out_lens)
res = {}
for name, rs in runs.items():
    # the best of the 3 interleaved runs (wall, and each run's own TPOT percentiles): load from outside only adds
    # time, and a p99 over the pooled runs would report the one run a neighbour slowed (CI saw 1.38x that way)
    wall = float(min(r[2] for r in rs))
    p50, p99 = (min(float(np.percentile(r[1], q)) for r in rs) for q in (50, 99))
    res[name] = dict(wall=wall, tok_s=useful / wall, tpot_p50=p50, tpot_p99=p99)
    print(f"{name:22s} wall {wall:6.3f} s  {useful / wall:7.0f} useful tok/s  TPOT p50 "
          f"{res[name]['tpot_p50'] * 1e3:5.2f} ms  p99 {res[name]['tpot_p99'] * 1e3:5.2f} ms")  # fmt: skip
same = [a == b for a, b in zip(runs["static (HF generate)"][0][0], runs["continuous (tl.serve)"][0][0])]
print(f"greedy tokens equal to transformers' for {sum(same)}/{N_REQ} requests")
st, co = res["static (HF generate)"], res["continuous (tl.serve)"]
fig, ax = plt.subplots(1, 2, figsize=(11, 3.5))
ax[0].bar(list(res), [r["tok_s"] for r in res.values()], color=["tab:gray", "tab:blue"])
ax[0].set(ylabel="useful output tokens/s", title=f"{N_REQ} requests, 8 at a time")
ax[1].bar(list(res), [r["tpot_p99"] * 1e3 for r in res.values()], color=["tab:gray", "tab:blue"])
ax[1].set(ylabel="TPOT p99 (ms)", title="time per output token")
plt.show()
# the same weights give the same greedy tokens in both (transformers is the oracle; fp32 ties could flip a token)
assert sum(same) >= N_REQ - 1
# static batching computes every batch member until the batch's longest request ends: the slots it wastes
slots = sum(BATCH * max(out_lens[i : i + BATCH]) for i in range(0, N_REQ, BATCH))
speedup = co["tok_s"] / st["tok_s"]
print(f"static batching: {1 - useful / slots:.0%} of its decode slots produce nothing; "
      f"continuous / static throughput: {speedup:.2f}x (issue goal >= 2x: {'met' if speedup >= 2 else 'NOT met'} "
      f"in this run), TPOT p99 {co['tpot_p99'] / st['tpot_p99']:.2f}x static's")  # fmt: skip
assert 1 - useful / slots > 0.25  # this workload's arithmetic (output lengths 8-96, batches of 8)
# continuous batching delivers well over static batching's useful tokens per second (goal >= 2x: measured 2.2x on a
# quiet machine, 1.5-1.6x with two other processes loading the two cores; the asserted margin is > 1.3x)
assert speedup > 1.3, speedup
# ... at no worse a per-token latency (the goal's "equal p99 TPOT"; measured lower, asserted within 1.25x under load)
assert co["tpot_p99"] <= 1.25 * st["tpot_p99"], (co["tpot_p99"], st["tpot_p99"])

# %% [markdown]
# Reading the numbers: on this workload static batching leaves over a quarter of its decode slots idle (a finished
# request keeps its row until the batch's longest one ends), and the next batch waits for the whole previous one;
# the engine fills a freed slot at the next step. The measured gap (printed above the plot) also contains each
# framework's own per-step cost — transformers' `generate` runs torch eager with its logits processors, the engine
# runs tinylearn's ops — so it is the gap a user sees, not the scheduling effect alone.
# The tokens are the same: batching changes when a token is computed, never which.

# %% [markdown]
# ## 3. Automatic prefix caching: hashes, reference counts, the hit rate read from the cache [Q203]
#
# Requests that share a prefix (a system prompt, a few-shot header, an earlier turn) would recompute the same K/V.
# The block manager indexes every **full** block by a hash chained over the prefix, $h_i = H(h_{i-1}, \text{tokens of
# block } i)$, so a hit on block $i$ means the whole prefix up to it matches (the stored tokens are compared too, so a
# collision cannot share wrong K/V). A new request walks its blocks through the index, takes every hit by reference
# (refcount + 1, no copy) and computes only the rest — at least its last token, whose logits it needs. Blocks whose
# refcount falls to 0 stay indexed as *cached* and are evicted least-recently-freed first only when the pool needs
# them. Below: 12 requests with the same 448-token system prompt and their own 24-token question, arriving one after
# another, with prefix caching on and off.

# %%
# NBVAL_IGNORE_OUTPUT
SYS, Q, N_PC = 448, 24, 12
pc = np.random.default_rng(9)
system = pc.integers(0, 256, SYS).tolist()
questions = [pc.integers(0, 256, Q).tolist() for _ in range(N_PC)]


def run_prefix(caching: bool) -> tuple[list[float], dict]:
    e = Engine(model, enable_prefix_caching=caching, max_num_batched_tokens=512)
    ttft = []
    for q in questions:  # one at a time: TTFT is the prefill of what the cache does not hold
        (o,) = e.generate([system + q], SamplingParams(temperature=0, max_tokens=1))
        ttft.append(o.metrics["first_token_s"] - o.metrics["arrival_s"])
    return ttft, e.stats()


with limited_threads(1, torch=True):
    run_prefix(True)  # warm-up
    pcs = {False: [], True: []}
    for _ in range(3):  # interleaved: a load change on the machine hits both alike
        for c in pcs:
            pcs[c].append(run_prefix(c))
# requests 2..N (the first one fills the cache): each request's best of the 3 interleaved runs, then the median
ttft = {c: float(np.median(np.min([r[0][1:] for r in rs], axis=0))) for c, rs in pcs.items()}
stats_on = pcs[True][0][1]
print(f"prefix cache: queried {stats_on['prefix_queried_tokens']} tokens, hit {stats_on['prefix_hit_tokens']} "
      f"(hit rate {stats_on['prefix_hit_rate']:.3f})")  # fmt: skip
print(f"TTFT p50: {ttft[False] * 1e3:.2f} ms without, {ttft[True] * 1e3:.2f} ms with prefix caching "
      f"({ttft[False] / ttft[True]:.1f}x)")  # fmt: skip
# the hit count is arithmetic: requests 2..12 each find the 448 / 16 = 28 full blocks of the system prompt
assert stats_on["prefix_hit_tokens"] == (N_PC - 1) * SYS
assert stats_on["prefix_queried_tokens"] == N_PC * (SYS + Q)
assert abs(stats_on["prefix_hit_rate"] - (N_PC - 1) * SYS / (N_PC * (SYS + Q))) < 1e-12
assert pcs[False][0][1]["prefix_hit_tokens"] == 0
cut = ttft[False] / ttft[True]
print(f"issue goal: prefix caching cuts TTFT p50 >= 3x: {'met' if cut >= 3 else 'NOT met'} ({cut:.1f}x)")
# computing 24 tokens instead of 472 cuts the time to first token several-fold (goal >= 3x; the asserted margin,
# > 2.5x, holds under load from other processes: both sides are measured in the same run, each request's best of 3)
assert cut > 2.5, cut
fig, ax = plt.subplots(figsize=(6, 3))
for c, rs in pcs.items():
    ax.plot(range(1, N_PC + 1), np.array(rs[0][0]) * 1e3, "o-", label=f"prefix caching {'on' if c else 'off'}")
ax.set(xlabel="request", ylabel="TTFT (ms)", title="same 448-token system prompt, 24-token questions")
ax.legend()
plt.show()

# %% [markdown]
# ## 4. Chunked prefill: trading the long prompt's TTFT for everyone else's TPOT
#
# Without chunking, a long prompt's prefill runs as one step, and every decoding request waits for it: their time per
# output token (TPOT) spikes by the whole prefill. With chunked prefill the scheduler gives the prompt only what is
# left of the token budget after the decodes, over several steps: decodes keep their pace, the long prompt's first
# token comes later. Below, 8 requests are decoding when a 448-token prompt arrives; the budget is 64 tokens per step
# with chunking and 512 (the whole prompt) without (each the best of three runs).

# %%
# NBVAL_IGNORE_OUTPUT
ch = np.random.default_rng(13)
short = [ch.integers(0, 256, 32).tolist() for _ in range(8)]
long_prompt = ch.integers(0, 256, 448).tolist()


def run_chunked(chunked: bool) -> tuple[float, float]:
    """(the longest step while the long prompt prefills = the decoders' worst TPOT, the long prompt's TTFT)."""
    e = Engine(model, chunked_prefill=chunked, max_num_batched_tokens=64 if chunked else 512,
               enable_prefix_caching=False)  # fmt: skip
    for p in short:
        e.add_request(p, SamplingParams(temperature=0, max_tokens=48, ignore_eos=True))
    ttft = None
    gc.disable()  # as the bench harness does: a collection inside one step is not the step's cost
    try:
        while e.has_unfinished():
            if e.num_steps == 12:
                e.add_request(long_prompt, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
                              request_id="long")  # fmt: skip
            for o in e.step():
                if o.request_id == "long" and ttft is None and o.metrics["first_token_s"] is not None:
                    ttft = o.metrics["first_token_s"] - o.metrics["arrival_s"]
    finally:
        gc.enable()
    worst = max(s["duration_s"] for s in e.step_log if s["num_prefill_tokens"] and s["num_decode_tokens"] == 8)
    return worst, ttft


with limited_threads(1, torch=True):
    run_chunked(True)
    cres = {False: [], True: []}
    for _ in range(3):  # interleaved, as above
        for c in cres:
            cres[c].append(run_chunked(c))
# best of the 3 runs: a busy neighbour only adds time, and a worst step (a max) catches any spike it causes
gap = {c: min(r[0] for r in rs) for c, rs in cres.items()}
ttft_long = {c: min(r[1] for r in rs) for c, rs in cres.items()}
for c in (False, True):
    print(f"chunked prefill {'on ' if c else 'off'}: decoders' worst step {gap[c] * 1e3:6.2f} ms, "
          f"long prompt's TTFT {ttft_long[c] * 1e3:6.2f} ms")  # fmt: skip
# the trade: chunking shrinks the decoders' worst step (one 448-token prefill step vs steps of 56 + 8 tokens) ...
assert gap[True] < gap[False]
# ... and the long prompt's first token comes later (7 steps shared with decodes instead of one)
assert ttft_long[True] > ttft_long[False]
fig, ax = plt.subplots(figsize=(6, 3))
ax.bar(["worst TPOT gap\n(decoding requests)", "TTFT\n(448-token prompt)"], [gap[False] * 1e3, ttft_long[False] * 1e3],
       width=-0.35, align="edge", label="one-step prefill")  # fmt: skip
ax.bar(["worst TPOT gap\n(decoding requests)", "TTFT\n(448-token prompt)"], [gap[True] * 1e3, ttft_long[True] * 1e3],
       width=0.35, align="edge", label="chunked (64-token budget)")  # fmt: skip
ax.set(ylabel="ms")
ax.legend()
plt.show()

# %% [markdown]
# ## 5. When KV memory runs out: preemption by swap or recompute, and INT8 blocks [Q107]
#
# Admission reserves blocks for the prompt only; decoding sequences grow one token at a time, so a busy engine can
# run out of blocks mid-flight. The scheduler then **preempts** the running request last in policy order: by
# *recompute* (free its blocks; it re-enters the waiting queue with prompt + generated tokens as its new prompt and is
# prefilled again later — its prefix may still be a cache hit) or by *swap* (copy its blocks to a host store, here a
# `TieredKVStore`; copy them back when blocks free up: exact bytes, no recompute). Swap moves $2 \times$ the KV bytes
# over the host link; recompute spends a prefill. Low-bit blocks shrink the problem itself: INT8 codes with one fp32
# scale per (token, head) take $(d_h + 4)/(4 d_h)$ of fp32's bytes. Token-priority eviction bounds one long sequence
# (end of this section; its re-expansion is notebook 09 §4). Below: 16 requests that together need about 4x the pool.

# %%
# NBVAL_IGNORE_OUTPUT
pr = np.random.default_rng(21)
pre_prompts = [pr.integers(0, 256, 48).tolist() for _ in range(16)]
pre_params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
reference = [o.token_ids for o in Engine(model, enable_prefix_caching=False).generate(pre_prompts, pre_params)]


def run_preempt(mode: str, num_blocks: int = 28) -> dict:
    # the host store holds fp32 blocks shaped like the engine's: [layers, K/V, block_size, kv heads, head_dim]
    shape = (cfg.n_layers, 2, 16, cfg.kv_heads, cfg.head_dim)
    store = TieredKVStore(shape, np.float32, fast_blocks=256) if mode == "swap" else None
    e = Engine(model, num_blocks=num_blocks, preemption=mode, enable_prefix_caching=False, max_num_seqs=16,
               host_store=store)  # fmt: skip
    assert store is None or tuple(e.host_block_shape) == shape
    t0 = time.perf_counter()
    outs = e.generate(pre_prompts, pre_params)
    wall = time.perf_counter() - t0
    prefilled = sum(s["num_prefill_tokens"] for s in e.step_log)
    res = dict(wall=wall, tokens=[o.token_ids for o in outs], prefilled=prefilled, **e.stats())
    if store is not None:
        res["store"] = store.stats()
        store.close()
    return res


with limited_threads(1, torch=True):
    pre_runs = {"recompute": [], "swap": []}
    for _ in range(3):  # interleaved, so that a load change on the machine hits both modes alike
        for m in pre_runs:
            pre_runs[m].append(run_preempt(m))
for m, rs in pre_runs.items():
    r = rs[0]
    print(f"{m:9s}: wall {np.median([x['wall'] for x in rs]) * 1e3:6.1f} ms, preemptions "
          f"{r['preemptions_recompute'] + r['preemptions_swap']:3d}, prefilled tokens {r['prefilled']:5d} "
          f"(prompts: {16 * 48}), blocks swapped out/in {r['swapped_blocks_out']}/{r['swapped_blocks_in']}, "
          f"steps {r['num_steps']}")  # fmt: skip
rec, swp = pre_runs["recompute"][0], pre_runs["swap"][0]
# preemption changes when tokens are computed, never which: both equal the unconstrained run token for token
assert rec["tokens"] == reference and swp["tokens"] == reference
assert rec["preemptions_recompute"] > 0 and swp["preemptions_swap"] > 0
# recompute pays with prefill work, swap with copies: swap prefills only the prompts; every block out comes back in
assert rec["prefilled"] > 16 * 48 and swp["prefilled"] == 16 * 48
assert swp["swapped_blocks_out"] == swp["swapped_blocks_in"] > 0

# %% [markdown]
# Reading it: both modes preempt the same requests (the scheduler's choice does not depend on the mode), and both
# reproduce the unconstrained tokens exactly. Recompute prefilled the preempted requests' prompts and generated
# tokens again (the extra prefill tokens above); swap prefilled only the prompts and moved each preempted block out and
# back. On this tiny model the wall times are close (printed, not asserted): a 32 KiB block copy and a short prefill
# both cost tens of microseconds. On a GPU the trade is priced by PCIe bandwidth for swap ($2 \times$ the sequence's KV
# bytes) against the prefill FLOPs for recompute: recompute wins for short sequences, swap for long ones.
#
# **INT8 and FP8 KV blocks.** The same pool size in bytes holds more tokens when blocks are INT8 or FP8 (E4M3):

# %%
# NBVAL_IGNORE_OUTPUT
e32 = Engine(model, enable_prefix_caching=False)
e8 = Engine(model, enable_prefix_caching=False, kv_dtype="int8")
b32, b8 = (x.bm.cache.stats()["bytes_per_token"] for x in (e32, e8))
print(f"KV bytes per token: fp32 {b32:.0f}, int8 {b8:.0f} ({b8 / b32:.3f} of fp32)")
hd = cfg.head_dim
assert b8 / b32 == (hd + 4) / (4 * hd)  # codes (1 byte) + one fp32 scale per (token, head) per head_dim values
q_prompts = pre_prompts[:8]
sp16 = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
t32 = [o.token_ids for o in e32.generate(q_prompts, sp16)]
t8 = [o.token_ids for o in e8.generate(q_prompts, sp16)]
agree = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x)) for x, y in zip(t32, t8)]
print(f"greedy tokens identical to fp32 KV before the first divergence: {agree} (of 16)")
# int8 K/V perturbs the logits slightly: most requests' greedy continuations start identical
assert np.median(agree) >= 4
# FP8 (E4M3) blocks: the same bytes as int8 (a code per value + a scale per (token, head)), but 3 mantissa bits
# give a relative error up to 2^-4 per value where int8's per-row grid is finer for rows of similar magnitudes
e_f8 = Engine(model, enable_prefix_caching=False, kv_dtype="fp8_e4m3")
t_f8 = [o.token_ids for o in e_f8.generate(q_prompts, sp16)]
agree_f8 = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x)) for x, y in zip(t32, t_f8)]
print(f"fp8_e4m3 KV: {e_f8.bm.cache.stats()['bytes_per_token']:.0f} bytes per token; greedy tokens identical to fp32 "
      f"KV before the first divergence: {agree_f8} (of 16)")  # fmt: skip
assert e_f8.bm.cache.stats()["bytes_per_token"] == b8
assert sum(agree_f8) <= sum(agree)  # on these rows int8 keeps closer to fp32 than E4M3 does

# %% [markdown]
# **Token-priority eviction for a long context [Q107].** Preemption evicts whole sequences; a single long context can
# instead drop its *least useful tokens*. With `Engine(..., kv_token_budget=B, kv_evict_recent=R)`, after a step a
# sequence holding more than B tokens of K/V keeps its last R tokens and, up to B − block_size, the tokens its latest
# query attends to most (summed over layers and heads: H2O's heavy hitters, the policy of notebook 09 §4), and
# `PagedKVCache.evict_tokens` re-packs them into fewer blocks, freeing the rest. Positions keep counting the dropped
# tokens. The outputs become **approximate** from the first eviction on (attention no longer sees the dropped
# tokens); what is exact is the memory bound. A 400-token prompt (prefilled in one step) generating 48 tokens under a
# budget of 96 tokens:

# %%
# NBVAL_IGNORE_OUTPUT
long_prompt = np.random.default_rng(23).integers(0, 256, 400).tolist()
sp48 = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
exact = Engine(model, enable_prefix_caching=False, max_num_batched_tokens=512).generate([long_prompt], sp48)[0]
exact = exact.token_ids
ev = Engine(model, enable_prefix_caching=False, max_num_batched_tokens=512, kv_token_budget=96, kv_evict_recent=32)
rid = ev.add_request(long_prompt, sp48)
held = []
while ev.has_unfinished():
    outs = ev.step()
    if rid in ev.seqs:
        held.append((len(ev.kv_positions(rid)), ev.stats()["kv_blocks_used"]))
    done = [o for o in outs if o.finished]
approx = done[0].token_ids
same = next((i for i, (a, b) in enumerate(zip(exact, approx)) if a != b), len(exact))
print(f"KV tokens held after each step: max {max(h for h, _ in held)} (budget 96; without eviction up to "
      f"{len(long_prompt) + 48}); blocks in use: max {max(b for _, b in held)} of the {-(-448 // 16)} the full "
      f"context needs; {ev.stats()['kv_evicted_tokens']} tokens evicted in all")  # fmt: skip
print(f"greedy tokens equal to the exact run for the first {same} of 48 (approximate after the first eviction)")
assert max(h for h, _ in held) <= 96 and max(b for _, b in held) <= 96 // 16
assert ev.stats()["kv_evicted_tokens"] >= 400 + 47 - 96 and ev.stats()["kv_blocks_used"] == 0  # 447 computed
assert same >= 1  # the whole prompt was prefilled in one step, before any eviction: the first token is exact

# %%
tmp = tempfile.TemporaryDirectory()  # every file of sections 6-8 lives here; removed at the end of section 8
gpt = tiny_model(seed=0)  # the served model: byte vocab 258, d_model 128, 4 heads, 2 layers, random weights
cfg = gpt.config

# %% [markdown]
# ## 6. Tiered KV with prefetch [Q113] [Q244]
#
# When the KV of long contexts outgrows the accelerator, blocks move down a hierarchy and come back on demand.
# `TieredKVStore` is that hierarchy on a host: a **fast** arena (numpy slots), a **slow** compressed-RAM tier
# (byte-shuffle + zlib-1, lossless) and a **disk** tier (an `np.memmap` file). Every tier keeps its blocks in LRU
# order; a full tier demotes its least-recently-used block one level down, so the global order is
# disk < slow < fast by recency — exactly the "L1 hot / L2 warm / L3 cold" recency policy of Q244. A `get` promotes
# the block back to fast; `prefetch(keys)` does that on a background thread, so a sequential scan of a long
# sequence (attention reads its blocks in order) finds the next blocks already fast.
#
# The blocks below are real KV: a 384-token prefill of the served TinyGPT, cut into 24 blocks of 16 tokens in the
# engine's host-block layout [layers, K/V, 16 tokens, KV heads, head_dim] (32 KiB of fp32 each).

# %%
# NBVAL_IGNORE_OUTPUT
# (the KV values, hence their compressed size, depend on the BLAS summation order)
BS = 16
ids_long = np.random.default_rng(0).integers(0, cfg.vocab_size, (1, 384))
dense = gpt.new_cache()
with no_grad():
    gpt.logits_last(ids_long, dense)
k_all, v_all = kv_from_dense_cache(dense)  # [L, S, Hkv, D]
kv_blocks = [
    np.ascontiguousarray(np.stack([k_all[:, i : i + BS], v_all[:, i : i + BS]], axis=1))
    for i in range(0, k_all.shape[1], BS)
]
assert kv_blocks[0].shape == Engine(gpt, block_size=BS, num_blocks=4).host_block_shape  # the engine's swap unit
raw_bytes = sum(b.nbytes for b in kv_blocks)
ratio = {c: raw_bytes / sum(len(compress_block(b, c)) for b in kv_blocks) for c in ("shuffle-zlib", "zlib")}
print(f"{len(kv_blocks)} KV blocks of {kv_blocks[0].nbytes // 1024} KiB; lossless compression ratio on real fp32 KV:")
print(f"  byte-shuffle + zlib-1: {ratio['shuffle-zlib']:.3f}x   plain zlib-1: {ratio['zlib']:.3f}x")
assert 1.0 < ratio["zlib"] < ratio["shuffle-zlib"] < 1.5  # shuffling helps, but fp32 KV mantissas are noise

# %% [markdown]
# Per-tier `get` latency, measured in the steady state of a swap tier: a store whose fast tier holds one block, so
# each get from "slow" or "disk" also demotes the block it displaces (a compression, or a write into the mapped
# file). The disk tier here reads through the OS page cache (the file was just written); a block evicted from the
# page cache would add the SSD's read latency on top.

# %%
# NBVAL_IGNORE_OUTPUT
# (timings)
n_blk = len(kv_blocks) - 1
tier_cfg = {
    "fast": {"fast_blocks": n_blk + 1},
    "slow": {"fast_blocks": 1, "slow_blocks": n_blk},
    "disk": {"fast_blocks": 1, "disk_path": tmp.name, "disk_blocks": n_blk},
}
get_us = {}
with limited_threads(1, torch=True):
    for tier, kw in tier_cfg.items():
        with TieredKVStore(kv_blocks[0].shape, np.float32, **kw) as store:
            for i, b in enumerate(kv_blocks):
                store.put(i, b)
            keys = itertools.cycle(range(n_blk + 1))  # cycling in LRU order: every get is served by `tier`
            get_us[tier] = measure(lambda store=store, keys=keys: store.get(next(keys)), repeat=15).median * 1e6
            served = {t: store.stats()[t]["gets"] for t in tier_cfg}
            assert served[tier] == sum(served.values()) > 0, served
            if tier == "slow":
                slow_ratio = store.stats()["slow"]["compression_ratio"]
for tier, us in get_us.items():
    print(f"get from {tier:4s}: {us:8.1f} us  ({us / get_us['fast']:6.1f}x fast)")
print(f"slow tier stores {1 / slow_ratio:.0%} of the raw bytes (ratio {slow_ratio:.3f})")
assert get_us["slow"] > 5 * get_us["disk"]  # zlib on every move costs far more than a page-cached memmap copy
assert 0.8 < 1 / slow_ratio < 0.95  # ... and keeps 80-95% of the bytes (measured 88%)

# %% [markdown]
# The honest result: for fp32 KV on a CPU the compressed RAM tier is the *slowest* tier — over 5x (measured ~50x)
# slower than the page-cached disk tier, because zlib runs on every demotion and promotion — and it saves only
# 5-20% of the bytes (measured 12%): the low mantissa bytes of activations are noise, incompressible. Lossless
# compression earns its place only for low-entropy blocks (zero padding, repeated scales); a real system keeps the
# host tier as plain pinned RAM and quantizes the KV (int8/FP8) instead.
#
# **Sequential scan with prefetch.** A long sequence's 24 blocks are written in order, so the oldest are on disk;
# then attention scans them in order, doing ~3 ms of work per block (`time.sleep`, standing for the block's
# compute). Without prefetch every get misses (LRU's worst case: a scan longer than the fast tier). With prefetch of
# the next 2 blocks after each get, the background thread promotes them during the work of the current one.

# %%
# NBVAL_IGNORE_OUTPUT
# (the prefetch thread races the 3 ms of work: a hit count, measured)


def scan(prefetch_next: int, work_s: float = 3e-3) -> dict:
    """Write the blocks, then read them in order; count which tier served each get and time the stalls."""
    with TieredKVStore(
        kv_blocks[0].shape, np.float32, fast_blocks=6, slow_blocks=6, disk_path=tmp.name, disk_blocks=16
    ) as store:
        for i, b in enumerate(kv_blocks):
            store.put(i, b)
        served, stall = [], []
        for i in range(len(kv_blocks)):
            before = {t: store.stats()[t]["gets"] for t in tier_cfg}
            t0 = time.perf_counter()
            blk = store.get(i)
            stall.append(time.perf_counter() - t0)
            after = store.stats()
            served.append(next(t for t in tier_cfg if after[t]["gets"] > before[t]))
            assert np.array_equal(blk, kv_blocks[i])  # exact bytes back from every tier
            if prefetch_next:
                store.prefetch(list(range(i + 1, min(i + 1 + prefetch_next, len(kv_blocks)))))
            time.sleep(work_s)
        st = store.stats()
    return dict(served=served, stall=np.array(stall), hits=st["hits"], prefetch_hits=st["prefetch_hits"])


runs = {"no prefetch": scan(0), "prefetch next 2": scan(2)}
for name, r in runs.items():
    frac, tiers_seen, stall_ms = r["hits"] / len(kv_blocks), "".join(t[0] for t in r["served"]), r["stall"].sum() * 1e3
    print(f"{name:15s}: fast hits {r['hits']:2d}/24 ({frac:.0%}), tiers {tiers_seen}, stall {stall_ms:.2f} ms")
none, pref = runs["no prefetch"], runs["prefetch next 2"]
assert none["served"] == ["disk"] * len(kv_blocks) and none["hits"] == 0  # without prefetch: every get misses
assert pref["hits"] >= len(kv_blocks) // 2 and pref["prefetch_hits"] == pref["hits"]  # measured: 20+ of 24
assert pref["stall"].sum() < none["stall"].sum()

fig, ax = plt.subplots(figsize=(7, 3))
for name, r in runs.items():
    ax.semilogy(np.arange(len(kv_blocks)), r["stall"] * 1e6, "o-", ms=4, label=f"{name} ({r['hits']} fast hits)")
ax.set_xlabel("block of the sequence (scan order)")
ax.set_ylabel("get latency (us)")
ax.set_title("Sequential KV scan through fast / slow / disk tiers")
ax.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# **The L1/L2/L3 recency policy [Q244]** is the LRU demotion order. Touch a few blocks and each block's tier is
# determined by its recency rank alone: the 4 most recently used are in fast (L1), the next 4 in slow (L2), the
# rest on disk (L3).

# %%
with TieredKVStore(
    kv_blocks[0].shape, np.float32, fast_blocks=4, slow_blocks=4, disk_path=tmp.name, disk_blocks=8
) as store:
    last_use = {}
    clock = itertools.count()
    for i in range(12):
        store.put(i, kv_blocks[i])
        last_use[i] = next(clock)
    for i in (0, 5, 2, 9, 5):  # a recency pattern: old blocks 0, 2 and 5 come back into use
        store.get(i)
        last_use[i] = next(clock)
    tiers = {i: store.tier_of(i) for i in range(12)}
by_recency = sorted(last_use, key=last_use.get, reverse=True)
print("blocks by recency (most recent first):", by_recency)
for t in ("fast", "slow", "disk"):
    print(f"  {t}: {sorted(i for i in tiers if tiers[i] == t)}")
assert [tiers[i] for i in by_recency] == ["fast"] * 4 + ["slow"] * 4 + ["disk"] * 4

# %% [markdown]
# ### Delta-compressed K/V in the swap tier [Q137]
#
# Q137's premise: during generation adjacent tokens' K/V rows differ sparsely or by small amounts, so a host tier
# could keep each row as the entries that changed. `DeltaKVStore` is such a host tier for the engine's swap
# preemption: each (layer, K/V) slice [16 tokens, kv heads x head_dim] of a swapped block is stored by notebook 09's
# `delta_compress` — a keyframe row, then per row only the entries with |x_t − r_{t−1}| > threshold against the
# *reconstructed* previous row (so the error never accumulates: |x − r| ≤ threshold), a row whose delta would cost
# more than the row stored in full — and rebuilt by `delta_decompress` on swap-in. Threshold 0 is lossless bit for
# bit (the store patches the rare entry whose bits differ, e.g. −0.0 after +0.0). Below: section 5's workload (16
# requests, 4x the 28-block pool), swapped through the delta tier at threshold 0 and at a quarter of the K/V's RMS.

# %%
# NBVAL_IGNORE_OUTPUT
# (the K/V values, hence the bytes kept, depend on the BLAS summation order)
kv_arr = np.stack(kv_blocks)  # section 6's 24 full blocks of real K/V: [block, L, K/V, token, kv head, head_dim]
kv_rms = float(np.sqrt(np.mean(kv_arr.astype(np.float64) ** 2)))
adj_med = float(np.median(np.abs(np.diff(kv_arr, axis=3))))  # |x_t - x_{t-1}| between adjacent tokens
print(f"real K/V: RMS {kv_rms:.3f}, median |x_t - x_(t-1)| {adj_med:.3f} ({adj_med / kv_rms:.0%} of the RMS)")
assert adj_med > 0.5 * kv_rms  # random-init TinyGPT: adjacent tokens' K/V are NOT similar -- the premise fails here


def run_delta(threshold: float) -> dict:
    store = DeltaKVStore(threshold, keyframe_every=16)
    e = Engine(model, num_blocks=28, preemption="swap", enable_prefix_caching=False, max_num_seqs=16,
               host_store=store)  # fmt: skip
    toks = [o.token_ids for o in e.generate(pre_prompts, pre_params)]
    return dict(tokens=toks, **e.stats(), store=store.stats())


with limited_threads(1, torch=True):
    delta_runs = {th: run_delta(th) for th in (0.0, round(0.25 * kv_rms, 3))}
for th, r in delta_runs.items():
    ds = r["store"]
    n_same = sum(t == ref for t, ref in zip(r["tokens"], reference))
    print(f"threshold {th:5.3f}: {ds['puts']} blocks swapped, {ds['raw_bytes'] / 2**20:.3f} MiB raw -> "
          f"{ds['stored_bytes'] / 2**20:.3f} MiB stored (ratio {ds['ratio']:.3f}), entries kept in delta rows "
          f"{ds['kept_fraction']:.0%}, max |error| {ds['max_abs_error']:.4f}; requests with the unconstrained run's "
          f"tokens: {n_same}/16")  # fmt: skip
(th0, r0), (th1, r1) = delta_runs.items()
d0, d1 = r0["store"], r1["store"]
for r in (r0, r1):  # every swapped block came back through the tier
    assert r["preemptions_swap"] > 0 and r["swapped_blocks_out"] == r["swapped_blocks_in"] == r["store"]["gets"] > 0
# threshold 0: lossless -- the exact tokens of the unconstrained run, zero reconstruction error
assert r0["tokens"] == reference and d0["max_abs_error"] == 0.0
# lossy: the error bound holds (threshold rounded to float32) and buys a few more percent, not a multiple
assert 0 < d1["max_abs_error"] <= np.float32(th1) and d0["ratio"] < d1["ratio"] < 1.25
assert 1.0 <= d0["ratio"] < 1.1 and d1["kept_fraction"] > 0.8  # most entries move by more than a quarter RMS
assert r1["tokens"] != reference  # and the perturbed K/V changes some greedy continuations
# where the 0-threshold saving comes from: rows that do not change at all. Full blocks of real K/V save ~nothing;
# a block whose last 8 rows are not yet written (zeros: the tail of a sequence's last block) nearly halves
full0, tail0 = DeltaKVStore(0.0), DeltaKVStore(0.0)
for i, b in enumerate(kv_blocks):
    full0.put(i, b)
    half = b.copy()
    half[:, :, 8:] = 0.0
    tail0.put(i, half)
print(f"threshold 0 on section 6's full real blocks: ratio {full0.stats()['ratio']:.4f}; the same blocks with "
      f"their last 8 of 16 rows unwritten: ratio {tail0.stats()['ratio']:.3f}")  # fmt: skip
assert full0.stats()["ratio"] < 1.01 < d0["ratio"] and tail0.stats()["ratio"] > 1.5

# %% [markdown]
# What is measured, honestly: on this randomly initialised TinyGPT the premise of Q137 **fails** — adjacent tokens'
# K/V differ by about as much as the values themselves (the median adjacent difference is most of the RMS), so
# threshold 0 saves under 10% (measured ~2%), and that from rows that do not change at all (the unwritten tail of a
# sequence's last block; full blocks of real K/V save under 1%); even a lossy threshold of a quarter of the RMS
# keeps over 80% of the entries, saves under a fifth of the bytes (measured ~8%) and already changes some greedy
# outputs. The mechanism is sound — lossless at 0, a hard per-entry bound otherwise, exact byte accounting (the
# tests: a slowly varying sequence compresses > 3x) — but the gain is a property of the model's K/V along tokens,
# which a trained model may correlate far more than this random one (not measured here): measure before enabling.

# %% [markdown]
# ## 7. An append-only KV journal and fast recovery [Q143]
#
# Persisting a long context's KV by re-dumping the whole cache every step costs O(context) per token. A journal
# writes only the **increment**: `KVJournal.append(seq_id, start_pos, k, v)` logs the K/V of the new tokens at
# their offset and returns once the record is queued; a writer thread appends records (32-byte header with a CRC32,
# then the K and V bytes) and fsyncs them in groups. `recover(path)` replays the log into each sequence's full K/V;
# a crash mid-write leaves a torn last record, which recovery detects (length/CRC) and drops, so every sequence
# comes back as an exact prefix of what was appended. Replaying bytes is far cheaper than recomputing the KV with a
# prefill: over 5x here (asserted; the printed times give this run's ratio).
#
# Two sequences of the served model: prefills of 256 and 192 tokens, then 24 interleaved decode steps, each logging
# one token per sequence.

# %%
rng = np.random.default_rng(7)
prompts_j = {0: rng.integers(0, cfg.vocab_size, (1, 256)), 1: rng.integers(0, cfg.vocab_size, (1, 192))}
caches = {s: gpt.new_cache() for s in prompts_j}
toks_j = {}  # each sequence's tokens: prompt + generated
jpath = os.path.join(tmp.name, "kv.journal")
with (
    no_grad(),
    KVJournal(jpath, n_layers=cfg.n_layers, n_kv_heads=cfg.kv_heads, head_dim=cfg.head_dim, fsync_every=8) as journal,
):
    for s, ids in prompts_j.items():
        logits = gpt.logits_last(ids, caches[s])  # prefill
        journal.append(s, 0, *kv_from_dense_cache(caches[s]))
        toks_j[s] = [int(t) for t in ids[0]] + [int(np.argmax(logits[0]))]  # prompt + first generated token
    for _ in range(24):  # decode: each step journals only the K/V of the token it feeds
        for s, cache in caches.items():
            pos = cache.length
            toks_j[s].append(int(np.argmax(gpt.logits_last(np.array([[toks_j[s][-1]]]), cache)[0])))
            k, v = kv_from_dense_cache(cache)
            journal.append(s, pos, k[:, pos : pos + 1], v[:, pos : pos + 1])
    journal.flush()  # durable: every record written and fsynced
    jstats = journal.stats()
rec = recover(jpath)
for s, cache in caches.items():
    k, v = kv_from_dense_cache(cache)
    assert np.array_equal(rec[s][0], k) and np.array_equal(rec[s][1], v)  # bit-exact
rec_lens = {s: kv[0].shape[1] for s, kv in rec.items()}
mib = os.path.getsize(jpath) / 2**20
print(f"{jstats['records']} records, {mib:.2f} MiB; recovered lengths {rec_lens}, reason {rec.reason!r}")
assert jstats["records"] == 2 + 2 * 24 and rec.records == 50 and rec.dropped_bytes == 0
assert rec_lens == {0: 280, 1: 216}

# %% [markdown]
# A crash in the middle of the last write: cut the file half-way through the final record (sequence 1's last
# decode token). Recovery stops at the torn record, drops exactly its bytes and returns the rest bit-exact;
# reopening the journal truncates the torn tail so new records are never written behind garbage.

# %%
torn = os.path.join(tmp.name, "kv_torn.journal")
shutil.copyfile(jpath, torn)
rec_bytes = 32 + 2 * cfg.n_layers * cfg.kv_heads * cfg.head_dim * 4  # header + K and V of one token
with open(torn, "r+b") as f:
    f.truncate(os.path.getsize(jpath) - rec_bytes // 2)
rt = recover(torn)
torn_lens = {s: kv[0].shape[1] for s, kv in rt.items()}
print(f"torn: reason {rt.reason!r}, {rt.records} records kept, {rt.dropped_bytes} bytes dropped, lengths {torn_lens}")
assert rt.reason == "truncated payload" and rt.records == 49 and rt.dropped_bytes == rec_bytes - rec_bytes // 2
assert np.array_equal(rt[0][0], rec[0][0]) and np.array_equal(rt[1][1], rec[1][1][:, :215])  # seq 1 lost 1 token
with KVJournal(torn, n_layers=cfg.n_layers, n_kv_heads=cfg.kv_heads, head_dim=cfg.head_dim) as j2:
    j2.append(1, 215, rec[1][0][:, 215:], rec[1][1][:, 215:])  # re-log the lost token after the reopen
assert recover(torn).dropped_bytes == 0 and np.array_equal(recover(torn)[1][0], rec[1][0])

# %% [markdown]
# Recovery time vs recomputing: replaying the log is a file read plus a copy; recomputing the same KV is a prefill
# forward pass over every token of both sequences.

# %%
# NBVAL_IGNORE_OUTPUT
# (timings)


def prefill_both() -> None:
    with no_grad():
        for toks in toks_j.values():
            gpt.logits_last(np.array([toks[:-1]]), gpt.new_cache())


with limited_threads(1, torch=True):
    t_rec = measure(lambda: recover(jpath), repeat=7).median
    t_pre = measure(prefill_both, repeat=5).median
print(
    f"append (caller side) {jstats['mean_append_s'] * 1e6:.1f} us/record vs writer {jstats['mean_write_s'] * 1e6:.1f}"
    f" us/record; {jstats['records_per_fsync']:.1f} records per fsync"
)
print(f"recover {t_rec * 1e3:.2f} ms  vs  recompute by prefill {t_pre * 1e3:.1f} ms  ({t_pre / t_rec:.0f}x)")
assert t_rec * 5 < t_pre  # measured 40-70x

# %% [markdown]
# ## 8. Scored cache eviction [Q193] [Q220] and shard prewarming [Q162]
#
# A long-conversation cache holds conversations' KV prefixes and retrieved documents under a byte budget.
# `ScoredCache` evicts the entry with the lowest score. LRU and LFU look only at the past; **semantic + decay**
# [Q193] scores `0.5 * cos(entry embedding, current context) + 0.5 * 2^(-age / 50 requests)`: what the conversation
# is about *now* plus recency. The **learned** scorer [Q220] is a logistic regression on (log age, log frequency,
# cosine to the context, log size) predicting "requested within the next 50 requests", fitted by gradient descent
# on one trace and evaluated on another. The workload is a SYNTHETIC seeded trace (`topic_drift_trace`, not a
# measured one): the topic drifts every ~80 requests, a third of the requests are one-off documents that pollute
# LRU, old topics come back. Byte hit rate = bytes served from the cache / bytes requested.

# %%
# NBVAL_IGNORE_OUTPUT
# (the learned scorer's weights come from a gradient descent whose sums depend on the BLAS)
train_trace, test_trace = topic_drift_trace(3000, 100), topic_drift_trace(3000, 0)  # SYNTHETIC, two seeds
predictor = LinearAccessPredictor(window=50).fit_trace(train_trace)
X_test, y_test = access_dataset(test_trace, window=50)
auc = roc_auc(y_test, predictor.predict_proba(X_test))
weights = {n: round(float(c), 2) for n, c in zip(("log_age", "log_freq", "cos_ctx", "log_size"), predictor.coef_)}
print(f"learned access predictor: held-out AUC {auc:.3f} on {len(y_test)} (object, moment) pairs; weights {weights}")
scorers = {"LRU": LRUScorer(), "LFU": LFUScorer(), "semantic+decay": SemanticDecayScorer(0.5, 50), "learned": predictor}
caps = (128 << 10, 256 << 10, 512 << 10)
hit = {(c, n): replay_cache(test_trace, c, s)["byte_hit_rate"] for c in caps for n, s in scorers.items()}
for c in caps:
    print(f"capacity {c >> 10:4d} KiB: " + "  ".join(f"{n} {hit[c, n]:.3f}" for n in scorers))
assert auc > 0.8  # measured 0.94
for c in caps:
    assert hit[c, "semantic+decay"] > hit[c, "LRU"] and hit[c, "learned"] > hit[c, "LRU"], c
    if c >= 256 << 10:
        assert hit[c, "LFU"] == min(hit[c, n] for n in scorers)  # frequency alone keeps stale topics' entries
assert weights["cos_ctx"] > 0 and weights["log_freq"] > 0 and weights["log_age"] < 0

fig, ax = plt.subplots(figsize=(7, 3))
w = 0.2
for j, n in enumerate(scorers):
    ax.bar(np.arange(len(caps)) + (j - 1.5) * w, [hit[c, n] for c in caps], w, label=n)
ax.set_xticks(np.arange(len(caps)), [f"{c >> 10} KiB" for c in caps])
ax.set_ylabel("byte hit rate")
ax.set_title("Eviction scorers on a SYNTHETIC topic-drift trace (held-out seed)")
ax.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# Semantic + decay and the learned predictor beat LRU at every capacity; LFU is the worst of the four from 256 KiB
# on, since old topics' popular entries keep their counts after the topic has moved on. The learned model's weights
# say what matters: relevance to the current context and frequency up, age down.
#
# **Shard prewarming [Q162].** A server holding 8 adapters (or model shards, 128 KiB safetensors files each) keeps
# only 3 resident; a request for a cold one reads its file on the critical path. `MarkovPrewarmer` counts
# transitions shard → next shard on past traffic and, while a request is served (1 ms of work here), prefetches the
# top-k predicted next shards on a background thread. Cold loads on the critical path are a count fixed by the
# predictions and the capacity (the slot is reserved synchronously), not by timing; the trace is SYNTHETIC
# (`markov_trace`: each shard has 2 likely successors, 10% uniform noise), fitted on its first 300 requests and
# replayed on the next 200: 48 cold loads without prewarming, 25 with top-1, 11 with top-2.

# %%
# NBVAL_IGNORE_OUTPUT
# (stall times and late prefetches are measured; the cold-load counts are exact)
shard_dir = os.path.join(tmp.name, "adapters")
rng = np.random.default_rng(0)
ShardedCheckpoint.save(
    {f"a{i}.{w}": rng.standard_normal((128, 128)).astype(np.float32) for i in range(8) for w in ("A", "B")},
    shard_dir,
    lambda name: name.split(".")[0],
)
trace, _ = markov_trace(8, 500, 0, prefix="a")
prewarm = {}
for k in (0, 1, 2):
    with LazyModel(shard_dir, capacity=3) as lazy:
        prewarm[k] = replay_shards(
            lazy, trace[300:], MarkovPrewarmer().fit(trace[:300]) if k else None, k=max(k, 1), think_s=1e-3
        )
for k, st in prewarm.items():
    name = "no prewarm" if k == 0 else f"top-{k} prewarm"
    print(
        f"{name:13s}: cold loads {st['cold_loads']:3d}/200, late prefetches {st['late_prefetches']:3d}, "
        f"prediction hit rate {st['hit_rate']:.2f}, stall {st['stall_s'] * 1e3:6.1f} ms"
    )
cold = [prewarm[k]["cold_loads"] for k in (0, 1, 2)]
assert cold == [48, 25, 11]  # exact: fixed by the seeded trace, the predictions and the capacity
assert cold[0] > cold[1] > cold[2]  # strictly fewer with each predicted shard (held on 8 of 8 seeds checked)
assert prewarm[1]["hit_rate"] > 0.5
tmp.cleanup()

# %% [markdown]
# ## 9. Latency model, admission and SLO scheduling [Q259] [Q106] [Q133] [Q124]
#
# To control latency you must predict it. Every `Engine.step()` logs its measured duration with its features
# (prefill tokens, decode tokens, KV tokens attended), and `StepCostModel.fit` fits the MODEL
# `step_s ≈ c0 + c_prefill·prefill + c_decode·decode + c_kv·kv_tokens` by non-negative least squares, scored on a
# held-out quarter of the steps. From it follow TTFT (the steps until a prompt's last chunk, given the queue ahead and
# the token budget) and TPOT (one step with the running decodes), and `AdmissionController` admits a request only if
# both meet their SLOs, with the reason. The data: the real engine on the served TinyGPT, 40 requests (prompts of
# 4-300 tokens, 2-24 output tokens) arriving 2 every 3 steps, token budget 128 with chunked prefill, replayed 5
# times (the schedule is identical) and each step timed as its fastest replay.

# %%
# NBVAL_IGNORE_OUTPUT
# (measured step times)
FEATS = ("num_prefill_tokens", "num_decode_tokens", "kv_tokens", "num_seqs")


def mixed_run() -> list[dict]:
    """The mixed workload (same seed every time: the same steps in the same order); the engine's step log."""
    rng = np.random.default_rng(0)
    eng = Engine(gpt, block_size=16, num_blocks=256, max_num_batched_tokens=128, max_num_seqs=16)
    lens, outs = rng.integers(4, 300, 40), rng.integers(2, 24, 40)
    step, added = 0, 0
    while added < len(lens) or eng.has_unfinished():
        while added < len(lens) and added <= 2 * (step // 3):
            prompt = [int(t) for t in rng.integers(0, cfg.vocab_size, int(lens[added]))]
            eng.add_request(prompt, SamplingParams(temperature=0, max_tokens=int(outs[added]), ignore_eos=True))
            added += 1
        eng.step()
        step += 1
    return eng.step_log


with limited_threads(1, torch=True):
    replays = [mixed_run() for _ in range(5)]
assert all([[s[f] for f in FEATS] for s in r] == [[s[f] for f in FEATS] for s in replays[0]] for r in replays)
# each step's duration: the minimum over the 5 identical replays (other processes only ever add time)
log = [dict(s, duration_s=min(r[i]["duration_s"] for r in replays)) for i, s in enumerate(replays[0])][3:]
cost = StepCostModel.fit(log, holdout=0.25, seed=0)
print(cost)
print({k: f"{v:.3g}" for k, v in cost.report.items()})
step_s = float(np.median([s["duration_s"] for s in log]))
assert cost.report["r2"] > 0.5 and cost.report["rel_err_p50"] < 0.5  # measured: R^2 0.97, p50 error 8%
assert cost.c_prefill > 0  # prefill tokens cost time
meas = np.array([s["duration_s"] for s in log]) * 1e3
pred = np.array([cost.predict(s["num_prefill_tokens"], s["num_decode_tokens"], s["kv_tokens"]) for s in log]) * 1e3
has_prefill = np.array([s["num_prefill_tokens"] > 0 for s in log])
assert meas[~has_prefill].mean() < meas[has_prefill].mean()  # decode-only steps are the cheap ones
fig, ax = plt.subplots(figsize=(4.5, 4))
ax.scatter(meas[has_prefill], pred[has_prefill], s=12, label="steps with a prefill chunk")
ax.scatter(meas[~has_prefill], pred[~has_prefill], s=12, label="decode-only steps")
lim = [0, max(meas.max(), pred.max()) * 1.05]
ax.plot(lim, lim, "k--", lw=1)
ax.set_xlabel("measured step (ms)")
ax.set_ylabel("MODEL prediction (ms)")
ax.set_title("Step-cost MODEL vs the engine's measured steps")
ax.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# The fit holds on steps it did not see (held-out R² and the median relative error printed above). Decode-only
# steps are the cheapest points: a decode token costs one row of every GEMM, and the fixed per-step cost `c0`
# (Python, scheduling, reading every weight once) is shared by all the sequences in the batch.
#
# **Admission control.** SLOs are set from the model itself here (TTFT SLO = the predicted TTFT of a 256-token
# prompt on an idle engine + 1%; TPOT SLO = 2x the predicted step of 16 decodes over 4k cached tokens), so the
# decisions below do not depend on this machine's speed: on an idle engine a short prompt and the 256-token one are
# admitted, a 480-token prompt is not (two more prefill chunks); with 12 running decodes and 600 queued prompt
# tokens ahead even the short prompt breaks the TTFT SLO.

# %%
# NBVAL_IGNORE_OUTPUT
# (the predicted seconds in the reasons come from measured steps)
idle = {"running_decodes": 0, "kv_tokens": 0, "budget": 128}
busy = {"running_decodes": 12, "kv_tokens": 3000, "budget": 128, "queue_tokens_ahead": 600, "num_waiting": 4}
ttft_slo = 1.01 * cost.predict_ttft(256, 0, 128, 0)
ac = AdmissionController(cost, ttft_slo_s=ttft_slo, tpot_slo_s=2 * cost.predict_tpot(16, 4000))
print(ac)
decisions = {}
for state_name, state in (("idle", idle), ("busy", busy)):
    for n in (32, 256, 480):
        ok, why = ac.admit(n, state)
        decisions[state_name, n] = ok
        print(f"{state_name:4s} engine, prompt {n:3d}: {why}")
assert [decisions["idle", n] for n in (32, 256, 480)] == [True, True, False]
assert not any(decisions["busy", n] for n in (32, 256, 480))
assert "TTFT" in ac.admit(480, idle)[1].split(":")[0] and "TTFT" in ac.admit(32, busy)[1].split(":")[0]

# %% [markdown]
# **The same controller inside the engine, and a KV budget.** `Engine(..., admission=ac)` asks the controller at
# every `add_request` with the engine's live state (`engine_state()`: running decodes, their KV tokens, the prefill
# tokens queued ahead, the budget) and raises `AdmissionRejected` (reason "slo", the model's numbers in the message;
# the server answers 503 + `Retry-After`). A burst of 32-token prompts: each admitted one adds 32 tokens to the queue
# ahead, so the 9th would need a third 128-token prefill step — more than the 256-token prompt's two steps the SLO
# was set from — and is refused, whatever this machine's speed. `kv_budget_blocks=B` admits a request only if its
# *worst-case* KV (prompt + max_tokens, in blocks) fits B minus the claims of the requests already admitted
# (reason "kv_budget", the server answers 429 + `Retry-After`): admitted requests can always grow to their end, so
# nothing is ever preempted — against a free-for-all on the same 64-block pool, which preempts.

# %%
# NBVAL_IGNORE_OUTPUT
from tinylearn.serve import AdmissionRejected  # noqa: E402

eng_slo = Engine(gpt, max_num_batched_tokens=128, admission=ac)
burst_ok, refusal = 0, None
for _ in range(12):
    try:
        eng_slo.add_request(list(range(1, 33)), SamplingParams(temperature=0, max_tokens=4))
        burst_ok += 1
    except AdmissionRejected as err:
        refusal = refusal or err
print(f"burst of 12 x 32-token prompts: {burst_ok} admitted; first refusal ({refusal.reason}): {str(refusal)[:150]}...")
assert burst_ok == 8 and refusal.reason == "slo" and eng_slo.stats()["rejected_slo"] == 4


def kv_budget_run(budget: int | None) -> dict:
    """8 requests (prompt 150 + 100 tokens = 16 blocks each) on a 64-block pool, re-sent after each refusal."""
    e = Engine(gpt, num_blocks=64, enable_prefix_caching=False, kv_budget_blocks=budget)
    todo = [np.random.default_rng(k).integers(0, 256, 150).tolist() for k in range(8)]
    while todo or e.has_unfinished():
        while todo:
            try:
                e.add_request(todo[0], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
                todo.pop(0)
            except AdmissionRejected:
                break  # retry after the next step (a client would wait Retry-After)
        e.step()
    return e.stats()


with limited_threads(1, torch=True):
    kv_runs = {"no KV budget": kv_budget_run(None), "kv_budget_blocks=64": kv_budget_run(64)}
for name, st in kv_runs.items():
    print(f"{name:20s} preemptions {st['preemptions_recompute']:2d}, refusals {st['rejected_kv_budget']:2d}, "
          f"steps {st['num_steps']}")  # fmt: skip
assert kv_runs["no KV budget"]["preemptions_recompute"] > 0 and kv_runs["no KV budget"]["rejected_kv_budget"] == 0
assert kv_runs["kv_budget_blocks=64"]["preemptions_recompute"] == 0
assert kv_runs["kv_budget_blocks=64"]["rejected_kv_budget"] > 0

# %% [markdown]
# **SLO scheduling [Q106] [Q133].** One burst of 20 requests arrives at once: 4 long prompts (300-400 tokens, loose
# deadlines) first, then 14 short prompts (8-40 tokens, TTFT deadlines of 4-16 steps) and 2 "urgent" long prompts
# (200-260 tokens, deadlines of 5-7 steps). Deadlines are in engine steps, so the step counts below are exact whatever
# the machine (the wall-clock misses use deadline × the median measured step above; the engine gets the deadlines as 1 s
# per step: EDF only compares them, and a common scale keeps a scheduling hiccup between two `add_request` calls from
# reordering them); the measured TTFTs are the faster of two identical replays. The same burst runs through the engine
# under three orders of its queues: `fcfs` (arrival), `spf` (shortest prompt first) and `edf` (earliest deadline first).
# With a 128-token budget the 4 long prompts (1,426 tokens) hold FCFS's short prompts back until step 12, when their
# prefill is done (head-of-line blocking): FCFS misses 12 deadlines, SPF 1 (an urgent long prompt waits behind the short
# ones), EDF none; SPF has the lowest mean TTFT (4.45 steps vs 12.9 for FCFS), EDF trades a little of it (6.4) to meet
# every deadline.

# %%
# NBVAL_IGNORE_OUTPUT
# (wall-clock TTFTs; the step counts are exact)
rng = np.random.default_rng(0)
kinds = ["long"] * 4 + ["short"] * 7 + ["urgent"] + ["short"] * 7 + ["urgent"]
span = {"long": ((300, 400), (40, 60)), "short": ((8, 40), (4, 16)), "urgent": ((200, 260), (5, 8))}
burst = []
for kind in kinds:
    (lo, hi), (dlo, dhi) = span[kind]
    burst.append(
        dict(
            prompt=[int(t) for t in rng.integers(0, cfg.vocab_size, int(rng.integers(lo, hi)))],
            deadline=int(rng.integers(dlo, dhi)),
            max_tokens=int(rng.integers(4, 12)),
        )
    )
deadline = np.array([r["deadline"] for r in burst])


def run_burst(policy: str) -> dict:
    e = Engine(gpt, block_size=16, num_blocks=256, max_num_batched_tokens=128, max_num_seqs=16, policy=policy)
    rids = [
        e.add_request(
            r["prompt"],
            SamplingParams(temperature=0, max_tokens=r["max_tokens"], ignore_eos=True),
            deadline_s=r["deadline"] * 1.0,  # EDF's sort key: 1 s per step, so no OS jitter can reorder it
        )
        for r in burst
    ]
    first_step, metrics, n = {}, {}, 0
    while e.has_unfinished():
        n += 1
        for o in e.step():
            if o.new_token_ids and o.request_id not in first_step:
                first_step[o.request_id] = n
            if o.finished:
                metrics[o.request_id] = o.metrics
    ttft_steps = np.array([first_step[r] for r in rids])
    ttft_s = np.array([metrics[r]["first_token_s"] - metrics[r]["arrival_s"] for r in rids])
    return dict(ttft_steps=ttft_steps, ttft_s=ttft_s, log=e.step_log, steps=n)


pol = {}
with limited_threads(1, torch=True):
    for p in ("fcfs", "spf", "edf"):
        r1, r2 = run_burst(p), run_burst(p)  # two identical replays; each request's TTFT is its faster one
        assert np.array_equal(r1["ttft_steps"], r2["ttft_steps"])
        pol[p] = dict(r1, ttft_s=np.minimum(r1["ttft_s"], r2["ttft_s"]))
print("policy  misses(steps)  mean TTFT(steps)  misses(wall)  mean / median TTFT (ms, measured)")
for p, r in pol.items():
    miss, miss_wall = int((r["ttft_steps"] > deadline).sum()), int((r["ttft_s"] > deadline * step_s).sum())
    print(
        f"{p:6s}  {miss:13d}  {r['ttft_steps'].mean():16.2f}  {miss_wall:12d}  "
        f"{r['ttft_s'].mean() * 1e3:8.1f} / {np.median(r['ttft_s']) * 1e3:.1f}"
    )
miss = {p: int((r["ttft_steps"] > deadline).sum()) for p, r in pol.items()}
mean_steps = {p: float(r["ttft_steps"].mean()) for p, r in pol.items()}
assert (miss["fcfs"], miss["spf"], miss["edf"]) == (12, 1, 0)  # exact: the schedule is a function of the burst
assert {p: round(v, 2) for p, v in mean_steps.items()} == {"fcfs": 12.9, "spf": 4.45, "edf": 6.4}
long_tokens = sum(len(r["prompt"]) for r, k in zip(burst, kinds) if k == "long")
short_fcfs = [t for t, k in zip(pol["fcfs"]["ttft_steps"], kinds) if k == "short"]
print(f"fcfs: first token of the short prompts at steps {sorted(int(t) for t in short_fcfs)}")
assert long_tokens == 1426 and min(short_fcfs) == 12  # HOL: the longs' 12 steps of prefill go first
assert np.median(pol["spf"]["ttft_s"]) < np.median(pol["fcfs"]["ttft_s"])  # measured: ~3x, held on 8 of 8 seeds

fig, ax = plt.subplots(figsize=(8, 3.2))
x = np.arange(len(burst))
for j, (p, r) in enumerate(pol.items()):
    ax.bar(x + (j - 1) * 0.27, r["ttft_steps"], 0.27, label=f"{p} ({miss[p]} misses)")
ax.scatter(x, deadline, marker="_", s=150, c="k", label="deadline")
ax.set_xticks(x, [k[0].upper() for k in kinds])
ax.set_xlabel("request in arrival order (L = long, S = short, U = urgent long)")
ax.set_ylabel("TTFT (engine steps)")
ax.set_ylim(0, 30)
ax.legend(fontsize=8, ncol=4)
ax.set_title("One burst, three queue orders")
plt.tight_layout()
plt.show()

# %% [markdown]
# **Length bucketing [Q124].** Reordering by length (SPF) is the first half of Q124: short requests stop queueing
# behind long ones. The second half — padding — does not exist in this engine: its batch is *ragged* (all scheduled
# tokens of all sequences concatenated into one [N, d_model] matrix, attention per sequence over its block table), so
# every computed token slot is a real token. A static batcher pads every batch to its longest member; notebook 09's
# `form_batches` buckets by length to cut that. On this burst's 20 prompts, batches of up to 8:

# %%
prompt_lens = [len(r["prompt"]) for r in burst]
for r in pol.values():
    computed = sum(s["num_prefill_tokens"] + s["num_decode_tokens"] for s in r["log"])
    assert computed == sum(prompt_lens) + sum(r_["max_tokens"] - 1 for r_ in burst)  # no padding, no recompute
print(f"engine (ragged): {sum(prompt_lens)} prompt tokens computed in {sum(prompt_lens)} slots, padding 0")
static = {}
for policy in ("fifo", "bucket"):
    batches = form_batches([0.0] * len(burst), prompt_lens, max_batch=8, window=1.0, policy=policy, bucket_width=32)
    static[policy] = padding_stats(prompt_lens, batches)
    st = static[policy]
    print(
        f"static {policy:6s}: {st['batches']} batches, {st['slots']} slots for {st['real_tokens']} real tokens, "
        f"padding {st['padding']} ({st['waste']:.0%})"
    )
assert (round(static["fifo"]["waste"], 2), round(static["bucket"]["waste"], 2)) == (0.62, 0.04)
assert max(prompt_lens) == prompt_lens[0] == 385

# %% [markdown]
# Padded static batches in arrival order would waste 62% of their token slots on this burst (a short prompt batched
# with a 385-token one pays for 385); length buckets of 32 cut that to 4%, at the price of more, smaller batches.
# The ragged engine wastes none and needs no buckets — what remains of Q124 is the *ordering* (SPF/EDF above).

# %%
gpt = tiny_model(seed=0)  # the served model: byte vocab 258, d_model 128, 4 heads, 2 layers, random weights
tok = ByteTokenizer()

# %% [markdown]
# ## 10. Autoscaling under bursty load [Q261]
#
# A scaling controller sees, once per control interval, the arrival rate, the queue depth, the p95 latency and the
# utilisation of the ready replicas, and returns a target replica count (`tl.serve.autoscale.Autoscaler`):
#
# - **multi-metric up-scaling**: the Kubernetes-HPA rule on utilisation, ⌈replicas·util/target⌉; a queue rule that
#   serves the arrivals *and* drains the backlog within one SLO, ⌈(rate + queue/SLO)/(μ·target)⌉; one more replica
#   on an SLO breach; any one signal may ask for capacity;
# - **predictive**: Holt's double exponential smoothing of the arrival rate, asked for the load one cold start ahead:
#   capacity ordered now is ready only `cold_start` later, so it must be sized for the load *then*;
# - **conservative down-scaling (hysteresis)**: only when every signal is low (utilisation under a lower band,
#   p95 under half the SLO, empty queue), after a cooldown since the last change, one replica per decision; the
#   up-side needs the need to exceed the current count by a tolerance.
#
# The cold start is measured: a fresh Python process imports tinylearn, builds a TinyGPT and runs its first
# forward; the wall time from spawn to its answer is what a new replica costs before it serves anything.

# %%
# NBVAL_IGNORE_OUTPUT
cold = measure_cold_start(timeout_s=120)
c = cold.wall_s
print(
    f"MEASURED replica cold start {c * 1e3:.0f} ms: import {cold.import_s * 1e3:.0f} ms, build "
    f"{cold.build_s * 1e3:.1f} ms, first forward {cold.forward_s * 1e3:.1f} ms, the rest process spawn and exit"
)
assert cold.pid != os.getpid() and cold.wall_s >= cold.import_s + cold.build_s + cold.forward_s
assert cold.import_s > cold.build_s + cold.forward_s  # loading the code dominates, not the tiny model

# %% [markdown]
# Importing the code dominates this replica's cold start; a real LLM replica also loads gigabytes of weights and
# captures its kernels, which makes the cold start longer and the lag of a reactive policy worse.
#
# The controller then runs in a **discrete-event MODEL** (`simulate`, not a measurement): an FCFS queue shared by the
# replicas, deterministic service time 1/μ, a new replica ready one measured cold start `c` after the decision.
# Model parameters (ASSUMED, in units of the measured `c`): a replica serves μ = 40 requests per cold start, SLO = 5
# service times, a control interval of c/4, target utilisation 0.7, 1 to 80 replicas, 2 at the start. Two traces
# (Poisson arrivals, seeds 0-3), both from one replica's worth of load to 30:
#
# - an **exponential burst** (a viral spike): the rate grows as e^(t/τ), τ = 2c, holds 5c, falls back;
# - a **linear ramp** to the same peak over the same rise time.
#
# Every time is a multiple of `c`, so the model's outcome hardly depends on the measured value (only through the
# order of near-simultaneous events); the asserts below were checked for c between 0.25 and 2.9 s.

# %%
# NBVAL_IGNORE_OUTPUT
mu = 40.0 / c
onset, tau, hold = 5 * c, 2 * c, 5 * c
rise = tau * np.log(30)
traces = {
    "exponential burst": burst_knots(mu, 30 * mu, onset_s=onset, tau_s=tau, hold_s=hold),
    "linear ramp": [(0.0, mu), (onset, mu), (onset + rise, 30 * mu), (onset + rise + hold, 30 * mu),
                    (onset + rise + hold + 2 * tau, mu)],
}  # fmt: skip


def policy(predictive: bool, **kw) -> Autoscaler:
    return Autoscaler(1, 80, 0.7, c, service_rate=mu, slo_s=5 / mu, interval_s=c / 4, predictive=predictive, **kw)


res, arrivals = {}, {}
for name, knots in traces.items():
    for seed in range(4):
        arrivals[name, seed] = ramp_trace(knots, knots[-1][0] + 4 * c, seed=seed)
        for pred in (False, True):
            res[name, seed, pred] = simulate(arrivals[name, seed], policy(pred), c, mu, initial_replicas=2)
print("MODEL (simulated), 4 seeds; replica-seconds in units of the cold start c")
hdr = ("trace", "seed", "reactive: SLO viol.", "repl.-c", "predictive: SLO viol.", "repl.-c")
print(f"{hdr[0]:18} {hdr[1]:>4} {hdr[2]:>20} {hdr[3]:>8} {hdr[4]:>22} {hdr[5]:>8}")
for (name, seed, pred), r in res.items():
    if pred:
        q = res[name, seed, False]
        print(f"{name:18} {seed:4d} {q.slo_violations:20d} {q.replica_seconds / c:8.0f} {r.slo_violations:22d} "
              f"{r.replica_seconds / c:8.0f}")  # fmt: skip
tot = {(n, p): sum(res[n, s, p].slo_violations for s in range(4)) for n in traces for p in (False, True)}
n_req = {n: sum(len(arrivals[n, s]) for s in range(4)) for n in traces}
for n in traces:
    print(f"{n}: {n_req[n]} requests, SLO violations reactive {tot[n, False]}, predictive {tot[n, True]}")

BURST, RAMP = "exponential burst", "linear ramp"
assert all(np.isfinite(r.latencies).all() for r in res.values())  # every request served
assert all(res[BURST, s, True].slo_violations < res[BURST, s, False].slo_violations for s in range(4))
assert tot[BURST, True] < 0.25 * tot[BURST, False]  # predictive removes most of the burst's violations ...
assert all(res[BURST, s, True].replica_seconds < 1.5 * res[BURST, s, False].replica_seconds for s in range(4))
assert tot[RAMP, True] > 0.7 * tot[RAMP, False]  # ... but on the linear ramp it saves less than 30% of them
late = [arrivals[RAMP, s][res[RAMP, s, p].latencies > 5 / mu] for s in range(4) for p in (False, True)]
late = np.concatenate(late)
print(f"linear ramp: {np.mean((late >= onset) & (late <= onset + 3 * c)):.0%} of the late requests arrived in the "
      "first 3 cold starts of the ramp")  # fmt: skip
assert np.mean((late >= onset) & (late <= onset + 3 * c)) > 0.9

# %% [markdown]
# What the model says, honestly:
#
# - On the **exponential burst** the predictive policy wins on every seed: it removes more than 75% of the SLO
#   violations (the printed totals) for at most 1.5x the replica-seconds on every seed. Exponential growth is what
#   defeats a reactive policy: in every cold-start window the load grows by the same factor e^(c/τ), the reactive
#   policy always orders for the load it sees now, and its replicas arrive one cold start later into a load that
#   has outgrown them; the 30% headroom of target utilisation 0.7 never catches up. The forecast asks for the load
#   one cold start ahead.
# - On the **linear ramp** prediction buys little (less than 30% fewer violations): more than 90% of the late
#   requests arrive in the first 3 cold starts of the ramp, where both policies are late — the forecaster needs two
#   intervals to see a trend, and on a ramp starting from one replica's worth the first cold start already multiplies
#   the load. After that, a linear ramp adds a fixed amount per cold start, which the reactive policy's headroom
#   covers.
#
# Hysteresis against flapping, on a flat noisy load (3 replicas' worth, Poisson; 30 arrivals per control interval,
# so the measured rate fluctuates by ~18%): the default band (scale down below 0.6 x target utilisation, 4-interval
# cooldown, 10% tolerance up) against the same controller with the band squeezed to nothing.

# %%
# NBVAL_IGNORE_OUTPUT
flat = ramp_trace([(0.0, 3 * mu)], 100 * c, seed=3)
per_interval = np.histogram(flat, np.arange(0, 100 * c, c / 4))[0]
cv = per_interval.std() / per_interval.mean()
print(f"flat load: {per_interval.mean():.1f} arrivals per control interval, relative std {cv:.1%}")
assert 27 < per_interval.mean() < 33 and 0.14 < cv < 0.22
default = policy(False)
assert (
    np.isclose(default.down_util, 0.6 * 0.7) and np.isclose(default.cooldown_s, 4 * c / 4) and default.tolerance == 0.1
)
band = simulate(flat, policy(False), c, mu, initial_replicas=5)
thin = simulate(flat, policy(False, down_util=0.69, cooldown_s=0, tolerance=0, down_latency_frac=10.0), c, mu, 5)
n_steps = round(90 * c / (c / 4))
n_band = sum(d.time > 10 * c for d in band.decisions)
n_thin = sum(d.time > 10 * c for d in thin.decisions)
print(f"MODEL, flat load, {n_steps} control steps after warm-up: with hysteresis {n_band} scaling decisions, "
      f"{band.slo_violations} SLO violations; without: {n_thin}, {thin.slo_violations}")  # fmt: skip
assert n_thin > 3 * n_band and thin.slo_violations > band.slo_violations

# %%
fig, axes = plt.subplots(1, 3, figsize=(14, 3.4))
for ax, name in zip(axes[:2], traces):
    tr = arrivals[name, 0]
    edges = np.arange(0, tr[-1] + c / 4, c / 4)
    demand = np.histogram(tr, edges)[0] / (c / 4) / mu
    ax.plot(edges[:-1] / c, demand / 0.7, color="gray", lw=1, label="replicas needed at util 0.7")
    for pred, col in ((False, "tab:red"), (True, "tab:blue")):
        log = np.array(res[name, 0, pred].replicas)
        lab = f"{'predictive' if pred else 'reactive'}: {res[name, 0, pred].slo_violations} SLO viol."
        ax.step(log[:, 0] / c, log[:, 1], where="post", color=col, label=lab)
    ax.set_title(f"MODEL: {name} (seed 0)", fontsize=10)
    ax.set_xlabel("time / measured cold start")
    ax.set_ylabel("replicas (ready)")
    ax.legend(fontsize=7)
for r, col, lab in ((band, "tab:green", "with hysteresis"), (thin, "tab:orange", "no band")):
    log = np.array(r.replicas)
    axes[2].step(log[:, 0] / c, log[:, 2], where="post", color=col, label=f"{lab}: {len(r.decisions)} decisions")
axes[2].axhline(3 / 0.7, color="gray", lw=1, label="needed at util 0.7")
axes[2].set_title("MODEL: flat noisy load, provisioned replicas", fontsize=10)
axes[2].set_xlabel("time / measured cold start")
axes[2].legend(fontsize=7)
plt.tight_layout()
plt.show()

# %% [markdown]
# With the band squeezed away the controller takes more than three times as many decisions, and it scales down
# into under-provisioning between noisy intervals, which costs more SLO violations than the banded controller has
# (the printed counts). Scale up fast on any signal, scale down slowly on all of them.

# %% [markdown]
# ## 11. Stage pipelines and asynchronous preprocessing [Q189] [Q198]
#
# An inference request often passes several stages with very different costs — here a real one built on the served
# TinyGPT (`demo_stages`): **tokenize** (Python), **embed** (numpy: embedding rows and GEMMs), **decode** (a TinyGPT
# forward) and **postprocess** (softmax, top-5, detokenize). `tl.serve.pipeline.Pipeline` runs groups of adjacent
# stages on threads connected by **bounded queues**: a slow stage fills the queue in front of it, and the stages
# before it (finally the producer) block instead of piling up work — backpressure, nothing dropped. Results come
# back in submission order (a reorder buffer), so they equal sequential execution.
#
# The rebalancer (`plan_rebalance`) reads the MEASURED per-stage service times: the pipeline runs at the rate of its
# bottleneck group, max_g(Σ stage times / workers). It merges adjacent light groups while the merge stays under the
# bottleneck (fewer queue hops, a thread freed), then gives the bottleneck more workers while the thread budget
# allows and its stages are stateless. That plan is a *model* of what threads buy; whether they buy it is measured.

# %%
texts = [f"request {i}: " + "serve the tiny model " * (2 + i % 4) for i in range(24)]
stages = demo_stages(gpt, tok, seq_len=48, feat_dim=256)
with limited_threads(1, torch=True), no_grad():  # no_grad on the calling thread: autograd's switch is global
    ref = []
    for x in texts:
        for s in stages:
            x = s.fn(x)
        ref.append(x)
    p1 = Pipeline(stages, queue_size=2)
    out1 = p1.run(texts)
    plan, decisions = plan_rebalance(p1.stats()["service_s"], [s.parallel_safe for s in stages], max_workers=4)
    p2 = Pipeline(stages, plan, queue_size=2)
    out2 = p2.run(texts)
assert all(a["top"] == b["top"] == d["top"] and a["text"] == b["text"] == d["text"] for a, b, d in zip(ref, out1, out2))
print("outputs of both plans == sequential execution, in order")

# %%
# NBVAL_IGNORE_OUTPUT
svc = p1.stats()["service_s"]
print("MEASURED mean stage times:", ", ".join(f"{s.name} {t * 1e3:.3f} ms" for s, t in zip(stages, svc)))
print("rebalancer:", *decisions, sep="\n  ")
print(f"before {p1!r}: {p1.stats()['throughput']:.0f} items/s, max queue depths {p1.stats()['max_queue_depth']}")
print(f"after  {p2!r}: {p2.stats()['throughput']:.0f} items/s (MODEL predicted "
      f"{bottleneck_s(p1.plan, svc) / bottleneck_s(plan, svc):.2f}x)")  # fmt: skip
assert svc[2] > svc[0] and svc[1] > svc[0]  # the forward and the GEMMs outweigh byte tokenization
assert bottleneck_s(plan, svc) < bottleneck_s(p1.plan, svc) and sum(g.workers for g in plan) <= 4

# %% [markdown]
# Backpressure, exactly: two stages, queues of size 1, the second stage blocked. The producer gets 4 items in —
# one held by the blocked stage, one in the queue before it, one held by the first stage (blocked on its full output
# queue), one in the input queue — and the 5th `put` times out with `queue.Full` instead of growing a backlog.
# Unblocked, all 4 come out, in order.

# %%
gate = threading.Event()
pb = Pipeline([Stage("a", lambda x: x), Stage("blocked", lambda x: gate.wait(30) and x)], queue_size=1).start()
accepted = 0
try:
    for i in range(10):
        pb.put(i, timeout=0.5)
        accepted += 1
except queue.Full:
    print(f"accepted {accepted} items, then put() raised queue.Full")
gate.set()
drained = [pb.get(timeout=10) for _ in range(accepted)]
pb.close()
print("drained:", drained)
assert accepted == 4 and drained == [0, 1, 2, 3]

# %% [markdown]
# **Do more threads help?** Only where the stage releases the GIL. Three stages of a few milliseconds per item,
# run with 1 and 2 worker threads (MEASURED, median of 5 runs of 12 items), with the process's CPU-seconds per
# wall-second:
#
# - **I/O-like** (`time.sleep`, standing in for a network or disk call): the thread waits without the GIL or a core,
#   so two workers overlap their waits even on a busy machine;
# - **numpy GEMMs** (BLAS releases the GIL): two workers can use two cores — *if* two cores are free;
# - **pure Python**: holds the GIL; two threads take turns, so the process never gets more than one core.

# %%
# NBVAL_IGNORE_OUTPUT
rng = np.random.default_rng(0)
A, W = rng.standard_normal((128, 512)).astype(np.float32), (rng.standard_normal((512, 512)) / 25).astype(np.float32)


def io_like(x):
    time.sleep(0.003)
    return x


def numpy_gemm(x):
    h = A
    for _ in range(4):
        h = np.tanh(h @ W)
    return x + float(h[0, 0] > 10)


def pure_python(x):
    acc = 0
    for i in range(100_000):
        acc += i & 7
    return x + (acc & 1)


def run_workers(fn, workers: int, cpu: list) -> None:
    p = Pipeline([Stage("light", lambda x: x), Stage(fn.__name__, fn)], [Group((0,)), Group((1,), workers)], 4)
    c0, w0 = time.process_time(), time.perf_counter()
    assert p.run(range(12)) == list(range(12))
    cpu.append((time.process_time() - c0) / (time.perf_counter() - w0))


gil = {}
with limited_threads(1, torch=True):
    for fn in (io_like, numpy_gemm, pure_python):
        for w in (1, 2):
            cpu = []
            t = measure(lambda fn=fn, w=w, cpu=cpu: run_workers(fn, w, cpu), warmup=1, repeat=5, min_call_s=0)
            gil[fn.__name__, w] = (t.median, float(np.median(cpu)))
for name in ("io_like", "numpy_gemm", "pure_python"):
    (t1, c1), (t2, c2) = gil[name, 1], gil[name, 2]
    print(f"{name:12}: 1 worker {t1 * 1e3:5.1f} ms ({c1:.2f} CPU-s/s), 2 workers {t2 * 1e3:5.1f} ms "
          f"({c2:.2f} CPU-s/s): speed-up {t1 / t2:.2f}x")  # fmt: skip
assert gil["io_like", 1][0] > 1.3 * gil["io_like", 2][0]  # waits overlap, whatever the CPU load
assert gil["pure_python", 2][1] < 1.25  # the GIL: never more than one core for Python bytecode

# %% [markdown]
# The I/O-like stage gains from a second worker on any machine (its threads need no core while they wait); the
# pure-Python stage cannot use more than one core (CPU-seconds per second < 1.25 with two workers), so a second
# thread only adds switching — it does not speed up. The numpy stage sits in between: it releases the GIL, so its
# speed-up is bounded by the *free* cores; on a shared 2-core machine that is often no gain at all (the printed
# line says what this run got). Pure-Python stages need processes (multiprocessing, separate workers) or native
# code. The TinyGPT forward above is a mix — numpy kernels driven by Python — so the model's predicted gain from a
# second decode worker is an upper bound, and `run_adaptive` closes the loop: it tries the proposed plan on the next
# chunk of requests and keeps it only if the MEASURED throughput improved by 10%, otherwise it reverts and marks
# those stages as non-scaling.

# %%
# NBVAL_IGNORE_OUTPUT
with limited_threads(1, torch=True), no_grad():
    out_ad, hist = run_adaptive(stages, [texts[:12], texts[12:], texts[:12]], max_workers=4)
for h in hist:
    print(f"{h['throughput']:6.0f} items/s  {h['decision']:52}  plan {[(g.stages, g.workers) for g in h['plan']]}")
assert [o["top"] for o in out_ad] == [r["top"] for r in ref + ref[:12]]

# %% [markdown]
# **Asynchronous preprocessing of multi-turn requests [Q198].** In a chat, every turn resends the history; per batch
# the CPU must render and tokenize every conversation, compute the prefix-cache keys (chained block hashes, the
# scheme of the paged cache: turn j's full blocks are hits from turn j-1) and pack a padded [B, T] array.
# `AsyncPreprocessor.serve(..., overlap=True)` runs that in a thread pool feeding a bounded `asyncio.Queue`
# (depth 1: double buffering); the model step runs on the event-loop thread, so batch i+1 is preprocessed while
# batch i is in the model. `overlap=False` runs them back to back. The timestamps of every call are recorded.

# %%
# NBVAL_IGNORE_OUTPUT
chats = chat_requests(4, 6, seed=1)  # 6 batches: batch j = the 4 conversations after j + 1 turns
pre = AsyncPreprocessor(tok, block_size=16, max_len=96, workers=2, depth=1)


def model_step(packed):
    return gpt(packed.ids).data[np.arange(len(packed.lengths)), packed.lengths - 1].copy()


with limited_threads(1, torch=True), no_grad():
    pre.serve(chats[:1], model_step, overlap=False)  # warm-up
    seq_out, seq_t = pre.serve(chats, model_step, overlap=False)
    ovl_out, ovl_t = pre.serve(chats, model_step, overlap=True)
assert all(np.array_equal(a, b) for a, b in zip(seq_out, ovl_out))  # the same logits either way
ps, ss = ovl_t["pre_spans"], ovl_t["step_spans"]
ahead = [ps[i + 1][0] < ss[i][1] for i in range(len(chats) - 1)]
print("overlapped: preprocessing of batch i+1 started before step i ended:", ahead)
print(f"overlapped: {ovl_t['overlap_s'] * 1e3:.2f} ms of preprocessing ran during model steps")
assert all(ahead) and ovl_t["overlap_s"] > 0
assert all(seq_t["pre_spans"][i + 1][0] >= seq_t["step_spans"][i][1] for i in range(len(chats) - 1))
assert seq_t["overlap_s"] == 0
frac = seq_t["preprocess_s"] / seq_t["step_s"]
print(f"sequential: wall {seq_t['wall_s'] * 1e3:.1f} ms = preprocessing {seq_t['preprocess_s'] * 1e3:.2f} ms "
      f"+ model steps {seq_t['step_s'] * 1e3:.1f} ms (preprocessing = {frac:.1%} of the steps)")  # fmt: skip
pre_s = seq_t["preprocess_s"]
print(f"overlapped: wall {ovl_t['wall_s'] * 1e3:.1f} ms; the most overlap can save is min(pre, step) = "
      f"{pre_s * 1e3:.2f} ms = {pre_s / seq_t['wall_s']:.1%} of the wall time")  # fmt: skip
assert frac < 0.1

# %% [markdown]
# The timestamps show the pipelining: in overlapped mode the preprocessing of batch i+1 starts before the model step
# of batch i ends (for every i), in sequential mode always after it. The wall times cannot show a real gain:
# overlapping two phases saves at most the shorter one, min(pre, step) / (pre + step) of the time (Amdahl), and with
# a byte tokenizer preprocessing is under 10% of a TinyGPT step here (the printed share) — of the order of the
# run-to-run noise of the steps, so any difference between the two printed wall times is mostly noise.
# Pure-Python preprocessing also holds the GIL, so it overlaps only with the GIL-free (BLAS) part of the step.
# Overlap pays when preprocessing is a real fraction of a step: a BPE tokenizer over long histories, image
# decoding, or host→device copies while the accelerator computes (there the CPU side and the device are separate
# resources).

# %% [markdown]
# ## 12. Merging speculative branches [Q224] and choosing a decode strategy [Q183]
#
# Beam search, draft trees and parallel sampling grow several branches from one prompt; on a paged KV cache they
# share the prompt's blocks (reference counts) and own the blocks of their own tokens. Two branches that end in
# the same tokens can be **merged** (hypothesis recombination): keep the better one, free the other's private
# blocks, add its probability mass to the survivor (logaddexp of the two log-probabilities). The rule
# (`tl.serve.beams`): merge iff the last `suffix_len` tokens are identical **and** the two next-token
# distributions are close — Jensen-Shannon distance √JSD (base 2, in [0, 1], symmetric, a metric) or total
# variation ½Σ|p − q| (the largest difference in probability of any event) under a threshold. The survivor's KV
# came from *its* context, so a merge is exact only for identical token sequences; otherwise the error is measured
# from real forwards (`continuation_error`: the largest |Δ log p| over a 5-token continuation).

# %%
tl.manual_seed(0)  # TinyGPT draws its initial weights from tinylearn's generator
small = TinyGPT(64, 64, 4, 2, 128, n_kv_heads=2)
prompt, suffix = list(range(1, 11)), [5, 9, 13, 2, 7, 7]  # 10 prompt tokens: blocks of 4 -> 2 full + 1 partial
bs = BranchSet(small, prompt, num_blocks=64, block_size=4)
a = bs.fork(bs.root, [20, *suffix])
b = bs.fork(bs.root, [20, *suffix])  # two draft branches that sampled the same tokens
used = bs.cache.stats()["blocks_used"]
print(f"blocks in use {used}; private blocks of a: {bs.private_blocks(a)}, of b: {bs.private_blocks(b)}")
err_same = bs.continuation_error(a, b, [3, 4, 5, 6, 8])
d = bs.merge(a, b, suffix_len=len(suffix), metric="js", threshold=0.0)
print(f"identical branches: {d.reason} -> merged; continuation error {err_same}; blocks freed {bs.blocks_freed}, "
      f"in use now {bs.cache.stats()['blocks_used']}")  # fmt: skip
# 17 tokens = 5 blocks: the 2 full prompt blocks shared, the partial one copied on write + 2 new = 3 private
assert used == 3 + 3 + 3 and d and err_same == 0.0
assert bs.blocks_freed == 3 and bs.cache.stats()["blocks_used"] == used - 3
b2 = bs.fork(bs.root, [20, *suffix[:-1], 8])  # the last token differs: never merged, whatever the distance
assert not bs.decide(bs.merges[0][0], b2, suffix_len=1, metric="tv", threshold=1.0)

# %% [markdown]
# Same suffix after a *different* earlier token (20 vs 33): the merge is an approximation. The longer the shared
# suffix, the less the differing token weighs in attention, so both the distance of the next-token distributions
# and the error of continuing one branch from the other's KV shrink. With a JS threshold of 0.009 the rule keeps
# the 2-token-suffix pair apart (its continuation error is the largest) and merges the two longer ones.

# %%
# NBVAL_IGNORE_OUTPUT
rng = np.random.default_rng(1)
rows = []
for n in (2, 8, 24):
    bs = BranchSet(small, prompt, num_blocks=64, block_size=4)
    suf = rng.integers(0, 64, n).tolist()
    a, b = bs.fork(bs.root, [20, *suf]), bs.fork(bs.root, [33, *suf])
    pa, pb = np.exp(bs.branches[a].next_logp), np.exp(bs.branches[b].next_logp)
    err = bs.continuation_error(a, b, [3, 4, 5, 6, 8])
    freed_if = bs.private_blocks(b)
    dec = bs.merge(a, b, suffix_len=n, metric="js", threshold=0.009)
    rows.append((n, js_distance(pa, pb), tv_distance(pa, pb), err, bool(dec), bs.blocks_freed, freed_if))
    print(
        f"suffix {n:2d}: JS {rows[-1][1]:.4f}, TV {rows[-1][2]:.4f}, continuation max|dlogp| {err:.4f} -> "
        f"{'merge' if dec else 'keep both'} ({bs.blocks_freed} of the loser's {freed_if} private blocks freed)"
    )
js_d, errs = [r[1] for r in rows], [r[3] for r in rows]
assert all(e > 0 for e in errs) and errs == sorted(errs, reverse=True) and js_d == sorted(js_d, reverse=True)
assert [r[4] for r in rows] == [False, True, True]
assert all(r[5] == (r[6] if r[4] else 0) for r in rows)  # a merge frees exactly the loser's private blocks

# %% [markdown]
# **Choosing a decode strategy [Q183].** Tensor parallelism (TP), KV-sharded attention (split-K over the sequence)
# and speculative decoding attack different terms of one decode step. `tl.serve.parallel_choice` is a cost MODEL
# of one forward of q tokens per sequence, batch B, context S, on tp × kv devices:
# memory = weights/tp + B·S·kv_read/(tp·kv); compute = B·q·token/tp + B·q·S·attn/(tp·kv); communication = 2L ring
# all-reduces per forward for TP plus L for the KV shards (α-β model); speculative decoding with k drafts and
# acceptance α costs k draft steps plus one (k+1)-token verify per round and emits (1 − α^(k+1))/(1 − α) tokens.
# `choose(S, B)` takes the strategy of least modelled latency per token (up to 8 devices, k ≤ 8).
#
# The model is **calibrated on this CPU**: real TinyGPT forwards timed at several (B, S, q), a non-negative
# least-squares fit of the fixed, per-token, per-KV-token and attention terms; the draft/target cost ratio and the
# acceptance α come from a real speculative run with a smaller draft. The link parameters (5 µs latency, 100 GB/s) are
# **ASSUMED** — one CPU has no interconnect to measure. Beside it, the same MODEL for a 7B-class model on an
# ASSUMED accelerator (400 TFLOP/s, 2 TB/s; nothing ran on one).

# %%
# NBVAL_IGNORE_OUTPUT
tl.manual_seed(0)  # TinyGPT draws its initial weights from tinylearn's generator
target = TinyGPT(64, 128, 4, 2, 512, n_kv_heads=2)
draft = TinyGPT(64, 32, 2, 1, 512)
with limited_threads(1, torch=True):
    cpu_model, rep = calibrate_cpu(
        target, batches=(1, 4, 16), seq_lens=(32, 128, 384), qs=(1, 4), repeat=3, draft=draft, k=4
    )
print(cpu_model)
print(f"fit over {len(rep['points'])} MEASURED forwards: R^2 {rep['r2']:.3f}; "
      f"draft/target cost {rep['draft_ratio']:.2f}")  # fmt: skip
fixed = cpu_model.overhead_s + cpu_model.weight_s
print(f"fixed cost per forward {fixed * 1e3:.2f} ms vs {cpu_model.token_s * 1e6:.1f} us per token of the batch")
# the fixed part dominates: ~20x a token's cost on an AVX-512 CPU path, ~4x on the scalar path (no SIMD GEMM)
assert rep["r2"] > 0.5 and fixed > 2 * cpu_model.token_s
assert cpu_model.link_alpha_s == 5e-6 and cpu_model.link_beta_s == 1 / 100e9  # the ASSUMED link

# %% [markdown]
# On this CPU a TinyGPT forward is mostly a fixed cost (Python and op dispatch; the printed fit): one more sequence
# in the batch costs several times less than the forward's fixed part (over 2x asserted; how much depends on the
# CPU's GEMM path) — the CPU analogue of a memory-bound decode step, where batching is cheap and speculation pays.
#
# The speculative term, checked against real runs: `speculative_generate` at temperature 1 with draft length
# k = 4, tokens emitted per target call in the rounds that drafted k tokens, against (1 − α^(k+1))/(1 − α) at the
# run's measured per-token acceptance α — once with the small random draft of the calibration, once with a draft
# that is the target with noisy weights (higher acceptance).

# %%
# NBVAL_IGNORE_OUTPUT
checks = {"small draft": rep["speculative"], "noisy-weights draft": check_speculative(
    target, perturbed_draft(target, noise=0.6, seed=1), k=4, n_tokens=128, temperature=1.0, seed=0)}  # fmt: skip
for name, chk in checks.items():
    print(f"{name:20}: alpha {chk['alpha']:.3f}, MEASURED {chk['measured']:.2f} tokens per target call over "
          f"{chk['rounds']} rounds, formula {chk['formula']:.2f} (ratio {chk['ratio']:.3f})")  # fmt: skip
    assert 0 < chk["alpha"] < 1 and chk["rounds"] >= 15 and 1 / 1.35 <= chk["ratio"] <= 1.35
    assert chk["formula"] == expected_tokens(chk["alpha"], 4)
assert checks["noisy-weights draft"]["alpha"] > checks["small draft"]["alpha"]

# %%
# NBVAL_IGNORE_OUTPUT
hw = DecodeCostModel.from_hardware(7e9, 32, 4096, 2 * 32 * 8 * 128 * 2, 4e14, 2e12)  # fp16, GQA 8 KV heads
maps = {
    "CPU-calibrated TinyGPT": (cpu_model, [2**i for i in range(4, 10)], [2**i for i in range(9)]),
    "7B on an ASSUMED accelerator": (hw, [2**i for i in range(7, 18)], [2**i for i in range(13)]),
}
fig, axes = plt.subplots(1, 2, figsize=(14, 4.2))
chosen = {}
for ax, (title, (m, seqs, batches)) in zip(axes, maps.items()):
    grid = [[m.choose(s, bt) for bt in batches] for s in seqs]
    chosen[title] = {(s, bt): st for s, row in zip(seqs, grid) for bt, st in zip(batches, row)}
    names = sorted({str(st) for row in grid for st in row})
    idx = np.array([[names.index(str(st)) for st in row] for row in grid])
    ax.imshow(idx, origin="lower", cmap="tab20", vmin=0, vmax=19, aspect="auto")
    ax.set_xticks(range(len(batches)), batches, fontsize=7)
    ax.set_yticks(range(len(seqs)), seqs, fontsize=7)
    ax.set_xlabel("batch size")
    ax.set_ylabel("context length")
    ax.set_title(f"MODEL (link ASSUMED): {title}", fontsize=10)
    cmap = plt.get_cmap("tab20")
    ax.legend([Patch(color=cmap(i)) for i in range(len(names))], names, fontsize=6, loc="upper left",
              bbox_to_anchor=(1.0, 1.0))  # fmt: skip
plt.tight_layout()
plt.show()
tab = chosen["7B on an ASSUMED accelerator"]
for s_b, st in sorted(tab.items()):
    if s_b in ((128, 1), (128, 4096), (131072, 1), (131072, 256)):
        print(
            f"7B MODEL, S={s_b[0]}, B={s_b[1]}: {st} (speed-up vs one device "
            f"{hw.latency_per_token(s_b[1], s_b[0], Strategy()) / hw.latency_per_token(s_b[1], s_b[0], st):.1f}x)"
        )
hw_seqs, hw_batches = maps["7B on an ASSUMED accelerator"][1:]
assert all([tab[s, bt].kv for s in hw_seqs] == sorted(tab[s, bt].kv for s in hw_seqs) for bt in hw_batches)
assert tab[128, 4096].k == 0 and tab[128, 1].k > 0 and tab[128, 1].tp > 1
assert tab[131072, 1].kv > 1

# %% [markdown]
# The 7B map reads as the interview rule table: at **small batch** decode is memory-bound — tensor parallelism
# (splits the weight reads) and speculation (one weight read verifies several tokens) both pay; at **large batch
# and short context** the step becomes compute-bound, the k + 1 verify tokens cost k + 1 times the compute and
# speculation switches off; at **long context** the KV reads dominate and the KV shards grow (never fewer shards as
# S grows, checked for every batch size). The CPU map comes from measured forwards but an assumed link, so it says
# what a cluster of such CPUs would do if its links were that fast; its regions move with the measured fit (output
# not compared). A production system keeps such a table per model and hardware and looks it up per batch.

# %% [markdown]
# ## 13. The HTTP server under load
#
# `tl.serve.create_app(engine)` puts an OpenAI-compatible API in front of the engine (FastAPI + uvicorn):
# `POST /v1/completions` and `/v1/chat/completions` (JSON, or server-sent events with `stream: true`), `GET /v1/models`,
# `/health`, `/metrics` (Prometheus text: queue depth, running, KV usage, prefix hit rate, TTFT/TPOT histograms).
# The engine runs in one background thread (`AsyncEngine`); requests are queued to it and their tokens streamed back.
# Bad requests get **400** naming the field; a full waiting queue gets **429** with `Retry-After` (load is shed, not
# queued without bound); a draining server (SIGTERM) gets **503**; a client that disconnects mid-stream is aborted and
# its KV blocks are freed. `tinylearn serve` runs the same app from the command line. Below, the server listens on a
# free loopback port inside this process and `tl.serve.loadgen.run_load` (asyncio + httpx; `tools/loadgen.py` is its
# command line) sends Poisson arrivals: TTFT, TPOT and end-to-end latency are measured by the client, per request.

# %%
# NBVAL_IGNORE_OUTPUT
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

import httpx  # noqa: E402

from tinylearn.serve import create_app  # noqa: E402
from tinylearn.serve.loadgen import run_load  # noqa: E402
from tinylearn.serve.server import build_engine, serve_in_thread  # noqa: E402


def load(url: str, **kw) -> dict:
    """run_load in a worker thread (it runs its own asyncio loop; the notebook's kernel already has one)."""
    with ThreadPoolExecutor(1) as ex:
        return ex.submit(run_load, url, **kw).result()


LOADS = {}
with limited_threads(1, torch=True):
    for caching in (False, True):
        app = create_app(build_engine("tiny", max_num_seqs=16, enable_prefix_caching=caching), max_waiting=64)
        with serve_in_thread(app) as url:
            r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "Hello", "max_tokens": 4,
                                                        "temperature": 0})  # fmt: skip
            assert r.status_code == 200, r.text
            if caching:
                LOADS["random, 20 req/s"] = load(url, n_requests=40, rate=20.0, workload="random", seed=1,
                                                 output_len=("uniform", 8, 32), duration_s=30)  # fmt: skip
            LOADS[f"shared prefix, caching {'on' if caching else 'off'}"] = load(
                url, n_requests=40, rate=20.0, workload="shared-prefix", prefix_len=448, seed=2,
                prompt_len=("uniform", 8, 24), output_len=("uniform", 8, 32), duration_s=30)  # fmt: skip
            # requests the load generator gave up on at its deadline are cancelled by the server as it notices the
            # disconnect: wait (bounded) for the engine to drain, then nothing may be left
            drain_end = time.monotonic() + 15.0
            while True:
                stats = app.state.server.aengine.stats()
                drain_ok = stats["running"] == 0 and stats["waiting"] == 0 and stats["kv_usage"] == 0
                if drain_ok or time.monotonic() > drain_end:
                    break
                time.sleep(0.05)
            assert drain_ok, stats  # nothing leaked
for name, s in LOADS.items():
    print(f"{name:28s} ok {s['n_ok']:3d}/{s['n_requests']}  {s['output_tok_s']:6.0f} tok/s  TTFT p50/p99 "
          f"{s['ttft_s']['p50'] * 1e3:6.1f}/{s['ttft_s']['p99'] * 1e3:6.1f} ms  TPOT p50/p99 "
          f"{s['tpot_s']['p50'] * 1e3:5.2f}/{s['tpot_s']['p99'] * 1e3:5.2f} ms")  # fmt: skip
off, on = LOADS["shared prefix, caching off"], LOADS["shared prefix, caching on"]
http_cut = off["ttft_s"]["p50"] / on["ttft_s"]["p50"]
print(f"shared-prefix TTFT p50 over HTTP: caching cuts it {http_cut:.1f}x (the >= 3x goal is met inside the engine, "
      f"section 3; over HTTP it is {'met' if http_cut >= 3 else 'NOT met'} -- see the reading below)")  # fmt: skip
assert all(s["n_ok"] == s["n_requests"] for s in LOADS.values())  # at 20 req/s nothing is shed or lost
assert all(s["ttft_s"]["p99"] >= s["ttft_s"]["p50"] > 0 for s in LOADS.values())
# what holds over HTTP: caching lowers the client-measured median TTFT (by less than the engine's cut, see below)
assert 1.0 < http_cut < cut, (http_cut, cut)
fig, ax = plt.subplots(1, 2, figsize=(12, 3.5))
names = list(LOADS)
for i, (k, lab) in enumerate((("ttft_s", "TTFT"), ("tpot_s", "TPOT"))):
    ax[i].bar(np.arange(len(names)) - 0.2, [LOADS[n][k]["p50"] * 1e3 for n in names], 0.4, label="p50")
    ax[i].bar(np.arange(len(names)) + 0.2, [LOADS[n][k]["p99"] * 1e3 for n in names], 0.4, label="p99")
    ax[i].set_xticks(range(len(names)), [n.replace(", ", "\n") for n in names])
    ax[i].set(ylabel="ms", title=f"{lab} measured by the client (loopback, 40 requests)")
    ax[i].legend()
plt.show()

# %% [markdown]
# **Throughput and p99 latency against offered load.** The same server (prefix caching on, 16 running slots) under the
# random workload at offered rates from 10 to 640 requests/s, 32 requests each (kept short: a few seconds in all).
# At low rates the server keeps up and throughput is the offered load; as the rate grows, the batch fills and the
# throughput rises to what the engine and the HTTP path can deliver, while the p99 latencies grow with the queue.

# %%
# NBVAL_IGNORE_OUTPUT
RATES = (10.0, 40.0, 160.0, 640.0)
curve = {}
with limited_threads(1, torch=True):
    app = create_app(build_engine("tiny", max_num_seqs=16), max_waiting=256)
    with serve_in_thread(app) as url:
        load(url, n_requests=4, rate=float("inf"), seed=9, output_len=("uniform", 8, 32), duration_s=10)  # warm-up
        for rate in RATES:
            curve[rate] = load(url, n_requests=32, rate=rate, seed=4, output_len=("uniform", 8, 32), duration_s=20)
print(" offered req/s  served req/s  out tok/s  TTFT p99 ms  TPOT p99 ms  e2e p50 ms  e2e p99 ms")
for rate, c in curve.items():
    print(f"{rate:14.0f}  {c['throughput_req_s']:12.1f}  {c['output_tok_s']:9.0f}  {c['ttft_s']['p99'] * 1e3:11.1f}  "
          f"{c['tpot_s']['p99'] * 1e3:11.2f}  {c['e2e_s']['p50'] * 1e3:10.1f}  "
          f"{c['e2e_s']['p99'] * 1e3:10.1f}")  # fmt: skip
lo, hi = curve[RATES[0]], curve[RATES[-1]]
assert all(c["n_ok"] == 32 for c in curve.values())  # the queue (256) is never full: every request is served
# at 10 req/s throughput is the offered load; a burst fills the batch: several times more tokens per second ...
assert hi["output_tok_s"] > 3 * lo["output_tok_s"], (lo["output_tok_s"], hi["output_tok_s"])
# ... and at 640 req/s the last of 32 requests queue behind 16 running ones: its latency exceeds a lone request's
assert hi["e2e_s"]["p99"] > 1.5 * lo["e2e_s"]["p50"], (lo["e2e_s"]["p50"], hi["e2e_s"]["p99"])
fig, ax = plt.subplots(1, 2, figsize=(11, 3.5))
ax[0].plot(RATES, [c["output_tok_s"] for c in curve.values()], "o-")
ax[0].set(xscale="log", xlabel="offered load (requests/s)", ylabel="output tokens/s", title="throughput")
for k, lab in (("ttft_s", "TTFT p99"), ("e2e_s", "end-to-end p99")):
    ax[1].plot(RATES, [c[k]["p99"] * 1e3 for c in curve.values()], "o-", label=lab)
ax[1].set(xscale="log", xlabel="offered load (requests/s)", ylabel="ms", title="p99 latency (client-measured)")
ax[1].legend()
plt.show()

# %% [markdown]
# **Overload and faults.** The same server with 4 running slots and a waiting queue of 4 receives 64 requests at
# once, a fifth of them malformed JSON and a fifth disconnecting after their first token: it must answer every
# malformed one with 400, shed what does not fit the queue with 429 + `Retry-After`, serve the rest, and end (after a
# bounded wait for the engine to notice the disconnects) with no request running and no KV block in use. (The test
# suite runs the same fault run at 1,000 requests on up to 1,000 concurrent loopback connections:
# `tests/serve/test_serve_fault_load.py`.)

# %%
# NBVAL_IGNORE_OUTPUT
app = create_app(build_engine("tiny", max_num_seqs=4), max_waiting=4)  # 8 in flight: 64 at once must overflow
with limited_threads(1, torch=True), serve_in_thread(app) as url:
    bad = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 0})
    print(bad.status_code, bad.json()["error"]["message"])
    fault = load(url, n_requests=64, rate=float("inf"), seed=3, output_len=("uniform", 32, 64),
                 malformed_frac=0.2, disconnect_frac=0.2, duration_s=60)  # fmt: skip
    drain_end = time.monotonic() + 15.0  # the engine thread frees the disconnected requests' blocks at its next step
    while True:
        after = app.state.server.aengine.stats()
        if (after["running"], after["waiting"], after["kv_usage"]) == (0, 0, 0) or time.monotonic() > drain_end:
            break
        time.sleep(0.05)
    metrics_text = httpx.get(url + "/metrics").text
print("status counts:", fault["status_counts"])
print({k: after[k] for k in ("running", "waiting", "kv_usage", "aborted")})
assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
counts = fault["status_counts"]
assert counts.get("400", 0) > 0 and counts.get("429", 0) > 0 and counts.get("200", 0) > 0
assert sum(counts.values()) == 64 and "error" not in counts  # every request got an answer (or hung up itself)
assert after["running"] == 0 and after["waiting"] == 0 and after["kv_usage"] == 0
# the server's own Prometheus counters agree with what the client saw
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

http = {s.labels["code"]: s.value for f in text_string_to_metric_families(metrics_text) for s in f.samples
        if s.name.endswith("_http_responses_total")}  # fmt: skip
print("server-side HTTP counters:", http)
assert http.get("429") == counts["429"] and http.get("400", 0) >= counts["400"]

# %% [markdown]
# Reading the load test: at 20 requests/s every request is served; prefix caching lowers the shared-prefix workload's
# median TTFT here too, but by less than inside the engine (section 3): **the issue's ≥ 3× TTFT goal is met inside the
# engine, not reliably over HTTP on this machine** (the printed ratio; same 448-token prefix), because a
# client-measured TTFT also holds costs caching cannot cut — the HTTP round trip, JSON parsing, tokenization, the
# wait for the engine thread's next step (other requests' decode steps run in it) and the first SSE chunk — and the
# server shares this process and its two cores with the load generator. What the assert checks over HTTP is the
# direction (caching lowers the median TTFT) and that the cut is smaller than the engine's. Under the burst, the
# queue bound does its job: malformed requests get 400, what does not fit gets 429 with `Retry-After`, the rest are
# served, disconnected clients' requests are aborted, and afterwards no request runs and no KV block is in use; the
# server's own `/metrics` counters match the status codes the client received.

# %% [markdown]
# ## Recap (interview answers)
#
# - **Prefill vs decode**: a decode step reads all weights (and each sequence's K/V) for one token per sequence:
#   ~$B/2$ FLOP/byte, memory-bound; batching $B$ sequences raises the intensity until the K/V reads dominate, so a
#   step's time grows far slower than $B$ (measured in section 1). A prefill is a matrix product, compute-bound.
# - **Continuous batching [Q133]**: schedule per iteration, not per batch: decodes first, then new prompts under a
#   token budget; a finished request's slot is refilled at the next step. Static batching wastes the slots of
#   finished requests until the batch's longest one ends (over a quarter of them on section 2's workload).
# - **Prefix caching [Q203]**: index full KV blocks by a hash chained over the prefix (verify the stored tokens),
#   share hits by reference count, compute only the rest (at least the last token), keep freed blocks indexed and
#   evict them least-recently-freed first; the hit rate is hit tokens / queried tokens, read from the cache.
# - **Chunked prefill**: give a long prompt only the budget left after the decodes, over several steps: the decoders'
#   worst step shrinks from a whole prefill to one chunk; the long prompt's TTFT grows. Tune the budget to the TPOT SLO.
# - **Preemption and KV pressure [Q107]**: when blocks run out mid-decode, evict whole sequences (last in policy order)
#   by recompute (free; prefill prompt + generated again later) or swap (copy blocks to host, copy back); both exact.
#   Recompute costs FLOPs, swap costs $2\times$ the KV bytes over the host link. INT8 blocks with a per-(token, head)
#   scale take $(d_h+4)/(4d_h)$ of fp32's bytes. Inside one long sequence, token-priority eviction
#   (`kv_token_budget`) keeps the recent window + the heavy hitters of the latest query and frees the rest: a hard
#   memory bound, approximate outputs (re-expansion: notebook 09 §4).
# - **A serving API**: OpenAI-compatible routes, SSE streaming, 400 naming the field, 429 + Retry-After from a bounded
#   queue (shed load, never an unbounded backlog), 503 while draining on SIGTERM, aborts on disconnect that free KV
#   blocks at once, Prometheus metrics (queue depth, KV usage, hit rate, TTFT/TPOT histograms).
# - **Tiered KV offload with prefetch [Q113]**: fixed-size KV blocks in tiers (device arena → host RAM → SSD file),
#   each tier LRU, a full tier demotes its LRU block one level down; a get promotes. Attention reads a sequence's
#   blocks in order, so prefetching the next blocks on a background thread during the current block's compute
#   turns the misses of a sequential scan into hits (none of 24 without prefetch, at least half with it, here).
#   Compressing fp32 KV losslessly saves only 5-20% at over 5x the latency of a page-cached read: quantize
#   (int8/FP8 KV) instead.
# - **Delta-compressed KV [Q137]**: store each token's K/V row as the entries that moved by more than a threshold
#   since the *reconstructed* previous row (keyframes bound the decode chain): lossless at 0, error ≤ threshold
#   otherwise; in the engine's swap tier it saved under 10% at 0 (~2%) on random-init TinyGPT, whose adjacent K/V
#   rows are not similar — the gain is the model's, measure it.
# - **L1/L2/L3 by recency [Q244]**: the tier of a block is its recency rank: the k1 most recent in L1, the next k2
#   in L2, the rest in L3 — LRU demotion maintains exactly that order with O(1) moves per access.
# - **Append-only KV journal [Q143]**: log only each step's new-token K/V with (seq, start offset, length, CRC);
#   a writer thread group-commits with fsync; recovery replays the log, drops a torn tail (bad length or CRC) and
#   returns an exact prefix of each sequence; compaction rewrites one record per live sequence atomically. Replay
#   is far cheaper than recomputing the KV by prefill (over 5x here, asserted).
# - **Semantic + time-decay eviction [Q193]**: score = α·cos(entry, current context) + (1-α)·2^(-age/half-life);
#   evict the lowest. Beats LRU on topic-drift traffic because one-off documents are unrelated to the context.
# - **Learned eviction [Q220]**: features (log age, log frequency, context cosine, log size) → logistic regression
#   for P(access within the next W requests), trained on a past trace (held-out AUC 0.94 here); evict the lowest
#   probability. It beat LRU at every capacity on the held-out SYNTHETIC trace; LFU was the worst.
# - **Shard prewarming [Q162]**: lazy per-shard loading with an LRU of resident shards; a Markov chain over shard
#   transitions (with back-off to shorter contexts) predicts the top-k next shards, prefetched in the background
#   while the current request runs: cold loads on the critical path 48 → 25 → 11 for k = 0, 1, 2.
# - **Latency prediction and control [Q259]**: log each step's features and duration, fit a non-negative linear
#   step-cost model (fixed cost + per prefill token + per decode token + per KV token), check it on held-out steps,
#   derive TTFT/TPOT from the token budget and the queue, and admit a request only if both predicted SLOs hold —
#   in the engine (`admission=`), from its live state; with a KV budget (`kv_budget_blocks`) a request is admitted
#   only if its worst-case KV fits, so nothing admitted is ever preempted (rejections: 503 / 429 + Retry-After).
# - **SLO-aware scheduling [Q106] [Q133]**: order the queues by deadline (EDF) or prompt length (SPF) inside a
#   continuous-batching engine with a token budget; EDF minimises deadline misses (12 → 0 vs FCFS), SPF minimises
#   mean TTFT (12.9 → 4.45 steps); admission control keeps the load where the deadlines are feasible.
# - **Length bucketing [Q124]**: with padded batches, group requests of similar length inside a sync window (62% →
#   4% padding here); a ragged engine has no padding at all and keeps only the reordering (SPF) to cut
#   head-of-line blocking.
# - **Autoscaling under bursts [Q261]**: fuse signals — utilisation (HPA rule), queue depth against the SLO, p95
#   latency, and a Holt forecast of the arrival rate one cold start ahead; scale up on any signal, down only when
#   all are low, one replica at a time, after a cooldown (hysteresis). With a measured replica cold start in a
#   simulation MODEL, prediction removed most SLO violations of an exponential burst at similar cost, but bought
#   little on a linear ramp (there the reactive headroom keeps up); without hysteresis the controller took more than
#   3x the decisions and more violations on a flat load. Cut the cold start itself: warm pools, preloaded weights.
# - **Stage pipelines [Q189]**: run stages on threads joined by bounded queues (backpressure, in-order results),
#   measure per-stage service times, merge light neighbours under the bottleneck and replicate the bottleneck if it
#   is stateless — then keep a new plan only if the measured throughput improves: threads help I/O-like and
#   GIL-releasing stages (given free cores), never pure-Python ones (one core at most, measured).
# - **Async preprocessing for multi-turn chat [Q198]**: tokenize, hash prefix blocks (turn j hits turn j-1's
#   blocks) and pack in a thread pool feeding a bounded asyncio queue, so batch i+1 is prepared while batch i runs
#   (checked from timestamps). The gain is at most the shorter phase (Amdahl): byte tokenization was under 10% of a
#   TinyGPT step here, so overlap matters only for heavy preprocessing (BPE over long histories, host→device copies).
# - **Merging speculative branches [Q224]**: merge two branches iff their last tokens agree and the JS (or TV)
#   distance of their next-token distributions is under a threshold; the survivor keeps its KV, the loser's private
#   blocks (refcount 1) are freed — exactly counted — and its probability mass is added (logaddexp). Identical
#   sequences merge exactly; otherwise the continuation error, measured on real forwards, shrinks with the shared
#   suffix, and the distance tracks it.
# - **Choosing TP / KV sharding / speculation [Q183]**: a calibrated per-step cost model (weights, per-token
#   compute, KV reads, attention, α-β all-reduces) plus the speculative yield (1 − α^(k+1))/(1 − α) (checked against
#   real runs); pick the least latency per token for each (S, B): speculation and TP at small batch
#   (memory-bound), no speculation at large batch, more KV shards at long context.

# %% [markdown]
# ## Exercises (`exercises/13_llm_serving/`)
#
# Edit `stubs.py`, then `pytest exercises/13_llm_serving` (or `tinylearn check 13`):
#
# 1. `schedule_step` — one scheduler step: decodes first, then new prompts under the token budget and `max_num_seqs`,
#    chunking prompts that do not fit.
# 2. the block-hash prefix cache — chained block hashes and the longest cached prefix (full blocks only, at least one
#    token left to compute).
# 3. the chunked-prefill budget — how many steps until a prompt's first token, given the budget and the decodes.
#
# `pytest exercises/13_llm_serving --impl=reference` runs the same tests on tinylearn's answers.
