"""The Engine's admission control and token-priority eviction (a mixin of ``tinylearn.serve.engine.Engine``).

Admission control (``add_request``, before a request is queued; a rejection is ``AdmissionRejected`` with a reason and
a Retry-After estimate, which the server answers with 429 / 503):
    ``kv_budget_blocks=B``  each unfinished request holds a claim on its WORST-CASE KV blocks,
                            ceil(min(prompt + max_tokens, max_seq_len) / block_size); a request whose claim does not
                            fit B minus the claims already held is rejected ("kv_budget"). With B <= num_blocks the
                            admitted requests can always grow to their end, so the pool never runs dry and nothing
                            is preempted (claims ignore prefix sharing: conservative). A claim alone larger than B is
                            a ValueError naming max_tokens (it could never be admitted).
    ``admission=AdmissionController(StepCostModel, ttft_slo_s, tpot_slo_s)``  the latency MODEL (latency.py) is asked
                            with the engine's live state (``engine_state()``): running decodes, their KV tokens, the
                            prefill tokens queued ahead, the token budget; a predicted TTFT or TPOT beyond its SLO
                            rejects the request ("slo") with the model's numbers in the message.
Token-priority eviction for long contexts (``kv_token_budget=B``, ``kv_evict_recent=R``): after a step, a sequence
whose cache holds more than B tokens keeps the last R tokens and, up to B - block_size (hysteresis: the re-pack runs
once per block of growth, not every step), the tokens with the most attention from its latest query summed over
layers and heads (``paged_math.attention_received`` + ``priority_keep``, H2O's heavy hitters, as notebook 09); the
rest are dropped with ``PagedKVCache.evict_tokens`` (kept tokens re-packed, their blocks freed). Positions keep
counting the dropped tokens. Between steps every sequence then holds at most B tokens of KV (within a step, B plus
the step's chunk). The outputs are APPROXIMATE once tokens are dropped (attention no longer sees them): the exact
greedy equality of engine.py holds only until a sequence first exceeds B. Needs enable_prefix_caching=False (an evicted
sequence's blocks no longer hold its token prefix).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..inference.paged_math import attention_received, blocks_needed, priority_keep
from .scheduler import Sequence
from .types import AdmissionRejected, SamplingParams


def _int_arg(name: str, v: Any, minimum: int, optional: bool = False) -> Any:
    if optional and v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | np.integer):
        raise TypeError(f"{name}: expected an int >= {minimum}, got {type(v).__name__} {v!r}")
    if v < minimum:
        raise ValueError(f"{name}: must be an int >= {minimum}, got {v!r}")
    return int(v)


class EngineControl:
    """Admission (``kv_budget_blocks``, ``admission``) and eviction (``kv_token_budget``, ``kv_evict_recent``) for
    the Engine; it uses the engine's config, block_size, num_blocks, seqs, scheduler, bm, runner and step_log."""

    config: Any
    block_size: int
    num_blocks: int
    max_num_batched_tokens: int
    enable_prefix_caching: bool
    seqs: dict[str, Sequence]
    scheduler: Any
    bm: Any
    runner: Any
    step_log: list[dict[str, Any]]
    _retry_after: Any

    def _init_control(
        self, kv_budget_blocks: int | None, admission: Any, kv_token_budget: int | None, kv_evict_recent: int | None
    ) -> None:
        self.kv_budget_blocks = _int_arg("kv_budget_blocks", kv_budget_blocks, 1, optional=True)
        if self.kv_budget_blocks is not None and self.kv_budget_blocks > self.num_blocks:
            raise ValueError(
                f"kv_budget_blocks: {kv_budget_blocks} exceeds the KV pool of num_blocks={self.num_blocks}; the budget "
                "is what admission may promise, at most the pool"
            )
        if admission is not None and not (hasattr(admission, "admit") and hasattr(admission, "predict")):
            got = type(admission).__name__
            raise TypeError(f"admission: expected an AdmissionController (admit/predict), got {got}")
        self.admission = admission
        self.kv_token_budget = _int_arg("kv_token_budget", kv_token_budget, 2, optional=True)
        self.kv_evict_recent = _int_arg("kv_evict_recent", kv_evict_recent, 1, optional=True)
        if self.kv_token_budget is None and self.kv_evict_recent is not None:
            raise ValueError(f"kv_evict_recent: {kv_evict_recent} given without kv_token_budget")
        if self.kv_token_budget is not None:
            if self.enable_prefix_caching:
                raise ValueError(
                    "kv_token_budget: token-priority eviction needs enable_prefix_caching=False (an evicted "
                    "sequence's blocks no longer hold its token prefix)"
                )
            if self.kv_evict_recent is None:
                self.kv_evict_recent = max(1, self.kv_token_budget // 4)
            if self.kv_evict_recent >= self.kv_token_budget:
                raise ValueError(
                    f"kv_evict_recent: {self.kv_evict_recent} must be < kv_token_budget={self.kv_token_budget}"
                )
        self.kv_evicted_tokens = 0
        self.rejected = {"kv_budget": 0, "slo": 0}
        self.last_admission: str | None = None  # the admission controller's last reason (admit or reject)

    # -- admission control ------------------------------------------------------------------------------------
    def kv_claim(self, prompt_len: int, max_tokens: int) -> int:
        """The worst-case KV blocks of a request: its prompt plus every token it may generate, within the context."""
        return blocks_needed(min(prompt_len + max_tokens, self.config.max_seq_len), self.block_size)

    def kv_claimed_blocks(self) -> int:
        """The sum of the unfinished requests' worst-case KV claims (what kv_budget_blocks bounds)."""
        return sum(self.kv_claim(len(s.prompt), s.params.max_tokens) for s in self.seqs.values())

    def engine_state(self) -> dict[str, int]:
        """The live state an AdmissionController reads: running decodes, the KV tokens they attend over, the
        prefill tokens queued ahead (waiting requests and unfinished prefills), waiting requests, the token budget."""
        sch = self.scheduler
        decodes = [s for s in sch.running if s.prefilled]
        prefills = [s for s in sch.running if not s.prefilled] + sch.waiting + sch.swapped
        return dict(
            running_decodes=len(decodes),
            kv_tokens=sum(s.num_computed for s in decodes),
            queue_tokens_ahead=sum(len(s.tokens) - s.num_computed for s in prefills),
            num_waiting=len(prefills),
            budget=self.max_num_batched_tokens,
        )

    def _mean_step_s(self) -> float:
        recent = self.step_log[-20:]
        return float(np.mean([s["duration_s"] for s in recent])) if recent else 0.05

    def _admit(self, ids: list[int], params: SamplingParams) -> None:
        """Admission control (module docstring): AdmissionRejected, or return to queue the request."""
        if self.kv_budget_blocks is not None:
            need, budget = self.kv_claim(len(ids), params.max_tokens), self.kv_budget_blocks
            if need > budget:
                raise ValueError(
                    f"max_tokens: prompt {len(ids)} + max_tokens {params.max_tokens} need {need} KV blocks of "
                    f"{self.block_size} tokens, more than the engine's kv_budget_blocks={budget}"
                )
            held = self.kv_claimed_blocks()
            if held + need > budget:
                # when will enough claims be released? requests finish in order of their remaining tokens (a bound:
                # each needs at least that many steps), so walk them until the freed claims make room
                left = sorted(
                    (s.params.max_tokens - len(s.output), self.kv_claim(len(s.prompt), s.params.max_tokens))
                    for s in self.seqs.values()
                )
                freed, steps = 0, 1
                for steps, blocks in left:  # noqa: B007 -- the last value read is the answer
                    freed += blocks
                    if held - freed + need <= budget:
                        break
                self.rejected["kv_budget"] += 1
                raise AdmissionRejected(
                    f"kv_budget: the request's worst case of {need} KV blocks (prompt {len(ids)} + max_tokens "
                    f"{params.max_tokens}) does not fit: {held} of kv_budget_blocks={budget} are claimed by "
                    f"{len(self.seqs)} unfinished requests",
                    "kv_budget",
                    retry_after_s=max(0.05, steps * self._mean_step_s()),
                )
        if self.admission is not None:
            ok, why = self.admission.admit(len(ids), self.engine_state())
            self.last_admission = why
            if not ok:
                self.rejected["slo"] += 1
                pred = self.admission.predict(len(ids), self.engine_state())["ttft_s"]
                wait = pred - self.admission.ttft_slo_s if np.isfinite(pred) else self._retry_after()
                raise AdmissionRejected(f"slo: {why}", "slo", retry_after_s=max(0.05, wait))

    # -- token-priority eviction ------------------------------------------------------------------------------
    def kv_positions(self, request_id: str) -> np.ndarray:
        """The positions whose K/V an unfinished request's cache holds, in cache order (all of them unless
        token-priority eviction dropped some)."""
        seq = self.seqs.get(request_id)
        if seq is None:
            raise KeyError(f"request_id: {request_id!r} is not an unfinished request")
        if seq.kv_kept_pos is None:
            return np.arange(seq.num_computed)
        return np.concatenate([seq.kv_kept_pos, np.arange(seq.kv_kept_until, seq.num_computed)])

    def _evict(self, seq: Sequence) -> None:
        """Token-priority eviction (module docstring) when the sequence's cache holds more than kv_token_budget."""
        if seq.cache_id is None:
            return
        held = seq.num_computed - seq.kv_evicted
        budget = self.kv_token_budget
        if held <= budget:
            return
        qs = self.runner.last_q.get(seq.cache_id)
        if qs is None or len(qs) != self.config.n_layers:
            return
        cache = self.bm.cache
        scores = np.zeros(held)
        for layer, q in qs.items():
            k, _ = cache.gather(seq.cache_id, layer)
            scores += attention_received(q[None], k)
        target = max(self.kv_evict_recent + 1, budget - self.block_size)
        keep = priority_keep(scores, target, recent=self.kv_evict_recent)
        pos = self.kv_positions(seq.request_id)
        cache.evict_tokens(seq.cache_id, keep)
        dropped = int((~keep).sum())
        seq.kv_kept_pos, seq.kv_kept_until = pos[keep], seq.num_computed
        seq.kv_evicted += dropped
        self.kv_evicted_tokens += dropped
