# %% [markdown]
# # 09 · LLM inference: a tiny GPT, KV caches (dense, paged, INT8), sampling, speculative decoding, batching
#
# **Interview questions this notebook answers** (seed 003: 17, 106, 107, 114, 124, 133, 137, 155, 203, 247):
#
# 1. **[Q17]** How does self-attention compute its output, why several heads, and what do multi-query /
#    grouped-query attention change? Implement a (decoder) transformer block.
# 2. **[Q107]** The KV cache dominates memory for long contexts: how big is it per token, how does paging
#    (block tables) remove fragmentation, what does low-bit (INT8, per-head scales) KV cost in accuracy, and how do
#    token-priority eviction and re-expansion trade accuracy for memory?
# 3. **[Q203]** Requests in a batch share a prefix (system prompt): how does a hash index over blocks find it, how do
#    you share its KV with reference counts, and what happens when one of them writes (copy-on-write)?
# 4. **[Q114]** How does speculative decoding (draft + verifier) cut the number of large-model calls, and why is
#    its output distributed *exactly* like the large model's? (Prefix caching: section 5.)
# 5. **[Q133]** Requests arrive unevenly: how do static and continuous (iteration-level) batching differ in
#    throughput and tail latency, how does an SLA priority queue protect urgent requests, and what do you do when
#    the KV memory runs out (preemption)?
# 6. **[Q247]** How can a controller adapt the sampling temperature in real time from the repetition rate,
#    perplexity and semantic consistency of the output? (section 3)
# 7. **[Q137]** Adjacent tokens' K/V often differ little: how do you store thresholded deltas with keyframes, and
#    what do they save on real K/V? (section 4)
# 8. **[Q124]** How do length buckets inside a sync window cut the padding of batched requests? (section 7)
# 9. **[Q155]** Several models share a device with SLA weights: how does a min-heap on weighted urgency
#    (weight / remaining time) cut the weighted tail latency? (section 7)
# 10. **[Q106]** Requests of different batch sizes and SLOs share a GPU: how do you schedule with estimated SM
#    occupancy and memory bandwidth plus deadline priority? (section 7)
#
# Everything runs on `tinylearn.inference`: `TinyGPT` is built from tinylearn's own autograd/nn (`tl.nn.Linear`,
# `LayerNorm`, `Embedding`, `tl.Tensor` ops) and checked against the same architecture in torch.
# Models are tiny and randomly initialised: the *mechanisms* (cache, paging, sampling, rejection rule, batching)
# are what is measured, not text quality.

# %%
import tinylearn as tl  # first: its short OpenMP spin-wait is set before torch loads libgomp (notebook 00)

# isort: split
import os

import matplotlib.pyplot as plt
import numpy as np
import torch
from scipy import stats as sps
from threadpoolctl import threadpool_limits

from tinylearn.bench import measure
from tinylearn.inference import (
    GPTConfig,
    PagedKVCache,
    TableLM,
    TemperatureController,
    TinyGPT,
    attention_received,
    delta_compress,
    delta_decompress,
    delta_stats,
    dense_attention,
    estimate_footprint,
    filter_probs,
    form_batches,
    generate,
    generate_adaptive,
    kv_bytes_per_token,
    linear_step_cost,
    open_session,
    padding_stats,
    paged_attention,
    paged_attention_batch,
    poisson_requests,
    priority_keep,
    simulate_serving,
    simulate_shared_device,
    speculative_generate,
    torch_reference,
    weighted_tail_latency,
)
from tinylearn.testing import assert_close

FULL = os.environ.get("TINYLEARN_FULL") == "1"
# one BLAS thread for the whole notebook: these matrices are far too small to gain from a second one, and on a
# shared 2-core box BLAS workers waiting on each other made single timings vary by 10x
threadpool_limits(limits=1)
torch.manual_seed(0)
tl.manual_seed(0)
CFG = GPTConfig(vocab_size=64, d_model=64, n_heads=4, n_layers=2, max_seq_len=512, n_kv_heads=2)
print(CFG)

# %% [markdown]
# ## 1. A decoder-only transformer in tinylearn, checked against torch [Q17]
#
# Pre-LN block: `x = x + Attn(LN1(x)); x = x + MLP(LN2(x))`, MLP = `Linear(d, 4d) -> GELU(erf) -> Linear(4d, d)`.
# Attention per head: $\mathrm{softmax}(QK^\top/\sqrt{d_h} + M)V$ with the causal mask $M_{ij} = -\infty$ for
# $j > i$. Several heads attend to different subspaces at the same cost as one wide head.
# **GQA**: `n_kv_heads < n_heads` K/V heads, query head $h$ reads KV head $h / g$ ($g$ = n_heads / n_kv_heads);
# **MQA** is `n_kv_heads = 1`. Fewer KV heads shrink the KV cache by $g\times$ and the K/V projections too.
#
# **RoPE** (rotate-half convention): dims $i$ and $i + d_h/2$ form a pair rotated by angle
# $\text{pos}\cdot 10000^{-2i/d_h}$: `rope(x) = x*cos + rotate_half(x)*sin`, `rotate_half([x1, x2]) = [-x2, x1]`.
# Rotating q and k by their own positions makes $q\cdot k$ depend only on the offset.
#
# `torch_reference(config)` is the same architecture in torch with the same parameter names; we copy its weights
# into `TinyGPT` and compare logits at fp32 tolerance for MHA, GQA and MQA.

# %%
for kv in (4, 2, 1):
    cfg = GPTConfig(64, 64, 4, 2, 512, n_kv_heads=kv)
    ref = torch_reference(cfg)
    model = TinyGPT.from_config(cfg).load_torch_state_dict(ref.state_dict())
    ids = np.random.default_rng(0).integers(0, 64, (2, 24))
    with tl.no_grad():
        out = model(ids).numpy()
    assert_close(out, ref(torch.from_numpy(ids)).detach().numpy(), np.float32)
    n_kv_params = sum(p.data.size for n, p in model.named_parameters() if "k_proj" in n or "v_proj" in n)
    print(
        f"n_kv_heads={kv}: logits {out.shape} match torch; K/V projection params {n_kv_params}, "
        f"KV cache {kv_bytes_per_token(2, kv, 16)} B/token"
    )

# RoPE: the score of (query at m, key at n) depends on m - n only
from tinylearn.inference import apply_rope, rope_tables  # noqa: E402

cos, sin = rope_tables(128, 16)
rng = np.random.default_rng(1)
q, k = (tl.Tensor(rng.standard_normal(16).astype(np.float32)) for _ in range(2))


def score(m, n):
    return float((apply_rope(q, cos[m], sin[m]) * apply_rope(k, cos[n], sin[n])).sum().item())


assert abs(score(7, 3) - score(107, 103)) < 1e-4
print(f"RoPE score(7, 3) = {score(7, 3):.4f} = score(107, 103) = {score(107, 103):.4f}")

# %% [markdown]
# ## 2. The KV cache removes the O(T²) recompute
#
# Without a cache, producing token $T+1$ re-runs the model over all $T$ tokens: $O(T)$ MLP rows and $O(T^2)$
# attention per step, $O(T^3)$ for a whole generation. With a cache, each step feeds only the new token and
# attends over $T$ stored K/V rows: $O(T)$ per step. The outputs are identical (greedy tokens below). The timing
# is one decode step at context length $T$. Timings in this notebook are the best sample of the bench harness over 5
# interleaved rounds (`best_times`): on a shared 2-core box the median swings with the load of other processes,
# the best sample much less (`tinylearn bench inference` reports medians).

# %%
model = TinyGPT.from_config(CFG)
a = generate(model, [1, 2, 3], 24, kv_cache=True)
b = generate(model, [1, 2, 3], 24, kv_cache=False)
assert a == b
print("greedy tokens, cache == no cache:", a)

# %%
# NBVAL_IGNORE_OUTPUT
lengths = [16, 64, 128, 256] if not FULL else [16, 64, 128, 256, 500]
rng = np.random.default_rng(2)


def best_times(fns, rounds=5, repeat=3):
    """Per function, the min over `rounds` round-robin passes of the bench harness (each: warm-up, then `repeat`
    timed calls). Interleaving spreads every function's samples over the whole window, so a burst of load on a shared
    2-core box slows all of them alike instead of one; the best sample is the least disturbed statistic."""
    best = [np.inf] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            best[i] = min(best[i], measure(fn, repeat=repeat).min)
    return np.array(best)


steps, fulls = [], []
for T in lengths:
    ids = rng.integers(0, CFG.vocab_size, (1, T + 1))
    cache = model.new_cache(1)
    with tl.no_grad():
        model(ids[:, :T], cache)

    def step(cache=cache, ids=ids, T=T):
        cache.length = T
        with tl.no_grad():
            model(ids[:, T:], cache)

    def full(ids=ids):
        with tl.no_grad():
            model(ids)

    steps.append(step)
    fulls.append(full)
times = best_times(steps + fulls)
t_cache, t_full = times[: len(lengths)], times[len(lengths) :]
for T, c, f in zip(lengths, t_cache, t_full):
    print(
        f"T={T:4d}: cached step {c * 1e3:6.2f} ms ({1 / c:7.0f} tok/s)   "
        f"full recompute {f * 1e3:7.2f} ms ({1 / f:6.0f} tok/s)"
    )
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.loglog(lengths, 1 / np.array(t_cache), "o-", label="KV cache")
ax.loglog(lengths, 1 / np.array(t_full), "s-", label="no cache (recompute)")
ax.set_xlabel("context length T")
ax.set_ylabel("decode tokens/s")
ax.set_title("TinyGPT decode speed (tinylearn, CPU)")
ax.legend()
plt.show()
# claims that hold on any CPU and load: recompute costs more than a cached step, the gap grows with T, and the
# cached step grows far less than T (16x longer context, < 3x the time)
assert t_full[-1] > t_cache[-1]
assert t_full[-1] / t_cache[-1] > t_full[0] / t_cache[0]
assert t_cache[-1] < 3 * t_cache[0]

