"""[Q189] threaded stage pipeline + rebalancer, [Q198] async multi-turn preprocessing overlapped with a TinyGPT step."""

from __future__ import annotations

import queue
import threading
import time

import numpy as np
import pytest

from tinylearn.autograd import no_grad
from tinylearn.inference import TinyGPT
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
from tinylearn.serve.tokenizer import ByteTokenizer


@pytest.fixture(scope="module")
def model():
    np.random.seed(0)
    return TinyGPT(258, 64, 4, 2, 128)


def _sequential(stages, items):
    out = []
    for x in items:
        for s in stages:
            x = s.fn(x)
        out.append(x)
    return out


def test_outputs_equal_sequential_in_order_with_parallel_workers():
    def slow(x):  # later items finish first on a 3-worker group: the reorder buffer must restore the order
        time.sleep(0.002 * (5 - x % 5))
        return x * 10

    stages = [Stage("inc", lambda x: x + 1), Stage("slow", slow), Stage("neg", lambda x: -x)]
    items = list(range(40))
    p = Pipeline(stages, [Group((0,)), Group((1,), 3), Group((2,), 2)], queue_size=2)
    assert p.run(items, timeout_s=60) == _sequential(stages, items)
    st = p.stats()
    assert st["items"] == 40 and all(c == 40 for c in p._calls)
    assert st["service_s"][1] > st["service_s"][0]  # the sleeping stage is measured heavier


# stage service times are measured and decide whether the plan moves a worker: run alone (serial timing pass)
@pytest.mark.timing
def test_real_workload_pipeline_and_rebalance(model):
    tok = ByteTokenizer()
    stages = demo_stages(model, tok, seq_len=48, feat_dim=256)
    texts = [f"request {i}: " + "serve the tiny model " * (2 + i % 4) for i in range(24)]
    with no_grad():
        ref = _sequential(stages, texts)
        p = Pipeline(stages, queue_size=4)
        out = p.run(texts)
        # 5 threads for 4 stages: the planner always has a worker to give the bottleneck, whatever the measured
        # split (with 4, no merge fits when embed and decode measure within a tokenize of each other -- CI saw
        # 17.0 vs 17.8 ms -- and the plan cannot change)
        plan, log = p.rebalance(max_workers=5)
        p2 = Pipeline(stages, plan, queue_size=4)
        out2 = p2.run(texts)
    for a, b, c in zip(ref, out, out2):
        assert a["top"] == b["top"] == c["top"] and a["text"] == b["text"] == c["text"]
        np.testing.assert_array_equal(a["f"], c["f"])
    svc = p.stats()["service_s"]
    assert svc[1] > svc[0] and svc[2] > svc[0]  # numpy embed and the forward outweigh byte tokenization (MEASURED)
    assert sum(g.workers for g in plan) <= 5 and log
    assert bottleneck_s(plan, svc) < bottleneck_s(p.plan, svc)
    print(f"\n[Q189] before {p!r}: {p.stats()['throughput']:.0f} items/s; after {p2!r}: {p2.stats()['throughput']:.0f}")


def test_rebalancer_on_hand_made_timings():
    plan, log = plan_rebalance([0.1, 5.0, 1.0, 0.2], [True] * 4, max_workers=4)
    assert plan == [Group((0,)), Group((1,), 2), Group((2, 3))]  # merge the light tail, replicate the heavy stage
    assert "merge stages [2, 3]" in log[0] and "2 workers" in log[1]
    # a serial (not parallel-safe) heavy stage gets no second worker; the budget is left unused
    plan, log = plan_rebalance([0.1, 5.0, 1.0, 0.2], [True, False, True, True], max_workers=4)
    assert plan == [Group((0,)), Group((1,)), Group((2, 3))] and "not parallel-safe" in log[-1]
    # light stages on both sides merge repeatedly, cheapest pair first
    plan, _ = plan_rebalance([1.0, 1.0, 1.0, 6.0], [True] * 4, max_workers=3)
    assert plan == [Group((0, 1, 2)), Group((3,), 2)]
    # a thread budget below the stage count forces merges
    plan, _ = plan_rebalance([1.0, 2.0, 3.0], [True] * 3, max_workers=1)
    assert plan == [Group((0, 1, 2))]
    # balanced stages: nothing to merge, the bottleneck (first maximum) is replicated
    plan, _ = plan_rebalance([2.0, 2.0], [True, True], max_workers=3)
    assert plan == [Group((0,), 2), Group((1,))]


