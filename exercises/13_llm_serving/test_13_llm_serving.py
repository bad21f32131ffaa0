"""Tests for exercises/13_llm_serving (run on stubs by default, on tinylearn with --impl=reference).

Hand-computed cases first; then random cases checked against the real ``tl.serve.Engine`` stepping the same state
(its scheduler's queues, its prefix cache's hit tokens, its chunk sizes per step)."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from tinylearn.inference.config import GPTConfig
from tinylearn.inference.paged_math import blocks_needed
from tinylearn.serve.checkpoint import tiny_model
from tinylearn.serve.engine import Engine
from tinylearn.serve.types import SamplingParams

CFG = GPTConfig(vocab_size=64, d_model=16, n_heads=2, n_layers=1, max_seq_len=256)


def _model():
    return tiny_model(0, CFG)


def _run(rid: str, num_tokens: int, num_computed: int, decoding: bool) -> dict:
    return {"id": rid, "num_tokens": num_tokens, "num_computed": num_computed, "decoding": decoding}


def _wait(rid: str, num_tokens: int) -> dict:
    return {"id": rid, "num_tokens": num_tokens, "num_computed": 0}


# ------------------------------------------------------------------------------------------- (a) scheduler step
def test_schedule_decodes_first_then_chunked_prompts(impl: ModuleType) -> None:
    running = [_run("A", 20, 10, False), _run("B", 9, 8, True)]
    waiting = [_wait("C", 12), _wait("D", 5)]
    kw = dict(budget=16, max_num_seqs=8, free_blocks=100, block_size=4)
    got = impl.schedule_step(running, waiting, **kw)
    assert got == {"scheduled": [("B", 1), ("A", 10), ("C", 5)], "preempted": []}
    # without chunked prefill C (12 tokens) does not fit the 5 left and D may not jump the queue
    got = impl.schedule_step(running, waiting, chunked_prefill=False, **kw)
    assert got == {"scheduled": [("B", 1), ("A", 10)], "preempted": []}
    # ... but a prompt longer than the whole per-step budget is chunked anyway
    got = impl.schedule_step([], [_wait("E", 40)], chunked_prefill=False, **kw)
    assert got == {"scheduled": [("E", 16)], "preempted": []}


def test_schedule_max_num_seqs_and_blocks_head_of_line(impl: ModuleType) -> None:
    running = [_run("B", 9, 8, True), _run("F", 5, 4, True)]
    got = impl.schedule_step(running, [_wait("C", 3)], budget=16, max_num_seqs=2, free_blocks=100, block_size=4)
    assert got == {"scheduled": [("B", 1), ("F", 1)], "preempted": []}
    # B's decode takes 1 of the 2 free blocks; C needs 3: it waits, and D (1 block) waits behind it
    got = impl.schedule_step(running[:1], [_wait("C", 12), _wait("D", 2)], budget=16, max_num_seqs=8, free_blocks=2,
                             block_size=4)  # fmt: skip
    assert got == {"scheduled": [("B", 1)], "preempted": []}


def test_schedule_preempts_the_last_request(impl: ModuleType) -> None:
    # A and B each need one more block to decode; 1 is free: B's growth preempts C (last in policy order)
    running = [_run("A", 9, 8, True), _run("B", 13, 12, True), _run("C", 20, 8, False)]
    got = impl.schedule_step(running, [_wait("W", 3)], budget=16, max_num_seqs=8, free_blocks=1, block_size=4)
    assert got == {"scheduled": [("A", 1), ("B", 1)], "preempted": ["C"]}  # and W is not admitted this step


def test_schedule_self_preemption(impl: ModuleType) -> None:
    # A (already scheduled) is no victim: B's chunk of 7 needs 2 blocks, none are free, so B preempts itself
    running = [_run("A", 9, 8, True), _run("B", 14, 4, False)]
    got = impl.schedule_step(running, [], budget=8, max_num_seqs=8, free_blocks=1, block_size=4)
    assert got == {"scheduled": [("A", 1)], "preempted": ["B"]}


def _snapshot(engine: Engine) -> tuple[list[dict], list[dict], list]:
    sch, bs = engine.scheduler, engine.block_size
    assert not sch.swapped
    running = sorted(sch.running, key=sch.key)
    waiting = sorted(sch.waiting, key=lambda s: (not s.resumed, sch.key(s)))
    for s in running:  # the exercise's "holds ceil(num_computed / block_size) blocks"
        assert len(engine.bm.cache.seqs[s.cache_id].table) == blocks_needed(s.num_computed, bs)
    r = [_run(s.request_id, len(s.tokens), s.num_computed, s.prefilled) for s in running]
    w = [_wait(s.request_id, len(s.tokens)) for s in waiting]
    return r, w, running + waiting


@pytest.mark.parametrize("chunked, seed", [(True, 0), (True, 1), (False, 2), (False, 3)])
def test_schedule_matches_the_engine(impl: ModuleType, chunked: bool, seed: int) -> None:
    """Random arrivals on a pool too small for everyone: every step of the real engine, replayed."""
    rng = np.random.default_rng(seed)
    bs, budget, max_seqs = 4, 16, 4
    engine = Engine(_model(), block_size=bs, num_blocks=10, max_num_batched_tokens=budget, max_num_seqs=max_seqs,
                    chunked_prefill=chunked, enable_prefix_caching=False)  # fmt: skip
    to_add = 20
    steps = 0
    while to_add or engine.has_unfinished():
        while to_add and (not engine.has_unfinished() or rng.random() < 0.6):
            prompt = rng.integers(0, 64, int(rng.integers(2, 17))).tolist()
            engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=int(rng.integers(1, 17))))
            to_add -= 1
        r, w, seqs = _snapshot(engine)
        before = [(s, s.num_computed) for s in seqs]
        got = impl.schedule_step(r, w, budget=budget, max_num_seqs=max_seqs, free_blocks=engine.bm.free_blocks,
                                 block_size=bs, chunked_prefill=chunked)  # fmt: skip
        was_running = list(engine.scheduler.running)
        engine.step()
        steps += 1
        want = {s.request_id: s.num_computed - c for s, c in before if s.num_computed > c}
        preempted = {s.request_id for s in was_running if s in engine.scheduler.waiting}
        assert len(got["scheduled"]) == len(dict(got["scheduled"])), got
        assert dict(got["scheduled"]) == want, (steps, r, w, got)
        assert set(got["preempted"]) == preempted, (steps, r, w, got)
    assert engine.scheduler.preemptions["recompute"] > 0  # the run exercised preemption


# ----------------------------------------------------------------------------------------- (b) prefix cache
def test_block_hashes_chain(impl: ModuleType) -> None:
    h1 = hash((0, (1, 2)))
    h2 = hash((h1, (3, 4)))
    assert impl.block_hashes([1, 2, 3, 4, 5], 2) == [h1, h2]  # the partial block (5,) has no hash
    assert impl.block_hashes([1, 2, 3], 4) == []
    # the same block after a different prefix hashes differently: a hash names the whole prefix
    assert impl.block_hashes([9, 9, 3, 4], 2)[1] != h2


def test_longest_cached_prefix(impl: ModuleType) -> None:
    ids = list(range(1, 9))
    index = {h: tuple(ids[2 * i : 2 * i + 2]) for i, h in enumerate(impl.block_hashes(ids, 2))}
    assert impl.longest_cached_prefix(ids, index, 2) == 6  # the whole prompt is cached, but one token is left
    assert impl.longest_cached_prefix([*ids, 9], index, 2) == 8
    assert impl.longest_cached_prefix([1, 2, 3, 4, 9, 9, 9], index, 2) == 4
    assert impl.longest_cached_prefix([1, 2, 4, 3, 5, 6, 7, 8], index, 2) == 2  # a miss ends the walk
    assert impl.longest_cached_prefix([1], index, 2) == 0
    h1 = hash((0, (1, 2)))
    assert impl.longest_cached_prefix([1, 2, 3], {h1: (7, 7)}, 2) == 0  # hash present, tokens differ: no hit
    with pytest.raises(ValueError, match="token_ids"):
        impl.longest_cached_prefix([], index, 2)


@pytest.mark.parametrize("seed", [0, 1])
def test_prefix_hits_match_the_engine(impl: ModuleType, seed: int) -> None:
    """Requests served one after another with prefix caching: each one's hit tokens in the engine equal the longest
    cached prefix of its prompt in an index of every earlier request's computed full blocks."""
    rng = np.random.default_rng(seed)
    bs = 4
    engine = Engine(_model(), block_size=bs, num_blocks=256, max_num_batched_tokens=64, enable_prefix_caching=True)
    systems = [rng.integers(0, 64, int(n)).tolist() for n in (7, 12, 16)]
    index: dict[int, tuple[int, ...]] = {}
    served: list[list[int]] = []
    hits = 0
    for _ in range(14):
        if served and rng.random() < 0.2:
            prompt = list(served[int(rng.integers(len(served)))])  # an exact repeat
        else:
            prompt = systems[int(rng.integers(3))] + rng.integers(0, 64, int(rng.integers(0, 9))).tolist()
        expect = impl.longest_cached_prefix(prompt, index, bs)
        out = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=int(rng.integers(1, 7))))[0]
        assert out.metrics["prefix_hit_tokens"] == expect, (prompt, expect, out.metrics)
        hits += expect > 0
        computed = (prompt + out.token_ids)[:-1]  # the last sampled token's KV is never computed
        for i, h in enumerate(impl.block_hashes(computed, bs)):
            index.setdefault(h, tuple(computed[i * bs : (i + 1) * bs]))
        served.append(prompt)
    assert hits >= 3


