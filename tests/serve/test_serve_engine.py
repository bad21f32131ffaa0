"""The serving engine end to end: greedy outputs of a mixed continuous batch equal running each request alone and
``tinylearn.inference.generate`` (MHA, GQA, learned positions; chunked or not; prefix cached or not; preempted by
recompute or swap; int8 KV), prefix-cache hit counts by arithmetic, LRU eviction, a randomized workload with the
invariants checked after every step, aborts, sampling, stop strings, speculative decoding and bad input."""

from __future__ import annotations

import numpy as np
import pytest
from _serve_models import make_model, prompts

from tinylearn.inference import TinyGPT, generate
from tinylearn.serve.engine import Engine
from tinylearn.serve.tokenizer import ByteTokenizer
from tinylearn.serve.types import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=8)
CFGS = {
    "mha": dict(vocab_size=64, d_model=32, n_heads=4, n_layers=2, max_seq_len=96),
    "gqa": dict(vocab_size=64, d_model=32, n_heads=4, n_layers=2, max_seq_len=96, n_kv_heads=2),
    "abs_pos": dict(vocab_size=64, d_model=32, n_heads=2, n_layers=2, max_seq_len=96, rope=False),
}


def tokens(outs: list) -> list[list[int]]:
    return [o.token_ids for o in outs]


@pytest.fixture(scope="module")
def model() -> TinyGPT:
    return make_model()


@pytest.mark.parametrize("cfg", list(CFGS))
def test_mixed_batch_equals_alone_and_generate(cfg: str) -> None:
    m = make_model(1, **CFGS[cfg])
    ps = prompts(6, seed=2)
    ref = [generate(m, p, 8, temperature=0) for p in ps]
    eng = Engine(m, block_size=4, max_num_batched_tokens=48)
    outs = eng.generate(ps, GREEDY)
    assert tokens(outs) == ref
    assert all(o.finished and o.finish_reason == "length" for o in outs)
    alone = Engine(m, block_size=4, max_num_seqs=1)
    assert [alone.generate([p], GREEDY)[0].token_ids for p in ps] == ref
    assert max(s["num_seqs"] for s in eng.step_log) > 1  # it really batched
    assert any(s["num_prefill_tokens"] and s["num_decode_tokens"] for s in eng.step_log)  # mixed steps


@pytest.mark.parametrize("chunk", [3, 16, 200])
def test_chunked_prefill_gives_same_tokens(model: TinyGPT, chunk: int) -> None:
    ps = prompts(5, seed=3, lo=20, hi=60)
    ref = tokens(Engine(model, chunked_prefill=False, max_num_batched_tokens=256).generate(ps, GREEDY))
    eng = Engine(model, max_num_batched_tokens=chunk, block_size=4)
    assert tokens(eng.generate(ps, GREEDY)) == ref
    assert all(s["num_prefill_tokens"] + s["num_decode_tokens"] <= chunk for s in eng.step_log)
    if chunk == 3:
        assert max(s["num_prefill_tokens"] for s in eng.step_log) == 3  # prompts really were split


def test_prefix_cache_hits_by_arithmetic(model: TinyGPT) -> None:
    shared = list(range(1, 13))  # 12 tokens = 3 full blocks of 4
    a, b, c = shared + [20, 21, 22, 23, 24], shared + [30, 31, 32], shared[:9]
    ref = [generate(model, p, 8, temperature=0) for p in (a, b, c)]
    eng = Engine(model, block_size=4)
    assert eng.generate([a], GREEDY)[0].token_ids == ref[0]
    out_b = eng.generate([b], GREEDY)[0]
    assert out_b.token_ids == ref[1] and out_b.metrics["prefix_hit_tokens"] == 12
    out_c = eng.generate([c], GREEDY)[0]  # 9 tokens: blocks 0, 1 of the cache ((9 - 1) // 4 = 2 full blocks)
    assert out_c.token_ids == ref[2] and out_c.metrics["prefix_hit_tokens"] == 8
    st = eng.stats()
    assert st["prefix_queried_tokens"] == len(a) + len(b) + len(c)
    assert st["prefix_hit_tokens"] == 20 and st["prefix_hit_rate"] == pytest.approx(20 / 41)
    # a fully cached prompt still computes its last token: same prompt again hits (17 - 1) // 4 = 4 blocks
    again = eng.generate([a], GREEDY)[0]
    assert again.token_ids == ref[0] and again.metrics["prefix_hit_tokens"] == 16
    eng.check_invariants()
    off = Engine(model, block_size=4, enable_prefix_caching=False)
    assert tokens(off.generate([a, b], GREEDY)) == ref[:2] and off.stats()["prefix_hit_tokens"] == 0