def _gil_bound(x):  # pure-Python work: holds the GIL, two threads run it no faster than one
    acc = 0
    for i in range(40_000):
        acc += i & 7
    return x + (acc & 1)


def _gil_free(x):  # blocking I/O or native work: releases the GIL, threads overlap
    time.sleep(0.004)
    return x


def test_online_rebalancer_keeps_only_measured_gains():
    light = Stage("light", lambda x: x * 2)
    chunks = [list(range(i * 30, (i + 1) * 30)) for i in range(3)]
    want = [x * 2 for c in chunks for x in c]
    out, hist = run_adaptive([light, Stage("io", _gil_free)], chunks, max_workers=3, min_gain=1.3)
    assert out == want
    assert hist[1]["plan"][-1].workers == 2 and hist[1]["decision"].startswith("trial kept")
    out, hist = run_adaptive([light, Stage("python", _gil_bound)], chunks, max_workers=3, min_gain=1.3)
    assert out == want  # sum of i & 7 over 40000 ints is even
    # GIL-bound work gains little from a second thread, but how little is a measurement (a cold first chunk or a busy
    # machine can make the trial look faster): the rebalancer must act on what it measured, either way
    t0, t1 = hist[0]["throughput"], hist[1]["throughput"]
    assert hist[1]["plan"][-1].workers == 2  # the trial replicated the heavy stage
    kept = hist[1]["decision"].startswith("trial kept")
    assert kept == (t1 >= 1.3 * t0) and (kept or hist[1]["decision"].startswith("trial reverted"))
    if not kept:
        assert all(g.workers == 1 for g in hist[2]["plan"])  # marked non-scaling: not replicated again
    print(f"\n[Q189] online: {[round(h['throughput']) for h in hist]} items/s, {[h['decision'] for h in hist]}")


def test_bounded_queues_backpressure_nothing_lost():
    gate = threading.Event()

    def blocked(x):
        assert gate.wait(30)
        return x

    p = Pipeline([Stage("a", lambda x: x), Stage("b", blocked)], queue_size=1).start()
    accepted = 0
    with pytest.raises(queue.Full):
        for i in range(10):
            p.put(i, timeout=0.5)
            accepted += 1
    # in flight: 1 in stage b, 1 in q1, 1 held by stage a (blocked on the full q1), 1 in q0
    assert accepted == 4
    assert max(p.max_depth) <= 1
    gate.set()
    assert [p.get(timeout=10) for _ in range(accepted)] == list(range(accepted))
    p.close()


