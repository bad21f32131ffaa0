"""``tinylearn bench serving``: static batching (HF transformers) vs the tl.serve engine, offline and online.

Everything runs in this process on one model: ``tiny_model(0)``'s shape with learned positions (``rope=False``), so
``to_hf_gpt2`` gives transformers' GPT2LMHeadModel with the SAME weights. Two tables:

    offline throughput   one seeded workload (N requests, prompt and output lengths uniform, ignore_eos, greedy),
                         served to completion by
                           static batching   HF ``generate`` on batches of B requests in arrival order (left
                                             padding + attention mask, max_new_tokens = the batch's longest output,
                                             do_sample=False); useful tokens = each request's own output length,
                                             the rest of a short request's row is padding work
                           continuous        tl.serve.Engine, no chunked prefill, no prefix caching
                           + chunked prefill
                           preemption        a KV pool too small for the batch (``num_blocks``): recompute vs swap
                         and, on a shared-prefix variant (one common system prompt + a short suffix each), static vs
                         the engine with prefix caching off and on. Columns: median wall ms of ``repeat`` runs after
                         one warm-up run, output tok/s, tok/s relative to static on the same workload, the
                         per-request latencies of the last run with every request arriving at t=0 (TTFT, TPOT and
                         end-to-end p50 / p99; static: a token's time is when ``generate``'s streamer received its
                         step, a request ends at its OWN last token -- the view most favourable to static), goodput
                         (requests/s meeting the SLO TTFT <= ``slo_ttft_s`` and TPOT <= ``slo_tpot_s``), engine steps,
                         preemptions, prefix hit rate, and how many requests got exactly the static baseline's
                         greedy tokens (the same weights, so every engine row must match: batching, chunking,
                         caching and preemption change speed, never tokens). tinygrad: n/a, it has no serving
                         engine (no paged KV cache, no batching scheduler).
    online               a live server (``create_app`` + ``serve_in_thread`` on a free loopback port) under
                         ``loadgen.run_load`` (Poisson arrivals, streamed completions, bounded n and duration) at two
                         rates: TTFT / TPOT p50 / p99, output tok/s, goodput under the SLO; then prefix caching off
                         vs on under the shared-prefix workload (TTFT p50 ratio).

Sizes: default about a minute on 2 cores; ``full=True`` more requests and longer prompts. Both sides run at
``threads`` (default 1) threads: torch's intra-op pool and BLAS / OpenMP (``limited_threads``), so the rows compare
schedulers, not thread counts (a d_model=128 model's GEMMs are too small to scale; on a shared 2-core box torch at 2
threads next to other work timed 10x slower than at 1).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .._threads import limited_threads
from ..bench import Table
from ..bench.table import Row
from ..inference.config import GPTConfig
from ..inference.model import TinyGPT
from .checkpoint import TINY_CONFIG, tiny_model
from .engine import Engine
from .loadgen import make_workload, run_load
from .types import SamplingParams

BASELINE = "static (HF generate)"
TINYGRAD_NA = "n/a: tinygrad has no serving engine (no paged KV cache, no continuous-batching scheduler)"


def bench_model(seed: int = 0) -> TinyGPT:
    """The served model's shape (``TINY_CONFIG``) with learned positions, so that GPT-2 can hold the same weights."""
    c = TINY_CONFIG
    return tiny_model(seed, GPTConfig(c.vocab_size, c.d_model, c.n_heads, c.n_layers, c.max_seq_len, rope=False))


def sizes(full: bool = False) -> dict[str, Any]:
    """The default (or full) workload sizes; every key can be overridden in ``offline_table`` / ``online_table``."""
    if full:
        return dict(n_requests=128, prompt_len=(32, 192), output_len=(32, 96), prefix_len=384, suffix_len=(8, 24),
                    batch_size=8, repeat=5, num_blocks=48, online_n=96, rates=(16.0, 48.0),
                    duration_s=60.0, threads=1, slo_ttft_s=2.0, slo_tpot_s=0.05)  # fmt: skip
    return dict(n_requests=40, prompt_len=(16, 96), output_len=(16, 64), prefix_len=384, suffix_len=(8, 32),
                batch_size=8, repeat=3, num_blocks=24, online_n=48, rates=(8.0, 24.0), duration_s=20.0,
                threads=1, slo_ttft_s=0.5, slo_tpot_s=0.05)  # fmt: skip


def workload(kind: str, n: int, prompt_len: tuple[int, int], output_len: tuple[int, int], prefix_len: int = 0,
             seed: int = 0) -> list[dict[str, Any]]:  # fmt: skip
    """Seeded requests (dicts with ``prompt`` token ids and ``max_tokens``): kind "random" or "shared-prefix"."""
    return make_workload(kind, n, prompt_len=("uniform", *prompt_len), output_len=("uniform", *output_len),
                         prefix_len=prefix_len, seed=seed, max_context=TINY_CONFIG.max_seq_len)  # fmt: skip


