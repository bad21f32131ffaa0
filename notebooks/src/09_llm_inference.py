# %% [markdown]
# # 09 · LLM inference: a tiny GPT, KV caches (dense, paged, INT8), sampling, speculative decoding, batching
#
# **Interview questions this notebook answers** (seed 003: 17, 107, 114, 133, 203):
#
# 1. **[Q17]** How does self-attention compute its output, why several heads, and what do multi-query /
#    grouped-query attention change? Implement a (decoder) transformer block.
# 2. **[Q107]** The KV cache dominates memory for long contexts: how big is it per token, how does paging
#    (block tables) remove fragmentation, and what does low-bit (INT8, per-head scales) KV cost in accuracy?
# 3. **[Q203]** Requests in a batch share a prefix (system prompt): how do you share its KV with reference
#    counts, and what happens when one of them writes (copy-on-write)?
# 4. **[Q114]** How does speculative decoding (draft + verifier) cut the number of large-model calls, and why is
#    its output distributed *exactly* like the large model's?
# 5. **[Q133]** Requests arrive unevenly: how do static and continuous (iteration-level) batching differ in
#    throughput and tail latency, and what do you do when the KV memory runs out (preemption)?
#
# Everything runs on `tinylearn.inference`: `TinyGPT` is built from tinylearn's own autograd/nn (`tl.nn.Linear`,
# `LayerNorm`, `Embedding`, `tl.Tensor` ops) and checked against the same architecture in torch.
# Models are tiny and randomly initialised: the *mechanisms* (cache, paging, sampling, rejection rule, batching)
# are what is measured, not text quality.

# %%
import os
import time

import matplotlib.pyplot as plt
import numpy as np
import torch
from scipy import stats as sps

import tinylearn as tl
from tinylearn.inference import (
    GPTConfig,
    PagedKVCache,
    TableLM,
    TinyGPT,
    dense_attention,
    filter_probs,
    generate,
    kv_bytes_per_token,
    linear_step_cost,
    paged_attention,
    poisson_requests,
    simulate_serving,
    speculative_generate,
    torch_reference,
)
from tinylearn.testing import assert_close

FULL = os.environ.get("TINYLEARN_FULL") == "1"
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
# is one decode step at context length $T$.

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


def best_of(fn, n=5):
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts)


t_cache, t_full = [], []
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

    t_cache.append(best_of(step))
    t_full.append(best_of(full))
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
# claims that hold on any CPU and load: recompute costs more than a cached step, and the gap grows with T
assert t_full[-1] > t_cache[-1]
assert t_full[-1] / t_cache[-1] > t_full[0] / t_cache[0]

# %% [markdown]
# The cached step is nearly flat in $T$ (tinylearn's per-op Python overhead dominates at this size; the attention
# read is $O(T)$), while recompute grows with $T$: the ratio at the longest context is larger than at the
# shortest. Side-by-side numbers against torch (with `past_key_values`) and tinygrad (TinyJit): `tinylearn bench
# inference`.
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
# ## 4. Paged KV cache: memory per token, block tables, INT8 [Q107]
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
assert s["blocks_used"] * 16 - s["tokens"] < 16 * len(lens)
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

# %% [markdown]
# ## 5. Prefix sharing with fork and copy-on-write [Q203]
#
# Eight requests share a 40-token system prompt. `fork(seq)` gives each a new block table pointing at the same
# physical blocks (refcount + 1). The prompt ends inside block 3 (40 = 2.5 blocks of 16): the first write of each
# child into that shared, partially filled block copies it (**copy-on-write**); full shared blocks are never
# written and stay shared. Freeing a sequence decrements refcounts; a block returns to the free list at 0.

# %%
model = TinyGPT.from_config(CFG)
pc = PagedKVCache(L, H, D, num_blocks=64, block_size=16)
system = np.random.default_rng(6).integers(0, 64, (1, 40))
root = pc.new_sequence()
with tl.no_grad():
    model(system, pc.model_cache(root))  # prefill the shared prompt once
children = [pc.fork(root) for _ in range(8)]
print("after fork:", {k: pc.stats()[k] for k in ("blocks_used", "shared_blocks", "blocks_saved_by_sharing")})
suffixes = np.random.default_rng(7).integers(0, 64, (8, 10))
with tl.no_grad():
    for sid, suf in zip(children, suffixes):
        out = model(suf[None], pc.model_cache(sid))
        ref = model(np.concatenate([system, suf[None]], 1)).numpy()[:, 40:]
        assert_close(out.numpy(), ref, np.float32)  # reused prefix KV gives the same logits as recomputing