def test_generated_tokens_are_cached_too(model: TinyGPT) -> None:
    """A multi-turn follow-up (prompt + answer + more) hits the blocks the answer filled."""
    p = list(range(5, 15))
    eng = Engine(model, block_size=4)
    first = eng.generate([p], SamplingParams(temperature=0, max_tokens=10))[0]
    follow = p + first.token_ids + [3, 4]  # 22 tokens; the first 19 were computed (the last answer token was not)
    out = eng.generate([follow], GREEDY)[0]
    assert out.metrics["prefix_hit_tokens"] == 16 and out.token_ids == generate(model, follow, 8, temperature=0)


def test_lru_eviction_under_pressure_stays_correct(model: TinyGPT) -> None:
    ps = prompts(8, seed=4, lo=20, hi=30)
    ref = [generate(model, p, 8, temperature=0) for p in ps]
    eng = Engine(model, block_size=4, num_blocks=24, max_num_seqs=2)
    for p, r in zip(ps, ref):
        assert eng.generate([p], GREEDY)[0].token_ids == r
        eng.check_invariants()
    st = eng.stats()
    assert st["prefix_evictions"] > 0 and st["kv_blocks_cached"] > 0
    assert st["kv_blocks_used"] == st["kv_blocks_cached"]  # nothing running: only cached blocks remain
    # the most recent prompt is still cached (LRU keeps the newest), the oldest was evicted
    assert eng.generate([ps[-1]], GREEDY)[0].metrics["prefix_hit_tokens"] > 0
    assert eng.generate([ps[0]], GREEDY)[0].token_ids == ref[0]


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("kv_dtype", ["float32", "int8"])
def test_preemption_gives_identical_outputs(model: TinyGPT, mode: str, kv_dtype: str) -> None:
    ps = prompts(6, seed=5, lo=10, hi=30)
    params = SamplingParams(temperature=0, max_tokens=12)
    free = Engine(model, block_size=4, kv_dtype=kv_dtype)
    ref = tokens(free.generate(ps, params))
    if kv_dtype == "float32":
        assert ref == [generate(model, p, 12, temperature=0) for p in ps]
    eng = Engine(model, block_size=4, num_blocks=14, preemption=mode, kv_dtype=kv_dtype)
    outs = eng.generate(ps, params)
    assert tokens(outs) == ref
    st = eng.stats()
    assert st[f"preemptions_{mode}"] > 0 and sum(o.metrics["num_preemptions"] for o in outs) > 0
    if mode == "swap":
        assert st["swapped_blocks_out"] == st["swapped_blocks_in"] > 0
    eng.check_invariants()
    assert st["running"] == st["waiting"] == st["swapped"] == 0


def test_swap_with_tiered_store_if_available(model: TinyGPT) -> None:
    tiering = pytest.importorskip("tinylearn.serve.tiering")
    ps = prompts(6, seed=5, lo=10, hi=30)
    plain = Engine(model, block_size=4)
    ref = tokens(plain.generate(ps, GREEDY))
    store = tiering.TieredKVStore(
        plain.host_block_shape, plain.host_block_dtype, fast_blocks=2, slow_blocks=4, prefetch_threads=1
    )
    eng = Engine(model, block_size=4, num_blocks=12, preemption="swap", host_store=store)
    assert tokens(eng.generate(ps, GREEDY)) == ref and eng.stats()["preemptions_swap"] > 0
    assert store.stats()["demotions"] > 0  # blocks really went through the slower tier


