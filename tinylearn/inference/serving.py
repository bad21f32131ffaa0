"""A discrete-event simulator of an LLM server: static vs continuous (iteration-level) batching.

Each request is dict(arrival=s, prompt_len=int, output_len=int). The engine runs steps; a step processes
``batch_tokens`` tokens (prompt tokens of sequences being prefilled + one token per decoding sequence) and takes
``step_cost(batch_tokens)`` seconds. ``max_batch_tokens`` is the KV-cache budget: tokens resident in the cache.

static (request-level batching, e.g. a plain ``model.generate(batch)``): when the engine is idle, take arrived
    requests first-come-first-served while the padded reservation n * (max prompt + max output) fits the budget;
    one prefill step over n * max_prompt tokens, then max(output) decode steps of n tokens each. A request's
    latency ends at its own last token, but its slot stays idle until the whole batch ends.
continuous (Orca / vLLM): before every step admit arrived requests FCFS while their prompt fits the free KV
    budget; every step = prefills of new requests + one decode token for each running one; finished requests
    leave immediately. The cache grows by one token per running request per step; when it would exceed the
    budget the most recently admitted request is preempted (vLLM's default order) with the *recompute* policy:
    its KV is dropped, it goes back to the front of the queue and, when re-admitted, prefills prompt + the tokens
    it had generated (no swap space; generated tokens are kept, only their KV is recomputed).
The first output token comes from the prefill step (TTFT = end of that step - arrival).

order (continuous only): "fcfs" admits the queue in arrival order (preempted requests first) and preempts the
    newest; "slo" is an SLA priority queue: each request may carry ``slo`` (seconds from arrival to its last
    token; default inf), and the queue is a heap on the deadline arrival + slo (earliest deadline first = least
    remaining slack first, ties to the longest-waiting request); requests already past their deadline drop behind
    every request that can still meet its own and are served longest-waiting first; under memory pressure the
    running request with the latest deadline is preempted. ``slo_attainment``: the fraction of requests with an slo
    that met it.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .checks import int_arg, real_arg, seed_arg


def _check_requests(requests: Sequence[dict[str, Any]], budget: int) -> list[dict[str, Any]]:
    if isinstance(requests, (str, bytes, dict)) or not hasattr(requests, "__iter__"):
        raise TypeError(f"requests: expected a list of request dicts, got {type(requests).__name__}")
    out = []
    for i, r in enumerate(requests):
        try:
            a, slo = float(r["arrival"]), float(r.get("slo", math.inf))
            p, o = int_arg(r["prompt_len"], f"requests[{i}].prompt_len"), int_arg(r["output_len"], "output_len")
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"requests[{i}]: need arrival (s) and integer prompt_len and output_len, got {r!r}") from e
        if not math.isfinite(a) or a < 0 or p < 1 or o < 1 or not slo > 0:
            raise ValueError(
                f"requests[{i}]: arrival >= 0, prompt_len >= 1, output_len >= 1, slo > 0 required, got {r!r}"
            )
        if p + o > budget:
            raise ValueError(
                f"requests[{i}]: prompt_len + output_len = {p + o} tokens can never fit max_batch_tokens={budget}"
            )
        out.append(dict(id=i, arrival=a, prompt_len=p, output_len=o, slo=slo, generated=0, first=None, finish=None))
    return sorted(out, key=lambda r: (r["arrival"], r["id"]))


def _static(reqs: list[dict[str, Any]], budget: int, cost: Callable[[int], float], st: dict[str, Any]) -> None:
    t, i = 0.0, 0
    while i < len(reqs):
        t = max(t, reqs[i]["arrival"])
        batch = [reqs[i]]
        j = i + 1
        while j < len(reqs) and reqs[j]["arrival"] <= t:
            cand = batch + [reqs[j]]
            need = len(cand) * (max(r["prompt_len"] for r in cand) + max(r["output_len"] for r in cand))
            if need > budget:
                break
            batch, j = cand, j + 1
        n, pmax, omax = len(batch), max(r["prompt_len"] for r in batch), max(r["output_len"] for r in batch)
        t += cost(n * pmax)
        st["steps"] += 1
        st["batch_tokens"].append(n * pmax)
        for r in batch:
            r["first"], r["generated"] = t, 1
            if r["output_len"] == 1:
                r["finish"] = t
        for _ in range(omax - 1):
            t += cost(n)
            st["steps"] += 1
            st["batch_tokens"].append(n)
            for r in batch:
                if r["generated"] < r["output_len"]:
                    r["generated"] += 1
                    if r["generated"] == r["output_len"]:
                        r["finish"] = t
        st["kv_peak"] = max(st["kv_peak"], n * (pmax + omax))
        i = j


class _Queue:
    """The waiting queue. "fcfs": FIFO with preempted requests at the front. "slo": a heap on the deadline
    (arrival + slo) -- least remaining slack first, ties to the longest-waiting request -- plus a FIFO of requests
    whose deadline has already passed: they are served by waiting time after every request that can still make
    it, so one late request cannot push all the others past their deadlines too (the EDF domino effect)."""

    def __init__(self, order: str) -> None:
        self.order = order
        self.items: list[Any] = []
        self.late: list[Any] = []  # (arrival, id, request), sorted

    def __len__(self) -> int:
        return len(self.items) + len(self.late)

    def push(self, r: dict[str, Any], now: float, front: bool = False) -> None:
        if self.order == "slo":
            if r["arrival"] + r["slo"] < now:
                bisect.insort(self.late, (r["arrival"], r["id"], r))
            else:
                heapq.heappush(self.items, (r["arrival"] + r["slo"], r["arrival"], r["id"], r))
        elif front:
            self.items.insert(0, r)
        else:
            self.items.append(r)

    def _expire(self, now: float) -> None:
        while self.items and self.items[0][0] < now:
            _, a, i, r = heapq.heappop(self.items)
            bisect.insort(self.late, (a, i, r))

    def peek(self, now: float) -> dict[str, Any]:
        if self.order != "slo":
            return self.items[0]
        self._expire(now)
        return self.items[0][-1] if self.items else self.late[0][-1]

    def pop(self, now: float) -> dict[str, Any]:
        if self.order != "slo":
            return self.items.pop(0)
        self._expire(now)
        return heapq.heappop(self.items)[-1] if self.items else self.late.pop(0)[-1]


def _continuous(
    reqs: list[dict[str, Any]], budget: int, cost: Callable[[int], float], st: dict[str, Any], order: str = "fcfs"
) -> None:
    t, nxt = 0.0, 0
    waiting = _Queue(order)
    running: list[dict[str, Any]] = []  # in admission order
    done = 0
    while done < len(reqs):
        while nxt < len(reqs) and reqs[nxt]["arrival"] <= t:
            waiting.push(reqs[nxt], t)
            nxt += 1
        if not running and not waiting:
            t = reqs[nxt]["arrival"]
            continue
        used = sum(r["prompt_len"] + r["generated"] for r in running)
        prefill = []
        while waiting:
            r = waiting.peek(t)
            ctx = r["prompt_len"] + r["generated"]  # recompute: re-prefill what it had
            if used + ctx + 1 > budget:
                break
            waiting.pop(t)
            prefill.append((r, ctx))
            used += ctx
        decode = list(running)
        if order == "slo":  # victims: latest deadline first
            decode.sort(key=lambda r: (r["arrival"] + r["slo"], r["arrival"], r["id"]))
        # growth: every sequence in the step adds one token of KV; preempt the newest until it fits
        while used + len(decode) + len(prefill) > budget and decode:
            victim = decode.pop()
            running.remove(victim)
            used -= victim["prompt_len"] + victim["generated"]
            waiting.push(victim, t, front=True)
            st["preemptions"] += 1
        if not decode and not prefill:  # nothing fits (only possible transiently); admit the head alone
            r = waiting.pop(t)
            prefill.append((r, r["prompt_len"] + r["generated"]))
        tokens = sum(c for _, c in prefill) + len(decode)
        t += cost(tokens)
        st["steps"] += 1
        st["batch_tokens"].append(tokens)
        st["recomputed_tokens"] += sum(c - r["prompt_len"] for r, c in prefill)
        for r in decode + [r for r, _ in prefill]:
            r["generated"] += 1
            if r["first"] is None:
                r["first"] = t
            if r["generated"] == r["output_len"]:
                r["finish"] = t
                done += 1
        running = [r for r in running if r["finish"] is None] + [r for r, _ in prefill if r["finish"] is None]
        st["kv_peak"] = max(st["kv_peak"], sum(r["prompt_len"] + r["generated"] for r in running))


def simulate_serving(
    requests: Sequence[dict[str, Any]],
    policy: str = "continuous",
    max_batch_tokens: int = 4096,
    step_cost: Callable[[int], float] | None = None,
    order: str = "fcfs",
) -> dict[str, Any]:
    """Simulate serving ``requests``; returns throughput_tok_s, p50/p99 latency, TTFT, preemptions and more.

    ``step_cost(batch_tokens) -> seconds`` (default: 5 ms + 20 us per token). ``order``: "fcfs" or "slo" (continuous
    only; see the module docstring). See the module docstring."""
    if policy not in ("static", "continuous"):
        raise ValueError(f"policy: expected 'static' or 'continuous', got {policy!r}")
    if order not in ("fcfs", "slo") or (order == "slo" and policy != "continuous"):
        raise ValueError(f"order: expected 'fcfs' or 'slo' (slo needs policy='continuous'), got {order!r}")
    if not isinstance(max_batch_tokens, int | np.integer) or max_batch_tokens < 2:
        raise ValueError(f"max_batch_tokens: must be an int >= 2, got {max_batch_tokens!r}")
    cost = step_cost if step_cost is not None else linear_step_cost(5e-3, 20e-6)
    if not callable(cost):
        raise TypeError(f"step_cost: expected a callable batch_tokens -> seconds, got {type(cost).__name__}")
    reqs = _check_requests(requests, int(max_batch_tokens))
    if not reqs:
        raise ValueError("requests: empty trace")
    st: dict[str, Any] = dict(steps=0, batch_tokens=[], preemptions=0, recomputed_tokens=0, kv_peak=0)
    if policy == "static":
        _static(reqs, int(max_batch_tokens), cost, st)
    else:
        _continuous(reqs, int(max_batch_tokens), cost, st, order)
    lat = np.array([r["finish"] - r["arrival"] for r in reqs])
    ttft = np.array([r["first"] - r["arrival"] for r in reqs])
    out_tok = sum(r["output_len"] for r in reqs)
    span = max(r["finish"] for r in reqs) - min(r["arrival"] for r in reqs)
    tpot = [(r["finish"] - r["first"]) / (r["output_len"] - 1) for r in reqs if r["output_len"] > 1]
    with_slo = [r for r in reqs if math.isfinite(r["slo"])]
    met = [r["finish"] - r["arrival"] <= r["slo"] for r in with_slo]
    bt = np.array(st["batch_tokens"])
    return dict(
        policy=policy,
        n_requests=len(reqs),
        output_tokens=out_tok,
        makespan_s=span,
        throughput_tok_s=out_tok / span if span > 0 else float("inf"),
        p50_latency=float(np.percentile(lat, 50)),
        p99_latency=float(np.percentile(lat, 99)),
        mean_latency=float(lat.mean()),
        ttft_p50=float(np.percentile(ttft, 50)),
        ttft_p99=float(np.percentile(ttft, 99)),
        tpot_mean=float(np.mean(tpot)) if tpot else 0.0,
        steps=st["steps"],
        mean_batch_tokens=float(np.mean(bt)),
        batch_tokens_p5=float(np.percentile(bt, 5)),
        batch_tokens_p95=float(np.percentile(bt, 95)),
        batch_tokens_max=int(bt.max()),
        slo_attainment=float(np.mean(met)) if met else float("nan"),
        latencies=[r["finish"] - r["arrival"] for r in sorted(reqs, key=lambda r: r["id"])],  # in input order
        preemptions=st["preemptions"],
        recomputed_tokens=st["recomputed_tokens"],
        kv_peak_tokens=st["kv_peak"],
    )


def linear_step_cost(fixed_s: float, per_token_s: float) -> Callable[[int], float]:
    """step_cost(n) = fixed_s + per_token_s * n: a weight-read floor plus per-token compute."""
    fixed_s, per_token_s = real_arg(fixed_s, "fixed_s"), real_arg(per_token_s, "per_token_s")
    if not (fixed_s >= 0 and per_token_s >= 0 and math.isfinite(fixed_s) and math.isfinite(per_token_s)):
        raise ValueError(f"fixed_s, per_token_s: must be >= 0, got {fixed_s}, {per_token_s}")
    return lambda n: fixed_s + per_token_s * n


def poisson_requests(
    n: int,
    rate: float,
    prompt_len: tuple[int, int] = (16, 128),
    output_len: tuple[int, int] = (8, 128),
    seed: int = 0,
) -> list[dict[str, Any]]:
    """n requests with exponential inter-arrival times (``rate`` req/s) and uniform prompt/output lengths."""
    n = int_arg(n, "n")
    if n < 1 or not real_arg(rate, "rate") > 0 or not np.isfinite(rate):  # `not rate > 0` also rejects NaN
        raise ValueError(f"n, rate: need n >= 1 and a finite rate > 0, got {n}, {rate}")
    for name, rng_ in (("prompt_len", prompt_len), ("output_len", output_len)):
        if not isinstance(rng_, (tuple, list)) or len(rng_) != 2:
            raise TypeError(f"{name}: expected a (low, high) pair of ints, got {rng_!r}")
        lo, hi = int_arg(rng_[0], name), int_arg(rng_[1], name)
        if not 1 <= lo <= hi:
            raise ValueError(f"{name}: need 1 <= low <= high, got {rng_!r}")
    rng = np.random.default_rng(seed_arg(seed))
    arr = np.cumsum(rng.exponential(1.0 / rate, n))
    p = rng.integers(prompt_len[0], prompt_len[1] + 1, n)
    o = rng.integers(output_len[0], output_len[1] + 1, n)
    return [dict(arrival=float(a), prompt_len=int(x), output_len=int(y)) for a, x, y in zip(arr, p, o, strict=True)]
