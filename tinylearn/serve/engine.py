"""Engine: an LLM serving engine on TinyGPT (vLLM / nano-vllm design) -- continuous batching over a paged KV cache.

    engine = Engine(model, block_size=16, num_blocks=256, max_num_batched_tokens=256, policy="fcfs")
    rid = engine.add_request([1, 2, 3], SamplingParams(temperature=0, max_tokens=16))
    while engine.has_unfinished():
        for out in engine.step(): ...          # streamed: new_token_ids per step, finish_reason at the end

One ``step()``:
    1. the Scheduler (scheduler.py) picks work from the running / swapped / waiting queues under the token budget
       ``max_num_batched_tokens`` and ``max_num_seqs``: decodes first, then swap-ins, then new prompts (chunked
       when ``chunked_prefill``); it reserves KV blocks and preempts (recompute or swap) when the pool runs dry;
    2. speculative requests draft k tokens with the draft model (its own dense cache per request);
    3. the ModelRunner (runner.py) runs ONE forward over the ragged batch of all scheduled tokens (prefill chunks,
       decode tokens, speculative verify rows) against the paged cache (block_manager.py: prefix caching with
       LRU eviction of free cached blocks, swap to a host store);
    4. each sequence whose computed tokens reached its end samples its next token (greedy when temperature == 0,
       else temperature / top-k / top-p with its own seeded generator) or accepts/rejects its drafts, then the
       stop checks: EOS (unless ignore_eos), stop strings (text cut before them), max_tokens, the context length;
    5. full blocks are indexed for prefix reuse, finished requests free their blocks, RequestOutputs go out.
Admission control (KV budget, SLO MODEL) and token-priority eviction: ``engine_control.py``. Without eviction,
greedy outputs equal ``tinylearn.inference.generate(model, prompt, n, temperature=0)``: the KV of every token is
the same whatever it was batched with, so batching, chunking, caching and preemption change speed, not tokens.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import numpy as np

from ..inference.model import TinyGPT
from ..inference.paged_math import blocks_needed
from ..inference.sampling import choose, filter_probs, sample_from
from ..inference.session import open_session
from ..inference.speculative import accept_draft, residual_distribution
from .block_manager import BlockManager, HostStore
from .engine_control import EngineControl, _int_arg
from .runner import BatchItem, ModelRunner
from .scheduler import POLICIES, PREEMPTION, Scheduler, Sequence
from .types import EngineFull, RequestOutput, SamplingParams

__all__ = ["Engine", "HostStore"]


def _choice(name: str, v: Any, allowed: tuple) -> str:
    if not isinstance(v, str) or v not in allowed:
        raise ValueError(f"{name}: expected one of {allowed}, got {v!r}")
    return v


def _bool(name: str, v: Any) -> bool:
    if not isinstance(v, bool | np.bool_):
        raise TypeError(f"{name}: expected a bool, got {type(v).__name__} {v!r}")
    return bool(v)


class Engine(EngineControl):
    """Continuous-batching LLM engine; see the module docstring for the step and ``stats()`` for its counters."""

    def __init__(
        self,
        model: TinyGPT,
        *,
        block_size: int = 16,
        num_blocks: int | None = None,
        max_num_batched_tokens: int = 256,
        max_num_seqs: int = 32,
        policy: str = "fcfs",
        preemption: str = "recompute",
        enable_prefix_caching: bool = True,
        chunked_prefill: bool = True,
        kv_dtype: str = "float32",
        max_waiting: int | None = None,
        host_store: Any = None,
        tokenizer: Any = None,
        eos_token_id: int | None = None,
        draft_model: TinyGPT | None = None,
        kv_budget_blocks: int | None = None,
        admission: Any = None,
        kv_token_budget: int | None = None,
        kv_evict_recent: int | None = None,
    ) -> None:
        if not isinstance(model, TinyGPT):
            raise TypeError(f"model: expected a TinyGPT, got {type(model).__name__}")
        c = self.config = model.config
        self.model = model
        self.block_size = _int_arg("block_size", block_size, 1)
        self.max_num_batched_tokens = _int_arg("max_num_batched_tokens", max_num_batched_tokens, 1)
        self.max_num_seqs = _int_arg("max_num_seqs", max_num_seqs, 1)
        if num_blocks is None:  # default: every running sequence can reach the full context
            num_blocks = self.max_num_seqs * blocks_needed(c.max_seq_len, self.block_size)
        self.num_blocks = _int_arg("num_blocks", num_blocks, 1)
        self.policy = _choice("policy", policy, POLICIES)
        self.preemption = _choice("preemption", preemption, PREEMPTION)
        self.enable_prefix_caching = _bool("enable_prefix_caching", enable_prefix_caching)
        self.chunked_prefill = _bool("chunked_prefill", chunked_prefill)
        kv_dtype = _choice("kv_dtype", kv_dtype, ("float32", "int8", "fp8_e4m3"))
        self.max_waiting = _int_arg("max_waiting", max_waiting, 1, optional=True)
        if tokenizer is not None and not all(hasattr(tokenizer, a) for a in ("encode", "decode")):
            raise TypeError(f"tokenizer: expected an object with encode/decode, got {type(tokenizer).__name__}")
        self.tokenizer = tokenizer
        if eos_token_id is None and tokenizer is not None:
            eos_token_id = getattr(tokenizer, "eos_token_id", None)
        self.eos_token_id = _int_arg("eos_token_id", eos_token_id, 0, optional=True)
        if self.eos_token_id is not None and self.eos_token_id >= c.vocab_size:
            raise ValueError(f"eos_token_id: must be < vocab_size={c.vocab_size}, got {eos_token_id}")
        if draft_model is not None:
            if not isinstance(draft_model, TinyGPT):
                raise TypeError(f"draft_model: expected a TinyGPT, got {type(draft_model).__name__}")
            if draft_model.config.vocab_size != c.vocab_size:
                raise ValueError(
                    f"draft_model: vocab_size {draft_model.config.vocab_size} != the model's {c.vocab_size}"
                )
        self.draft_model = draft_model
        self._init_control(kv_budget_blocks, admission, kv_token_budget, kv_evict_recent)
        for name in ("put", "get", "pop", "discard", "prefetch", "__contains__", "stats"):
            if host_store is not None and not hasattr(host_store, name):
                raise TypeError(f"host_store: expected a TieredKVStore-like object with {name}(), got {host_store!r}")
        self.bm = BlockManager(
            c.n_layers,
            c.kv_heads,
            c.head_dim,
            self.num_blocks,
            self.block_size,
            kv_dtype,
            self.enable_prefix_caching,
            host_store,
        )
        self.runner = ModelRunner(model, self.bm.cache)
        self.host_block_shape, self.host_block_dtype = self.bm.host_block_shape, self.bm.host_block_dtype
        self.scheduler = Scheduler(
            self.bm,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
            policy=self.policy,
            preemption=self.preemption,
            chunked_prefill=self.chunked_prefill,
            spec_k=self._spec_k,
        )
        self.seqs: dict[str, Sequence] = {}
        self._pending: list[RequestOutput] = []
        self._ids = itertools.count()
        self.step_log: list[dict[str, Any]] = []
        self.num_steps = self.tokens_generated = self.aborted = 0
        self.spec_proposed = self.spec_accepted = 0

    # -- requests -------------------------------------------------------------------------------------------
    def _prompt_ids(self, prompt: Any) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise TypeError("prompt: a str prompt needs the engine's tokenizer (Engine(..., tokenizer=...))")
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, list | tuple) or (isinstance(prompt, np.ndarray) and prompt.ndim == 1):
            ids = list(prompt)
        else:
            got = f"an array of shape {prompt.shape}" if isinstance(prompt, np.ndarray) else type(prompt).__name__
            raise TypeError(f"prompt: expected a list (or 1-d array) of token ids or a str, got {got}")
        if not ids:
            raise ValueError(f"prompt: must hold at least one token, got {prompt!r}")
        vocab = self.config.vocab_size
        for t in ids:
            if isinstance(t, bool | np.bool_) or not isinstance(t, int | np.integer):
                raise TypeError(f"prompt: token ids must be ints, got {type(t).__name__} {t!r}")
            if not 0 <= t < vocab:
                raise ValueError(f"prompt: token id {t} outside the vocabulary [0, {vocab})")
        return [int(t) for t in ids]

    def add_request(
        self,
        prompt: list[int] | str,
        params: SamplingParams | None = None,
        *,
        request_id: str | None = None,
        priority: int = 0,
        deadline_s: float | None = None,
    ) -> str:
        """Queue a request; returns its id. EngineFull when ``max_waiting`` requests already wait."""
        ids = self._prompt_ids(prompt)
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params: expected a SamplingParams, got {type(params).__name__}")
        if request_id is None:
            request_id = f"req-{next(self._ids)}"
            while request_id in self.seqs:
                request_id = f"req-{next(self._ids)}"
        if not isinstance(request_id, str):
            raise TypeError(f"request_id: expected a str, got {type(request_id).__name__} {request_id!r}")
        if request_id in self.seqs:
            raise ValueError(f"request_id: {request_id!r} is already in use by an unfinished request")
        if isinstance(priority, bool) or not isinstance(priority, int | np.integer):
            raise TypeError(f"priority: expected an int, got {type(priority).__name__} {priority!r}")
        if deadline_s is not None and (
            isinstance(deadline_s, bool)
            or not isinstance(deadline_s, int | float | np.integer | np.floating)
            or not np.isfinite(deadline_s)
            or deadline_s < 0
        ):
            raise ValueError(f"deadline_s: expected a finite number of seconds >= 0 or None, got {deadline_s!r}")
        m = self.config.max_seq_len
        if len(ids) + 1 > m:
            raise ValueError(f"prompt: {len(ids)} tokens + 1 generated exceed the context max_seq_len={m}")
        if blocks_needed(len(ids) + 1, self.block_size) > self.num_blocks:
            raise ValueError(
                f"prompt: {len(ids)} tokens need more than the whole KV pool ({self.num_blocks} blocks of "
                f"{self.block_size} tokens)"
            )
        if not self.chunked_prefill and len(ids) > self.max_num_batched_tokens:
            raise ValueError(
                f"prompt: {len(ids)} tokens exceed max_num_batched_tokens={self.max_num_batched_tokens} and "
                "chunked_prefill is off"
            )
        if params.stop and self.tokenizer is None:
            raise ValueError(f"stop: stop strings {params.stop!r} need the engine's tokenizer")
        if params.speculative and self.draft_model is None:
            raise ValueError(f"speculative: {params.speculative} draft tokens need Engine(..., draft_model=...)")
        if self.max_waiting is not None and len(self.scheduler.waiting) >= self.max_waiting:
            raise EngineFull(
                f"waiting queue full: {len(self.scheduler.waiting)} requests wait (max_waiting={self.max_waiting})",
                retry_after_s=self._retry_after(),
            )
        self._admit(ids, params)
        now = time.perf_counter()
        seq = Sequence(request_id, ids, params, now, int(priority), None if deadline_s is None else now + deadline_s)
        self.seqs[request_id] = seq
        self.scheduler.waiting.append(seq)
        return request_id

    def _retry_after(self) -> float:
        recent = self.step_log[-20:]
        step = float(np.mean([s["duration_s"] for s in recent])) if recent else 0.05
        return max(0.05, step * len(self.scheduler.waiting) / max(1, self.max_num_seqs))

    def abort(self, request_id: str) -> bool:
        """Cancel a request: its KV blocks are freed now; the next step returns it with finish_reason "abort"."""
        seq = self.seqs.get(request_id)
        if seq is None:
            return False
        self.scheduler.remove(seq)
        self.bm.register(seq)
        self._finish(seq, "abort")
        self.aborted += 1
        self._pending.append(self._output(seq, []))
        return True

    def has_unfinished(self) -> bool:
        return bool(self.seqs) or bool(self._pending)

    # -- the step -------------------------------------------------------------------------------------------
    def _spec_k(self, seq: Sequence) -> int:
        k = seq.params.speculative
        if not k or self.draft_model is None:
            return 0
        room = min(self.config.max_seq_len, self.draft_model.config.max_seq_len) - len(seq.tokens)
        return max(0, min(k, seq.params.max_tokens - len(seq.output) - 1, room))

    def _dist(self, logits: np.ndarray, p: SamplingParams) -> np.ndarray:
        return logits if p.temperature == 0 else filter_probs(logits, p.temperature, p.top_k, p.top_p)

    def _draft(self, seq: Sequence, k: int) -> tuple[list[int], list[np.ndarray]]:
        """k draft tokens from the draft model (its own dense KV cache, rolled back to the accepted tokens)."""
        if seq.draft is None:
            seq.draft = open_session(self.draft_model, True)
        sd, ctx = seq.draft, seq.tokens
        if sd.length > len(ctx) - 1:
            sd.truncate(len(ctx) - 1)
        if sd.length < len(ctx) - 1:
            sd.extend(ctx[sd.length : len(ctx) - 1])
        ql = sd.extend([ctx[-1]])[-1]
        drafts, qs = [], []
        for i in range(k):
            q = self._dist(ql, seq.params)
            x = int(np.argmax(q)) if seq.params.temperature == 0 else sample_from(q, seq.rng)
            drafts.append(x)
            qs.append(q)
            if i < k - 1:
                ql = sd.extend([x])[-1]
        return drafts, qs

    def _verify(self, seq: Sequence, drafts: list[int], qs: list[np.ndarray], pl: np.ndarray) -> list[int]:
        """Accept/reject as tinylearn.inference.speculative: the emitted tokens (accepted drafts + one more)."""
        p, greedy = seq.params, seq.params.temperature == 0
        n_acc, new = 0, None
        for i, x in enumerate(drafts):
            dist = self._dist(pl[i], p)
            ok = (
                int(np.argmax(dist)) == x if greedy else accept_draft(float(dist[x]), float(qs[i][x]), seq.rng.random())
            )
            if not ok:
                new = int(np.argmax(dist)) if greedy else sample_from(residual_distribution(dist, qs[i]), seq.rng)
                break
            n_acc += 1
        if new is None:
            new = choose(pl[len(drafts)], p.temperature, p.top_k, p.top_p, seq.rng)
        self.spec_proposed += len(drafts)
        self.spec_accepted += n_acc
        self.bm.truncate(seq, seq.num_computed - len(drafts) + n_acc)
        return drafts[:n_acc] + [new]

    def step(self) -> list[RequestOutput]:
        """One scheduler iteration: schedule, one batched forward, sample, stream the outputs."""
        t0 = time.perf_counter()
        outputs, self._pending = self._pending, []
        sched = self.scheduler.schedule()
        for seq in sched.kv_full:
            self._finish(seq, "length")
            outputs.append(self._output(seq, []))
        items, drafts = [], {}
        for s in sched.scheduled:
            seq, start = s.seq, s.seq.num_computed
            if self.kv_token_budget is not None:
                self.runner.capture.add(seq.cache_id)
            if s.spec:
                drafts[id(seq)] = self._draft(seq, s.spec)
                toks = [seq.tokens[-1], *drafts[id(seq)][0]]
            else:
                toks = seq.tokens[start : start + s.n]
            reaches_end = start + s.n == len(seq.tokens) + s.spec
            n_logits = (s.spec + 1) if reaches_end else 0
            items.append(BatchItem(seq.cache_id, start - seq.kv_evicted, toks, n_logits, pos_start=start))
        logits = self.runner.forward(items)
        n_prefill = n_decode = n_prefill_seqs = kv_tokens = 0
        for s, it, lg in zip(sched.scheduled, items, logits):
            seq = s.seq
            decoding = seq.prefilled
            n_decode += s.n if decoding else 0
            n_prefill += 0 if decoding else s.n
            n_prefill_seqs += not decoding
            kv_tokens += seq.num_computed - seq.kv_evicted + s.n
            seq.num_computed += s.n
            new: list[int] = []
            if it.n_logits:
                seq.prefilled = True
                toks = (
                    self._verify(seq, *drafts[id(seq)], lg)
                    if s.spec
                    else [choose(lg[-1], seq.params.temperature, seq.params.top_k, seq.params.top_p, seq.rng)]
                )
                for tok in toks:
                    new.append(tok)
                    if self._append(seq, tok):
                        break
            self.bm.register(seq)
            if seq.finish_reason is not None:
                self.scheduler.remove(seq)
                self._finish(seq, seq.finish_reason)
            elif self.kv_token_budget is not None:
                self._evict(seq)
            if new or seq.finish_reason is not None:
                outputs.append(self._output(seq, new))
        self.runner.capture.clear()
        self.runner.last_q.clear()
        self.num_steps += 1
        self.step_log.append(
            dict(
                t=t0,
                duration_s=time.perf_counter() - t0,
                num_prefill_tokens=n_prefill,
                num_decode_tokens=n_decode,
                num_seqs=len(items),
                kv_tokens=kv_tokens,
                num_prefill_seqs=n_prefill_seqs,
            )
        )
        return outputs

    def _append(self, seq: Sequence, tok: int) -> bool:
        """Add a sampled token and run the stop checks; True when the request finished."""
        seq.tokens.append(int(tok))
        self.tokens_generated += 1
        if seq.first_token_s is None:
            seq.first_token_s = time.perf_counter()
        p, out = seq.params, seq.output
        reason = None
        if self.tokenizer is not None:
            seq.text = self.tokenizer.decode(out)
            cuts = [i for i in (seq.text.find(s) for s in p.stop) if i >= 0]
            if cuts:
                seq.text, reason = seq.text[: min(cuts)], "stop"
        if reason is None and self.eos_token_id is not None and tok == self.eos_token_id and not p.ignore_eos:
            reason = "stop"
        elif reason is None and (len(out) >= p.max_tokens or len(seq.tokens) >= self.config.max_seq_len):
            reason = "length"
        seq.finish_reason = reason
        return reason is not None

    def _finish(self, seq: Sequence, reason: str) -> None:
        self.bm.free(seq)
        seq.finish_reason, seq.finish_s, seq.draft = reason, time.perf_counter(), None
        self.seqs.pop(seq.request_id, None)

    def _output(self, seq: Sequence, new: list[int]) -> RequestOutput:
        done = seq.finish_reason is not None
        metrics = dict(
            arrival_s=seq.arrival_s,
            first_token_s=seq.first_token_s,
            finish_s=seq.finish_s,
            prefix_hit_tokens=seq.prefix_hit_tokens,
            num_preemptions=seq.num_preemptions,
        )
        return RequestOutput(
            seq.request_id, len(seq.prompt), list(new), list(seq.output), done, seq.finish_reason, seq.text, metrics
        )

    # -- offline and introspection --------------------------------------------------------------------------
    def generate(
        self, prompts: Any, params: SamplingParams | list[SamplingParams] | None = None
    ) -> list[RequestOutput]:
        """Offline batch: add every prompt, step until all finish; the final RequestOutput of each, in input order."""
        if isinstance(prompts, str) or (isinstance(prompts, list | tuple) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if not isinstance(prompts, list | tuple) or not prompts:
            raise ValueError(f"prompts: expected a non-empty list of prompts, got {prompts!r}")
        plist = list(params) if isinstance(params, list | tuple) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"params: {len(plist)} SamplingParams for {len(prompts)} prompts")
        rids = [self.add_request(p, sp) for p, sp in zip(prompts, plist)]
        final: dict[str, RequestOutput] = {}
        while any(r not in final for r in rids):
            for out in self.step():
                if out.finished:
                    final[out.request_id] = out
        return [final[r] for r in rids]

    def stats(self) -> dict[str, Any]:
        cs, sch = self.bm.cache.stats(), self.scheduler
        used = self.bm.used_blocks
        return dict(
            waiting=len(sch.waiting),
            running=len(sch.running),
            swapped=len(sch.swapped),
            kv_blocks_used=used,
            kv_blocks_cached=cs["cached_blocks"],
            kv_blocks_total=self.num_blocks,
            kv_usage=(used - cs["cached_blocks"]) / self.num_blocks,
            prefix_queried_tokens=cs["prefix_lookup_tokens"],
            prefix_hit_tokens=cs["prefix_hit_tokens"],
            prefix_hit_rate=cs["prefix_hit_rate"],
            prefix_evictions=cs["prefix_evictions"],
            preemptions_recompute=sch.preemptions["recompute"],
            preemptions_swap=sch.preemptions["swap"],
            swapped_blocks_out=self.bm.swapped_blocks_out,
            swapped_blocks_in=self.bm.swapped_blocks_in,
            num_steps=self.num_steps,
            tokens_generated=self.tokens_generated,
            aborted=self.aborted,
            spec_proposed=self.spec_proposed,
            spec_accepted=self.spec_accepted,
            kv_claimed_blocks=self.kv_claimed_blocks(),
            kv_evicted_tokens=self.kv_evicted_tokens,
            rejected_kv_budget=self.rejected["kv_budget"],
            rejected_slo=self.rejected["slo"],
        )

    def check_invariants(self) -> None:
        """RuntimeError naming the broken invariant (block ownership, refcounts, free + used == total, queues)."""
        sch = self.scheduler
        queued = sch.waiting + sch.running + sch.swapped
        if len({id(s) for s in queued}) != len(queued) or {s.request_id for s in queued} != set(self.seqs):
            raise RuntimeError("invariant 'each unfinished request is in exactly one queue' broken")
        for s in sch.waiting:
            if s.cache_id is not None or s.swapped_blocks:
                raise RuntimeError(f"invariant 'waiting requests hold no KV blocks' broken for {s.request_id}")
        self.bm.check(sch.running, sch.swapped)