class _StepClock:
    """A transformers streamer that only timestamps: ``generate`` calls put() with the prompt, then once per step."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value: Any) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def static_generate(
    hf_model: Any, reqs: list[dict[str, Any]], batch_size: int, timings: list[dict[str, float]] | None = None
) -> list[list[int]]:
    """Static batching with transformers: batches of ``batch_size`` in arrival order, left padding + attention mask,
    greedy ``generate`` for the batch's longest output; returns each request's own ``max_tokens`` tokens.
    ``timings`` (a list) receives per request {"ttft_s", "e2e_s", "n"} from the call's start: the time of its
    batch's first generated step and of its own last token (a streamer timestamps every step)."""
    import torch

    out: list[list[int]] = []
    t0 = time.perf_counter()
    with torch.no_grad():
        for i in range(0, len(reqs), batch_size):
            batch = reqs[i : i + batch_size]
            width = max(len(r["prompt"]) for r in batch)
            ids = torch.tensor([[0] * (width - len(r["prompt"])) + r["prompt"] for r in batch])
            mask = torch.tensor([[0] * (width - len(r["prompt"])) + [1] * len(r["prompt"]) for r in batch])
            new = max(r["max_tokens"] for r in batch)
            clock = _StepClock() if timings is not None else None
            gen = hf_model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0,
                                    streamer=clock)  # fmt: skip
            out += [gen[j, width : width + r["max_tokens"]].tolist() for j, r in enumerate(batch)]
            if clock is not None:
                steps = clock.times[1:]  # [0] is the prompt
                for r in batch:
                    timings.append(dict(ttft_s=steps[0] - t0, e2e_s=steps[r["max_tokens"] - 1] - t0, n=r["max_tokens"]))
    return out


def engine_timings(outs: list[Any]) -> list[dict[str, float]]:
    """Per request {"ttft_s", "e2e_s", "n"} from the engine's RequestOutput metrics (from each one's arrival)."""
    res = []
    for o in outs:
        m = o.metrics
        res.append(dict(ttft_s=m["first_token_s"] - m["arrival_s"], e2e_s=m["finish_s"] - m["arrival_s"],
                        n=len(o.token_ids)))  # fmt: skip
    return res


def latency_summary(timings: list[dict[str, float]], wall_s: float, slo_ttft_s: float, slo_tpot_s: float) -> dict:
    """TTFT / TPOT / e2e p50 and p99 (ms) and goodput (requests/s meeting both SLOs over ``wall_s``)."""
    ttft = np.array([t["ttft_s"] for t in timings])
    e2e = np.array([t["e2e_s"] for t in timings])
    n = np.array([t["n"] for t in timings])
    tpot = np.where(n > 1, (e2e - ttft) / np.maximum(n - 1, 1), 0.0)
    good = int(np.sum((ttft <= slo_ttft_s) & (tpot <= slo_tpot_s)))
    res: dict[str, Any] = {}
    for name, x in (("TTFT", ttft), ("TPOT", tpot[n > 1] if (n > 1).any() else tpot), ("e2e", e2e)):
        res[f"{name} p50 ms"], res[f"{name} p99 ms"] = (float(v) * 1e3 for v in np.percentile(x, [50, 99]))
    res["goodput req/s"] = good / wall_s
    return res


def engine_generate(model: TinyGPT, reqs: list[dict[str, Any]], **engine_kw: Any) -> tuple[list[list[int]], Engine]:
    """Serve ``reqs`` to completion with a fresh ``Engine(model, **engine_kw)`` (greedy, ignore_eos)."""
    engine = Engine(model, **engine_kw)
    params = [SamplingParams(temperature=0.0, max_tokens=r["max_tokens"], ignore_eos=True) for r in reqs]
    outs = engine.generate([r["prompt"] for r in reqs], params)
    engine.last_outputs = outs  # the final RequestOutputs (their metrics give the latencies)
    return [o.token_ids for o in outs], engine


def _timed(fn: Callable[[], Any], repeat: int) -> tuple[list[float], Any]:
    """One warm-up call, then ``repeat`` timed calls: (seconds of each, the last result)."""
    res = fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        res = fn()
        times.append(time.perf_counter() - t0)
    return times, res


def _row(case: str, impl: str, times: list[float], useful: int, note: str, **extra: Any) -> Row:
    wall = float(np.median(times))
    ex = {"wall s": wall, "out tok/s": useful / wall, **extra}
    return Row(case, impl, wall * 1e3, min(times) * 1e3, note=note, extra=ex)