# %% [markdown]
# The cached step is nearly flat in $T$ (under 3x the time for a 16x longer context: tinylearn's per-op Python
# overhead dominates at this size; the attention read is $O(T)$), while recompute grows with $T$: the ratio at the
# longest context is larger than at the shortest. Side-by-side numbers against torch (with `past_key_values`) and
# tinygrad (TinyJit): `tinylearn bench inference`.
#
# ## 3. Sampling: temperature, top-k, top-p
#
# `generate` draws from `softmax(logits / T)`, then keeps the `top_k` most likely tokens, then the smallest
# nucleus whose cumulative probability is $\ge p$ (at least one token), renormalising after each filter. We check
# the filtered distributions against a torch implementation of the same rules on fixed logits.

# %%
logits = np.random.default_rng(3).standard_normal(16)


def torch_filter(lg, t, k=None, p=None):
    probs = torch.softmax(torch.tensor(lg, dtype=torch.float64) / t, -1)
    if k is not None:
        probs = torch.where(probs >= torch.topk(probs, k).values[-1], probs, 0.0)
        probs = probs / probs.sum()
    if p is not None:
        s, idx = torch.sort(probs, descending=True, stable=True)
        keep = (torch.cumsum(s, 0) - s) < p
        keep[0] = True
        probs = torch.where(torch.zeros_like(keep).scatter(0, idx, keep), probs, 0.0)
        probs = probs / probs.sum()
    return probs.numpy()


settings = [(1.0, None, None), (0.5, None, None), (1.0, 5, None), (1.0, None, 0.8), (0.7, 8, 0.9)]
fig, axes = plt.subplots(1, len(settings), figsize=(13, 2.6), sharey=True)
for ax, (t, k, p) in zip(axes, settings):
    probs = filter_probs(logits, t, k, p)
    assert_close(probs, torch_filter(logits, t, k, p), np.float64)
    ax.bar(range(16), probs)
    ax.set_title(f"T={t} k={k} p={p}\n{np.count_nonzero(probs)} tokens kept", fontsize=8)
plt.tight_layout()
plt.show()
print("kept tokens:", [int(np.count_nonzero(filter_probs(logits, *s))) for s in settings])
x = generate(model, [5], 12, temperature=0.8, top_p=0.9, seed=1)
assert x == generate(model, [5], 12, temperature=0.8, top_p=0.9, seed=1)
print("seeded sample:", x)

# %% [markdown]
# ### Adaptive temperature from repetition, perplexity and semantic consistency [Q247]
#
# A fixed low temperature makes a model loop on a few tokens; a high one makes the text improbable and lets it
# wander away from what it was saying. A feedback controller (`TemperatureController`) watches the last 16 generated
# tokens after every token and measures three signals:
#
# - **repetition rate**: 1 - distinct/count of the window;
# - **perplexity** of the window under the model's own untempered distribution (how surprising the text is to it);
# - **semantic consistency**: the cosine similarity between the mean token embedding of the window and the mean
#   embedding of the text before it (prompt and earlier tokens), read from the model's own embedding table
#   (`tok_emb.weight`). A trained model's embeddings place related tokens close, so a low cosine means the text
#   drifted off its subject; TinyGPT's are random, so here the signal only says how far the window strays from the
#   tokens that came before it.
#
# The rules, in order: perplexity above a bound (30) **or** consistency below a bound (`min_consistency` = 0.5)
# -> temperature / 1.1 (one step when both fire); otherwise repetition above a target (0.1) -> temperature x1.1;
# clamped to [0.05, 2]. The lowering rules win: incoherent or off-topic text is the worse failure.
# `min_consistency=None` (the default) switches the third rule off and gives the earlier controller exactly.
# `generate_adaptive` samples with it from TinyGPT and reports the consistency of every 16-token window. Over four
# seeds we compare fixed T=0.1 (the controller's start), fixed T=1.0, the controller on repetition and perplexity
# only, and the controller with the consistency bound. Sampling is seeded, but the logits come from BLAS, whose last
# bits differ between CPU paths, so the printed values stay out of the checked output and the asserts leave margins.

# %%
# NBVAL_IGNORE_OUTPUT
emb = model.tok_emb.weight.data  # TinyGPT's own [V, d] token embeddings
runs = {"fixed T=0.1": [], "fixed T=1.0": [], "repetition+perplexity": [], "+ consistency >= 0.5": []}
for seed in range(4):
    runs["fixed T=0.1"].append(generate_adaptive(model, [1, 2, 3], 128, temperature=0.1, seed=seed))
    runs["fixed T=1.0"].append(generate_adaptive(model, [1, 2, 3], 128, temperature=1.0, seed=seed))
    ctl = TemperatureController(t0=0.1, target_repetition=0.1, max_perplexity=30.0, step=0.1)
    runs["repetition+perplexity"].append(generate_adaptive(model, [1, 2, 3], 128, controller=ctl, seed=seed))
    ctl = TemperatureController(
        t0=0.1, target_repetition=0.1, max_perplexity=30.0, step=0.1, min_consistency=0.5, embeddings=emb
    )
    runs["+ consistency >= 0.5"].append(generate_adaptive(model, [1, 2, 3], 128, controller=ctl, seed=seed))


def mean_consistency(out):
    """Mean consistency over the output's full 16-token windows (the first 15 tokens have none: NaN)."""
    return float(np.nanmean(out["consistency"]))


stat = {
    name: {
        "repetition": np.array([o["repetition"] for o in outs]),
        "perplexity": np.array([o["perplexity"] for o in outs]),
        "consistency": np.array([mean_consistency(o) for o in outs]),
        "t_max": np.array([max(o["temperatures"]) for o in outs]),
    }
    for name, outs in runs.items()
}
for name, st in stat.items():
    print(
        f"{name:22s} repetition {np.array2string(st['repetition'], precision=2)}  "
        f"perplexity {np.array2string(st['perplexity'], precision=1)}  "
        f"consistency {np.array2string(st['consistency'], precision=2)}  max T {st['t_max'].max():.2f}"
    )
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(12, 3.4))
for name, outs in runs.items():
    ax0.plot(outs[0]["consistency"], label=name)
    ax1.plot(outs[0]["temperatures"], label=name)
ax0.axhline(0.5, color="k", ls=":", lw=1, label="min_consistency")
ax0.set(xlabel="generated token", ylabel="consistency of the last 16 tokens", title="semantic consistency (seed 0)")
ax1.set(xlabel="generated token", ylabel="temperature", title="temperature (seed 0)")
ax0.legend(fontsize=7)
plt.tight_layout()
plt.show()
fixed, hot, old, new = (stat[k] for k in runs)
# the repetition+perplexity controller lowers the repetition of fixed T=0.1 in every seed (on average by more than
# 0.04, about a fifth) and keeps the perplexity under its bound of 30, while T=1.0 pushes it far above (> 40)
assert np.all(old["repetition"] < fixed["repetition"]) and fixed["repetition"].mean() - old["repetition"].mean() > 0.04
assert np.all(old["perplexity"] < 30.0) and np.all(hot["perplexity"] > 40.0)
assert np.all(old["t_max"] > 0.1)  # it did raise the temperature
assert old["consistency"].mean() < fixed["consistency"].mean() - 0.05  # ... and the text strays more
# the consistency bound: in every seed the mean consistency stays above 0.4 where fixed T=1.0 stays below it, and it
# is higher than without the bound by more than 0.05 on average; perplexity still under 30, temperature still raised
assert np.all(new["consistency"] > 0.4) and np.all(hot["consistency"] < 0.4)
assert new["consistency"].mean() > old["consistency"].mean() + 0.05
assert np.all(new["perplexity"] < 30.0) and np.all(new["t_max"] > 0.1)

# %% [markdown]
# The controller on repetition and perplexity lowers the repetition of the fixed low temperature in every seed (on
# average by more than 0.04, about a fifth or more: this random TinyGPT loops only mildly at T=0.1) and keeps the
# perplexity of the whole output under its bound of 30, where a fixed T=1.0 exceeds 40. But the temperature it
# climbs to lets the text stray: its mean window consistency is lower than at T=0.1 (by more than 0.05 on average).
# With the consistency bound the controller backs off whenever the window drifts below 0.5: its mean consistency
# stays above 0.4 in every seed, more than 0.05 above the controller without the bound on average, while a fixed
# T=1.0 stays below 0.4 in every seed; the perplexity stays under 30 and the temperature still rises above its start.
# The price is part of the diversity the temperature bought (the repetition is printed beside the others). Single
# windows early in the output are noisy (a 3-token prompt is a thin reference), which is why the claims are about
# the mean. TinyGPT is random, so "quality" here is only the model's own likelihood and "meaning" only its embedding
# geometry; with a trained model the same three signals apply, a sentence-embedding model can replace the mean of
# token embeddings, and the target and bounds are tuned per task.

# %% [markdown]
# ## 4. Paged KV cache: memory per token, block tables, INT8, eviction [Q107]
#
# KV bytes per token $= 2 \cdot n_\text{layers} \cdot n_\text{kv heads} \cdot d_\text{head} \cdot
# \text{bytes}$ (the 2 is K and V). A dense cache reserves `max_seq_len` slots per request up front; most
# requests stop early, so most of the reservation is wasted. A **paged** cache (vLLM) allocates fixed blocks of
# `block_size` tokens on demand from a free list and maps logical positions through a per-sequence **block
# table**: waste is at most `block_size - 1` slots per sequence, and the blocks need not be contiguous.
# `PagedKVCache` takes its blocks from `tl.memory.SlabAllocator` (one size class = one block) over one arena.

# %%
llama8b = kv_bytes_per_token(n_layers=32, n_kv_heads=8, head_dim=128)
print(f"Llama-3-8B-like (32 layers, 8 KV heads of 128, fp16 = 2 B): {llama8b // 2 / 1024:.0f} KiB/token (fp16)")
assert llama8b // 2 == 128 * 1024  # 128 KiB per token in fp16; 8k tokens -> 1 GiB per sequence

L, H, D = CFG.n_layers, CFG.kv_heads, CFG.head_dim
for dtype in ("float32", "int8"):
    c = PagedKVCache(L, H, D, num_blocks=64, block_size=16, dtype=dtype)
    formula = 2 * L * H * D * (4 if dtype == "float32" else 1) + (2 * L * H * 4 if dtype == "int8" else 0)
    assert c.stats()["bytes_per_token"] == formula
    print(f"{dtype}: {c.stats()['bytes_per_token']:.0f} B/token = formula {formula}")