@pytest.mark.parametrize("seed", [0, 1])
def test_randomized_workload_invariants(model: TinyGPT, seed: int) -> None:
    rng = np.random.default_rng(seed)
    mode = ["recompute", "swap"][seed % 2]
    eng = Engine(
        model,
        block_size=4,
        num_blocks=20,
        max_num_batched_tokens=int(rng.integers(8, 40)),
        max_num_seqs=4,
        preemption=mode,
    )
    pool = prompts(6, seed=seed + 10, lo=2, hi=24)
    shared = [int(t) for t in rng.integers(0, 64, 8)]
    live: dict[str, list[int]] = {}
    want: dict[str, list[int]] = {}
    finished: dict[str, object] = {}
    aborted = set()
    for step in range(120):
        if step < 60 and rng.random() < 0.4:
            p = pool[int(rng.integers(len(pool)))]
            p = shared + p if rng.random() < 0.5 else p
            n = int(rng.integers(1, 10))
            rid = eng.add_request(p, SamplingParams(temperature=0, max_tokens=n))
            live[rid], want[rid] = p, generate(model, p, n, temperature=0)
        if live and rng.random() < 0.08:
            rid = list(live)[int(rng.integers(len(live)))]
            used = eng.stats()["kv_blocks_used"] - eng.stats()["kv_blocks_cached"]
            assert eng.abort(rid)
            assert eng.stats()["kv_blocks_used"] - eng.stats()["kv_blocks_cached"] <= used  # freed at once
            assert rid not in {s.request_id for s in eng.scheduler.running}
            aborted.add(rid)
        for out in eng.step():
            if out.finished:
                finished[out.request_id] = out
                live.pop(out.request_id, None)
        eng.check_invariants()
        if step >= 60 and not eng.has_unfinished():
            break
    assert not eng.has_unfinished()
    for rid, out in finished.items():
        if rid in aborted:
            assert out.finish_reason == "abort"
        else:
            assert out.token_ids == want[rid]
    st = eng.stats()
    assert st["kv_blocks_used"] == st["kv_blocks_cached"] and not eng.bm.cache.seqs
    assert st["aborted"] == len(aborted)


def test_abort_frees_blocks_at_once(model: TinyGPT) -> None:
    eng = Engine(model, block_size=4)
    rid = eng.add_request(list(range(30)), SamplingParams(temperature=0, max_tokens=20))
    other = eng.add_request([1, 2, 3], SamplingParams(temperature=0, max_tokens=20))
    eng.step()
    held = len(eng.bm.cache.block_table(eng.seqs[rid].cache_id))
    busy = eng.stats()["kv_blocks_used"] - eng.stats()["kv_blocks_cached"]
    assert eng.abort(rid) and not eng.abort(rid) and not eng.abort("nope")
    st = eng.stats()
    assert st["kv_blocks_used"] - st["kv_blocks_cached"] == busy - held
    eng.check_invariants()
    outs = {o.request_id: o for o in eng.step()}
    assert outs[rid].finish_reason == "abort" and outs[rid].finished and other in outs


def test_seeded_sampling_reproducible_and_batch_independent(model: TinyGPT) -> None:
    ps = prompts(4, seed=6)
    params = [SamplingParams(temperature=0.9, top_k=20, top_p=0.9, max_tokens=10, seed=s) for s in range(4)]
    a = tokens(Engine(model).generate(ps, params))
    b = tokens(Engine(model, max_num_seqs=1).generate(ps, params))
    assert a == b
    assert a == [generate(model, p, 10, temperature=0.9, top_k=20, top_p=0.9, seed=s) for s, p in enumerate(ps)]
    c = tokens(
        Engine(model).generate(ps, [SamplingParams(temperature=0.9, max_tokens=10, seed=s + 7) for s in range(4)])
    )
    assert c != a


def test_stop_strings_and_eos() -> None:
    m = make_model(2, vocab_size=128)  # byte ids < 128: ASCII text
    tok = ByteTokenizer()
    prompt = "hello"
    ref = generate(m, tok.encode(prompt), 30, temperature=0)
    full = tok.decode(ref)
    stop = full[6:8]
    j = next(i for i in range(1, 31) if stop in tok.decode(ref[:i]))
    eng = Engine(m, tokenizer=tok, eos_token_id=ref[4] if ref[4] not in ref[:4] else None)
    out = eng.generate([prompt], SamplingParams(temperature=0, max_tokens=30, stop=[stop], ignore_eos=True))[0]
    assert out.finish_reason == "stop" and out.token_ids == ref[:j] and out.text == full[: full.find(stop)]
    if eng.eos_token_id is not None:
        out = eng.generate([prompt], SamplingParams(temperature=0, max_tokens=30))[0]
        assert out.finish_reason == "stop" and out.token_ids == ref[:5]  # EOS included in the ids
    # the context: prompt 90 + 6 tokens reach max_seq_len 96
    out = Engine(m).generate([[1] * 90], SamplingParams(temperature=0, max_tokens=50))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 6