def offline_table(full: bool = False, progress: Callable[[str], None] | None = None, **override: Any) -> Table:
    """The offline-throughput table (see the module docstring); ``override`` replaces keys of ``sizes(full)``."""
    sz = sizes(full) | override
    with limited_threads(sz["threads"], torch=True):
        return _offline_table(sz, progress)


def _offline_table(sz: dict[str, Any], progress: Callable[[str], None] | None) -> Table:
    import torch

    from .hf import to_hf_gpt2

    model = bench_model()
    hf = to_hf_gpt2(model)
    n, rep, bsz = sz["n_requests"], sz["repeat"], sz["batch_size"]
    table = Table(f"serving: offline throughput ({n} requests, greedy, ignore_eos, 1 process)", baseline=BASELINE)
    budget = max(256, sz["prompt_len"][1], sz["prefix_len"] + sz["suffix_len"][1])
    common = dict(block_size=16, max_num_batched_tokens=budget, max_num_seqs=32)
    off = dict(chunked_prefill=True, enable_prefix_caching=False)
    small = dict(off, num_blocks=sz["num_blocks"])
    random_configs = [
        ("continuous batching", dict(off, chunked_prefill=False), "no chunked prefill"),
        ("+ chunked prefill", off, f"budget {budget} tok/step"),
        (f"preempt recompute ({sz['num_blocks']} blocks)", dict(small, preemption="recompute"),
         "KV pool too small: preempted requests recompute their KV"),
        (f"preempt swap ({sz['num_blocks']} blocks)", dict(small, preemption="swap"),
         "KV pool too small: preempted requests' blocks go to host RAM and back"),
    ]  # fmt: skip
    shared_configs = [
        ("+ chunked prefill", off, "prefix caching off"),
        ("+ prefix caching", dict(off, enable_prefix_caching=True), "the prefix's blocks are computed once, shared"),
    ]
    cases = [
        (f"random {n} req, prompt U{sz['prompt_len']}, out U{sz['output_len']}",
         workload("random", n, sz["prompt_len"], sz["output_len"]), random_configs),
        (f"shared prefix {sz['prefix_len']} + suffix U{sz['suffix_len']}, {n} req",
         workload("shared-prefix", n, sz["suffix_len"], sz["output_len"], sz["prefix_len"]), shared_configs),
    ]  # fmt: skip
    slo = (sz["slo_ttft_s"], sz["slo_tpot_s"])
    for case, reqs, configs in cases:
        useful = sum(r["max_tokens"] for r in reqs)
        timings: list[dict[str, float]] = []
        times, ref = _timed(lambda reqs=reqs, tm=timings: static_generate(hf, reqs, bsz, tm.clear() or tm), rep)
        lat = latency_summary(timings, times[-1], *slo)
        table.add(_row(case, BASELINE, times, useful, f"batches of {bsz}, left padding, "
                       f"torch threads {torch.get_num_threads()}", **{"tok/s x static": 1.0}, **lat))  # fmt: skip
        static_wall = float(np.median(times))
        if progress:
            progress(f"{case} / {BASELINE}")
        for impl, kw, note in configs:
            times, (toks, eng) = _timed(lambda reqs=reqs, kw=kw: engine_generate(model, reqs, **common, **kw), rep)
            st = eng.stats()
            same = sum(a == b for a, b in zip(toks, ref))
            lat = latency_summary(engine_timings(eng.last_outputs), times[-1], *slo)
            table.add(_row(case, impl, times, useful, note, **lat, **{
                "tok/s x static": static_wall / float(np.median(times)), "steps": st["num_steps"],
                "preemptions": st["preemptions_recompute"] + st["preemptions_swap"],
                "prefix hit rate": st["prefix_hit_rate"], "same tokens": f"{same}/{len(reqs)}"}))  # fmt: skip
            if progress:
                progress(f"{case} / {impl}")
        if case.startswith("random"):
            table.add(Row(case, "tinygrad", None, note=TINYGRAD_NA))
    table.notes.append(
        "static = transformers GPT2LMHeadModel.generate on the same weights (to_hf_gpt2); 'same tokens' counts the "
        "requests whose greedy tokens equal static's; wall = median of the timed runs after one warm-up run"
    )
    table.notes.append(
        f"latencies: the last timed run, all requests arriving at t=0; goodput = requests/s with TTFT <= "
        f"{slo[0] * 1e3:g} ms and TPOT <= {slo[1] * 1e3:g} ms"
    )
    table.compute_ratios()
    return table


