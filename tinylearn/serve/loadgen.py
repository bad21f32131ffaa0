"""Load generator for an OpenAI-compatible completions server (``tinylearn serve``): asyncio + httpx, loopback only.

    python tools/loadgen.py --url http://127.0.0.1:8000 --n 200 --rate 20 --workload shared-prefix --json out.json
    run_load(base_url, n_requests=..., rate=..., workload=..., ...) -> dict          (notebooks, `tinylearn bench`)

Arrivals are Poisson: inter-arrival gaps ~ Exponential(mean 1/rate), seeded; rate=inf sends all at once. Prompt and
output lengths are drawn per request from a stated distribution: ("uniform", lo, hi) inclusive, or
("lognormal", median, sigma) rounded and clipped to [1, cap]. Prompts are token-id lists of printable bytes, so their
length is exact. Workloads:
    random         independent prompts
    shared-prefix  one common "system prompt" of ``prefix_len`` tokens + a distinct suffix per request (what prefix
                   caching serves: the prefix's KV blocks are computed once)
    multi-turn     sessions of ``turns`` requests; a session's arrivals are Poisson, its turns closed-loop: turn t+1
                   is sent when turn t finished, its prompt = turn t's prompt + the completion + a new user suffix
Every request streams (``stream_options.include_usage``): TTFT = send -> first chunk with text, e2e = send -> [DONE],
TPOT = (e2e - TTFT) / (completion_tokens - 1). Optional faults: ``disconnect_frac`` of requests close the connection
after their first chunk, ``malformed_frac`` send broken JSON (the server must answer 400 and leak nothing).
Summary: counts by status (200/400/429/503/..., "disconnected", "error", "not_sent" after the wall-clock limit),
throughput (finished req/s, output tok/s), goodput (req/s meeting the SLO TTFT <= slo_ttft_s and
TPOT <= slo_tpot_s), TTFT/TPOT/e2e p50/p90/p99/mean over successful requests, and ``peak_concurrency``: the most
requests open at once (each holds its own connection; at most ``max_concurrency``).
Bounded: n_requests <= 100000, duration_s (wall clock; unsent requests are not sent, in-flight ones cancelled),
max_concurrency connections; only 127.0.0.1 / localhost / ::1 URLs are accepted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from typing import Any
from urllib.parse import urlparse

import numpy as np

LOOPBACK = ("127.0.0.1", "localhost", "::1")
WORKLOADS = ("random", "shared-prefix", "multi-turn")
MAX_REQUESTS = 100_000


def check_url(base_url: str) -> str:
    if not isinstance(base_url, str):
        raise TypeError(f"base_url: expected a str, got {type(base_url).__name__}")
    u = urlparse(base_url)
    if u.scheme not in ("http", "https") or u.hostname not in LOOPBACK:
        raise ValueError(f"base_url: loopback only (http://127.0.0.1:PORT), got {base_url!r}")
    return base_url.rstrip("/")


def _dist(name: str, spec: Any) -> tuple:
    if not isinstance(spec, list | tuple) or len(spec) != 3 or spec[0] not in ("uniform", "lognormal"):
        raise ValueError(f"{name}: expected ('uniform', lo, hi) or ('lognormal', median, sigma), got {spec!r}")
    kind, a, b = spec
    if kind == "uniform" and not (isinstance(a, int) and isinstance(b, int) and 1 <= a <= b):
        raise ValueError(f"{name}: uniform needs ints 1 <= lo <= hi, got {spec!r}")
    if kind == "lognormal" and not (a > 0 and b >= 0):
        raise ValueError(f"{name}: lognormal needs median > 0 and sigma >= 0, got {spec!r}")
    return tuple(spec)


def sample_lengths(spec: tuple, n: int, rng: np.random.Generator, cap: int) -> np.ndarray:
    """n ints from ``spec`` (see the module docstring), clipped to [1, cap]."""
    kind, a, b = spec
    if kind == "uniform":
        x = rng.integers(a, b + 1, size=n)
    else:
        x = np.rint(rng.lognormal(math.log(a), b, size=n))
    return np.clip(x, 1, cap).astype(int)


def make_workload(workload: str = "random", n_requests: int = 32, *, prompt_len: tuple = ("uniform", 16, 64),
                  output_len: tuple = ("uniform", 8, 32), prefix_len: int = 128, turns: int = 3, seed: int = 0,
                  max_context: int = 512) -> list[dict[str, Any]]:  # fmt: skip
    """The request list: dicts with prompt (token ids), max_tokens, session, turn; seeded and exact."""
    if workload not in WORKLOADS:
        raise ValueError(f"workload: expected one of {WORKLOADS}, got {workload!r}")
    if isinstance(n_requests, bool) or not isinstance(n_requests, int) or not 1 <= n_requests <= MAX_REQUESTS:
        raise ValueError(f"n_requests: expected an int in [1, {MAX_REQUESTS}], got {n_requests!r}")
    if not isinstance(turns, int) or turns < 1:
        raise ValueError(f"turns: expected an int >= 1, got {turns!r}")
    pl, ol = _dist("prompt_len", prompt_len), _dist("output_len", output_len)
    rng = np.random.default_rng(seed)
    out_n = sample_lengths(ol, n_requests, rng, max(1, max_context // 4))
    budget = max_context - int(out_n.max()) - 1
    if workload == "shared-prefix" and not 0 <= prefix_len < budget:
        raise ValueError(f"prefix_len: must leave room in max_context={max_context}, got {prefix_len}")
    cap = budget - (prefix_len if workload == "shared-prefix" else 0)
    if workload == "multi-turn":
        cap = max(1, budget // (2 * turns))  # the conversation grows by prompt + completion each turn
    p_n = sample_lengths(pl, n_requests, rng, max(1, cap))
    toks = lambda k: rng.integers(32, 127, size=int(k)).tolist()  # noqa: E731 -- printable ASCII bytes
    prefix = toks(prefix_len) if workload == "shared-prefix" else []
    reqs = []
    for i in range(n_requests):
        session, turn = (i // turns, i % turns) if workload == "multi-turn" else (i, 0)
        reqs.append(dict(prompt=prefix + toks(p_n[i]), max_tokens=int(out_n[i]), session=session, turn=turn))
    return reqs


def _pct(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"p50": None, "p90": None, "p99": None, "mean": None, "n": 0}
    a = np.asarray(xs, dtype=float)
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "mean": float(a.mean()), "n": len(xs)}


async def _one(client: Any, url: str, model: str, req: dict, disconnect: bool, malformed: bool) -> dict[str, Any]:
    rec: dict[str, Any] = {"status": None, "ttft_s": None, "e2e_s": None, "completion_tokens": 0, "text": ""}
    body = {"model": model, "prompt": req["prompt"], "max_tokens": req["max_tokens"], "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    t0 = time.perf_counter()
    try:
        if malformed:
            r = await client.post(url, content=b'{"prompt": [1, 2,', headers={"Content-Type": "application/json"})
            rec["status"] = r.status_code
            return rec
        async with client.stream("POST", url, json=body) as r:
            rec["status"] = r.status_code
            if r.status_code != 200:
                await r.aread()
                return rec
            parts = []
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    rec["e2e_s"] = time.perf_counter() - t0
                    break
                chunk = json.loads(data)
                if chunk.get("usage"):
                    rec["completion_tokens"] = chunk["usage"]["completion_tokens"]
                for ch in chunk.get("choices", []):
                    if ch.get("text"):
                        parts.append(ch["text"])
                        if rec["ttft_s"] is None:
                            rec["ttft_s"] = time.perf_counter() - t0
                        if disconnect:
                            rec["status"] = "disconnected"
                            return rec  # leaving the context manager closes the connection mid-stream
            rec["text"] = "".join(parts)
            if rec["e2e_s"] is None:
                rec["status"] = "error"
    except asyncio.CancelledError:
        rec["status"] = "cancelled"
    except Exception as e:  # noqa: BLE001 -- a refused/reset connection is a measured outcome, not a crash
        rec["status"] = "error"
        rec["error"] = repr(e)[:200]
    return rec


async def run_load_async(base_url: str, *, n_requests: int = 32, rate: float = 8.0, workload: str = "random",
                         prompt_len: tuple = ("uniform", 16, 64), output_len: tuple = ("uniform", 8, 32),
                         prefix_len: int = 128, turns: int = 3, seed: int = 0, duration_s: float = 60.0,
                         max_concurrency: int = 256, slo_ttft_s: float = 1.0, slo_tpot_s: float = 0.1,
                         model: str | None = None, disconnect_frac: float = 0.0, malformed_frac: float = 0.0,
                         max_context: int | None = None, timeout_s: float = 120.0) -> dict[str, Any]:  # fmt: skip
    """Run one load test (see the module docstring); returns the summary dict."""
    import httpx

    base = check_url(base_url)
    if not (isinstance(rate, int | float) and rate > 0):
        raise ValueError(f"rate: expected requests/s > 0 (inf = all at once), got {rate!r}")
    if not (isinstance(duration_s, int | float) and 0 < duration_s <= 3600):
        raise ValueError(f"duration_s: expected a wall-clock limit in (0, 3600] s, got {duration_s!r}")
    if not (isinstance(max_concurrency, int) and 1 <= max_concurrency <= 2048):
        raise ValueError(f"max_concurrency: expected an int in [1, 2048], got {max_concurrency!r}")
    for name, f in (("disconnect_frac", disconnect_frac), ("malformed_frac", malformed_frac)):
        if not 0 <= f <= 1:
            raise ValueError(f"{name}: expected a fraction in [0, 1], got {f!r}")
    limits = httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout_s), trust_env=False) as client:
        info = (await client.get(base + "/v1/models")).json()["data"][0]
        model = model or info["id"]
        ctx = max_context or int(info.get("max_model_len", 512))
        reqs = make_workload(workload, n_requests, prompt_len=prompt_len, output_len=output_len,
                             prefix_len=prefix_len, turns=turns, seed=seed, max_context=ctx)  # fmt: skip
        rng = np.random.default_rng(seed + 1)
        gaps = rng.exponential(1.0 / rate, size=n_requests) if math.isfinite(rate) else np.zeros(n_requests)
        faults = rng.random((n_requests, 2))
        url = base + "/v1/completions"
        records: list[dict[str, Any] | None] = [None] * n_requests
        sessions: dict[int, list[int]] = {}
        for i, r in enumerate(reqs):
            sessions.setdefault(r["session"], []).append(i)
        t_start = time.perf_counter()
        deadline = t_start + float(duration_s)
        open_now = [0, 0]  # requests in flight now, the most at once

        async def one(req: dict, disconnect: bool, malformed: bool) -> dict[str, Any]:
            open_now[0] += 1
            open_now[1] = max(open_now[1], open_now[0])
            try:
                return await _one(client, url, model, req, disconnect, malformed)
            finally:
                open_now[0] -= 1

        async def session(idx: list[int], t_arrive: float) -> None:
            await asyncio.sleep(max(0.0, t_arrive - time.perf_counter()))
            history: list[int] = []
            for i in idx:
                if time.perf_counter() >= deadline:
                    return
                req = dict(reqs[i])
                if history:  # multi-turn: the conversation so far + this turn's new user tokens
                    req["prompt"] = (history + req["prompt"])[-(ctx - req["max_tokens"] - 1) :]
                records[i] = rec = await one(req, faults[i, 0] < disconnect_frac, faults[i, 1] < malformed_frac)
                rec["t_send"] = time.perf_counter() - t_start
                if rec["status"] != 200:
                    return
                history = req["prompt"] + list(rec["text"].encode("utf-8", "replace"))

        arrivals = t_start + np.cumsum(gaps)
        firsts = {s: idx for s, idx in sessions.items()}
        order = sorted(firsts, key=lambda s: firsts[s][0])
        tasks = [asyncio.ensure_future(session(firsts[s], arrivals[firsts[s][0]])) for s in order]
        remaining = max(0.0, deadline - time.perf_counter())
        done, pending = await asyncio.wait(tasks, timeout=remaining)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        elapsed = time.perf_counter() - t_start
    return summarize(records, elapsed, slo_ttft_s, slo_tpot_s) | {
        "peak_concurrency": open_now[1],
        "config": dict(
            workload=workload,
            n_requests=n_requests,
            rate=rate,
            prompt_len=list(prompt_len),
            output_len=list(output_len),
            prefix_len=prefix_len if workload == "shared-prefix" else 0,
            turns=turns if workload == "multi-turn" else 1,
            seed=seed,
            duration_s=duration_s,
            max_concurrency=max_concurrency,
            disconnect_frac=disconnect_frac,
            malformed_frac=malformed_frac,
        ),  # fmt: skip
    }


def summarize(records: list[dict | None], elapsed_s: float, slo_ttft_s: float, slo_tpot_s: float) -> dict:
    """Counts, throughput, goodput and latency percentiles of per-request records (None = never sent)."""
    counts: dict[str, int] = {}
    ttft, tpot, e2e = [], [], []
    out_tokens = good = ok = 0
    for rec in records:
        key = "not_sent" if rec is None else str(rec["status"])
        counts[key] = counts.get(key, 0) + 1
        if rec is None or rec["status"] != 200 or rec["e2e_s"] is None:
            continue
        ok += 1
        n = rec["completion_tokens"]
        out_tokens += n
        e2e.append(rec["e2e_s"])
        t1 = rec["ttft_s"] if rec["ttft_s"] is not None else rec["e2e_s"]
        ttft.append(t1)
        tp = (rec["e2e_s"] - t1) / (n - 1) if n >= 2 else None
        if tp is not None:
            tpot.append(tp)
        good += int(t1 <= slo_ttft_s and (tp is None or tp <= slo_tpot_s))
    el = max(elapsed_s, 1e-9)
    return {
        "n_requests": len(records),
        "status_counts": dict(sorted(counts.items())),
        "n_ok": ok,
        "elapsed_s": elapsed_s,
        "throughput_req_s": ok / el,
        "output_tok_s": out_tokens / el,
        "output_tokens": out_tokens,
        "goodput_req_s": good / el,
        "slo": {"ttft_s": slo_ttft_s, "tpot_s": slo_tpot_s, "attainment": good / ok if ok else None},
        "ttft_s": _pct(ttft),
        "tpot_s": _pct(tpot),
        "e2e_s": _pct(e2e),
    }


def run_load(base_url: str, **kw: Any) -> dict[str, Any]:
    """Synchronous wrapper of ``run_load_async`` (its own event loop; call from a thread without a running loop)."""
    return asyncio.run(run_load_async(base_url, **kw))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--n", type=int, default=64, help="number of requests")
    ap.add_argument("--rate", type=float, default=8.0, help="Poisson arrival rate, requests/s (inf: all at once)")
    ap.add_argument("--workload", choices=WORKLOADS, default="random")
    ap.add_argument("--prompt-len", nargs=3, default=["uniform", "16", "64"], metavar=("DIST", "A", "B"))
    ap.add_argument("--output-len", nargs=3, default=["uniform", "8", "32"], metavar=("DIST", "A", "B"))
    ap.add_argument("--prefix-len", type=int, default=128)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--duration", type=float, default=60.0, help="wall-clock limit, seconds")
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--slo-ttft", type=float, default=1.0)
    ap.add_argument("--slo-tpot", type=float, default=0.1)
    ap.add_argument("--json", metavar="PATH", help="also write the summary here")
    a = ap.parse_args(argv)

    def dist(v: list[str]) -> tuple:
        return (v[0], int(v[1]), int(v[2])) if v[0] == "uniform" else (v[0], float(v[1]), float(v[2]))

    try:
        s = run_load(a.url, n_requests=a.n, rate=a.rate, workload=a.workload, prompt_len=dist(a.prompt_len),
                     output_len=dist(a.output_len), prefix_len=a.prefix_len, turns=a.turns, seed=a.seed,
                     duration_s=a.duration, max_concurrency=a.concurrency, slo_ttft_s=a.slo_ttft,
                     slo_tpot_s=a.slo_tpot)  # fmt: skip
    except (ValueError, TypeError) as e:
        print(f"loadgen: {e}", file=sys.stderr)
        return 2
    text = json.dumps(s, indent=2)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