# waste of a dense max_seq_len reservation vs paging, for 32 requests of random length
lens = np.random.default_rng(4).integers(20, 400, 32)
paged = PagedKVCache(L, H, D, num_blocks=1024, block_size=16)
for n in lens:
    sid = paged.new_sequence()
    for layer in range(L):
        paged.append(sid, layer, np.zeros((n, H, D), np.float32), np.zeros((n, H, D), np.float32))
s = paged.stats()
dense_slots = len(lens) * CFG.max_seq_len
print(
    f"tokens stored {s['tokens']}; dense reservation {dense_slots} slots ({s['tokens'] / dense_slots:.0%} used); "
    f"paged {s['blocks_used']} blocks = {s['blocks_used'] * 16} slots ({s['slot_utilization']:.1%} used)"
)
assert s["tokens"] == lens.sum() and s["blocks_used"] == sum(-(-n // 16) for n in lens)
waste = [len(paged.block_table(sid)) * 16 - paged.length(sid) for sid in paged.seqs]
assert max(waste) < 16  # each sequence wastes less than one block
print("block table of sequence 0:", paged.block_table(0))

# %% [markdown]
# **Paged attention** reads K/V block by block through the table with an online softmax (running max and
# normaliser, as in FlashAttention), never materialising the gathered sequence. It equals dense attention over
# `gather()` and torch's `scaled_dot_product_attention`. The model itself can decode through a paged sequence
# (`cache.model_cache(seq_id)`), with the same logits as its dense cache.
#
# **INT8 KV**: one float32 scale per (token, head) for K and for V, `scale = max|x| / 127`; the rounding error
# is at most `scale / 2` per element. Memory drops from $4D$ to $D + 4$ bytes per head and token.

# %%
rng = np.random.default_rng(5)
kv = [(rng.standard_normal((300, H, D)).astype(np.float32), rng.standard_normal((300, H, D)).astype(np.float32))]
caches = {dt: PagedKVCache(1, H, D, num_blocks=32, block_size=16, dtype=dt) for dt in ("float32", "int8")}
for c in caches.values():
    c.append(c.new_sequence(), 0, *kv[0])
q = rng.standard_normal((CFG.n_heads, D)).astype(np.float32)  # 4 query heads on 2 KV heads (GQA)
k32, v32 = caches["float32"].gather(0, 0)
exact = paged_attention(q, caches["float32"], 0, 0)
assert_close(exact, dense_attention(q, k32, v32), np.float32)
tq, tk, tv = (torch.from_numpy(x) for x in (q[:, None], k32.transpose(1, 0, 2), v32.transpose(1, 0, 2)))
sdpa = torch.nn.functional.scaled_dot_product_attention(tq, tk.repeat_interleave(2, 0), tv.repeat_interleave(2, 0))
assert_close(exact, sdpa[:, 0].numpy(), np.float32)
k8, _ = caches["int8"].gather(0, 0)
approx = paged_attention(q, caches["int8"], 0, 0)
kerr = np.abs(k8 - k32).max()
rel = np.linalg.norm(approx - exact) / np.linalg.norm(exact)
ratio = caches["int8"].stats()["bytes_per_token"] / caches["float32"].stats()["bytes_per_token"]
print(
    f"paged == dense == torch SDPA; INT8: max |K error| {kerr:.4f}, attention output rel. error {rel:.2e}, "
    f"memory x{ratio:.3f}"
)
assert np.all(np.abs(k8 - k32) <= np.abs(k32).max(-1, keepdims=True) / 254 + 1e-7)
assert rel < 1e-2 and ratio == (D + 4) / (4 * D)
b_out = paged_attention_batch(np.stack([q, q]), caches["int8"], [0, 0], 0)  # a batch: one sequence id per query
assert_close(b_out[1], approx, np.float32)

# %% [markdown]
# **From a Python loop to a kernel.** The block loop above is the reference (`backend="numpy"`): one numpy pass per
# 16-token block. The default is C++ (`cpp_src/inference_paged_decode.cpp`, registered as
# `inference.paged_attention` with versions `"scalar"` and `"simd"`): one work item per (sequence, KV head) walks
# the block table, the Hq/Hkv query heads of the group share every K/V row it reads (GQA), the online softmax runs
# over up to 32 tokens per step, INT8 rows are dequantized inside the loop, and `paged_attention_batch` takes a
# ragged batch (one sequence id per query). The table climbs the ladder — numpy loop → C++ scalar → C++ AVX2 — beside
# torch SDPA and tinygrad (TinyJit) on a contiguous [Hq, S, D] cache, which have no block table to follow; GB/s
# counts the K/V bytes read once.

# %%
# NBVAL_IGNORE_OUTPUT
# (timings)
from tinylearn import cpu  # noqa: E402
from tinylearn.bench import plot_table  # noqa: E402
from tinylearn.inference.bench import attention_table  # noqa: E402

att = attention_table()
print(att)
plot_table(att)
plt.show()
am = {(r.case, r.impl): r.median_ms for r in att.rows if r.median_ms is not None}
for case in ("S=128", "S=1024"):
    loop, scalar, simd = (am[case, f"tinylearn paged {x}"] for x in ("numpy loop", "C++ scalar", "C++ SIMD"))
    tg_txt = f", tinygrad {am[case, 'tinygrad'] / am[case, 'torch']:.1f}x" if (case, "tinygrad") in am else ""
    print(
        f"{case}: numpy loop {loop / simd:.0f}x and C++ scalar {scalar / simd:.1f}x the SIMD kernel's time; "
        f"SIMD kernel {simd / am[case, 'torch']:.2f}x torch SDPA's time{tg_txt}"
    )
    assert loop > 2 * scalar  # leaving Python's per-block loop at least halves the time, even on a busy machine
    if "avx2" in cpu.cpu_features():  # TINYLEARN_CPU_FEATURES=scalar makes "simd" run the scalar code
        assert scalar > simd

# %% [markdown]
# Reading it: every rung is faster than the one below (asserted; with `TINYLEARN_CPU_FEATURES=scalar` the "simd"
# version runs the scalar code), and leaving the numpy loop at least halves the time (asserted) — at S = 1024
# it pays 64 rounds of numpy dispatch for 64 blocks. The printed ratios give the kernel's time against torch SDPA
# on the contiguous cache (the goal is at most 1.2×): the paged kernel follows a block table and still need not
# lose, because a decode step is bound by reading K/V once, and GQA lets 4 query heads share each row read.

# %% [markdown]
# **Token-priority eviction and re-expansion.** When even INT8 does not fit, drop the tokens that matter least.
# H2O (Zhang et al. 2023) observes that a few "heavy hitter" tokens receive most of the attention; the priority of a
# token is the attention mass it received from recent queries (`attention_received`), and `priority_keep(scores,
# budget, recent)` keeps a recent window plus the highest-priority tokens. `evict_tokens(seq, keep)` re-packs the
# kept tokens into fewer blocks, returns the freed blocks to the pool and hands back the evicted K/V (an offload
# store, host memory on a GPU server); `restore_tokens` **re-expands** the sequence when blocks are free again.
# The keys below have 12 heavy hitters (a shared direction that the queries also carry, like attention sinks);
# priorities come from 16 observed queries and the error is measured on 16 *other* queries.

# %%
# NBVAL_IGNORE_OUTPUT
rng = np.random.default_rng(10)
S = 256
u = rng.standard_normal((H, D))
u /= np.linalg.norm(u, axis=-1, keepdims=True)
k_all = rng.standard_normal((S, H, D)).astype(np.float32)
v_all = rng.standard_normal((S, H, D)).astype(np.float32)
heavy = rng.choice(S - 32, 12, replace=False)
k_all[heavy] += 6 * u
q_obs, q_eval = (
    (rng.standard_normal((16, CFG.n_heads, D)) + 2 * np.repeat(u, CFG.n_heads // H, 0)).astype(np.float32)
    for _ in range(2)
)
prio = attention_received(q_obs, k_all)
ref = np.stack([dense_attention(q, k_all, v_all) for q in q_eval])


def rel_err(keep):
    out = np.stack([dense_attention(q, k_all[keep], v_all[keep]) for q in q_eval])
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


errs = {}
for budget in (32, 64, 128):
    recent = np.arange(S) >= S - budget
    errs[budget] = (rel_err(priority_keep(prio, budget, recent=budget // 4)), rel_err(recent))
    print(f"keep {budget:3d}/{S}: attention error, priority {errs[budget][0]:.2f} vs most recent {errs[budget][1]:.2f}")
assert all(p_ < 0.6 * r_ for p_, r_ in errs.values())  # priority eviction: < 60% of the error of recency
assert np.all(priority_keep(prio, 32, 8)[heavy])  # every heavy hitter survives even the smallest budget

# the same on the paged cache: evict to 64 tokens, attend, re-expand
ec = PagedKVCache(1, H, D, num_blocks=32, block_size=16)
sid = ec.new_sequence()
ec.append(sid, 0, k_all, v_all)
keep = priority_keep(prio, 64, recent=16)
evicted = ec.evict_tokens(sid, keep)
blocks_small = ec.stats()["blocks_used"]
assert_close(paged_attention(q_eval[0], ec, sid, 0), dense_attention(q_eval[0], k_all[keep], v_all[keep]), np.float32)
ec.restore_tokens(sid, evicted)  # blocks are free again: re-expand
assert_close(paged_attention(q_eval[0], ec, sid, 0), ref[0], np.float32)  # exact attention again
print(
    f"paged: 16 blocks -> {blocks_small} after eviction ({len(evicted['pos'])} tokens offloaded) -> "
    f"{ec.stats()['blocks_used']} after re-expansion, attention exact again"
)
assert blocks_small == 4 and ec.stats()["blocks_used"] == 16

# %% [markdown]
# ### Delta-compressed K/V with keyframes [Q137]
#
# If the K/V rows of adjacent tokens differ little, store only the change. `delta_compress` keeps every 16th row
# in full (a **keyframe**: random access decodes at most 16 rows) and, for the others, only the entries whose
# difference to the *reconstructed* previous row exceeds a threshold (2-byte index + fp32 value each). Because the
# delta is taken against the reconstruction, errors do not accumulate: every reconstructed entry is within the
# threshold of the truth. A row whose delta would cost at least as much as the row itself is stored in full, so the
# scheme never stores more than the dense cache.
#
# Does the premise hold? We measure on real K/V of this notebook's TinyGPT (all layers, K and V, KV heads
# concatenated per token) for two 128-token inputs: a sampled continuation of a prompt (T = 0.8), and its first 16
# tokens each repeated 8 times (runs of identical tokens, as in indentation, padding or a model stuck on one
# token). Threshold 0.05 (about 1/12 of the K/V standard deviation). BLAS rounding can move an entry across the
# threshold on another CPU path, so the counts are printed in an ignored cell; the asserts check the bound exactly
# and the ratios with margins.

# %%
# NBVAL_IGNORE_OUTPUT
prompt = [1, 2, 3]
texts = {
    "sampled T=0.8": prompt + generate(model, prompt, 125, temperature=0.8, top_p=0.9, seed=0),
}
texts["runs of 8"] = [t for t in texts["sampled T=0.8"][:16] for _ in range(8)]
delta_res = {}
for name, seq in texts.items():
    kv_cache = model.new_cache(1)
    with tl.no_grad():
        model(np.array([seq]), kv_cache)
    T_ = len(seq)
    for layer in range(CFG.n_layers):
        for kind, arr in (("K", kv_cache.k[layer]), ("V", kv_cache.v[layer])):
            x_ = arr[0, :, :T_].transpose(1, 0, 2).reshape(T_, -1)  # [tokens, kv_heads * head_dim]
            comp = delta_compress(x_, 0.05, keyframe_every=16)
            st_ = delta_stats(comp)
            err = float(np.abs(delta_decompress(comp) - x_).max())
            delta_res[name, layer, kind] = (st_, err)
            print(
                f"{name:13s} layer {layer} {kind}: ratio {st_['ratio']:4.2f}x, {st_['kept_fraction']:4.0%} of delta "
                f"entries kept ({st_['fallback_rows']:3d} full rows), max error {err:.4f}, "
                f"mean |adjacent diff| {np.abs(np.diff(x_, axis=0)).mean():.3f}"
            )
    tot = sum(v[0]["dense_bytes"] for k, v in delta_res.items() if k[0] == name)
    stored = sum(v[0]["stored_bytes"] for k, v in delta_res.items() if k[0] == name)
    delta_res[name] = tot / stored
    print(f"{name}: whole cache {tot} B dense -> {stored} B stored, ratio {tot / stored:.2f}x")
errs_ = [v[1] for k, v in delta_res.items() if isinstance(k, tuple)]
assert max(errs_) <= 0.05  # the closed-loop bound: every entry within the threshold
assert delta_res["sampled T=0.8"] < 1.05  # premise fails: adjacent sampled tokens' K/V differ a lot, no saving
n_delta_rows = 128 - 128 // 16
sampled_stats = [delta_res["sampled T=0.8", layer, kind][0] for layer in range(CFG.n_layers) for kind in "KV"]
assert all(st_["fallback_rows"] > 0.9 * n_delta_rows for st_ in sampled_stats)
assert delta_res["runs of 8"] > 2.5  # premise holds on runs of repeated tokens
assert all(delta_res["runs of 8", layer, "V"][0]["ratio"] > 5 for layer in range(CFG.n_layers))
assert all(1.5 < delta_res["runs of 8", layer, "K"][0]["ratio"] < 2.5 for layer in range(CFG.n_layers))

# %% [markdown]
# Every entry is reconstructed within the 0.05 threshold. The saving depends entirely on the data: on sampled text
# adjacent tokens' K/V differ by about as much as the K/V themselves (mean |diff| of the order of their spread), so
# more than 90% of the delta rows fall back to full rows and the ratio stays at 1x (below 1.05x; without the
# fallback the sparse format would *expand* the cache). On runs of repeated tokens the whole cache shrinks more than
# 2.5x, V more than 5x, K only 1.5-2.5x: with RoPE, K of a repeated token still rotates with its position, V does
# not. For a real model, measure first: the premise is a property of the text and the layer, and a lossy cache needs
# its attention error checked as in the INT8 test above.

# %% [markdown]
# ## 5. Prefix sharing: a hash index over blocks, fork and copy-on-write [Q203]
#
# Eight requests arrive one after another, each a 40-token system prompt followed by its own 10 tokens.
# **Automatic prefix caching** (vLLM): every *full* block gets a chained hash
# $h_i = \mathrm{hash}(h_{i-1}, \text{token ids of block } i)$, so one key names the whole prefix up to that block.
# `register_prefix(seq, ids)` puts a computed sequence's full blocks in the index (hash -> physical block);
# `match_prefix(ids)` walks a new request's blocks through the index and returns a sequence that already shares the
# matched blocks (refcount + 1, nothing copied or recomputed) and the number of tokens it can skip. A hit is
# confirmed by comparing the block's stored token ids, so a hash collision cannot hand out another prompt's KV.
# Only full blocks are indexed, and the prompt ends inside block 3 (40 = 2.5 blocks of 16): every request after
# the first reuses 32 of its 50 tokens. The cache counts lookups and hits; the rate printed is read from it.

# %%
model = TinyGPT.from_config(CFG)
pc = PagedKVCache(L, H, D, num_blocks=64, block_size=16)
system = np.random.default_rng(6).integers(0, 64, 40)
suffixes = np.random.default_rng(7).integers(0, 64, (8, 10))
cached = []
with tl.no_grad():
    for suf in suffixes:
        ids = np.concatenate([system, suf])
        sid, n_cached = pc.match_prefix(ids)  # share the indexed blocks of the longest matching prefix
        out = model(ids[None, n_cached:], pc.model_cache(sid))  # compute only the rest
        assert_close(out.numpy(), model(ids[None]).numpy()[:, n_cached:], np.float32)  # == recomputing everything
        pc.register_prefix(sid, ids)
        cached.append(n_cached)
s = pc.stats()
unshared = 8 * -(-50 // 16)
print(f"tokens served from the cache per request: {cached}")
print(
    f"prefix index: {s['prefix_queries']} lookups, {s['prefix_hit_tokens']} of {s['prefix_lookup_tokens']} tokens "
    f"hit = {s['prefix_hit_rate']:.0%}; {s['blocks_used']} blocks in use vs {unshared} without sharing"
)
assert cached == [0] + [32] * 7 and s["prefix_hit_rate"] == 7 * 32 / (8 * 50)
assert s["blocks_used"] == 4 + 7 * 2 and s["shared_blocks"] == 2

# %% [markdown]
# **Why not approximate matching?** With chained hashes one changed token in block $i$ changes $h_i$ and with it
# every later hash, so no block after it can match, even blocks whose own tokens are identical. That is the right
# answer, not a weakness: a block's K/V are computed by attention over *every* earlier token, so the KV of a prompt
# that differs in one earlier token is not this prompt's KV, and reusing it would change the logits. Approximate
# deduplication (a SimHash or MinHash over token-id n-grams) could at most *nominate* candidate prompts cheaply; each
# candidate must then match exactly, block by block from position 0, which is what `match_prefix` does. Below,
# request 0's 50 tokens (3 full blocks indexed) are looked up again with one token changed in block 0, 1 or 2: 49 of
# the 50 tokens still agree, yet an edit in block 0 gets 0 cached tokens, and an edit in the last full block keeps
# every block before it.

# %%
p0 = np.concatenate([system, suffixes[0]])
sid, n_exact = pc.match_prefix(p0)
pc.free(sid)
edit_hits = {}
for blk in (0, 1, 2):
    ids = p0.copy()
    ids[blk * 16 + 5] = (ids[blk * 16 + 5] + 1) % 64  # one token changed inside block blk
    assert (ids == p0).sum() == 49
    sid, edit_hits[blk] = pc.match_prefix(ids)
    pc.free(sid)
print(f"unchanged prompt: {n_exact} tokens cached; one token changed in block b -> cached tokens: {edit_hits}")
assert n_exact == 48 and edit_hits == {0: 0, 1: 16, 2: 32}

# %% [markdown]
# The partly filled block is not lost for good: **fork** shares *every* block of a running sequence, the partial
# one included (parallel sampling, beam search). Here the 40-token prompt is prefilled once and forked 8 times;
# the first write of each child into the shared, partially filled block 3 copies it (**copy-on-write**), and the
# full blocks are never written and stay shared. Freeing a sequence decrements refcounts; a block returns to the
# free list at 0 and leaves the prefix index with it.

# %%
pc = PagedKVCache(L, H, D, num_blocks=64, block_size=16)
root = pc.new_sequence()
with tl.no_grad():
    model(system[None], pc.model_cache(root))  # prefill the shared prompt once
children = [pc.fork(root) for _ in range(8)]
print("after fork:", {k: pc.stats()[k] for k in ("blocks_used", "shared_blocks", "blocks_saved_by_sharing")})
assert pc.stats()["shared_blocks"] == 3 and pc.stats()["blocks_saved_by_sharing"] == 8 * 3
with tl.no_grad():
    for sid, suf in zip(children, suffixes):
        out = model(suf[None], pc.model_cache(sid))
        ref = model(np.concatenate([system, suf])[None]).numpy()[:, 40:]
        assert_close(out.numpy(), ref, np.float32)  # reused prefix KV gives the same logits as recomputing
pc.free(root)
s = pc.stats()
print(
    f"8 forks x 50 tokens: {s['blocks_used']} blocks with sharing vs {unshared} without; "
    f"copy-on-write copies {s['cow_copies']}"
)
assert s["cow_copies"] == 8 and s["blocks_used"] == 2 + 8 * 2 and s["blocks_used"] < unshared
for sid in children:
    pc.free(sid)
assert pc.stats()["blocks_used"] == 0

# %% [markdown]
# ## 6. Speculative decoding [Q114]
#
# A cheap draft proposes $k$ tokens; the target scores all of them in **one** forward pass (the KV cache makes
# that a $k{+}1$-token step). Token $x_i$ is accepted with probability $\min(1, p(x_i)/q(x_i))$; at the first
# rejection the replacement is drawn from $\mathrm{norm}(\max(0, p - q))$; if all $k$ pass, a bonus token comes
# from $p$. Then $P(\text{emit } x) = \min(p, q)(x) + \max(0, p - q)(x) = p(x)$: the output follows the target
# exactly, while each target call yields 1 to $k{+}1$ tokens. Rejected positions are rolled back by moving the
# cache's length back. Greedy: accept iff the draft token is the target's argmax, so the tokens equal
# `generate(target)`.
#
# Any model with a `session()` works (`TableLM`: next-token logits from a fixed table), which makes the target's
# law computable for a chi-square test.

# %%
target = TinyGPT(64, 64, 4, 4, 256, n_kv_heads=2)
draft = TinyGPT(64, 64, 4, 1, 256, n_kv_heads=2)  # the target's first block + its embeddings and head
draft.load_state_dict(
    {n: p for n, p in target.state_dict().items() if not n.startswith(("blocks.1", "blocks.2", "blocks.3"))}
)
greedy = generate(target, [1, 2, 3], 30)
for k in (1, 2, 4):
    toks, st = speculative_generate(target, draft, [1, 2, 3], 30, k=k)
    assert toks == greedy
print("greedy speculative == generate(target) for k = 1, 2, 4")

v, n_runs = 3, 1500
rng = np.random.default_rng(8)
t_lm, d_lm = TableLM(rng.standard_normal((v, v)) * 1.5), TableLM(rng.standard_normal((v, v)) * 1.5)
pt = np.stack([filter_probs(r, 1.0) for r in t_lm.table])
pd = np.stack([filter_probs(r, 1.0) for r in d_lm.table])
runs = [speculative_generate(t_lm, d_lm, [0], 2, k=2, temperature=1.0, seed=s)[0] for s in range(n_runs)]
counts = np.bincount([a * v + b for a, b in runs], minlength=v * v)
exp_t = np.array([pt[0, a] * pt[a, b] for a in range(v) for b in range(v)]) * n_runs
exp_d = np.array([pd[0, a] * pd[a, b] for a in range(v) for b in range(v)]) * n_runs
p_target, p_draft = sps.chisquare(counts, exp_t).pvalue, sps.chisquare(counts, exp_d).pvalue
print(f"chi-square over {n_runs} seeded runs: p-value vs target law {p_target:.3f}, vs draft law {p_draft:.1e}")
assert p_target > 1e-3 and p_draft < 1e-6

# %% [markdown]
# Acceptance and speed-up vs $k$ (sampling at $T = 1$). If each draft token is accepted independently with
# probability $\alpha$, a round of $k$ drafts emits $1 + \alpha + \dots + \alpha^k = (1 - \alpha^{k+1})/(1 - \alpha)$
# tokens for one target call. $\alpha$ is estimated as accepted / *judged* drafts (`stats["alpha"]`, pooled over all
# runs): drafts after the first rejection are never judged, so accepted / proposed would underestimate it. Each $k$
# runs 8 seeds x 64 tokens; the mean tokens per full round (rounds that proposed all $k$ drafts, from
# `stats["round_log"]`) gets a Student-t confidence interval over seeds, 99% simultaneously for the four $k$
# (Bonferroni), and the formula must lie inside every one of them.
#
# Wall clock: a round also pays for $k$ draft steps. With $c$ = draft step time / target step time (both measured
# with the bench harness), Leviathan et al. (2023) expect a speed-up of
# $(1 - \alpha^{k+1}) / ((1 - \alpha)(kc + 1))$, assuming that verifying $k{+}1$ tokens costs one target step. The
# draft here is 1 of the target's 4 blocks with the same embeddings and head. The measured speed-up stays below the
# tokens per target call (the speed-up of a free draft, $c = 0$); how far below depends on $c$, on the extra cost of a
# $(k{+}1)$-token verification and per-round Python work, and, on a shared machine, on its load.

# %%
# NBVAL_IGNORE_OUTPUT
ks, n_seeds, n_new = [1, 2, 4, 6], (8 if not FULL else 32), 64
runs = {
    k: [speculative_generate(target, draft, [1, 2, 3], n_new, k=k, temperature=1.0, seed=s)[1] for s in range(n_seeds)]
    for k in ks
}
n_acc = sum(st["accepted"] for r in runs.values() for st in r)
alpha = n_acc / (n_acc + sum(st["rejected"] for r in runs.values() for st in r))


def tokens_per_round(a, k):
    return (1 - a ** (k + 1)) / (1 - a)


def decode_step(m, ctx=32):
    """One cached single-token forward at context ctx (the decode step generate() runs), as a timing closure."""
    sess = open_session(m, True)
    sess.extend(list(range(ctx)))

    def step():
        sess.extend([0])
        sess.truncate(ctx)

    return step


t_draft, t_target = best_times([decode_step(draft), decode_step(target)])
c = float(t_draft / t_target)
t_gen = measure(lambda: generate(target, [1, 2, 3], n_new, temperature=1.0, seed=0), warmup=1, repeat=3).min
print(f"alpha = {alpha:.3f} (pooled over {len(ks) * n_seeds} runs), draft/target step cost c = {c:.2f}")
mean_tpr, half_ci, speed = [], [], []
for k in ks:
    per_seed = [np.mean([e for kk, e in st["round_log"] if kk == k]) for st in runs[k]]
    mean_tpr.append(float(np.mean(per_seed)))
    t_q = sps.t.ppf(1 - 0.01 / (2 * len(ks)), n_seeds - 1)  # 99% simultaneous over the k values (Bonferroni)
    half_ci.append(float(t_q * np.std(per_seed, ddof=1) / np.sqrt(n_seeds)))
    t_spec = measure(
        lambda k=k: speculative_generate(target, draft, [1, 2, 3], n_new, k=k, temperature=1.0, seed=0),
        warmup=1,
        repeat=3,
    ).min
    speed.append(t_gen / t_spec)
    print(
        f"k={k}: tokens/round {mean_tpr[-1]:.2f} +- {half_ci[-1]:.2f} (99% simultaneous CI) vs formula "
        f"{tokens_per_round(alpha, k):.2f}; wall-clock speed-up {speed[-1]:.2f}x vs "
        f"(1-a^(k+1))/((1-a)(kc+1)) = {tokens_per_round(alpha, k) / (k * c + 1):.2f}x"
    )
kk = np.arange(1, 9)
fig, ax = plt.subplots(1, 2, figsize=(10, 3.2))
ax[0].errorbar(ks, mean_tpr, yerr=half_ci, fmt="o", capsize=3, label="measured (99% CI over seeds)")
ax[0].plot(kk, tokens_per_round(alpha, kk), "--", label=f"(1-a^(k+1))/(1-a), a={alpha:.2f}")
ax[0].set_xlabel("draft length k")
ax[0].set_ylabel("tokens per target call")
ax[0].legend(fontsize=8)
ax[1].plot(ks, speed, "s-", label="measured wall clock")
ax[1].plot(kk, tokens_per_round(alpha, kk) / (kk * c + 1), "--", label=f"Leviathan et al., c={c:.2f}")
ax[1].axhline(1, color="gray", lw=0.8)
ax[1].set_xlabel("draft length k")
ax[1].set_ylabel("speed-up vs generate(target)")
ax[1].legend(fontsize=8)
plt.tight_layout()
plt.show()
for k, m, h in zip(ks, mean_tpr, half_ci):
    assert abs(m - tokens_per_round(alpha, k)) <= h, (k, m, h)  # the i.i.d. model's prediction is inside the CI
assert mean_tpr == sorted(mean_tpr)  # longer drafts yield more tokens per target call
# no wall-clock speed-up beats a free draft (c = 0): the tokens per target call bound it
assert all(sp < tokens_per_round(alpha, k) for sp, k in zip(speed, ks))

# %% [markdown]
# ## 7. Static vs continuous batching, KV budget and preemption, SLA priority queue [Q133]
#
# `simulate_serving` is a discrete-event simulator. A step processes `batch_tokens` tokens and costs
# `step_cost(batch_tokens)` seconds; `max_batch_tokens` is the KV budget (tokens resident in the cache).
# **Static** batching takes the arrived requests that fit a padded reservation and runs them to the longest
# completion: new arrivals wait for the whole batch, and finished slots idle. **Continuous** batching (Orca,
# vLLM) re-forms the batch every step: new requests join as soon as their prompt fits, finished ones leave.
# When the cache would overflow, the newest request is **preempted** with the *recompute* policy: its KV is
# dropped and it re-prefills prompt + generated tokens when it is re-admitted.
#
# First the step cost of TinyGPT, measured on the code path a step runs: one cached forward of `n` new tokens
# (`model(ids, cache)` after a 16-token context; at `n = 1` this is the decode step timed in section 2) for `n`
# from 1 to 256, fitted by least squares (in relative error) to `a + b n`: a fixed per-step cost (here tinylearn's
# per-op overhead; on a GPU, reading the weights) plus a per-token cost. The fit must reproduce every measured step
# within a factor of 2.
# The simulations then run with a KV budget of 256 tokens, which bounds every step to at most 256 tokens, the fitted
# range (checked).

# %%
# NBVAL_IGNORE_OUTPUT
ctx, ns = 16, np.array([1, 8, 32, 64, 128, 256])
ids = np.random.default_rng(9).integers(0, 64, (1, ctx + ns[-1]))
step_cache = model.new_cache(1)
with tl.no_grad():
    model(ids[:, :ctx], step_cache)


def model_step(n):
    step_cache.length = ctx
    with tl.no_grad():
        model(ids[:, ctx : ctx + n], step_cache)


t_step = best_times([lambda n=n: model_step(n) for n in ns])
a_fit, b_fit = np.linalg.lstsq(np.stack([np.ones(len(ns)), ns], 1) / t_step[:, None], np.ones(len(ns)), rcond=None)[0]
fit = a_fit + b_fit * ns
print(f"fitted TinyGPT step: {a_fit * 1e3:.2f} ms + {b_fit * 1e6:.1f} us/token")
for n, t, f in zip(ns, t_step, fit):
    print(f"  n={n:3d}: measured {t * 1e3:6.2f} ms, fit {f * 1e3:6.2f} ms ({f / t - 1:+.0%})")
print(f"(section 2 timed the same n=1 step at T=16 earlier: {t_cache[0] * 1e3:.2f} ms)")
assert a_fit > 0 and b_fit > 0
assert np.all(np.abs(np.log(fit / t_step)) < np.log(2))  # the fit reproduces every measured step within 2x
measured_cost = linear_step_cost(a_fit, b_fit)
reqs = poisson_requests(100, rate=0.3 / measured_cost(64), prompt_len=(8, 64), output_len=(8, 64), seed=0)
for policy in ("static", "continuous"):
    r = simulate_serving(reqs, policy, 256, measured_cost)
    print(
        f"{policy:10s}: {r['throughput_tok_s']:7.0f} tok/s  p50 {r['p50_latency']:.3f} s  "
        f"p99 {r['p99_latency']:.3f} s  TTFT p50 {r['ttft_p50']:.3f} s  (step tokens 1..{r['batch_tokens_max']})"
    )
    assert r["batch_tokens_max"] <= ns[-1]  # every simulated step lies inside the measured range

# %% [markdown]
# The load sweep uses a fixed cost model (2 ms + 50 µs/token, the same shape) so its numbers are exact and
# portable: throughput and p99 latency vs arrival rate.

# %%
cost = linear_step_cost(2e-3, 50e-6)
rates = [5, 10, 20, 40, 80, 160]
res = {p: [] for p in ("static", "continuous")}
for rate in rates:
    reqs = poisson_requests(200, rate=rate, prompt_len=(8, 64), output_len=(8, 128), seed=1)
    for p in res:
        res[p].append(simulate_serving(reqs, p, 4096, cost))
fig, ax = plt.subplots(1, 2, figsize=(10, 3.2))
for p, rs in res.items():
    ax[0].plot(rates, [r["throughput_tok_s"] for r in rs], "o-", label=p)
    ax[1].semilogy(rates, [r["p99_latency"] for r in rs], "o-", label=p)
ax[0].set_xlabel("arrival rate (req/s)")
ax[0].set_ylabel("throughput (tok/s)")
ax[1].set_xlabel("arrival rate (req/s)")
ax[1].set_ylabel("p99 latency (s)")
ax[0].legend()
plt.tight_layout()
plt.show()
for rate, s_, c_ in zip(rates, res["static"], res["continuous"]):
    print(
        f"rate {rate:4d}/s: static {s_['throughput_tok_s']:6.0f} tok/s p99 {s_['p99_latency']:6.2f} s | "
        f"continuous {c_['throughput_tok_s']:6.0f} tok/s p99 {c_['p99_latency']:6.2f} s"
    )
hi_s, hi_c = res["static"][-1], res["continuous"][-1]
assert hi_c["throughput_tok_s"] > 1.5 * hi_s["throughput_tok_s"] and hi_c["p99_latency"] < hi_s["p99_latency"]
assert all(c["ttft_p50"] <= s["ttft_p50"] for s, c in zip(res["static"], res["continuous"]))

# %% [markdown]
# Under a small KV budget the continuous scheduler must preempt; with recompute, the work it redoes is counted.

# %%
reqs = poisson_requests(200, rate=80, prompt_len=(8, 64), output_len=(8, 128), seed=1)
for budget in (4096, 1024, 512):
    r = simulate_serving(reqs, "continuous", budget, cost)
    print(
        f"budget {budget:5d} tokens: {r['preemptions']:4d} preemptions, {r['recomputed_tokens']:6d} recomputed tokens, "
        f"throughput {r['throughput_tok_s']:6.0f} tok/s, p99 {r['p99_latency']:.2f} s, peak KV {r['kv_peak_tokens']}"
    )
    assert r["kv_peak_tokens"] <= budget
small = simulate_serving(reqs, "continuous", 512, cost)
assert small["preemptions"] > 0 and small["throughput_tok_s"] < res["continuous"][-1]["throughput_tok_s"]

# %% [markdown]
# **SLA priority queue.** FCFS admission ignores how urgent a request is. `order="slo"` keeps the waiting queue as a
# heap on each request's deadline (arrival + `slo`): least remaining slack first, ties to the longest-waiting
# request. A request whose deadline has already passed drops behind every request that can still make its own and is
# served by waiting time, so one late request does not drag the others past their deadlines too (the EDF domino
# effect); under memory pressure the running request with the latest deadline is preempted. A quarter of the
# requests are interactive (SLO 1 s), the rest batch jobs (SLO 30 s), at 160 req/s with a 1024-token KV budget.

# %%
reqs = poisson_requests(300, rate=160, prompt_len=(8, 64), output_len=(8, 128), seed=3)
reqs = [dict(r, slo=1.0 if i % 4 == 0 else 30.0) for i, r in enumerate(reqs)]
tight = np.arange(len(reqs)) % 4 == 0
sla = {}
for order in ("fcfs", "slo"):
    r = simulate_serving(reqs, "continuous", 1024, cost, order=order)
    lat = np.array(r["latencies"])
    sla[order] = dict(
        met=float(np.mean(lat[tight] <= 1.0)),
        p99_tight=float(np.percentile(lat[tight], 99)),
        p99_batch=float(np.percentile(lat[~tight], 99)),
        tok_s=r["throughput_tok_s"],
        all_met=r["slo_attainment"],
    )
    print(
        f"{order}: interactive SLO met {sla[order]['met']:4.0%}, p99 {sla[order]['p99_tight']:.2f} s | batch p99 "
        f"{sla[order]['p99_batch']:.2f} s | all SLOs met {sla[order]['all_met']:.0%} | {sla[order]['tok_s']:.0f} tok/s"
    )
f_, e_ = sla["fcfs"], sla["slo"]
assert e_["met"] == 1.0 and round(f_["met"], 2) == 0.31 and e_["p99_tight"] < f_["p99_tight"] / 3
assert e_["all_met"] > f_["all_met"] and f_["p99_batch"] < e_["p99_batch"] < 30
assert 0.9 * f_["tok_s"] < e_["tok_s"] < f_["tok_s"]

# %% [markdown]
# Every interactive request meets its 1 s SLO under the priority queue (FCFS: 31%), and their p99 latency
# drops more than 3x. The price is paid by the batch jobs, whose p99 latency rises (still inside their 30 s), and by
# a slightly lower throughput (less than 10% here).

# %% [markdown]
# ### Length buckets inside a sync window [Q124]
#
# When requests are run as padded batches (a prefill batch, an encoder, any engine without ragged kernels), a batch
# of $n$ sequences costs $n \cdot \max(\text{len})$ token slots. `form_batches` collects the requests arriving in
# one **sync window** (100 ms here) and dispatches them at its end: `"fifo"` cuts them into batches of 16 in arrival
# order, `"bucket"` groups them by length bucket (32 tokens wide) -- equivalently, reorders them by length -- and
# cuts each bucket. 400 requests at 200 req/s with prompts of 8-256 tokens; the step cost is the fixed model
# above (2 ms + 50 µs/token). All counts are exact.

# %%
reqs = poisson_requests(400, rate=200, prompt_len=(8, 256), output_len=(8, 8), seed=5)
arrivals_, lens_ = [r["arrival"] for r in reqs], [r["prompt_len"] for r in reqs]
pad = {}
for pol in ("fifo", "bucket"):
    batches_ = form_batches(arrivals_, lens_, max_batch=16, window=0.1, policy=pol, bucket_width=32)
    pad[pol] = padding_stats(lens_, batches_)
    pad[pol]["time"] = sum(cost(len(b) * max(lens_[i] for i in b)) for b in batches_)
    print(
        f"{pol:6s}: {pad[pol]['batches']:3d} batches, {pad[pol]['slots']:6d} token slots for "
        f"{pad[pol]['real_tokens']} real tokens, padding {pad[pol]['padding']:6d} ({pad[pol]['waste']:.1%}), "
        f"modelled compute {pad[pol]['time']:.2f} s"
    )
f_, b_ = pad["fifo"], pad["bucket"]
assert f_["real_tokens"] == b_["real_tokens"] == 52960
assert (f_["padding"], b_["padding"]) == (42091, 3055)  # padding: 44% of the slots -> 5.5%
assert (round(f_["waste"], 3), round(b_["waste"], 3)) == (0.443, 0.055)
assert (f_["batches"], b_["batches"]) == (37, 145) and b_["time"] < 0.7 * f_["time"]

# %% [markdown]
# Bucketing cuts the padding from 42091 to 3055 token slots (44% of the slots to 5.5%). The price is more, smaller
# batches (145 instead of 37: a bucket rarely fills 16 slots in one window), each paying the fixed step cost; with
# 2 ms per step the modelled compute still drops by more than 30%. A longer window fills buckets better but adds up
# to one window of latency to every request: the window is the knob between batching efficiency and latency.
# Continuous batching with ragged (paged) attention, as simulated above, avoids padding altogether.
#
# ### Several models on one device: weighted-urgency min-heap [Q155]
#
# Three models share one accelerator, each job (one request or step) runs to completion once started. Model A: 2-6
# ms jobs, SLA 50 ms, weight 4; B: 6-18 ms, SLA 200 ms, weight 2; C: 15-45 ms, SLA 1 s, weight 1; 600 jobs at
# 75 jobs/s (a 15% overload burst). `simulate_shared_device` (a deterministic discrete-event model) runs them
# with `"fifo"`, `"edf"` (earliest deadline first) and `"urgency"`: a min-heap on $-w/(\text{deadline} -
# \text{now})$, re-keyed at each decision because the remaining times shrink (late jobs come first, heaviest
# first). The objective is the **weighted tail latency** $\sum_m w_m \cdot p99_m / \sum_m w_m$
# (`weighted_tail_latency`).

# %%
rng = np.random.default_rng(0)
tenants = [dict(d=0.004, w=4.0, slo=0.05), dict(d=0.012, w=2.0, slo=0.2), dict(d=0.03, w=1.0, slo=1.0)]
jobs, t_ = [], 0.0
for _ in range(600):
    t_ += rng.exponential(1 / 75)
    m_ = tenants[rng.integers(0, 3)]
    jobs.append(dict(arrival=t_, duration=m_["d"] * rng.uniform(0.5, 1.5), slo=m_["slo"], weight=m_["w"]))
w_ = np.array([j["weight"] for j in jobs])
wt, p99 = {}, {}
for pol in ("fifo", "edf", "urgency"):
    r = simulate_shared_device(jobs, pol)
    lat = np.array(r["latencies"])
    wt[pol] = weighted_tail_latency(lat, w_)
    print(
        f"{pol:8s}: weighted p99 {wt[pol]:.3f} s | p99 by weight 4/2/1: "
        + " / ".join(f"{np.percentile(lat[w_ == g], 99):.3f}" for g in (4.0, 2.0, 1.0))
        + f" s | SLA met {r['slo_attainment']:.1%}"
    )
    p99[pol] = [np.percentile(lat[w_ == g], 99) for g in (4.0, 2.0, 1.0)]
assert [round(wt[p], 3) for p in ("urgency", "edf", "fifo")] == [0.416, 0.920, 1.348]
assert wt["urgency"] < 0.5 * wt["edf"]
assert max(p99["fifo"]) - min(p99["fifo"]) < 0.05  # FIFO: every model sees about the same tail
assert p99["urgency"][2] > p99["edf"][2] and p99["urgency"][0] < p99["edf"][0] / 5  # cost moved to the light model

# %% [markdown]
# FIFO gives every model about the same p99 (1.33-1.37 s): the queue does not know the weights. EDF helps
# (weighted 0.92 s) but spends the overload on whoever's deadline is nearest; the weighted-urgency heap serves the
# heavy, short-SLA jobs first (their p99 more than 5x below EDF's) and pushes the queueing onto the weight-1 model,
# cutting the weighted p99 to 0.42 s, less than half of EDF's. Weights matter when not everyone can be served on
# time. A real system would add aging (or a cap on the light tenant's wait) so that it cannot starve.
#
# ### SM occupancy and bandwidth aware packing with deadline priority [Q106]
#
# Small-batch kernels leave most of a GPU idle: a decode step of batch 8 launches few thread blocks and is bound by
# reading the weights, so two of them can run side by side (streams / MPS) if their SM and bandwidth needs fit.
# `estimate_footprint` is a roofline-style **model** (not a measurement) of one fp16 step on an H100/H200-class
# part: thread blocks = GEMM tiles of 128x128 of the [tokens, d_model] activation, SM share = blocks / 132;
# compute time from the SM share; weight bytes at the HBM rate, reached only with at least half of the SMs issuing
# loads; the bandwidth share is what it achieves. The scheduler then packs jobs while their summed SM and bandwidth
# shares stay <= 1, taking them in deadline order with backfill (`"edf"`), against `"fifo"` (head-of-line). Three
# request kinds share the device at 110 req/s: 7B chat decode, batch 8, SLO 30 ms (50%); 1B embedding, batch 16,
# SLO 10 ms (30%); 7B prefill of 2048 tokens, SLO 300 ms (20%). The "exclusive" rows give every job the whole
# device (no occupancy estimate).

# %%
# stable-output: a roofline-style footprint model and a seeded simulation, no timing
kinds = [
    ("7B decode b=8", estimate_footprint(8, 7e9, 4096), 0.03),
    ("1B embed b=16", estimate_footprint(16, 1e9, 2048), 0.01),
    ("7B prefill 2048", estimate_footprint(2048, 7e9, 4096), 0.3),
]
for name, f, slo in kinds:
    print(f"{name:16s}: SM {f['sm']:.0%}, HBM {f['bw']:.0%}, {f['duration'] * 1e3:5.2f} ms, SLO {slo * 1e3:.0f} ms")
rng = np.random.default_rng(1)
jobs, t_ = [], 0.0
for _ in range(800):
    t_ += rng.exponential(1 / 110)
    _, f, slo = kinds[rng.choice(3, p=[0.5, 0.3, 0.2])]
    jobs.append(dict(arrival=t_, duration=f["duration"], sm=f["sm"], bw=f["bw"], slo=slo))
att = {}
for pol in ("fifo", "edf"):
    for mode, js in (("exclusive", [dict(j, sm=1.0, bw=1.0) for j in jobs]), ("packed", jobs)):
        att[pol, mode] = simulate_shared_device(js, pol)["slo_attainment"]
        print(f"{pol:4s} {mode:9s}: SLO attainment {att[pol, mode]:.1%}")
assert all(f["sm"] < 0.25 and f["bw"] < 0.5 and not f["compute_bound"] for _, f, _ in kinds[:2])
assert kinds[2][1]["sm"] == 1 and kinds[2][1]["compute_bound"]
assert [round(att[k], 3) for k in sorted(att)] == [0.432, 0.835, 0.244, 0.53]  # edf/fifo x exclusive/packed
assert att["edf", "packed"] > 0.8 > 0.3 > att["fifo", "exclusive"]
assert att["edf", "packed"] > max(att["fifo", "packed"], att["edf", "exclusive"]) + 0.25

# %% [markdown]
# In this model the decode and embedding steps use under a quarter of the SMs and under half of the bandwidth
# each, while a 2048-token prefill fills every SM (compute bound). Giving each job the whole device in arrival
# order meets 24% of the SLOs; packing by the occupancy estimate and ordering by deadline meets 83.5%, and each half
# alone falls short by more than 25 points (FIFO packed 53%, EDF exclusive 43%). On real hardware the estimates
# come from the kernels' launch configurations and a profile (Nsight Compute reports achieved occupancy and DRAM
# throughput), and co-running kernels do slow each other somewhat: keep a margin below 100%.

# %% [markdown]
# ## 8. tinylearn vs torch vs tinygrad on the same weights
#
# The same TinyGPT weights (copied from `torch_reference`) in three frameworks, on the two kinds of step a server
# runs: a **prefill** of a 64-token prompt into an empty KV cache, and a **decode** step of one token at context 64.
# torch is eager with a `past_key_values` cache. tinygrad runs `tinylearn.inference.tinygrad_ref`: `build_prefill`
# (causal attention over the prompt, K/V written into a fixed cache of 65 slots) and `build_decode_step` (the new
# K/V written into that fixed cache through a one-hot row, attention over all slots with an additive mask), each
# under TinyJit, which needs fixed shapes; the decode step reads the caches the prefill wrote. TinyJit compiles a
# graph with clang on its first call and captures its kernels on the second: `jit_compiled` makes both calls
# before anything is timed and reports their wall time. By default it compiles with `NOOPT=1`, without tinygrad's
# hand-coded kernel optimisations (upcasts, unrolls): tinygrad's Python code generator is most of the compile time on
# CPU and has far less to rewrite without them, so both graphs compile in seconds (printed below), at the price of
# slower kernels. `TINYLEARN_FULL=1` compiles with the optimisations instead. The logits are checked first: the three
# frameworks agree to fp32 tolerance. Timings: bench harness (2 warm-up calls, then 7 timed), one thread each.

# %%
# NBVAL_IGNORE_OUTPUT
from tinylearn.bench import Comparison, import_tinygrad, plot_table, tinygrad_status  # noqa: E402
from tinylearn.inference.tinygrad_ref import build_decode_step, build_prefill, jit_compiled  # noqa: E402

torch_threads = torch.get_num_threads()
torch.set_num_threads(1)
ref = torch_reference(CFG).eval()
model = TinyGPT.from_config(CFG).load_torch_state_dict(ref.state_dict())
P = 64
ids = np.random.default_rng(11).integers(0, CFG.vocab_size, (1, P + 1))
tids = torch.from_numpy(ids)
tl_cache = model.new_cache(1)
with tl.no_grad(), torch.no_grad():
    pre_tl = model(ids[:, :P], tl_cache).numpy()
    pre_t, past = ref(tids[:, :P], use_cache=True)
    dec_tl = model(ids[:, P:], tl_cache).numpy()
    dec_t = ref(tids[:, P:], past_key_values=past, use_cache=True)[0]
assert_close(pre_tl, pre_t.numpy(), np.float32)
assert_close(dec_tl, dec_t.numpy(), np.float32)  # the same logits: the timings compare the same computation

# tinygrad: compile both graphs now (not in the timed calls), then check their logits against torch
tg_ok, tg_reason = tinygrad_status()
tg_runs, compile_s = {}, {}
if tg_ok:
    tg = import_tinygrad()
    sd = {k: v.numpy() for k, v in ref.state_dict().items()}
    prefill, make_prefill = build_prefill(tg, CFG, sd, P, P + 1)
    tg_runs["prefill"], compile_s["prefill"] = jit_compiled(tg, prefill, make_prefill(ids[0, :P]), noopt=not FULL)
    outs = tg_runs["prefill"]()
    assert_close(outs[0].numpy(), pre_t.numpy()[0], np.float32)
    caches = [tg.Tensor(c.numpy()) for c in outs[1:]]  # own copies of the prefill's K/V (its jit reuses its buffers)
    step, make_step = build_decode_step(tg, CFG, sd, P + 1)
    tg_runs["decode"], compile_s["decode"] = jit_compiled(
        tg, step, make_step(int(ids[0, P]), P, caches), noopt=not FULL
    )
    assert_close(tg_runs["decode"]()[0].numpy(), dec_t.numpy()[0], np.float32)  # decode after tinygrad's own prefill
    print(
        f"tinygrad logits match torch; compile ({'optimised' if FULL else 'NOOPT=1'}, in this process): "
        f"prefill {compile_s['prefill']:.1f} s, decode {compile_s['decode']:.1f} s"
    )


def tl_prefill():
    tl_cache.length = 0
    with tl.no_grad():
        model(ids[:, :P], tl_cache)


def tl_decode():
    tl_cache.length = P
    with tl.no_grad():
        model(ids[:, P:], tl_cache)


def torch_prefill():
    with torch.no_grad():
        ref(tids[:, :P], use_cache=True)


def torch_decode():
    with torch.no_grad():
        ref(tids[:, P:], past_key_values=past, use_cache=True)


tg_note = "TinyJit" + ("" if FULL else ", NOOPT=1")
cmp = Comparison(f"TinyGPT {CFG.n_layers} layers, d={CFG.d_model}, batch 1, fp32, CPU", baseline="torch", repeat=15)
with cmp.case(f"prefill {P} tokens") as c:
    c.add("torch", torch_prefill, note="eager")
    c.add("tinylearn", tl_prefill, note="tinylearn autograd/nn, numpy")
    if tg_ok:
        c.add("tinygrad", tg_runs["prefill"], note=f"{tg_note}, writes a fixed cache of S+1 slots")
    else:
        c.unavailable("tinygrad", tg_reason)
with cmp.case(f"decode 1 token at S={P}") as c:
    c.add("torch", torch_decode, note="past_key_values cache")
    c.add("tinylearn", tl_decode, note="dense KV cache")
    if tg_ok:
        c.add("tinygrad", tg_runs["decode"], note=f"{tg_note}, fixed cache of S+1 slots")
    else:
        c.unavailable("tinygrad", tg_reason)
torch.set_num_threads(torch_threads)
table = cmp.table
print(table)
plot_table(table)
plt.show()
ms = {(r.case, r.impl): r.min_ms for r in table.rows}  # best of 15: the least load-disturbed statistic
pre, dec = f"prefill {P} tokens", f"decode 1 token at S={P}"
impls = ["tinylearn", "torch"] + (["tinygrad"] if tg_ok else [])
for impl in impls:
    print(
        f"{impl:9s}: prefill {ms[pre, impl]:6.2f} ms ({ms[pre, impl] / ms[pre, 'torch']:4.1f}x torch), "
        f"decode {ms[dec, impl]:5.2f} ms ({ms[dec, impl] / ms[dec, 'torch']:4.1f}x torch); "
        f"a {P}-token prefill costs {ms[pre, impl] / ms[dec, impl]:.1f} decode steps"
    )
# every row that can run here did run (tinygrad needs clang: without it its rows say why)
assert all(ms[case, impl] > 0 for case in (pre, dec) for impl in impls)
# tinylearn's prefill and decode step, built from fused ops (one RoPE op, the flash-attention kernel, the LayerNorm
# kernel) and, for decode, without the autograd graph (inference/decode_fast.py), land near torch's (within 3x either
# way); and in every framework a 64-token prefill costs far fewer than 64 decode steps (why batching tokens pays)
print(f"tinylearn / torch: prefill {ms[pre, 'tinylearn'] / ms[pre, 'torch']:.2f}x, "
      f"decode {ms[dec, 'tinylearn'] / ms[dec, 'torch']:.2f}x")  # fmt: skip
assert 1 / 3 < ms[pre, "tinylearn"] / ms[pre, "torch"] < 3 and 1 / 3 < ms[dec, "tinylearn"] / ms[dec, "torch"] < 3
assert all(ms[pre, impl] < P / 4 * ms[dec, impl] for impl in impls)
if tg_ok:
    # tinygrad's prefill is the slowest of the three (measured: several times torch's; asserted: any margin), and
    # compiling a graph costs more than ten of its replays: it has to stay out of the timed calls
    assert ms[pre, "tinygrad"] > max(ms[pre, "torch"], ms[pre, "tinylearn"])
    assert compile_s["prefill"] > 10 * ms[pre, "tinygrad"] / 1e3
    assert compile_s["decode"] > 10 * ms[dec, "tinygrad"] / 1e3

# %% [markdown]
# Reading the table: tinylearn's prefill and decode step are both close to torch eager's (the ratios are printed;
# asserted within 3x either way, the best of 15 runs, since a busy machine disturbs a 0.5 ms step). A one-token step
# runs RoPE as one C++ op instead of seven (two muls, a neg, two slices, a cat, an add) and attention as the flash
# kernel instead of matmul, scale, softmax, matmul; under `no_grad` it calls each op's forward directly, without the
# autograd graph's per-op bookkeeping (`inference/decode_fast.py`, bitwise the same logits). In every framework
# a 64-token prefill costs far fewer than 64 decode steps (under 16 is asserted): one step over 64 tokens pays the
# per-op overhead once and turns 64 matrix-vector products into one matrix product, the reason servers batch tokens into
# one step. tinygrad's prefill is the slowest of the three: its kernels are C loops generated for this graph, without
# the tuned GEMMs that torch and numpy call (and, with `NOOPT=1`, without tinygrad's own unrolling and upcasting), and
# each of them is one more call when the jit replays. Its decode step is small enough that the three differ mostly in
# overhead; that ratio is printed, not asserted. Compiling costs more than ten replays of either graph, so it happens in
# warm-up, never in the timed calls.

# %% [markdown]
# ## Recap: interview answers
#
# **[Q17] Self-attention / MHA / GQA.** Per head $\mathrm{softmax}(QK^\top/\sqrt{d_h} + M)V$: scores are
# scaled dot products (the $\sqrt{d_h}$ keeps their variance ~1 so softmax does not saturate), the causal mask
# hides the future, and heads attend to different subspaces for the cost of one wide projection. GQA/MQA share
# each K/V head among $g$ query heads: the KV cache and K/V projections shrink $g\times$ at little quality cost.
# RoPE rotates q and k by position so scores depend on relative offsets (checked above).
#
# **[Q107] KV-cache memory.** $2 \cdot L \cdot H_{kv} \cdot d_h \cdot$ bytes per token (128 KiB for a
# Llama-3-8B-like model in fp16). Paging allocates fixed blocks on demand through a block table: no up-front
# `max_seq_len` reservation, waste < one block per sequence, blocks reusable by any request. INT8 with a
# per-(token, head) scale cuts memory to $(d_h+4)/(4d_h)$ of fp32 with < 1% relative attention error here.
# When even that does not fit, evict by token priority (attention received, plus a recent window: less than 60% of
# the error of keeping only the most recent tokens here, at every budget), offload the evicted K/V, and re-expand
# when blocks free up.
#
# **[Q203] Shared prefixes.** Fork the block table and count references per physical block; a write into a
# shared, partially filled block first copies it (copy-on-write), full blocks stay shared, and a block returns
# to the free list when its count reaches zero. To *find* a shared prefix among independent requests, index full
# blocks by a chained hash of their token ids (hash -> block, hit confirmed on the stored ids): here 7 of 8
# requests matched 32 of their 50 tokens, a measured hit rate of 56%, and both schemes held 18 blocks instead of 32.
#
# **[Q114] Speculative decoding.** Draft $k$ tokens cheaply, verify all in one target pass, accept each with
# $\min(1, p/q)$, resample a rejection from $\mathrm{norm}(\max(0, p-q))$, add a bonus token if all pass: the
# output law is exactly the target's (chi-square above), and each target call yields
# $(1-\alpha^{k+1})/(1-\alpha)$ tokens on average (inside the 99% confidence intervals of the measured means above).
# The wall-clock speed-up is $(1-\alpha^{k+1})/((1-\alpha)(kc+1))$ with $c$ the draft/target cost ratio: it needs a
# high acceptance $\alpha$ and a draft much cheaper than the target; the KV cache is rolled back past rejected
# tokens. Prefix caching (section 5) is the other way to skip target work: shared prompt blocks are computed once.
#
# **[Q133] Batching under uneven load.** Static batching holds a batch until its longest request finishes, so
# arrivals wait and slots idle; continuous batching schedules per iteration, admitting requests whenever KV
# memory allows, which raises throughput and cuts p99 latency and TTFT under load (plots above). When memory runs
# out, preempt the newest request (recompute or swap) — a smaller KV budget means more preemptions and less
# throughput. With SLOs, order the queue by deadline (least remaining slack first, longest wait breaking ties, late
# requests behind the ones that can still make it): here every interactive request met its 1 s SLO instead of 31%,
# for a slightly higher p99 of the batch jobs.

# **[Q247] Adaptive temperature.** After every token measure, over the last window: repetition (1 - distinct/count),
# perplexity under the model's untempered distribution, and semantic consistency (cosine of the window's mean token
# embedding with the preceding text's, from the model's own embedding table). Lower the temperature (/1.1) when the
# perplexity exceeds a bound or the consistency falls below one; otherwise raise it (x1.1) when the text repeats
# beyond a target. On TinyGPT the repetition and perplexity rules lowered the repetition of a fixed T=0.1 in every
# seed (on average by more than 0.04) while keeping the perplexity under 30 (fixed T=1.0: above 40); the consistency
# bound of 0.5 kept the mean consistency above 0.4 in every seed (fixed T=1.0: below 0.4; without the bound: more
# than 0.05 lower on average), the perplexity still under 30.
#
# **[Q137] Delta-compressed K/V.** Keyframe every $k$ tokens, otherwise store the entries whose change against the
# reconstructed previous row exceeds a threshold: closed loop, so the error stays within the threshold (checked), and
# random access decodes at most $k$ rows. The gain depends on the data: 1x on sampled TinyGPT text (adjacent K/V
# differ a lot), above 2.5x on runs of repeated tokens (V above 5x; RoPE keeps K changing). Measure before relying
# on it.
#
# **[Q124] Length buckets.** Collect a sync window, group by length bucket, batch within buckets: padding fell
# from 44% of the slots to 5.5% (42091 -> 3055 tokens) for more, smaller batches; the window trades latency for fuller
# buckets.
#
# **[Q155] Weighted urgency.** A min-heap on $-w/(\text{deadline}-\text{now})$, re-keyed per decision: under a 15%
# overload the weighted p99 fell from 1.35 s (FIFO) and 0.92 s (EDF) to 0.42 s, paid by the lightest model; add
# aging against starvation.
#
# **[Q106] Occupancy-aware deadline scheduling.** Estimate each kernel's SM and bandwidth share (a roofline model
# here), co-run jobs while the shares fit, pick by deadline with backfill: SLO attainment 83.5% vs 24% for exclusive
# FIFO in the simulation, and each ingredient alone was worse by more than 25 points.
#
# ## Exercises (`exercises/09_llm_inference/`)
#
# Fill in `stubs.py`, then run `pytest exercises/09_llm_inference` (or `tinylearn check 09_llm_inference`):
#
# 1. `kv_append` / `kv_gather` — a dense KV cache;
# 2. `top_p_filter` — nucleus sampling;
# 3. `accept_draft` / `residual_distribution` — the speculative acceptance rule;
# 4. `blocks_needed` / `locate` / `kv_bytes_per_token` — a paged cache's block table and memory per token.
#
# Benchmarks: `tinylearn bench inference` (decode tokens/s vs context for tinylearn with/without cache, torch
# with `past_key_values`, tinygrad with TinyJit; paged vs dense attention).
