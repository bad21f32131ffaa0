"""Scheduler: which requests run in the next engine step, under a token budget (vLLM's continuous batching).

Three queues of ``Sequence``: waiting (not started, or preempted by recompute), running (own device KV blocks),
swapped (preempted by swap: KV in the host store). One ``schedule()``:

    1. running, in policy order, decodes before unfinished prefill chunks: each gets its next token (or k + 1 with
       speculative decoding, or a chunk of min(remaining prompt, budget) with chunked prefill). Its blocks are
       reserved; when too few are free, the running request LAST in policy order (lowest priority / latest) that
       is not scheduled yet is preempted -- "recompute": blocks freed, the request goes to the FRONT of waiting
       with prompt + generated tokens to prefill again (its cached prefix blocks may still be hit); "swap": blocks
       copied to the host store and freed. With no other victim a request preempts itself; a request that is
       alone and still cannot grow has filled the whole KV pool and finishes with "length".
    2. swapped requests come back (swap-in) while blocks, budget and max_num_seqs allow -- not in a step that
       just preempted (it would thrash).
    3. waiting requests are admitted in policy order (preempted ones first) while the budget, max_num_seqs and
       the free blocks allow: the prefix cache is probed first, so only the uncached tail is computed and only
       its blocks must be free. Without chunked prefill a prompt that does not fit the remaining budget waits
       (head of line); with it, the prompt is split into chunks over several steps.
Budget: every scheduled token (prefill chunk tokens + decode tokens) counts against ``max_num_batched_tokens``;
at most ``max_num_seqs`` sequences run. Policies order a queue by a key: fcfs (arrival), spf (prompt length,
then arrival), priority (higher ``priority`` first, then arrival), edf (absolute deadline, then arrival).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..inference.paged_math import blocks_needed
from .types import SamplingParams

POLICIES = ("fcfs", "spf", "edf", "priority")
PREEMPTION = ("recompute", "swap")
_arrivals = itertools.count()


@dataclass(eq=False)
class Sequence:
    """One request's state. ``tokens`` = prompt + generated; KV is computed for tokens[:num_computed]."""

    request_id: str
    prompt: list[int]
    params: SamplingParams
    arrival_s: float
    priority: int = 0
    deadline_s: float | None = None  # absolute (perf_counter) deadline
    tokens: list[int] = field(default_factory=list)
    cache_id: int | None = None
    num_computed: int = 0
    kv_evicted: int = 0  # tokens dropped by token-priority eviction: the cache holds num_computed - kv_evicted
    kv_kept_pos: Any = None  # positions of the tokens kept at the last eviction (then kv_kept_until.. follow)
    kv_kept_until: int = 0
    registered_blocks: int = 0
    swapped_blocks: list[str] = field(default_factory=list)
    resumed: bool = False
    prefilled: bool = False  # its prompt (or recompute prefix) is computed: it decodes now
    num_preemptions: int = 0
    prefix_hit_tokens: int = 0
    first_token_s: float | None = None
    finish_s: float | None = None
    finish_reason: str | None = None
    text: str = ""
    rng: Any = None
    draft: Any = None  # the draft model's session (speculative decoding)
    arrival_idx: int = field(default_factory=lambda: next(_arrivals))

    def __post_init__(self) -> None:
        self.tokens = list(self.prompt)
        self.rng = np.random.default_rng(self.params.seed)

    @property
    def output(self) -> list[int]:
        return self.tokens[len(self.prompt) :]


@dataclass
class Scheduled:
    """A sequence's work in one step: ``n`` tokens from ``seq.num_computed``; ``spec`` draft tokens among them."""

    seq: Sequence
    n: int
    spec: int = 0


@dataclass
class SchedulerOutput:
    scheduled: list[Scheduled]
    preempted: list[Sequence]
    kv_full: list[Sequence]  # alone and still out of blocks: finish with "length"


