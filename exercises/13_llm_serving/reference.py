"""Reference answers for exercises/13_llm_serving: thin adapters onto tinylearn.serve's Scheduler and BlockManager
and tinylearn.inference's PagedKVCache (the dict requests of the exercises become the engine's Sequences)."""

from __future__ import annotations

from typing import Any

from tinylearn.inference.paged_cache import PagedKVCache
from tinylearn.inference.paged_math import blocks_needed
from tinylearn.serve.block_manager import BlockManager
from tinylearn.serve.scheduler import Scheduler, Sequence
from tinylearn.serve.types import SamplingParams


def _seq(r: dict[str, Any], order: int) -> Sequence:
    s = Sequence(str(r["id"]), [0] * int(r["num_tokens"]), SamplingParams(temperature=0.0), 0.0)
    s.arrival_idx = order  # the policy order given by the caller (fcfs key)
    return s


def _scheduler(n_blocks: int, block_size: int, budget: int, max_num_seqs: int, chunked: bool) -> Scheduler:
    bm = BlockManager(1, 1, 1, max(1, n_blocks), block_size, "float32", enable_prefix_caching=False)
    return Scheduler(
        bm,
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
        policy="fcfs",
        preemption="recompute",
        chunked_prefill=chunked,
    )


def schedule_step(
    running: list[dict[str, Any]],
    waiting: list[dict[str, Any]],
    *,
    budget: int,
    max_num_seqs: int,
    free_blocks: int,
    block_size: int,
    chunked_prefill: bool = True,
) -> dict[str, list]:
    held = sum(blocks_needed(int(r["num_computed"]), block_size) for r in running)
    sch = _scheduler(held + free_blocks, block_size, budget, max_num_seqs, chunked_prefill)
    for i, r in enumerate(running):
        s = _seq(r, i)
        s.num_computed, s.prefilled = int(r["num_computed"]), bool(r["decoding"])
        s.cache_id = sch.bm.cache.new_sequence()
        sch.bm.reserve(s, s.num_computed)
        sch.running.append(s)
    for i, r in enumerate(waiting):
        sch.waiting.append(_seq(r, len(running) + i))
    out = sch.schedule()
    return {
        "scheduled": [(s.seq.request_id, s.n) for s in out.scheduled],
        "preempted": [s.request_id for s in out.preempted],
    }


def block_hashes(token_ids: list[int], block_size: int) -> list[int]:
    cache = PagedKVCache(1, 1, 1, 1, block_size)
    ids = list(token_ids)
    return [h for h, _ in cache._block_hashes(ids, len(ids) // block_size)]


def longest_cached_prefix(token_ids: list[int], index: dict[int, tuple[int, ...]], block_size: int) -> int:
    cache = PagedKVCache(1, 1, 1, 1, block_size)
    cache._prefix_index = {h: (0, tuple(toks)) for h, toks in index.items()}
    try:
        return len(cache.lookup_prefix(list(token_ids))) * block_size
    except ValueError as e:
        raise ValueError(f"token_ids: {e}") from None


def chunked_prefill_plan(
    prompt_lens: list[int], budget: int, running_decodes: int
) -> tuple[list[list[tuple[int, int]]], list[int]]:
    # at least one prefill token per step, so no sequence grows past max prompt + sum(prompts) + 2 tokens
    n_tok, bs = max([1, *prompt_lens]) + sum(prompt_lens) + 2, 64
    sch = _scheduler((running_decodes + len(prompt_lens)) * blocks_needed(n_tok, bs), bs, budget, 1 << 30, True)
    for i in range(running_decodes):  # decoding all along: one token left to compute, never finishing
        s = _seq({"id": f"d{i}", "num_tokens": 2}, i)
        s.num_computed, s.prefilled = 1, True
        s.cache_id = sch.bm.cache.new_sequence()
        sch.bm.reserve(s, 1)
        sch.running.append(s)
    prompts = [_seq({"id": str(i), "num_tokens": n}, running_decodes + i) for i, n in enumerate(prompt_lens)]
    sch.waiting.extend(prompts)
    steps: list[list[tuple[int, int]]] = []
    ttft: list[int | None] = [None] * len(prompts)
    while any(t is None for t in ttft):
        out = sch.schedule()
        chunks = [(int(s.seq.request_id), s.n) for s in out.scheduled if not s.seq.prefilled]
        if not chunks:
            raise ValueError(f"budget: {budget} tokens are all taken by the decodes; a prompt would wait forever")
        steps.append(chunks)
        for s in out.scheduled:
            s.seq.num_computed += s.n
            if s.seq.num_computed == len(s.seq.tokens):  # the step's last position: a new token comes out
                if not s.seq.prefilled:
                    ttft[int(s.seq.request_id)] = len(steps)
                s.seq.prefilled = True
                s.seq.tokens.append(0)
    return steps, [int(t) for t in ttft if t is not None]