pc.free(root)
s = pc.stats()
unshared = 8 * -(-50 // 16)
hit = 7 * 40 / (8 * 50)
print(
    f"8 requests x 50 tokens: {s['blocks_used']} blocks with sharing vs {unshared} without; "
    f"copy-on-write copies {s['cow_copies']}; prefix hit rate {hit:.0%} of prompt tokens not recomputed"
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
# Acceptance rate $\alpha$ and tokens per target call vs $k$ (sampling at $T = 1$). With i.i.d. acceptance the
# expected tokens per round is $(1 - \alpha^{k+1})/(1 - \alpha)$. Wall-clock speedup also pays for $k$ draft calls
# per round; here the draft is 1 of the target's 4 blocks, and a tinylearn forward of $k{+}1$ tokens costs about
# the same as 1 token (per-op overhead dominated, like a memory-bound GPU decode).

# %%
# NBVAL_IGNORE_OUTPUT
t0 = time.perf_counter()
base = generate(target, [1, 2, 3], 40, temperature=1.0, seed=0)
t_base = time.perf_counter() - t0
ks, acc, tpc, speed = [1, 2, 4, 6], [], [], []
for k in ks:
    t0 = time.perf_counter()
    _, st = speculative_generate(target, draft, [1, 2, 3], 40, k=k, temperature=1.0, seed=0)
    speed.append(t_base / (time.perf_counter() - t0))
    acc.append(st["acceptance_rate"])
    tpc.append(st["tokens_per_target_call"])
    print(f"k={k}: acceptance {acc[-1]:.2f}, tokens/target call {tpc[-1]:.2f}, wall-clock speedup {speed[-1]:.2f}x")
fig, ax = plt.subplots(1, 2, figsize=(10, 3.2))
ax[0].plot(ks, tpc, "o-", label="measured tokens / target call")
a_mean = float(np.mean(acc))
ax[0].plot(ks, [(1 - a_mean ** (k + 1)) / (1 - a_mean) for k in ks], "--", label=f"(1-a^(k+1))/(1-a), a={a_mean:.2f}")
ax[0].set_xlabel("draft length k")
ax[0].legend(fontsize=8)
ax[1].plot(ks, speed, "s-")
ax[1].axhline(1, color="gray", lw=0.8)
ax[1].set_xlabel("draft length k")
ax[1].set_ylabel("speedup vs generate(target)")
plt.tight_layout()
plt.show()
assert max(tpc) > 1.5 and all(0 < a <= 1 for a in acc)

# %% [markdown]
# ## 7. Static vs continuous batching, with a KV budget and preemption [Q133]
#
# `simulate_serving` is a discrete-event simulator. A step processes `batch_tokens` tokens and costs
# `step_cost(batch_tokens)` seconds; `max_batch_tokens` is the KV budget (tokens resident in the cache).
# **Static** batching takes the arrived requests that fit a padded reservation and runs them to the longest
# completion: new arrivals wait for the whole batch, and finished slots idle. **Continuous** batching (Orca,
# vLLM) re-forms the batch every step: new requests join as soon as their prompt fits, finished ones leave.
# When the cache would overflow, the newest request is **preempted** with the *recompute* policy: its KV is
# dropped and it re-prefills prompt + generated tokens when it is re-admitted.
#
# First the step cost of TinyGPT, measured: a forward over 1 and over 128 tokens gives `a + b n` (a fixed per-step
# cost — on a GPU, reading the weights — plus a per-token cost).

# %%
# NBVAL_IGNORE_OUTPUT
ns = [1, 128]
times = []
for n in ns:
    ids = np.random.default_rng(9).integers(0, 64, (1, n))

    def fwd(ids=ids):
        with tl.no_grad():
            model(ids)

    times.append(best_of(fwd, 7))
a_fit = times[0]  # one decode token: the fixed cost
b_fit = max(times[1] - times[0], 0.0) / 127  # the extra cost per token of a 128-token prefill
print(f"measured TinyGPT step: {a_fit * 1e3:.2f} ms + {b_fit * 1e6:.1f} us/token")
assert times[1] > times[0]
measured_cost = linear_step_cost(a_fit, b_fit)
reqs = poisson_requests(100, rate=0.3 / measured_cost(64), prompt_len=(8, 64), output_len=(8, 64), seed=0)
for policy in ("static", "continuous"):
    r = simulate_serving(reqs, policy, 2048, measured_cost)
    print(
        f"{policy:10s}: {r['throughput_tok_s']:7.0f} tok/s  p50 {r['p50_latency']:.3f} s  "
        f"p99 {r['p99_latency']:.3f} s  "
        f"TTFT p50 {r['ttft_p50']:.3f} s"
    )

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
# per-(token, head) scale cuts memory to $(d_h+4)/(4d_h)$ of fp32 with < 1% relative attention error here;
# eviction/offload are the next levers when even that does not fit.
#
# **[Q203] Shared prefixes.** Fork the block table and count references per physical block; a write into a
# shared, partially filled block first copies it (copy-on-write), full blocks stay shared, and a block returns
# to the free list when its count reaches zero. Here 8 requests used 18 blocks instead of 32, and 70% of prompt
# tokens were not recomputed.
#
# **[Q114] Speculative decoding.** Draft $k$ tokens cheaply, verify all in one target pass, accept each with
# $\min(1, p/q)$, resample a rejection from $\mathrm{norm}(\max(0, p-q))$, add a bonus token if all pass: the
# output law is exactly the target's (chi-square above), and each target call yields
# $(1-\alpha^{k+1})/(1-\alpha)$ tokens on average. Speedup needs a high acceptance $\alpha$ and a draft much cheaper
# than the target; the KV cache is rolled back past rejected tokens.
#
# **[Q133] Batching under uneven load.** Static batching holds a batch until its longest request finishes, so
# arrivals wait and slots idle; continuous batching schedules per iteration, admitting requests whenever KV
# memory allows, which raises throughput and cuts p99 latency and TTFT under load (plots above). When memory runs
# out, preempt the newest request (recompute or swap) — a smaller KV budget means more preemptions and less
# throughput.
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
