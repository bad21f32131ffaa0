"""The serving engine's request-side types: SamplingParams, RequestOutput, and the errors a server maps to HTTP.

    SamplingParams   per request: temperature (0 = greedy), top_k, top_p, max_tokens, stop strings, seed,
                     ignore_eos, speculative (draft tokens per step, 0 = off)
    RequestOutput    what ``Engine.step()`` returns for each request that received tokens or finished in that step
    EngineFull       add_request refused: the bounded waiting queue is full (a server answers 429/503 + Retry-After)
    AdmissionRejected  an EngineFull raised by admission control: ``reason`` "kv_budget" (the request's worst-case KV
                     blocks do not fit the engine's KV budget now) or "slo" (the latency MODEL predicts a broken SLO)
Argument errors are ValueError/TypeError naming the field (``max_tokens: must be an int >= 1, got 0``), so a
server can answer 400 with the message as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

FINISH_REASONS = ("stop", "length", "abort")


class EngineFull(RuntimeError):
    """The engine's waiting queue is at its bound (``max_waiting``); ``retry_after_s`` estimates when to retry."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = float(retry_after_s)


class AdmissionRejected(EngineFull):
    """Admission control refused a request: ``reason`` is "kv_budget" or "slo"; the message says why in numbers."""

    REASONS = ("kv_budget", "slo")

    def __init__(self, message: str, reason: str, retry_after_s: float = 1.0) -> None:
        if reason not in self.REASONS:
            raise ValueError(f"reason: expected one of {self.REASONS}, got {reason!r}")
        super().__init__(message, retry_after_s)
        self.reason = reason


def _int(name: str, v: Any, minimum: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int | np.integer):
        raise TypeError(f"{name}: expected an int >= {minimum}, got {type(v).__name__} {v!r}")
    if v < minimum:
        raise ValueError(f"{name}: must be an int >= {minimum}, got {v!r}")
    return int(v)


def _real(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating):
        raise TypeError(f"{name}: expected a number, got {type(v).__name__} {v!r}")
    return float(v)


@dataclass
class SamplingParams:
    """Per-request decoding settings (OpenAI-style names). Validated on construction."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    speculative: int = 0

    def __post_init__(self) -> None:
        t = _real("temperature", self.temperature)
        if not np.isfinite(t) or t < 0:
            raise ValueError(f"temperature: must be a finite number >= 0, got {self.temperature!r}")
        self.temperature = t
        if self.top_k is not None:
            self.top_k = _int("top_k", self.top_k, 1)
        if self.top_p is not None:
            p = _real("top_p", self.top_p)
            if not 0 < p <= 1:
                raise ValueError(f"top_p: must be in (0, 1], got {self.top_p!r}")
            self.top_p = p
        self.max_tokens = _int("max_tokens", self.max_tokens, 1)
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        if not isinstance(stop, list | tuple) or not all(isinstance(s, str) and s for s in stop):
            raise TypeError(f"stop: expected a non-empty string or a list of them, got {self.stop!r}")
        self.stop = tuple(stop)
        if self.seed is not None:
            self.seed = _int("seed", self.seed, 0)
        if not isinstance(self.ignore_eos, bool | np.bool_):
            raise TypeError(f"ignore_eos: expected a bool, got {self.ignore_eos!r}")
        self.speculative = _int("speculative", self.speculative, 0)


@dataclass
class RequestOutput:
    """One request's state after an engine step.

    ``new_token_ids``: tokens produced in this step (several with speculative decoding); ``token_ids``: all
    generated so far; ``text``: the detokenized generation so far (with a tokenizer; stop strings cut it);
    ``finish_reason``: None while running, else "stop" (EOS or a stop string), "length" (max_tokens or the
    context) or "abort"; ``metrics``: arrival/first-token/finish times (time.perf_counter seconds),
    prefix-cache hit tokens, preemption count."""

    request_id: str
    prompt_len: int
    new_token_ids: list[int]
    token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None
    text: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