def _serve_and_load(model: TinyGPT, engine_kw: dict[str, Any], load_kw: dict[str, Any]) -> dict[str, Any]:
    """A fresh engine behind a live server on a free loopback port; a short warm-up load, then the measured one."""
    from .server import create_app, serve_in_thread

    engine = Engine(model, **engine_kw)
    app = create_app(engine, model_name="tiny", max_waiting=1024)
    with serve_in_thread(app) as url:
        warm = dict(load_kw, n_requests=4, rate=float("inf"), seed=load_kw.get("seed", 0) + 1000)
        run_load(url, **warm)
        summary = run_load(url, **load_kw)
    summary["engine"] = engine.stats()
    return summary


def _online_row(case: str, impl: str, s: dict[str, Any], note: str) -> Row:
    ms = lambda v: None if v is None else v * 1e3  # noqa: E731
    ttft, tpot = s["ttft_s"], s["tpot_s"]
    return Row(case, impl, ms(s["e2e_s"]["p50"]), note=note, extra={
        "TTFT p50 ms": ms(ttft["p50"]), "TTFT p99 ms": ms(ttft["p99"]), "TPOT p50 ms": ms(tpot["p50"]),
        "TPOT p99 ms": ms(tpot["p99"]), "e2e p99 ms": ms(s["e2e_s"]["p99"]), "out tok/s": s["output_tok_s"],
        "goodput req/s": s["goodput_req_s"],
        "ok": f"{s['n_ok']}/{s['n_requests']}", "prefix hit rate": s["engine"]["prefix_hit_rate"]})  # fmt: skip


def online_table(full: bool = False, progress: Callable[[str], None] | None = None, **override: Any) -> Table:
    """The online table (live server + load generator); ``override`` replaces keys of ``sizes(full)``."""
    sz = sizes(full) | override
    with limited_threads(sz["threads"], torch=True):
        return _online_table(sz, progress)


def _online_table(sz: dict[str, Any], progress: Callable[[str], None] | None) -> Table:
    model = bench_model()
    n, dur = sz["online_n"], sz["duration_s"]
    slo_ttft, slo_tpot = sz["slo_ttft_s"], sz["slo_tpot_s"]
    table = Table(f"serving: online (live server, loopback, Poisson arrivals, SLO TTFT <= {slo_ttft * 1e3:.0f} ms "
                  f"and TPOT <= {slo_tpot * 1e3:.0f} ms)", baseline="prefix caching off")  # fmt: skip
    budget = max(256, sz["prompt_len"][1], sz["prefix_len"] + sz["suffix_len"][1])
    ekw = dict(block_size=16, max_num_batched_tokens=budget, max_num_seqs=32, chunked_prefill=True)
    base = dict(n_requests=n, duration_s=dur, slo_ttft_s=slo_ttft, slo_tpot_s=slo_tpot, seed=0,
                output_len=("uniform", *sz["output_len"]))  # fmt: skip
    for rate in sz["rates"]:
        case = f"random {n} req @ {rate:g} req/s"
        load = dict(base, rate=rate, workload="random", prompt_len=("uniform", *sz["prompt_len"]))
        s = _serve_and_load(model, dict(ekw, enable_prefix_caching=True), load)
        table.add(_online_row(case, "engine (chunked prefill + prefix caching)", s, "median ms = e2e p50"))
        if progress:
            progress(case)
    rate = sz["rates"][-1]  # near saturation without the cache: there the prefix's prefill compute is what queues
    case = f"shared prefix {sz['prefix_len']} + suffix U{sz['suffix_len']}, {n} req @ {rate:g} req/s"
    load = dict(base, rate=rate, workload="shared-prefix", prompt_len=("uniform", *sz["suffix_len"]),
                prefix_len=sz["prefix_len"])  # fmt: skip
    ttft = {}
    for impl, on in (("prefix caching off", False), ("prefix caching on", True)):
        s = _serve_and_load(model, dict(ekw, enable_prefix_caching=on), load)
        table.add(_online_row(case, impl, s, "median ms = e2e p50"))
        ttft[on] = s["ttft_s"]["p50"]
        if progress:
            progress(f"{case} / {impl}")
    if ttft[True] and ttft[False]:
        table.rows[-1].extra["TTFT p50 x off"] = ttft[True] / ttft[False]
        table.notes.append(f"prefix caching cuts TTFT p50 {ttft[False] / ttft[True]:.2f}x on the shared-prefix load")
    table.notes.append("TTFT = send -> first streamed text chunk; TPOT = (e2e - TTFT) / (tokens - 1), per request")
    table.compute_ratios()
    return table


def run(full: bool = False, progress: Callable[[str], None] | None = None) -> list[Table]:
    """``tinylearn bench serving``: the offline-throughput table and the online (live server) table."""
    return [offline_table(full, progress), online_table(full, progress)]