@pytest.mark.parametrize("same_draft", [True, False])
def test_speculative_greedy_equals_plain(model: TinyGPT, same_draft: bool) -> None:
    draft = model if same_draft else make_model(9, n_layers=1)
    ps = prompts(4, seed=7)
    ref = [generate(model, p, 12, temperature=0) for p in ps]
    eng = Engine(model, draft_model=draft, block_size=4)
    spec = SamplingParams(temperature=0, max_tokens=12, speculative=3)
    outs = eng.generate(ps, [spec, GREEDY.__class__(temperature=0, max_tokens=12), spec, spec])
    assert tokens(outs) == ref
    st = eng.stats()
    assert st["spec_proposed"] > 0
    if same_draft:
        assert st["spec_accepted"] == st["spec_proposed"]
        assert st["num_steps"] < 12 + 2  # several tokens per step
    eng.check_invariants()
    sampled = SamplingParams(temperature=0.8, max_tokens=12, speculative=2, seed=3)
    x = tokens(Engine(model, draft_model=draft).generate(ps[:2], sampled))
    assert x == tokens(Engine(model, draft_model=draft).generate(ps[:2], sampled))


def test_bad_input(model: TinyGPT) -> None:
    with pytest.raises(ValueError, match="policy.*'lifo'"):
        Engine(model, policy="lifo")
    with pytest.raises(ValueError, match="num_blocks.*0"):
        Engine(model, num_blocks=0)
    with pytest.raises(ValueError, match="preemption"):
        Engine(model, preemption="drop")
    with pytest.raises(TypeError, match="model"):
        Engine("gpt2")
    eng = Engine(model, num_blocks=8, block_size=4, chunked_prefill=False, max_num_batched_tokens=16)
    eng.add_request([1, 2], request_id="x")
    with pytest.raises(ValueError, match="request_id.*'x'"):
        eng.add_request([1, 2], request_id="x")
    with pytest.raises(ValueError, match="prompt.*64"):
        eng.add_request([1, 64])
    with pytest.raises(ValueError, match="prompt: must hold"):
        eng.add_request([])
    with pytest.raises(TypeError, match="prompt.*tokenizer"):
        eng.add_request("hi")
    with pytest.raises(ValueError, match="prompt.*max_num_batched_tokens"):
        eng.add_request([1] * 17)
    with pytest.raises(ValueError, match="prompt.*KV pool"):
        Engine(model, num_blocks=2, block_size=4).add_request([1] * 8)
    with pytest.raises(ValueError, match="prompt.*max_seq_len=96"):
        Engine(model).add_request([1] * 96)
    with pytest.raises(TypeError, match="params"):
        eng.add_request([1], {"max_tokens": 3})
    with pytest.raises(ValueError, match="stop"):
        eng.add_request([1], SamplingParams(stop=["a"]))
    with pytest.raises(ValueError, match="speculative"):
        eng.add_request([1], SamplingParams(speculative=2))


def test_check_invariants_detects_corrupted_refcount(model: TinyGPT) -> None:
    eng = Engine(model, block_size=4)
    eng.add_request(list(range(10)), SamplingParams(temperature=0, max_tokens=5))
    eng.step()
    eng.check_invariants()
    b = eng.bm.cache.block_table(eng.scheduler.running[0].cache_id)[0]
    eng.bm.cache.refcount[b] += 1
    with pytest.raises(RuntimeError, match="refcount"):
        eng.check_invariants()
    eng.bm.cache.refcount[b] -= 1
    eng.scheduler.running.clear()  # a lost request: its blocks would leak
    with pytest.raises(RuntimeError, match="exactly one queue"):
        eng.check_invariants()
