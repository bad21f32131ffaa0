"""tinylearn.serve.loadgen (the code of tools/loadgen.py) against a live server (uvicorn on a free loopback port):
sane summaries, bounded, loopback only."""

from __future__ import annotations

import json
import time

import httpx
import numpy as np
import pytest

from tinylearn.serve import loadgen
from tinylearn.serve.server import build_engine, create_app, serve_in_thread


@pytest.fixture(scope="module")
def live():
    app = create_app(build_engine("tiny", max_num_seqs=16), max_waiting=64)
    with serve_in_thread(app) as url:
        yield url, app.state.server


def wait_idle(srv, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = srv.aengine.stats()
        if st["running"] == 0 and st["waiting"] == 0 and srv.aengine.num_in_flight() == 0:
            return st
        time.sleep(0.02)
    raise AssertionError(f"not idle: {srv.aengine.stats()}")


def check_summary(s: dict, n: int) -> None:
    assert s["n_requests"] == n and sum(s["status_counts"].values()) == n
    assert s["n_ok"] == s["status_counts"].get("200", 0)
    assert s["throughput_req_s"] > 0 and s["output_tok_s"] > 0 and s["output_tokens"] >= s["n_ok"]
    assert 0 <= s["goodput_req_s"] <= s["throughput_req_s"] + 1e-12
    for k in ("ttft_s", "tpot_s", "e2e_s"):
        p = s[k]
        assert p["n"] > 0 and 0 < p["p50"] <= p["p90"] <= p["p99"], (k, p)
    assert s["ttft_s"]["p50"] <= s["e2e_s"]["p50"] and s["ttft_s"]["n"] == s["n_ok"]
    json.dumps(s)  # serialisable as the CLI writes it


@pytest.mark.parametrize("workload", ["random", "shared-prefix", "multi-turn"])
def test_loadgen_workloads(live, workload):
    url, srv = live
    s = loadgen.run_load(url, n_requests=12, rate=40.0, workload=workload, prompt_len=("uniform", 8, 24),
                         output_len=("lognormal", 8, 0.5), prefix_len=64, turns=3, seed=1, duration_s=30)  # fmt: skip
    check_summary(s, 12)
    assert s["status_counts"] == {"200": 12} and s["config"]["workload"] == workload
    st = wait_idle(srv)
    assert st["kv_usage"] == 0.0
    if workload == "shared-prefix":  # the 64-token system prompt = 4 full blocks hit for every request but the first
        assert st["prefix_hit_rate"] > 0.3


def test_loadgen_faults_leave_no_blocks(live):
    url, srv = live
    s = loadgen.run_load(url, n_requests=16, rate=float("inf"), output_len=("uniform", 20, 40), seed=2,
                         disconnect_frac=0.3, malformed_frac=0.2, duration_s=30)  # fmt: skip
    c = s["status_counts"]
    assert sum(c.values()) == 16 and c.get("400", 0) >= 1 and c.get("disconnected", 0) >= 1, c
    assert c.get("200", 0) + c["400"] + c["disconnected"] == 16
    st = wait_idle(srv)
    assert st["kv_usage"] == 0.0 and st["kv_blocks_used"] == st["kv_blocks_cached"]


def test_loadgen_wall_clock_limit(live):
    url, srv = live
    t0 = time.perf_counter()
    s = loadgen.run_load(url, n_requests=40, rate=5.0, output_len=("uniform", 4, 8), seed=3, duration_s=1.0)
    assert time.perf_counter() - t0 < 5.0
    assert sum(s["status_counts"].values()) == 40 and s["status_counts"].get("not_sent", 0) > 0
    wait_idle(srv)


def test_workload_is_seeded_and_exact():
    a = loadgen.make_workload("shared-prefix", 8, prompt_len=("uniform", 5, 9), prefix_len=32, seed=4)
    b = loadgen.make_workload("shared-prefix", 8, prompt_len=("uniform", 5, 9), prefix_len=32, seed=4)
    assert a == b
    assert all(r["prompt"][:32] == a[0]["prompt"][:32] and 37 <= len(r["prompt"]) <= 41 for r in a)
    assert len({tuple(r["prompt"][32:]) for r in a}) == 8
    m = loadgen.make_workload("multi-turn", 7, turns=3)
    assert [(r["session"], r["turn"]) for r in m] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (2, 0)]
    x = loadgen.sample_lengths(("lognormal", 50, 0.8), 4000, np.random.default_rng(0), 10_000)
    assert 45 <= np.median(x) <= 55 and x.min() >= 1


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(base_url="http://10.0.0.1:8000"), "base_url"),
        (dict(base_url="http://example.com"), "base_url"),
        (dict(rate=0), "rate"),
        (dict(duration_s=0), "duration_s"),
        (dict(max_concurrency=0), "max_concurrency"),
        (dict(workload="chaos"), "workload"),
        (dict(prompt_len=("normal", 1, 2)), "prompt_len"),
        (dict(output_len=("uniform", 0, 2)), "output_len"),
        (dict(n_requests=0), "n_requests"),
        (dict(disconnect_frac=2), "disconnect_frac"),
    ],
)
def test_loadgen_refuses_bad_arguments(live, kw, field):
    url, _ = live
    kw = {"base_url": url, **kw}
    with pytest.raises(ValueError, match=field):
        loadgen.run_load(kw.pop("base_url"), **kw)


def test_loadgen_cli_writes_json(live, tmp_path, capsys):
    url, _ = live
    out = tmp_path / "s.json"
    assert loadgen.main(["--url", url, "--n", "4", "--rate", "50", "--output-len", "uniform", "4", "6",
                         "--json", str(out)]) == 0  # fmt: skip
    s = json.loads(out.read_text())
    check_summary(s, 4)
    assert loadgen.main(["--url", "http://192.168.1.1:80"]) == 2
    assert "loopback" in capsys.readouterr().err
    with httpx.Client(trust_env=False) as c:
        assert c.get(url + "/health").status_code == 200