def test_stage_error_is_reported_in_order():
    def bad(x):
        if x == 3:
            raise ValueError("boom")
        return x

    p = Pipeline([Stage("ok", lambda x: x), Stage("bad", bad)]).start()
    for i in range(5):
        p.put(i, timeout=5)
    assert [p.get(timeout=5) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(RuntimeError, match="'bad' failed on item 3"):
        p.get(timeout=5)
    assert p.get(timeout=5) == 4
    p.close()


# the overlap is read from measured spans (a batch's preprocessing running while the model step runs): run alone in
# the serial timing pass -- under xdist's load CI saw batch 1's preprocessing finish before step 0 was scheduled
@pytest.mark.timing
def test_async_preprocessor_overlap(model):
    tok = ByteTokenizer()
    pre = AsyncPreprocessor(tok, block_size=16, max_len=96, workers=2, depth=2)
    reqs = chat_requests(6, 6, seed=1)

    def step(packed):  # the model step: a real TinyGPT forward over the packed batch
        return model(packed.ids).data[np.arange(len(packed.lengths)), packed.lengths - 1].copy()

    with no_grad():
        seq_out, seq_t = pre.serve(reqs, step, overlap=False)
        # up to 3 overlapped runs: each must be issued ahead (structural); the measured overlap needs the OS to run
        # the preprocessing threads during a step, which a loaded host (CI once) can delay past it in one run
        for _ in range(3):
            ov_out, ov_t = pre.serve(reqs, step, overlap=True)
            for a, b in zip(seq_out, ov_out):
                np.testing.assert_array_equal(a, b)
            assert ov_t["pre_spans"][1][0] < ov_t["step_spans"][0][1]
            if ov_t["overlap_s"] > 0:
                break
    # multi-turn: turn j's rendered text starts with turn j-1's, so its full blocks are prefix-cache hits
    pre2 = AsyncPreprocessor(tok, block_size=16, max_len=96)
    for j, batch in enumerate(reqs):
        packed = pre2.lookup(pre2.preprocess(batch))
        if j:
            prev = [len(tok.encode("".join(f"<{r}>: {m}\n" for r, m in req[:-2]))) // 16 for req in batch]
            assert all(h >= n > 0 for h, n in zip(packed.cached_blocks, prev))
    # pipelining, from the measured spans: batch 1 is preprocessed while batch 0 is in the model step ...
    assert ov_t["overlap_s"] > 0
    assert seq_t["overlap_s"] == 0
    # ... and never more than 2 * depth + 1 batches ahead of the model (bounded queue)
    for j in range(5, len(reqs)):
        assert ov_t["pre_spans"][j][0] >= ov_t["step_spans"][j - 5][0]
    ms = {k: v * 1e3 for k, v in seq_t.items() if k.endswith("_s")}
    mo = {k: v * 1e3 for k, v in ov_t.items() if k.endswith("_s")}
    print(f"\n[Q198] sequential {ms['wall_s']:.1f} ms (pre {ms['preprocess_s']:.1f} + step {ms['step_s']:.1f} ms)")
    print(f"[Q198] overlapped {mo['wall_s']:.1f} ms, preprocessing overlapped with steps {mo['overlap_s']:.1f} ms")


def test_bad_args():
    s = Stage("a", lambda x: x)
    with pytest.raises(ValueError, match="stages"):
        Pipeline([])
    with pytest.raises(ValueError, match="queue_size"):
        Pipeline([s], queue_size=0)
    with pytest.raises(ValueError, match="plan"):
        Pipeline([s, s], [Group((1,)), Group((0,))])
    with pytest.raises(ValueError, match="parallel-safe"):
        Pipeline([Stage("a", lambda x: x, parallel_safe=False)], [Group((0,), 2)])
    with pytest.raises(RuntimeError, match="start"):
        Pipeline([s]).put(1)
    with pytest.raises(ValueError, match="service_s"):
        plan_rebalance([1.0, float("nan")], [True, True], 2)
    with pytest.raises(ValueError, match="parallel_safe"):
        plan_rebalance([1.0, 2.0], [True], 2)
    with pytest.raises(ValueError, match="max_workers"):
        plan_rebalance([1.0], [True], 0)
    with pytest.raises(TypeError, match="tokenizer"):
        AsyncPreprocessor(object())
    with pytest.raises(ValueError, match="depth"):
        AsyncPreprocessor(ByteTokenizer(), depth=0)
    with pytest.raises(ValueError, match="batch"):
        AsyncPreprocessor(ByteTokenizer()).preprocess([])
    with pytest.raises(TypeError, match="step"):
        AsyncPreprocessor(ByteTokenizer()).serve([], "model")
