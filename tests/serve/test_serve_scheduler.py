"""The engine's scheduler: policy order (fcfs, spf, priority, edf), the token budget and max_num_seqs, decode
before prefill, chunked vs unchunked admission, the victim of preemption, and the bounded waiting queue."""

from __future__ import annotations

import numpy as np
import pytest

from tinylearn.inference import TinyGPT
from tinylearn.serve.engine import Engine
from tinylearn.serve.types import EngineFull, SamplingParams


@pytest.fixture(scope="module")
def model() -> TinyGPT:
    rng = np.random.default_rng(0)
    m = TinyGPT(64, 32, 4, 2, 96)
    for _, p in m.named_parameters():
        p.data[...] = 0.3 * rng.standard_normal(p.shape) + (1.0 if p.data.ndim == 1 else 0.0)
    return m


def first_token_order(eng: Engine) -> list[str]:
    firsts: dict[str, float] = {}
    while eng.has_unfinished():
        for out in eng.step():
            if out.request_id not in firsts and out.token_ids:
                firsts[out.request_id] = out.metrics["first_token_s"]
    return sorted(firsts, key=firsts.get)


def test_policies_order_first_tokens(model: TinyGPT) -> None:
    p = SamplingParams(temperature=0, max_tokens=2)
    lens = {"a": 9, "b": 3, "c": 6, "d": 1}
    prio = {"a": 0, "b": 1, "c": 5, "d": 1}
    dead = {"a": 3.0, "b": None, "c": 2.0, "d": 1.0}
    expect = {"fcfs": "abcd", "spf": "dbca", "priority": "cbda", "edf": "dcab"}
    for policy, order in expect.items():
        eng = Engine(model, max_num_seqs=1, policy=policy)
        for rid in "abcd":
            eng.add_request([1] * lens[rid], p, request_id=rid, priority=prio[rid], deadline_s=dead[rid])
        assert "".join(first_token_order(eng)) == order, policy


def test_budget_and_max_num_seqs_respected(model: TinyGPT) -> None:
    eng = Engine(model, max_num_batched_tokens=10, max_num_seqs=3, block_size=4)
    for i in range(6):
        eng.add_request([i + 1] * (5 + i), SamplingParams(temperature=0, max_tokens=4))
    while eng.has_unfinished():
        eng.step()
        assert len(eng.scheduler.running) <= 3
    log = eng.step_log
    assert all(s["num_prefill_tokens"] + s["num_decode_tokens"] <= 10 and s["num_seqs"] <= 3 for s in log)
    assert max(s["num_prefill_tokens"] + s["num_decode_tokens"] for s in log) == 10  # the budget is used up
    assert sum(s["num_decode_tokens"] for s in log) == 6 * 3  # 4 tokens each, the first from the prefill row


def test_decodes_are_scheduled_before_new_prefills(model: TinyGPT) -> None:
    eng = Engine(model, max_num_batched_tokens=8, block_size=4)
    eng.add_request([1, 2, 3], SamplingParams(temperature=0, max_tokens=10), request_id="old")
    eng.step()
    eng.add_request([5] * 30, SamplingParams(temperature=0, max_tokens=1), request_id="new")
    for _ in range(3):  # the long prompt is chunked into the budget left after the decode token
        eng.step()
        s = eng.step_log[-1]
        assert s["num_decode_tokens"] == 1 and s["num_prefill_tokens"] == 7


def test_unchunked_prompt_waits_for_budget(model: TinyGPT) -> None:
    eng = Engine(model, max_num_batched_tokens=12, chunked_prefill=False, block_size=4)
    eng.add_request([1] * 10, SamplingParams(temperature=0, max_tokens=5), request_id="a")
    eng.add_request([2] * 8, SamplingParams(temperature=0, max_tokens=5), request_id="b")
    eng.step()
    assert [s.request_id for s in eng.scheduler.running] == ["a"]  # b (8) does not fit the remaining 2 tokens
    eng.step()  # a decodes (1 token), b's 8 tokens fit the rest
    assert {s.request_id for s in eng.scheduler.running} == {"a", "b"}
    assert eng.step_log[-1]["num_prefill_tokens"] == 8 and eng.step_log[0]["num_prefill_tokens"] == 10


@pytest.mark.parametrize("policy, victim", [("fcfs", "late"), ("priority", "early")])
def test_preemption_victim_is_lowest_priority(model: TinyGPT, policy: str, victim: str) -> None:
    eng = Engine(model, block_size=4, num_blocks=8, policy=policy)
    p = SamplingParams(temperature=0, max_tokens=14)
    eng.add_request([1] * 7, p, request_id="early", priority=0)
    eng.add_request([2] * 7, p, request_id="late", priority=5)
    finals = {}
    while eng.has_unfinished():
        for o in eng.step():
            if o.finished:
                finals[o.request_id] = o
        eng.check_invariants()
    other = "early" if victim == "late" else "late"
    assert finals[victim].metrics["num_preemptions"] > 0 and finals[other].metrics["num_preemptions"] == 0
    assert eng.stats()["preemptions_recompute"] > 0


def test_bounded_queue_raises_engine_full(model: TinyGPT) -> None:
    eng = Engine(model, max_waiting=2, max_num_seqs=1)
    eng.add_request([1])
    eng.add_request([2])
    with pytest.raises(EngineFull, match="max_waiting=2") as e:
        eng.add_request([3])
    assert e.value.retry_after_s > 0
    eng.step()  # one request admitted: room again
    eng.add_request([3])
    assert eng.stats()["waiting"] == 2


def test_alone_request_filling_the_pool_finishes_with_length(model: TinyGPT) -> None:
    eng = Engine(model, block_size=4, num_blocks=3)
    out = eng.generate([[1] * 6], SamplingParams(temperature=0, max_tokens=50))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 12 - 6 + 1  # 12 slots; the last token is not fed
    eng.check_invariants()
    assert eng.stats()["kv_blocks_used"] == eng.stats()["kv_blocks_cached"]
