"""A fault run against the live server (uvicorn on a free loopback port): 1,000 requests at once on up to 1,000
concurrent connections, a fifth malformed, a tenth disconnecting after their first token, the rest overflowing a
small bounded queue. Every request gets an answer (200 / 400 / 429) or hangs up itself, and afterwards no request
runs and no KV block is leaked (the engine's block invariants hold). Bounded: loopback, one run, 40 s wall clock."""

from __future__ import annotations

import time

import pytest

from tinylearn.serve import loadgen
from tinylearn.serve.server import build_engine, create_app, serve_in_thread

N = 1000


@pytest.mark.slow
def test_thousand_connections_with_faults_leak_no_blocks() -> None:
    eng = build_engine("tiny", max_num_seqs=4, max_num_batched_tokens=128)
    app = create_app(eng, max_waiting=8)  # 12 in flight at most: the burst must overflow
    t0 = time.perf_counter()
    with serve_in_thread(app) as url:
        s = loadgen.run_load(url, n_requests=N, rate=float("inf"), max_concurrency=N, seed=7,
                             prompt_len=("uniform", 4, 24), output_len=("uniform", 32, 64),
                             malformed_frac=0.2, disconnect_frac=0.1, duration_s=40, timeout_s=40)  # fmt: skip
        srv = app.state.server
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            st = srv.aengine.stats()
            if (st["running"], st["waiting"], srv.aengine.num_in_flight()) == (0, 0, 0):
                break
            time.sleep(0.05)
        st = srv.aengine.stats()
        assert (st["running"], st["waiting"], srv.aengine.num_in_flight()) == (0, 0, 0), st
        # zero leaked blocks: nothing owned (cached prefix blocks are free), no cache sequence left, invariants hold
        assert st["kv_usage"] == 0 and st["kv_blocks_used"] == st["kv_blocks_cached"], st
        assert not eng.bm.cache.seqs and not eng.seqs
        eng.check_invariants()
    c = s["status_counts"]
    print(f"{N} requests, peak {s['peak_concurrency']} open at once, {time.perf_counter() - t0:.1f} s: {c}")
    assert sum(c.values()) == N and set(c) <= {"200", "400", "429", "disconnected"}, c
    assert c.get("400", 0) > 0.1 * N and c.get("429", 0) > 0.1 * N and c.get("200", 0) > 0, c
    assert s["peak_concurrency"] > 0.5 * N  # the requests really were open together, not one after another
    assert time.perf_counter() - t0 < 60
