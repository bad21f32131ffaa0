"""tl.inference paged KV cache, paged attention and the serving simulator."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tinylearn.inference import (
    PagedKVCache,
    dense_attention,
    kv_bytes_per_token,
    linear_step_cost,
    paged_attention,
    poisson_requests,
    simulate_serving,
)
from tinylearn.testing import assert_close

L, H, D = 2, 2, 8


def fill(cache: PagedKVCache, sid: int, n: int, seed: int, chunks: tuple[int, ...] = ()) -> list[np.ndarray]:
    """Append n tokens to every layer (in the given chunk sizes); returns the dense [n, H, D] K and V per layer."""
    rng = np.random.default_rng(seed)
    ref = []
    for layer in range(cache.n_layers):
        k = rng.standard_normal((n, cache.n_kv_heads, cache.head_dim)).astype(np.float32)
        v = rng.standard_normal((n, cache.n_kv_heads, cache.head_dim)).astype(np.float32)
        a = 0
        for c in list(chunks) + [n]:
            b = min(n, a + c)
            if b > a:
                cache.append(sid, layer, k[a:b], v[a:b])
            a = b
        ref.append((k, v))
    return ref


@pytest.mark.parametrize("chunks", [(), (1, 1, 1), (5, 16, 3), (17,)])
def test_append_gather_roundtrip(chunks: tuple[int, ...]) -> None:
    cache = PagedKVCache(L, H, D, num_blocks=16, block_size=4)
    a, b = cache.new_sequence(), cache.new_sequence()
    ra = fill(cache, a, 23, 0, chunks)
    rb = fill(cache, b, 9, 1, chunks)
    for sid, ref in ((a, ra), (b, rb)):
        for layer in range(L):
            k, v = cache.gather(sid, layer)
            np.testing.assert_array_equal(k, ref[layer][0])
            np.testing.assert_array_equal(v, ref[layer][1])
    s = cache.stats()
    assert s["blocks_used"] == 6 + 3 and s["blocks_free"] == 16 - 9
    assert sorted(cache.block_table(a) + cache.block_table(b)) == sorted(
        set(cache.block_table(a) + cache.block_table(b))
    )


def test_blocks_live_in_the_allocator_arena() -> None:
    cache = PagedKVCache(L, H, D, num_blocks=4, block_size=4)
    sid = cache.new_sequence()
    k = np.full((1, H, D), 3.5, np.float32)
    cache.append(sid, 0, k, k)
    blk = cache.block_table(sid)[0]
    view = cache.allocator.view(blk * cache.slot_bytes, (L, 2, 4, H, D), np.float32)
    assert np.all(view[0, 0, 0] == 3.5) and cache.allocator.stats()["n_alloc"] == 1


def test_free_returns_blocks_and_reuses_them() -> None:
    cache = PagedKVCache(L, H, D, num_blocks=6, block_size=4)
    a = cache.new_sequence()
    fill(cache, a, 10, 0)
    blocks = set(cache.block_table(a))
    cache.free(a)
    assert cache.stats()["blocks_used"] == 0
    b = cache.new_sequence()
    fill(cache, b, 10, 1)
    assert set(cache.block_table(b)) == blocks  # the free list hands the same physical blocks back
    with pytest.raises(ValueError, match="seq_id"):
        cache.gather(a, 0)


def test_fork_copy_on_write() -> None:
    cache = PagedKVCache(L, H, D, num_blocks=12, block_size=4)
    a = cache.new_sequence()
    ra = fill(cache, a, 10, 0)  # 3 blocks, last one half full
    b = cache.fork(a)
    s = cache.stats()
    assert s["blocks_used"] == 3 and s["shared_blocks"] == 3 and s["blocks_saved_by_sharing"] == 3
    rng = np.random.default_rng(5)
    new = [rng.standard_normal((3, H, D)).astype(np.float32) for _ in range(L)]
    for layer in range(L):
        cache.append(b, layer, new[layer], -new[layer])
    # the child copied only its partially filled last block (once, although every layer wrote) and grew one block
    assert cache.cow_copies == 1
    assert cache.block_table(a)[:2] == cache.block_table(b)[:2] and cache.block_table(a)[2] != cache.block_table(b)[2]
    for layer in range(L):
        k, v = cache.gather(a, layer)
        np.testing.assert_array_equal(k, ra[layer][0])  # the parent is untouched
        kb, vb = cache.gather(b, layer)
        np.testing.assert_array_equal(kb, np.concatenate([ra[layer][0], new[layer]]))
        np.testing.assert_array_equal(vb, np.concatenate([ra[layer][1], -new[layer]]))
    assert cache.stats()["blocks_used"] == 5
    cache.free(a)
    assert cache.stats()["blocks_used"] == 4 and cache.stats()["shared_blocks"] == 0
    cache.free(b)
    assert cache.stats()["blocks_used"] == 0 and np.all(cache.refcount == 0)


def test_out_of_blocks_is_a_clear_memory_error() -> None:
    cache = PagedKVCache(L, H, D, num_blocks=3, block_size=4)
    a = cache.new_sequence()
    fill(cache, a, 10, 0)
    before = (cache.block_table(a), cache.length(a, 0), cache.stats())
    big = np.zeros((3, H, D), np.float32)
    with pytest.raises(MemoryError, match="num_blocks=3"):
        cache.append(a, 0, big, big)
    assert before == (cache.block_table(a), cache.length(a, 0), cache.stats())  # nothing half-done


@pytest.mark.parametrize("dtype,elem", [("float32", 4), ("int8", 1)])
def test_memory_per_token_formula(dtype: str, elem: int) -> None:
    n_layers, n_kv, hd, bs = 3, 2, 16, 8
    cache = PagedKVCache(n_layers, n_kv, hd, num_blocks=10, block_size=bs, dtype=dtype)
    scale = 0 if dtype == "float32" else 4
    formula = 2 * n_layers * n_kv * (hd * elem + scale)
    s = cache.stats()
    assert s["bytes_per_token"] == formula == kv_bytes_per_token(n_layers, n_kv, hd, dtype)
    sid = cache.new_sequence()
    fill(cache, sid, 20, 0)
    s = cache.stats()
    assert s["bytes_used"] == 3 * bs * formula and s["tokens"] == 20
    assert s["arena_bytes"] >= s["bytes_total"] == 10 * bs * formula


@pytest.mark.parametrize("hq", [2, 4, 8])
@pytest.mark.parametrize("n", [1, 7, 16, 37])
def test_paged_attention_equals_dense_and_torch(hq: int, n: int) -> None:
    cache = PagedKVCache(L, H, D, num_blocks=16, block_size=8)
    sid = cache.new_sequence()
    fill(cache, sid, n, n, chunks=(3,))
    q = np.random.default_rng(9).standard_normal((hq, D)).astype(np.float32)
    for layer in range(L):
        k, v = cache.gather(sid, layer)
        out = paged_attention(q, cache, sid, layer)
        assert_close(out, dense_attention(q, k, v), np.float32)
        g = hq // H
        tq = torch.from_numpy(q)[:, None]  # [Hq, 1, D]
        tk = torch.from_numpy(k).transpose(0, 1).repeat_interleave(g, 0)  # [Hq, S, D]
        tv = torch.from_numpy(v).transpose(0, 1).repeat_interleave(g, 0)
        exp = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv)[:, 0].numpy()
        assert_close(out, exp, np.float32)


def test_int8_cache_error_is_small_and_measured() -> None:
    f32 = PagedKVCache(L, H, D, num_blocks=16, block_size=8)
    i8 = PagedKVCache(L, H, D, num_blocks=16, block_size=8, dtype="int8")
    a, b = f32.new_sequence(), i8.new_sequence()
    ref = fill(f32, a, 40, 3)
    fill(i8, b, 40, 3)
    k8, v8 = i8.gather(b, 0)
    k = ref[0][0]
    # symmetric rounding: |x - x_hat| <= scale / 2 = max|x| / 254 per (token, head)
    bound = np.abs(k).max(-1, keepdims=True) / 254 + 1e-7
    assert np.all(np.abs(k8 - k) <= bound)
    q = np.random.default_rng(0).standard_normal((H, D)).astype(np.float32)
    exact = paged_attention(q, f32, a, 0)
    approx = paged_attention(q, i8, b, 0)
    rel = np.linalg.norm(approx - exact) / np.linalg.norm(exact)
    assert 0 < rel < 1e-2
    assert i8.stats()["bytes_per_token"] / f32.stats()["bytes_per_token"] == (D + 4) / (4 * D)


def test_paged_bad_inputs() -> None:
    cache = PagedKVCache(L, H, D, num_blocks=4)
    sid = cache.new_sequence()
    with pytest.raises(ValueError, match="k: expected shape"):
        cache.append(sid, 0, np.zeros((2, H + 1, D), np.float32), np.zeros((2, H + 1, D), np.float32))
    with pytest.raises(ValueError, match="v: has 1 tokens"):
        cache.append(sid, 0, np.zeros((2, H, D), np.float32), np.zeros((1, H, D), np.float32))
    with pytest.raises(TypeError, match="k: expected a floating"):
        cache.append(sid, 0, np.zeros((2, H, D), np.int64), np.zeros((2, H, D), np.int64))
    with pytest.raises(ValueError, match="layer"):
        cache.append(sid, L, np.zeros((1, H, D), np.float32), np.zeros((1, H, D), np.float32))
    with pytest.raises(ValueError, match="dtype"):
        PagedKVCache(L, H, D, 4, dtype="float16")
    with pytest.raises(ValueError, match="num_blocks"):
        PagedKVCache(L, H, D, 0)
    with pytest.raises(ValueError, match="q: expected shape"):
        cache.append(sid, 0, np.zeros((1, H, D), np.float32), np.zeros((1, H, D), np.float32))
        paged_attention(np.zeros((3, D), np.float32), cache, sid, 0)


# -- serving simulator --------------------------------------------------------------------------------------------
COST = linear_step_cost(0.01, 0.001)


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_single_request_latency(policy: str) -> None:
    r = simulate_serving([dict(arrival=1.0, prompt_len=10, output_len=5)], policy, 100, COST)
    assert r["ttft_p50"] == pytest.approx(COST(10))
    assert r["p50_latency"] == pytest.approx(COST(10) + 4 * COST(1))
    assert r["output_tokens"] == 5 and r["steps"] == 5


def test_continuous_beats_static_under_load() -> None:
    reqs = poisson_requests(60, rate=40.0, prompt_len=(8, 32), output_len=(4, 64), seed=1)
    s = simulate_serving(reqs, "static", 1024, COST)
    c = simulate_serving(reqs, "continuous", 1024, COST)
    assert c["throughput_tok_s"] > s["throughput_tok_s"]
    assert c["p99_latency"] < s["p99_latency"] and c["ttft_p50"] < s["ttft_p50"]


def test_preemption_recompute_finishes_everything() -> None:
    reqs = [dict(arrival=0.0, prompt_len=20, output_len=30) for _ in range(6)]
    r = simulate_serving(reqs, "continuous", 120, COST)
    assert r["preemptions"] > 0 and r["recomputed_tokens"] > 0
    assert r["kv_peak_tokens"] <= 120 and r["output_tokens"] == 180
    roomy = simulate_serving(reqs, "continuous", 1000, COST)
    assert roomy["preemptions"] == 0 and roomy["steps"] == 30


def test_serving_bad_inputs() -> None:
    with pytest.raises(ValueError, match="never fit max_batch_tokens=50"):
        simulate_serving([dict(arrival=0, prompt_len=40, output_len=20)], "continuous", 50, COST)
    with pytest.raises(ValueError, match="policy"):
        simulate_serving([dict(arrival=0, prompt_len=4, output_len=2)], "fifo", 50, COST)
    with pytest.raises(ValueError, match=r"requests\[0\]"):
        simulate_serving([dict(arrival=0, prompt_len=4)], "static", 50, COST)


def test_tinygpt_decodes_through_the_paged_cache() -> None:
    from tinylearn.inference import TinyGPT

    model = TinyGPT(29, 32, 4, 2, 64, n_kv_heads=2)
    ids = np.random.default_rng(3).integers(0, 29, (1, 21))
    full = model(ids).numpy()
    paged = PagedKVCache(2, 2, 8, num_blocks=8, block_size=4)
    a = paged.new_sequence()
    view = paged.model_cache(a)
    parts = [model(ids[:, :9], view).numpy()]
    b = paged.fork(a)  # the fork continues from the shared 9-token prefix
    parts += [model(ids[:, i : i + 1], view).numpy() for i in range(9, 21)]
    assert_close(np.concatenate(parts, axis=1), full, np.float32)
    other = paged.model_cache(b)
    assert_close(model(ids[:, 9:12], other).numpy(), full[:, 9:12], np.float32)
    assert paged.cow_copies == 1 and paged.length(b, 1) == 12


def test_append_accepts_strided_views() -> None:
    cache = PagedKVCache(1, H, D, num_blocks=4, block_size=4)
    sid = cache.new_sequence()
    rng = np.random.default_rng(8)
    k_hd = rng.standard_normal((H, 6, D)).astype(np.float32)  # [H, T, D]: a transposed view is [T, H, D]
    v64 = rng.standard_normal((6, H, 2 * D))[:, :, ::2]  # float64, strided last dim
    cache.append(sid, 0, k_hd.transpose(1, 0, 2), v64)
    k, v = cache.gather(sid, 0)
    np.testing.assert_array_equal(k, k_hd.transpose(1, 0, 2))
    assert_close(v, v64.astype(np.float32), np.float32)


def test_prefix_hash_index_shares_full_blocks_and_counts_hits() -> None:
    from tinylearn.inference import TinyGPT

    model = TinyGPT(29, 32, 4, 2, 64, n_kv_heads=2)
    cache = PagedKVCache(2, 2, 8, num_blocks=32, block_size=4)
    rng = np.random.default_rng(4)
    system = list(rng.integers(0, 29, 10))  # 2 full blocks + 2 tokens
    first = system + list(rng.integers(0, 29, 3))
    a, n = cache.match_prefix(first)
    assert n == 0 and cache.stats()["prefix_hit_tokens"] == 0  # empty index: a miss
    model(np.array([first]), cache.model_cache(a))
    assert cache.register_prefix(a, first) == 3  # 13 tokens = 3 full blocks of 4
    assert cache.register_prefix(a, first) == 0  # idempotent
    second = system + list(rng.integers(0, 29, 5))
    b, n = cache.match_prefix(second)
    assert n == 8 and cache.block_table(b) == cache.block_table(a)[:2]  # only the 2 full system blocks match
    out = model(np.array([second[n:]]), cache.model_cache(b)).numpy()
    assert_close(out, model(np.array([second])).numpy()[:, n:], np.float32)
    s = cache.stats()
    assert s["prefix_queries"] == 2 and s["prefix_lookup_tokens"] == 13 + 15 and s["prefix_hit_tokens"] == 8
    assert s["prefix_hit_rate"] == 8 / 28 and s["shared_blocks"] == 2
    # an exact repeat matches every full block but leaves the last token to compute (its logits are needed)
    c, n = cache.match_prefix(first[:12])
    assert n == 8
    # a different first block changes every chained hash after it: no match, even if block 2 is equal
    d, n = cache.match_prefix([(first[0] + 1) % 29] + first[1:])
    assert n == 0
    # freeing the owners unindexes blocks whose refcount reaches 0
    for sid in (a, b, c, d):
        cache.free(sid)
    assert cache.stats()["blocks_used"] == 0 and cache.stats()["indexed_blocks"] == 0
    e, n = cache.match_prefix(first)
    assert n == 0


def test_prefix_index_rejects_collisions_and_bad_input() -> None:
    cache = PagedKVCache(1, H, D, num_blocks=8, block_size=2)
    sid = cache.new_sequence()
    fill(cache, sid, 4, 0)
    cache.register_prefix(sid, [1, 2, 3, 4])
    h, _ = cache._block_hashes([5, 6], 1)[0]  # forge a collision: the hash of [5, 6] points at block [1, 2]
    cache._prefix_index[h] = cache._prefix_index[cache._block_hashes([1, 2], 1)[0][0]]
    _, n = cache.match_prefix([5, 6, 7])
    assert n == 0  # the stored token ids differ, so the hit is refused
    with pytest.raises(ValueError, match="ids"):
        cache.register_prefix(sid, [1, 2, 3, 4, 5])  # more ids than cached tokens
    with pytest.raises(ValueError, match="ids"):
        cache.match_prefix([])
    with pytest.raises(TypeError, match="ids"):
        cache.match_prefix([1.5, 2.0])


def test_slo_priority_queue_meets_more_deadlines() -> None:
    """EDF admission: under overload, tight-SLO requests overtake loose ones queued before them."""
    reqs = poisson_requests(300, rate=160, prompt_len=(8, 64), output_len=(8, 128), seed=3)
    for i, r in enumerate(reqs):
        r["slo"] = 1.0 if i % 4 == 0 else 30.0
    cost = linear_step_cost(2e-3, 50e-6)
    fcfs = simulate_serving(reqs, "continuous", 1024, cost)
    edf = simulate_serving(reqs, "continuous", 1024, cost, order="slo")
    assert edf["slo_attainment"] > fcfs["slo_attainment"]
    tight = [i for i in range(len(reqs)) if i % 4 == 0]
    assert max(edf["latencies"][i] for i in tight) < max(fcfs["latencies"][i] for i in tight)
    assert edf["output_tokens"] == fcfs["output_tokens"] and len(edf["latencies"]) == len(reqs)
    # without slo fields (and no preemption) both orders admit by arrival time: identical schedules
    plain = poisson_requests(50, rate=60, seed=3)
    a, b = (simulate_serving(plain, "continuous", 8192, COST, order=o) for o in ("fcfs", "slo"))
    assert a["preemptions"] == 0 and all(a[x] == b[x] for x in ("mean_latency", "p99_latency", "ttft_p99"))
    with pytest.raises(ValueError, match="order"):
        simulate_serving(plain, "static", 1024, COST, order="slo")
    with pytest.raises(ValueError, match=r"requests\[0\]"):
        simulate_serving([dict(arrival=0, prompt_len=4, output_len=2, slo=0)], "continuous", 50, COST)


def test_priority_keep_policy() -> None:
    from tinylearn.inference import priority_keep

    scores = np.array([5.0, 0.1, 3.0, 0.2, 0.3, 4.0, 0.0, 0.0])
    keep = priority_keep(scores, 4, recent=2)
    assert keep.tolist() == [True, False, False, False, False, True, True, True]  # 2 recent + top-2 of the rest
    assert priority_keep(scores, 3).tolist() == [True, False, True, False, False, True, False, False]
    assert priority_keep(scores, 10).all() and priority_keep(scores, 0).sum() == 0
    with pytest.raises(ValueError, match="budget"):
        priority_keep(scores, 2, recent=3)


def test_evict_and_restore_tokens() -> None:
    from tinylearn.inference import attention_received, priority_keep

    cache = PagedKVCache(L, H, D, num_blocks=16, block_size=4)
    sid = cache.new_sequence()
    ref = fill(cache, sid, 30, 5)  # 8 blocks
    rng = np.random.default_rng(6)
    q = rng.standard_normal((2 * H, D)).astype(np.float32)
    full = [paged_attention(q, cache, sid, layer) for layer in range(L)]
    prio = attention_received(q[None], ref[0][0])
    assert prio.shape == (30,) and abs(prio.sum() - 2 * H) < 1e-4  # each query head spreads mass 1
    keep = priority_keep(prio, 10, recent=3)
    ev = cache.evict_tokens(sid, keep)
    assert cache.length(sid) == 10 and cache.stats()["blocks_used"] == 3 and len(ev["pos"]) == 20
    for layer in range(L):
        k, v = cache.gather(sid, layer)
        np.testing.assert_array_equal(k, ref[layer][0][keep])
        np.testing.assert_array_equal(ev["kv"][layer][1], ref[layer][1][~keep])
    cache.restore_tokens(sid, ev)
    assert cache.length(sid) == 30 and cache.stats()["blocks_used"] == 8
    for layer in range(L):
        assert_close(paged_attention(q, cache, sid, layer), full[layer], np.float32)
    with pytest.raises(ValueError, match="keep"):
        cache.evict_tokens(sid, np.ones(29, bool))
    cache.evict_tokens(sid, np.zeros(30, bool))
    assert cache.stats()["blocks_used"] == 0 and cache.length(sid) == 0