# -------------------------------------------------------------------------------------- (c) chunked prefill
def test_chunked_prefill_hand_cases(impl: ModuleType) -> None:
    steps, ttft = impl.chunked_prefill_plan([10], 4, 1)
    assert steps == [[(0, 3)], [(0, 3)], [(0, 3)], [(0, 1)]] and ttft == [4]
    # prompt 0 finishes in step 2 and decodes from step 3 on, taking one token of prompt 1's budget
    steps, ttft = impl.chunked_prefill_plan([5, 5], 4, 0)
    assert steps == [[(0, 4)], [(0, 1), (1, 3)], [(1, 2)]] and ttft == [2, 3]
    with pytest.raises(ValueError, match="budget"):
        impl.chunked_prefill_plan([5], 2, 2)
    with pytest.raises(ValueError, match="budget"):  # after two prompts decode, the third never gets a token
        impl.chunked_prefill_plan([3, 3, 3], 2, 0)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_chunked_prefill_matches_the_engine(impl: ModuleType, seed: int) -> None:
    rng = np.random.default_rng(seed)
    decodes, n_prompts = int(rng.integers(0, 4)), int(rng.integers(1, 5))
    budget = int(rng.integers(decodes + n_prompts + 1, 25))
    lens = [int(x) for x in rng.integers(2, 21, n_prompts)]
    steps, ttft = impl.chunked_prefill_plan(lens, budget, decodes)
    assert [sum(n for i2, n in (c for s in steps for c in s) if i2 == i) for i in range(n_prompts)] == lens
    engine = Engine(_model(), block_size=8, num_blocks=512, max_num_batched_tokens=budget, max_num_seqs=64,
                    chunked_prefill=True, enable_prefix_caching=False)  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=150, ignore_eos=True)
    for _ in range(decodes):
        engine.add_request([1], params)
    if decodes:
        engine.step()  # one-token prompts: all decoding from the next step on
    seqs = [engine.seqs[engine.add_request(rng.integers(0, 64, n).tolist(), params)] for n in lens]
    got_steps: list[list[tuple[int, int]]] = []
    got_ttft = [0] * n_prompts
    while not all(got_ttft):
        before = [(s.num_computed, s.prefilled) for s in seqs]
        engine.step()
        got_steps.append([(i, s.num_computed - c) for i, (s, (c, p)) in enumerate(zip(seqs, before))
                          if not p and s.num_computed > c])  # fmt: skip
        for i, s in enumerate(seqs):
            if s.output and not got_ttft[i]:
                got_ttft[i] = len(got_steps)
    assert steps == got_steps and ttft == got_ttft
