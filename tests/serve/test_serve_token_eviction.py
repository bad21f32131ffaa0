"""Token-priority eviction in the Engine (``kv_token_budget``): a long context stays within its KV budget after every
step, the recent window and the heavy hitters survive, the block invariants hold, and the outputs are exact until the
first eviction and approximate after it (documented; here only bounded, never asserted equal)."""

from __future__ import annotations

import _serve_models
import numpy as np
import pytest

from tinylearn.inference import TinyGPT, generate
from tinylearn.inference.paged_math import blocks_needed
from tinylearn.serve.engine import Engine
from tinylearn.serve.types import SamplingParams


def make_model(seed: int = 0, **cfg: object) -> TinyGPT:
    return _serve_models.make_model(seed, **{"max_seq_len": 160, **cfg})


@pytest.mark.parametrize("kv_dtype", ["float32", "int8"])
@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_long_context_stays_within_budget(kv_dtype: str, preemption: str) -> None:
    m = make_model(1)
    rng = np.random.default_rng(0)
    ps = [rng.integers(0, 64, n).tolist() for n in (100, 70, 12)]
    B, R, bs = 32, 8, 4
    e = Engine(m, block_size=bs, max_num_batched_tokens=128, enable_prefix_caching=False, kv_dtype=kv_dtype,
               kv_token_budget=B, kv_evict_recent=R, preemption=preemption)  # fmt: skip
    p = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    rids = [e.add_request(x, p) for x in ps]
    first: dict[str, int] = {}
    final: dict[str, list[int]] = {}
    while e.has_unfinished():
        for o in e.step():
            if o.token_ids and o.request_id not in first:
                first[o.request_id] = o.token_ids[0]
            if o.finished:
                final[o.request_id] = o.token_ids
        e.check_invariants()
        for seq in e.scheduler.running:
            held = e.bm.cache.seqs[seq.cache_id].lens[0]
            assert held <= B and held == seq.num_computed - seq.kv_evicted
            assert len(e.bm.cache.seqs[seq.cache_id].table) <= blocks_needed(B, bs)
            pos = e.kv_positions(seq.request_id)
            assert len(pos) == held and np.all(np.diff(pos) > 0)  # kept in order, none twice
            if seq.kv_evicted:  # the last R positions are always kept
                assert set(range(seq.num_computed - R, seq.num_computed)) <= set(pos.tolist())
    assert e.stats()["kv_evicted_tokens"] > 0 and e.stats()["kv_blocks_used"] == 0
    for rid, x in zip(rids, ps):
        ref = generate(m, x, 40, temperature=0)
        assert len(final[rid]) == 40 and all(0 <= t < 64 for t in final[rid])
        if kv_dtype == "float32":
            # the whole prompt is prefilled in one step, before any eviction: the first token is exact
            assert first[rid] == ref[0]
        if len(x) + 40 <= B:  # the short request never exceeds the budget: exact all along
            assert final[rid] == ref


def test_budget_above_the_context_changes_nothing() -> None:
    m = make_model(2)
    rng = np.random.default_rng(1)
    ps = [rng.integers(0, 64, n).tolist() for n in (50, 30)]
    p = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    e = Engine(m, block_size=4, enable_prefix_caching=False, kv_token_budget=200)
    assert [o.token_ids for o in e.generate(ps, p)] == [generate(m, x, 20, temperature=0) for x in ps]
    assert e.stats()["kv_evicted_tokens"] == 0


def test_heavy_hitters_kept_over_plain_window() -> None:
    """After one 60-token prefill step the cache holds budget - block_size = 20 tokens: the last 4 (the recent
    window) and 16 chosen by attention score from before it."""
    m = make_model(3)
    rng = np.random.default_rng(2)
    x = rng.integers(0, 64, 60).tolist()
    e = Engine(m, block_size=4, enable_prefix_caching=False, kv_token_budget=24, kv_evict_recent=4)
    rid = e.add_request(x, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    e.step()  # prefill of 60 tokens in one step -> evicted to 24 - 4 = 20 tokens
    pos = e.kv_positions(rid)
    assert len(pos) == 20 and list(pos[-4:]) == [56, 57, 58, 59]
    assert pos[:-4].max() < 56  # the other 16 come from before the recent window, chosen by score


def test_bad_eviction_arguments() -> None:
    m = make_model()
    with pytest.raises(ValueError, match="kv_token_budget: token-priority eviction needs enable_prefix_caching"):
        Engine(m, kv_token_budget=32)
    with pytest.raises(ValueError, match="kv_evict_recent: 32 must be < kv_token_budget=32"):
        Engine(m, enable_prefix_caching=False, kv_token_budget=32, kv_evict_recent=32)
    with pytest.raises(ValueError, match="kv_evict_recent: 4 given without kv_token_budget"):
        Engine(m, kv_evict_recent=4)
    with pytest.raises(ValueError, match="kv_token_budget: must be an int >= 2"):
        Engine(m, enable_prefix_caching=False, kv_token_budget=1)
