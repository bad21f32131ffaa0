"""Admission control wired into the Engine and the server: a KV budget (worst-case block claims) and an SLO latency
MODEL (AdmissionController) reject requests with a reason and a Retry-After; HTTP answers 429 / 503."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from _serve_models import make_model, prompts

from tinylearn.serve.engine import Engine
from tinylearn.serve.latency import AdmissionController, StepCostModel
from tinylearn.serve.server import build_engine, create_app, serve_in_thread
from tinylearn.serve.types import AdmissionRejected, EngineFull, SamplingParams


def test_kv_budget_claims_reject_and_release() -> None:
    m = make_model()
    # block 4; prompt 10 + max_tokens 10 -> ceil(20 / 4) = 5 blocks claimed per request; budget 12 fits two
    e = Engine(m, block_size=4, num_blocks=24, kv_budget_blocks=12)
    p = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    assert e.kv_claim(10, 10) == 5
    e.add_request(list(range(10)), p)
    e.add_request(list(range(10, 20)), p)
    assert e.kv_claimed_blocks() == 10
    with pytest.raises(AdmissionRejected) as ei:
        e.add_request(list(range(20, 30)), p)
    err = ei.value
    assert isinstance(err, EngineFull) and err.reason == "kv_budget" and err.retry_after_s > 0
    assert "5 KV blocks" in str(err) and "10 of kv_budget_blocks=12" in str(err)
    # a smaller request still fits the 2 blocks left: prompt 3 + max_tokens 5 -> 2 blocks
    e.add_request([1, 2, 3], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    assert e.kv_claimed_blocks() == 12 and e.stats()["rejected_kv_budget"] == 1
    while e.has_unfinished():
        e.step()
        e.check_invariants()
    # finished requests release their claims: the rejected one is admitted now
    assert e.kv_claimed_blocks() == 0
    e.add_request(list(range(20, 30)), p)
    # a claim larger than the whole budget can never be admitted: a 400-style ValueError naming max_tokens
    with pytest.raises(ValueError, match=r"max_tokens: prompt 10 \+ max_tokens 60 need 18 KV blocks"):
        e.add_request(list(range(10)), SamplingParams(temperature=0, max_tokens=60))
    with pytest.raises(ValueError, match="kv_budget_blocks: 25 exceeds the KV pool of num_blocks=24"):
        Engine(m, block_size=4, num_blocks=24, kv_budget_blocks=25)
    with pytest.raises(TypeError, match="admission: expected an AdmissionController"):
        Engine(m, admission=object())


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_kv_budget_never_preempts_and_outputs_unchanged(preemption: str) -> None:
    """Random arrivals into a pool that would preempt without the budget; with it, no preemption, same tokens."""
    m = make_model(3)
    rng = np.random.default_rng(0)
    ps = prompts(24, seed=4, lo=4, hi=30)
    ns = [int(n) for n in rng.integers(4, 24, len(ps))]
    kw = dict(block_size=4, num_blocks=20, max_num_batched_tokens=32, max_num_seqs=8, preemption=preemption)

    def run(budget: int | None) -> tuple[dict[int, list[int]], Engine]:
        e = Engine(m, kv_budget_blocks=budget, **kw)
        pending, rid_of, done = list(range(len(ps))), {}, {}
        while pending or e.has_unfinished():
            for i in list(pending[: int(rng.integers(0, 3))]):  # 0-2 arrivals per step
                try:
                    rid_of[e.add_request(ps[i], SamplingParams(temperature=0, max_tokens=ns[i], ignore_eos=True))] = i
                    pending.remove(i)
                except AdmissionRejected:
                    break  # retry at a later step, as a client told Retry-After would
            for o in e.step():
                if o.finished:
                    done[rid_of[o.request_id]] = o.token_ids
            e.check_invariants()
            if budget is not None:
                assert e.kv_claimed_blocks() <= budget
        return done, e

    free, e_free = run(None)
    budgeted, e_b = run(20)
    st_free, st_b = e_free.stats(), e_b.stats()
    assert st_free["preemptions_recompute"] + st_free["preemptions_swap"] > 0  # the workload does overflow the pool
    assert st_b["preemptions_recompute"] + st_b["preemptions_swap"] == 0 and st_b["rejected_kv_budget"] > 0
    assert budgeted == free and len(budgeted) == len(ps)  # greedy tokens do not depend on scheduling
    assert st_b["kv_blocks_used"] - st_b["kv_blocks_cached"] == 0


def test_slo_admission_uses_live_engine_state() -> None:
    m = make_model()
    # MODEL by hand: 10 ms per step + 1 ms per prefill token + 2 ms per decode token
    cost = StepCostModel(c0=0.01, c_prefill=0.001, c_decode=0.002, c_kv=0.0)
    ac = AdmissionController(cost, ttft_slo_s=0.05, tpot_slo_s=1.0)
    e = Engine(m, block_size=4, max_num_batched_tokens=16, admission=ac)
    assert e.engine_state() == dict(running_decodes=0, kv_tokens=0, queue_tokens_ahead=0, num_waiting=0, budget=16)
    # an idle engine, 16-token prompt: one step, 0.01 + 0.016 = 0.026 s <= 0.05 s -> admitted
    e.add_request(list(range(16)), SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    assert e.last_admission.startswith("admit") and "0.026" in e.last_admission
    # queued ahead now: 16 tokens; another 16 -> 2 steps: 0.02 + 0.032 = 0.052 s > 0.05 -> rejected, no state change
    with pytest.raises(AdmissionRejected) as ei:
        e.add_request(list(range(16)), SamplingParams(temperature=0, max_tokens=4))
    assert ei.value.reason == "slo" and "reject (TTFT SLO)" in str(ei.value) and "0.052 s > SLO 0.05 s" in str(ei.value)
    assert ei.value.retry_after_s > 0 and e.stats()["rejected_slo"] == 1 and len(e.seqs) == 1
    e.step()  # the first prompt is prefilled and decodes: its KV counts, its prefill no longer queues
    st = e.engine_state()
    assert st["running_decodes"] == 1 and st["kv_tokens"] == 16 and st["queue_tokens_ahead"] == 0
    # 8-token prompt beside 1 decode: cap 15, one step 0.01 + 0.008 + 0.002 = 0.02 s -> admitted
    e.add_request(list(range(8)), SamplingParams(temperature=0, max_tokens=2))
    assert e.last_admission.startswith("admit")


def test_server_maps_rejections_to_429_and_503_with_retry_after() -> None:
    # KV budget: tiny model, block 16; a request of prompt 5 + max_tokens 200 claims ceil(205 / 16) = 13 blocks
    eng = build_engine("tiny", max_num_seqs=4, kv_budget_blocks=20)
    app = create_app(eng, max_waiting=8)
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30, trust_env=False) as c:
        body = {"prompt": "hello", "max_tokens": 200, "temperature": 0, "ignore_eos": True, "stream": True}
        with c.stream("POST", "/v1/completions", json=body) as first:  # holds its claim while streaming
            assert first.status_code == 200
            r = c.post("/v1/completions", json={**body, "stream": False})
            assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
            err = r.json()["error"]
            assert err["code"] == "admission_kv_budget" and "kv_budget" in err["message"]
            assert err["type"] == "rate_limit_error"
            for _ in first.iter_lines():
                pass
        too_big = c.post("/v1/completions", json={**body, "max_tokens": 400, "stream": False})
        assert too_big.status_code == 400 and too_big.json()["error"]["param"] == "max_tokens"
    # SLO: a MODEL under which no prompt can meet the TTFT SLO -> 503 with the model's numbers
    slow = AdmissionController(StepCostModel(c0=1.0, c_prefill=0.0, c_decode=0.0, c_kv=0.0), 0.5, 10.0)
    app = create_app(build_engine("tiny", admission=slow), max_waiting=8)
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30, trust_env=False) as c:
        r = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4})
        assert r.status_code == 503 and "Retry-After" in r.headers
        err = r.json()["error"]
        assert err["code"] == "admission_slo" and "reject (TTFT SLO)" in err["message"] and "MODEL" in err["message"]
