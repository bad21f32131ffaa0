"""The HTTP server end to end: uvicorn on a free loopback port in a thread, a tiny TinyGPT, real sockets.

OpenAI-shaped completions (stream and not), chat, errors naming the field (400, an unknown model too), 429/503 with
Retry-After, client disconnects freeing KV blocks, Prometheus metrics, SIGTERM drain of `tinylearn serve`."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from tinylearn.inference import generate
from tinylearn.serve.checkpoint import tiny_model
from tinylearn.serve.server import build_engine, create_app, render_chat, serve_in_thread
from tinylearn.serve.tokenizer import EOS, ByteTokenizer

TOK = ByteTokenizer()
MODEL = tiny_model(0)


def reference(prompt_ids: list[int], max_tokens: int) -> tuple[str, str]:
    """(text, finish_reason) of greedy decoding by tinylearn.inference.generate, stopping at EOS like the engine."""
    ids = generate(MODEL, prompt_ids, max_tokens)
    if EOS in ids:
        return TOK.decode(ids[: ids.index(EOS)]), "stop"
    return TOK.decode(ids), "length"


@pytest.fixture(scope="module")
def server():
    app = create_app(build_engine("tiny", max_num_seqs=8), model_name="tiny", max_waiting=32)
    with serve_in_thread(app) as url:
        with httpx.Client(base_url=url, timeout=30, trust_env=False) as client:
            yield app.state.server, client


def sse(lines) -> list:
    events = [ln[6:] for ln in lines if ln.startswith("data: ")]
    assert events and events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def wait_idle(srv, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = srv.aengine.stats()
        if st["running"] == 0 and st["waiting"] == 0 and srv.aengine.num_in_flight() == 0:
            return st
        time.sleep(0.02)
    raise AssertionError(f"server not idle after {timeout} s: {srv.aengine.stats()}")


def test_completion_greedy_equals_generate(server):
    srv, c = server
    r = c.post("/v1/completions", json={"model": "tiny", "prompt": "Hello, world", "max_tokens": 24, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    text, reason = reference(TOK.encode("Hello, world"), 24)
    assert body["object"] == "text_completion" and body["model"] == "tiny"
    assert body["choices"][0]["text"] == text and body["choices"][0]["finish_reason"] == reason
    u = body["usage"]
    assert u["prompt_tokens"] == 12 and u["total_tokens"] == 12 + u["completion_tokens"]
    # token-id prompts are accepted as in the OpenAI API
    r2 = c.post("/v1/completions", json={"prompt": TOK.encode("Hello, world"), "max_tokens": 24, "temperature": 0})
    assert r2.json()["choices"][0]["text"] == text


def test_completion_stream_matches_non_stream(server):
    srv, c = server
    req = {"prompt": "The quick brown fox", "max_tokens": 30, "temperature": 0}
    full = c.post("/v1/completions", json=req).json()["choices"][0]
    with c.stream(
        "POST", "/v1/completions", json={**req, "stream": True, "stream_options": {"include_usage": True}}
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        chunks = sse(list(r.iter_lines()))
    texts = [ch["choices"][0]["text"] for ch in chunks if ch["choices"]]
    assert len(texts) > 1 and "".join(texts) == full["text"]
    finals = [ch["choices"][0]["finish_reason"] for ch in chunks if ch["choices"]]
    assert finals[-1] == full["finish_reason"] and all(f is None for f in finals[:-1])
    assert chunks[-1]["usage"]["completion_tokens"] >= 1 and chunks[-1]["choices"] == []


def test_chat_completion_and_stream(server):
    srv, c = server
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    text, reason = reference(TOK.encode(render_chat(msgs)), 20)
    r = c.post("/v1/chat/completions", json={"model": "tiny", "messages": msgs, "max_tokens": 20, "temperature": 0})
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    assert r.json()["object"] == "chat.completion"
    assert ch["message"] == {"role": "assistant", "content": text} and ch["finish_reason"] == reason
    body = {"messages": msgs, "max_tokens": 20, "temperature": 0, "stream": True}
    with c.stream("POST", "/v1/chat/completions", json=body) as r:
        chunks = sse(list(r.iter_lines()))
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(x["choices"][0]["delta"].get("content", "") for x in chunks) == text
    assert all(x["object"] == "chat.completion.chunk" for x in chunks)


def test_sampling_seeded_is_reproducible(server):
    srv, c = server
    req = {"prompt": "abc", "max_tokens": 16, "temperature": 1.0, "top_k": 20, "top_p": 0.9, "seed": 3}
    a, b = (c.post("/v1/completions", json=req).json()["choices"][0]["text"] for _ in range(2))
    assert a == b


BAD = [
    (b'{"prompt": "x", ', None, "malformed JSON"),
    (b"[1, 2]", None, "JSON object"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens", ">= 1"),
    ({"prompt": "x", "max_tokens": -3}, "max_tokens", ">= 1"),
    ({"prompt": "x", "max_tokens": "ten"}, "max_tokens", "integer"),
    ({"prompt": "x", "max_tokens": 1.5}, "max_tokens", "integer"),
    ({"prompt": ""}, "prompt", "empty"),
    ({"prompt": []}, "prompt", "empty"),
    ({"prompt": 7}, "prompt", "string or a list"),
    ({"prompt": [1, 999]}, "prompt", "999"),
    ({"max_tokens": 3}, "prompt", "required"),
    ({"prompt": "x" * 600}, "prompt", "max_seq_len=512"),
    ({"prompt": "x" * 500, "max_tokens": 100}, "max_tokens", "max_seq_len=512"),
    ({"prompt": "x", "temperature": "hot"}, "temperature", "number"),
    ({"prompt": "x", "temperature": 5}, "temperature", r"\[0, 2\]"),
    ({"prompt": "x", "top_p": 0}, "top_p", r"\(0, 1\]"),
    ({"prompt": "x", "top_k": 0}, "top_k", ">= 1"),
    ({"prompt": "x", "top_k": "5"}, "top_k", "integer"),
    ({"prompt": "x", "seed": -1}, "seed", ">= 0"),
    ({"prompt": "x", "stop": 5}, "stop", "string"),
    ({"prompt": "x", "stream": "yes"}, "stream", "boolean"),
    ({"prompt": "x", "n": 2}, "n", "n=1"),
    ({"prompt": "x", "model": 3}, "model", "string"),
]


@pytest.mark.parametrize("body, field, words", BAD)
def test_bad_input_is_400_naming_the_field(server, body, field, words):
    srv, c = server
    kw = (
        {"content": body, "headers": {"Content-Type": "application/json"}}
        if isinstance(body, bytes)
        else {"json": body}
    )
    r = c.post("/v1/completions", **kw)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == field
    assert re.search(words, err["message"]), err["message"]
    if field is not None:
        assert err["message"].startswith(field)


@pytest.mark.parametrize(
    "messages", [None, [], [{"role": "wizard", "content": "x"}], [{"role": "user", "content": 3}], "hi"]
)
def test_bad_chat_messages_400(server, messages):
    srv, c = server
    body = {"max_tokens": 4} if messages is None else {"messages": messages, "max_tokens": 4}
    r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


def test_unknown_model_400_models_and_health(server):
    srv, c = server
    r = c.post("/v1/completions", json={"model": "gpt-5", "prompt": "x"})
    assert r.status_code == 400  # the issue: bad input, unknown model included, is a 400 naming the field
    err = r.json()["error"]
    assert err["param"] == "model" and "gpt-5" in err["message"] and err["code"] == "model_not_found"
    m = c.get("/v1/models").json()
    assert m["object"] == "list" and m["data"][0]["id"] == "tiny" and m["data"][0]["max_model_len"] == 512
    h = c.get("/health")
    assert h.status_code == 200 and h.json()["status"] == "ok"


def test_disconnect_mid_stream_frees_blocks(server):
    srv, c = server
    idle = wait_idle(srv)
    assert idle["kv_usage"] == 0.0
    aborted0 = idle["aborted"]
    body = {"prompt": "a long story: ", "max_tokens": 490, "temperature": 0, "ignore_eos": True, "stream": True}
    with c.stream("POST", "/v1/completions", json=body) as r:
        it = r.iter_lines()
        got = [next(it) for _ in range(6)]
        assert any(g.startswith("data: ") for g in got)
        assert srv.aengine.stats()["kv_blocks_used"] - srv.aengine.stats()["kv_blocks_cached"] > 0
    # the connection is closed with ~390 tokens still to go: the server aborts it and frees its blocks
    st = wait_idle(srv)
    assert st["aborted"] == aborted0 + 1 and st["tokens_generated"] < idle["tokens_generated"] + 490
    assert st["kv_usage"] == 0.0 and st["kv_blocks_used"] == st["kv_blocks_cached"]
    assert 'tinylearn_serve_requests_total{finish_reason="abort"}' in c.get("/metrics").text


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


def test_metrics_reflect_traffic(server):
    srv, c = server
    before = c.get("/metrics").text
    for name in ("queue_depth", "running", "swapped", "kv_usage", "prefix_hit_rate", "ttft_seconds_count"):
        _metric(before, f"tinylearn_serve_{name}")
    body = c.post("/v1/completions", json={"prompt": "metrics!", "max_tokens": 12, "temperature": 0}).json()
    c.post("/v1/completions", json={"prompt": "x", "max_tokens": 0})
    after = c.get("/metrics").text
    n_out = body["usage"]["completion_tokens"]
    gen = "tinylearn_serve_generated_tokens_total"
    assert _metric(after, gen) == _metric(before, gen) + n_out
    for h in ("ttft_seconds_count", "e2e_latency_seconds_count"):
        assert _metric(after, f"tinylearn_serve_{h}") == _metric(before, f"tinylearn_serve_{h}") + 1
    code400 = 'tinylearn_serve_http_responses_total{code="400"}'
    assert _metric(after, code400) == (_metric(before, code400) if code400 in before else 0) + 1
    assert (
        after.count("tinylearn_serve_tpot_seconds_bucket") >= 5
        and "# TYPE tinylearn_serve_ttft_seconds histogram" in after
    )


def test_full_queue_is_429_with_retry_after():
    app = create_app(build_engine("tiny", max_num_seqs=1, max_waiting=2), max_waiting=2)
    with serve_in_thread(app) as url:

        async def burst():
            async with httpx.AsyncClient(base_url=url, timeout=60, trust_env=False) as ac:
                body = {"prompt": "overload", "max_tokens": 120, "temperature": 0, "ignore_eos": True}
                return await asyncio.gather(*(ac.post("/v1/completions", json=body) for _ in range(16)))

        rs = asyncio.run(burst())
        codes = sorted(r.status_code for r in rs)
        assert set(codes) == {200, 429} and codes.count(200) >= 2, codes
        for r in rs:
            if r.status_code == 429:
                assert int(r.headers["Retry-After"]) >= 1 and r.json()["error"]["type"] == "rate_limit_error"
        st = wait_idle(app.state.server)
        assert st["kv_usage"] == 0.0
        assert 'tinylearn_serve_http_responses_total{code="429"}' in httpx.get(url + "/metrics").text


def test_draining_is_503_and_in_flight_finishes():
    app = create_app(build_engine("tiny"), max_waiting=8)
    srv = app.state.server
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30, trust_env=False) as c:
        body = {"prompt": "drain me", "max_tokens": 150, "temperature": 0, "ignore_eos": True, "stream": True}
        with c.stream("POST", "/v1/completions", json=body) as r:
            it = r.iter_lines()
            first = [next(it) for _ in range(2)]
            srv.aengine.begin_drain()
            r2 = c.post("/v1/completions", json={"prompt": "late", "max_tokens": 4})
            assert r2.status_code == 503 and int(r2.headers["Retry-After"]) >= 1
            assert r2.json()["error"]["code"] == "draining"
            h = c.get("/health")
            assert h.status_code == 503 and h.json()["status"] == "draining"
            chunks = sse(first + list(it))
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_sigterm_drains_in_flight_requests():
    port = _free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "tinylearn", "serve", "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(url + "/health", trust_env=False).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else ""
            time.sleep(0.1)
        result: dict = {}
        started = threading.Event()

        def client():
            body = {"prompt": "sigterm", "max_tokens": 200, "temperature": 0, "ignore_eos": True, "stream": True}
            with (
                httpx.Client(timeout=60, trust_env=False) as c,
                c.stream("POST", url + "/v1/completions", json=body) as r,
            ):
                lines = []
                for line in r.iter_lines():
                    lines.append(line)
                    started.set()
                result["lines"] = lines

        t = threading.Thread(target=client)
        t.start()
        assert started.wait(20)
        proc.send_signal(signal.SIGTERM)
        t.join(60)
        chunks = sse(result["lines"])
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        # uvicorn re-raises the captured SIGTERM after its graceful shutdown: killed by SIGTERM, not by a crash
        assert proc.wait(30) in (0, -signal.SIGTERM)
        out = proc.stdout.read()
        assert "Traceback" not in out, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_refuses_non_loopback_host(capsys):
    from tinylearn.__main__ import main

    assert main(["serve", "--host", "0.0.0.0", "--port", "9"]) == 2
    err = capsys.readouterr().err
    assert "host" in err and "0.0.0.0" in err and "--allow-remote" in err


def test_stop_string_cuts_text_stream_and_not(server):
    srv, c = server
    text, _ = reference(TOK.encode("stop test"), 40)
    i = next(i for i in range(3, len(text) - 2) if text[i : i + 2].isascii() and text.find(text[i : i + 2]) == i)
    stop = text[i : i + 2]
    req = {"prompt": "stop test", "max_tokens": 40, "temperature": 0, "stop": [stop]}
    ch = c.post("/v1/completions", json=req).json()["choices"][0]
    assert ch == {"index": 0, "text": text[:i], "logprobs": None, "finish_reason": "stop"}
    with c.stream("POST", "/v1/completions", json={**req, "stream": True}) as r:
        chunks = sse(list(r.iter_lines()))
    assert "".join(x["choices"][0]["text"] for x in chunks) == text[:i]


def test_async_engine_propagates_errors_and_shuts_down():
    from tinylearn.serve.async_engine import AsyncEngine, EngineDraining
    from tinylearn.serve.types import EngineFull, SamplingParams

    ae = AsyncEngine(build_engine("tiny", max_num_seqs=1, max_waiting=1))

    async def go():
        with pytest.raises(ValueError, match="prompt"):
            await ae.add_request([], SamplingParams(max_tokens=2))
        with pytest.raises(TypeError, match="params"):
            await ae.add_request([1, 2], "greedy")
        p = SamplingParams(temperature=0, max_tokens=300, ignore_eos=True)
        streams = [await ae.add_request([1, 2, 3], p), await ae.add_request([4, 5], p)]
        with pytest.raises(EngineFull):
            for _ in range(4):
                await ae.add_request([6], p)
        first = await streams[0].get(10)
        assert first.new_token_ids and not first.finished
        ae.shutdown()  # aborts what is left: every stream ends with finish_reason "abort"
        for s in streams:
            outs = [o async for o in s]
            assert outs and outs[-1].finish_reason == "abort"
        with pytest.raises(EngineDraining):
            await ae.add_request([1], p)

    asyncio.run(go())
    assert not ae._thread.is_alive()
    st = ae.engine.stats()
    assert st["running"] == st["waiting"] == 0 and st["kv_usage"] == 0.0


def test_server_metrics_own_registry_and_tpot():
    from prometheus_client import REGISTRY

    from tinylearn.serve.metrics import ServerMetrics

    a, b = ServerMetrics(), ServerMetrics()  # two servers in one process: no duplicate-registration clash
    a.observe_request(ttft_s=0.5, e2e_s=1.5, n_output=5, n_prompt=7, finish_reason="length")
    a.observe_request(ttft_s=0.1, e2e_s=0.1, n_output=1, n_prompt=2, finish_reason="stop")  # no TPOT sample
    a.count_response(429)
    text = a.render({"waiting": 3, "running": 2, "kv_usage": 0.25, "prefix_hit_rate": 0.5}).decode()
    assert _metric(text, "tinylearn_serve_tpot_seconds_sum") == pytest.approx(0.25)  # (1.5 - 0.5) / (5 - 1)
    assert _metric(text, "tinylearn_serve_tpot_seconds_count") == 1
    assert _metric(text, "tinylearn_serve_ttft_seconds_count") == 2
    assert _metric(text, "tinylearn_serve_generated_tokens_total") == 6
    assert _metric(text, "tinylearn_serve_queue_depth") == 3 and _metric(text, "tinylearn_serve_kv_usage") == 0.25
    assert _metric(text, 'tinylearn_serve_http_responses_total{code="429"}') == 1
    assert "tinylearn_serve_ttft_seconds_count 0.0" in b.render({}).decode()
    assert REGISTRY.get_sample_value("tinylearn_serve_ttft_seconds_count") is None


def test_async_engine_drain_blocking_finishes_in_flight():
    from tinylearn.serve.async_engine import AsyncEngine, EngineDraining
    from tinylearn.serve.types import SamplingParams

    ae = AsyncEngine(build_engine("tiny"))

    async def go():
        s = await ae.add_request([7, 8, 9], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
        assert await asyncio.to_thread(ae.drain_blocking, 30.0)  # returns once the request finished
        outs = [o async for o in s]
        assert outs[-1].finish_reason == "length" and len(outs[-1].token_ids) == 40
        with pytest.raises(EngineDraining, match="draining"):
            await ae.add_request([1], SamplingParams(max_tokens=1))

    asyncio.run(go())
    ae.shutdown()
