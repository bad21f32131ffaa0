"""Exercises for notebook 13 (LLM serving). Replace each ``raise NotImplementedError`` with your code, then run

    pytest exercises/13_llm_serving                  # your answers
    pytest exercises/13_llm_serving --impl=reference

Requests are plain dicts here, not the engine's objects:

    {"id": str, "num_tokens": int, "num_computed": int}            a waiting request (num_computed is 0)
    {"id": str, "num_tokens": int, "num_computed": int, "decoding": bool}   a running request

``num_tokens`` = prompt + generated tokens so far; the KV of ``tokens[:num_computed]`` is computed. A decoding request
has ``num_tokens - num_computed == 1`` (its last sampled token is its next input); a running request still in
(chunked) prefill has ``decoding=False``. A running request holds ``ceil(num_computed / block_size)`` KV blocks.

Each stub's NotImplementedError names the library function its reference answer (reference.py) calls.
"""

from __future__ import annotations

from typing import Any


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
    """One continuous-batching scheduler step (vLLM's order, no prefix caching, preemption by recompute).

    ``running`` and ``waiting`` are each in policy order (first = highest priority). Return
    ``{"scheduled": [(id, n_tokens), ...] in the order they were scheduled, "preempted": [id, ...]}``.

    1. Running requests, decoding ones first (stable: keep the policy order within each group). Stop when the
       budget is 0 or ``max_num_seqs`` requests are scheduled. A request's next work is ``remaining = num_tokens -
       num_computed`` tokens: a decode (remaining 1) takes 1 token; a prefill takes ``min(remaining, budget)`` with
       chunked prefill, else all ``remaining`` if it fits the budget (else it is skipped this step) -- except that a
       prefill longer than the WHOLE per-step budget is always chunked. Growing to ``num_computed + n`` tokens needs
       ``ceil((num_computed + n) / block_size) - held`` new blocks. While too few are free, preempt the running
       request that is LAST in policy order among those not scheduled yet (not the request itself): its blocks
       become free, it is not scheduled. With no such victim, the request preempts itself. Each scheduled request
       uses ``n`` tokens of the budget and its new blocks.
    2. If anything was preempted in this step, stop here (admitting new work now would thrash).
    3. Waiting requests, in order, while budget > 0 and fewer than ``max_num_seqs`` requests are running (those
       running now, scheduled or not, plus the admitted ones): ``n`` as for a prefill above (its ``remaining`` is
       ``num_tokens``); stop at the first that gets ``n == 0`` or whose ``ceil(n / block_size)`` blocks are not
       free (head of line: nobody behind it jumps the queue).

    Inputs satisfy ``ceil(num_tokens / block_size) <= free_blocks + blocks held by all running`` for every
    request (any one request fits the pool alone).
    """
    raise NotImplementedError("reference solution: tinylearn/serve/scheduler.py:Scheduler.schedule")


def block_hashes(token_ids: list[int], block_size: int) -> list[int]:
    """Chained hashes of the FULL blocks of ``token_ids``: ``h_i = hash((h_{i-1}, tuple(tokens of block i)))``
    with ``h_{-1} = 0`` (Python's built-in ``hash``; ints and tuples of ints hash the same in every process).
    A partial last block has no hash. Because each hash folds in the previous one, equal hashes mean equal
    prefixes, not just equal blocks."""
    raise NotImplementedError("reference solution: tinylearn/inference/paged_cache.py:PagedKVCache._block_hashes")


def longest_cached_prefix(token_ids: list[int], index: dict[int, tuple[int, ...]], block_size: int) -> int:
    """How many leading tokens of ``token_ids`` a prefix cache can serve: ``index`` maps a chained block hash
    (``block_hashes``) to that block's token ids. Walk the full blocks from the start while each block's hash is in
    the index AND its stored tokens equal the block's tokens (a hash collision must not share wrong KV); stop at
    the first miss. Full blocks only, and at least one token is left uncached (the model needs the logits of the
    last prompt token), so only the first ``(len(token_ids) - 1) // block_size`` blocks can hit. Returns the number
    of cached tokens (a multiple of ``block_size``). ValueError naming ``token_ids`` when it is empty."""
    raise NotImplementedError("reference solution: tinylearn/inference/paged_cache.py:PagedKVCache.lookup_prefix")


def chunked_prefill_plan(
    prompt_lens: list[int], budget: int, running_decodes: int
) -> tuple[list[list[tuple[int, int]]], list[int]]:
    """Chunked prefill of ``prompt_lens`` (all waiting at step 1, first come first served) next to
    ``running_decodes`` requests that decode all along and never finish.

    Each step: every decoding request takes 1 token of ``budget`` first -- the running decodes, plus every prompt
    whose prefill completed in an EARLIER step (it produced its first token then, and decodes from the next step
    on). The rest of the budget goes to the prompts in order, each taking ``min(tokens it has left, budget left)``.
    Returns ``(steps, ttft)``: ``steps[s]`` = the ``(prompt index, chunk tokens)`` pairs of step s + 1 (prefill
    chunks only, in order), until every prompt is prefilled; ``ttft[i]`` = the 1-based step whose chunk completes
    prompt i (its first token comes out of that step). No limit on sequences or KV blocks. ValueError naming
    ``budget`` when the decodes take the whole budget while a prompt still waits (it would never be scheduled).
    """
    raise NotImplementedError("reference solution: tinylearn/serve/scheduler.py:Scheduler.schedule (stepped)")