class Scheduler:
    """See the module docstring. ``spec_k(seq)`` -> draft tokens wanted for a decoding sequence (0 = plain)."""

    def __init__(
        self,
        block_manager: Any,
        *,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        policy: str,
        preemption: str,
        chunked_prefill: bool,
        spec_k: Callable[[Sequence], int] | None = None,
    ) -> None:
        self.bm = block_manager
        self.max_tokens, self.max_seqs = max_num_batched_tokens, max_num_seqs
        self.policy, self.preemption, self.chunked = policy, preemption, chunked_prefill
        self.spec_k = spec_k or (lambda seq: 0)
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.swapped: list[Sequence] = []
        self.preemptions = {"recompute": 0, "swap": 0}

    def key(self, s: Sequence) -> tuple:
        if self.policy == "spf":
            return (len(s.prompt), s.arrival_idx)
        if self.policy == "priority":
            return (-s.priority, s.arrival_idx)
        if self.policy == "edf":
            return (np.inf if s.deadline_s is None else s.deadline_s, s.arrival_idx)
        return (s.arrival_idx,)

    def remove(self, seq: Sequence) -> None:
        for q in (self.waiting, self.running, self.swapped):
            if seq in q:
                q.remove(seq)

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        seq.num_preemptions += 1
        self.preemptions[self.preemption] += 1
        out.preempted.append(seq)
        if self.preemption == "swap":
            self.bm.swap_out(seq)
            self.swapped.append(seq)
        else:
            self.bm.free(seq)
            seq.num_computed, seq.resumed, seq.prefilled = 0, True, False
            seq.kv_evicted, seq.kv_kept_pos, seq.kv_kept_until = 0, None, 0
            self.waiting.insert(0, seq)

    def _chunk(self, seq: Sequence, budget: int) -> tuple[int, int]:
        """(tokens, draft tokens) the sequence would compute now; tokens 0 = it cannot run in this budget."""
        remaining = len(seq.tokens) - seq.num_computed
        if remaining == 1:
            k = min(self.spec_k(seq), budget - 1)
            return (1 + k, k) if budget >= 1 else (0, 0)
        if self.chunked or remaining > self.max_tokens:  # a recompute prefix longer than the budget is chunked
            return min(remaining, budget), 0
        return (remaining, 0) if remaining <= budget else (0, 0)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput([], [], [])
        budget, done = self.max_tokens, set()
        self.running.sort(key=self.key)
        order = sorted(self.running, key=lambda s: not s.prefilled)  # decodes first (stable)
        for seq in order:
            if seq not in self.running:
                continue  # preempted as a victim in this step
            if budget == 0 or len(out.scheduled) >= self.max_seqs:
                break
            n, spec = self._chunk(seq, budget)
            if n == 0:
                continue
            end = seq.num_computed + n
            while self.bm.blocks_to_grow(seq, end) > self.bm.free_blocks:
                victims = [s for s in self.running if s is not seq and id(s) not in done]
                if victims:
                    self._preempt(victims[-1], out)
                elif len(self.running) == 1:
                    self.running.remove(seq)
                    out.kv_full.append(seq)
                    break
                else:
                    self._preempt(seq, out)
                    break
            if seq not in self.running:
                continue
            self.bm.reserve(seq, end)
            out.scheduled.append(Scheduled(seq, n, spec))
            done.add(id(seq))
            budget -= n
        if out.preempted:
            return out
        self.swapped.sort(key=self.key)
        for seq in list(self.swapped):
            if budget == 0 or len(out.scheduled) >= self.max_seqs or len(self.running) >= self.max_seqs:
                break
            n, spec = self._chunk(seq, budget)
            grow = blocks_needed(seq.num_computed - seq.kv_evicted + n, self.bm.block_size) - len(seq.swapped_blocks)
            if n == 0 or len(seq.swapped_blocks) + grow > self.bm.free_blocks:
                self.bm.host.prefetch(seq.swapped_blocks)  # next in line: warm its blocks in the host tiers
                break
            self.bm.swap_in(seq)
            self.swapped.remove(seq)
            self.running.append(seq)
            self.bm.reserve(seq, seq.num_computed + n)
            out.scheduled.append(Scheduled(seq, n, spec))
            budget -= n
        if self.swapped:
            return out
        self.waiting.sort(key=lambda s: (not s.resumed, self.key(s)))
        for seq in list(self.waiting):
            if budget == 0 or len(out.scheduled) >= self.max_seqs or len(self.running) >= self.max_seqs:
                break
            if blocks_needed(len(seq.tokens), self.bm.block_size) > self.bm.num_blocks:
                self.waiting.remove(seq)  # a recompute prefix that outgrew the whole pool can never run again
                out.kv_full.append(seq)
                continue
            hit, n_table, revived = self.bm.probe(seq)
            remaining = len(seq.tokens) - hit
            if self.chunked or remaining > self.max_tokens:
                n = min(remaining, budget)
            else:
                n = remaining if remaining <= budget else 0
            if n == 0:
                break
            need = blocks_needed(hit + n, self.bm.block_size) - n_table + revived
            if need > self.bm.free_blocks:
                break
            seq.prefix_hit_tokens += self.bm.admit(seq)
            self.bm.reserve(seq, seq.num_computed + n)
            self.waiting.remove(seq)
            self.running.append(seq)
            seq.resumed = False
            out.scheduled.append(Scheduled(seq, n))
            budget -= n
        return out
