"""A MODEL of one engine step's latency, fitted from measured steps, and admission control that uses it.

The engine records every step in ``step_log``: dicts with "t", "duration_s", "num_prefill_tokens",
"num_decode_tokens", "num_seqs", "kv_tokens", "num_prefill_seqs". ``StepCostModel.fit(step_log)`` fits

    duration_s ~= c0 + c_prefill * num_prefill_tokens + c_decode * num_decode_tokens + c_kv * kv_tokens

by non-negative least squares (``scipy.optimize.nnls`` on columns scaled to max 1; a negative per-token cost would
be unphysical and extrapolates badly). c0 is the fixed cost of a step (Python + scheduling + weight reads, the reason
decode is memory-bound: one step streams all weights whatever the batch), c_prefill / c_decode the per-token
compute, c_kv the attention's per-cached-token read (``kv_tokens`` = the KV positions the step's sequences attend
over, their new tokens included). It is a MODEL: linear, blind to prefill's quadratic attention term and to noise
(GC pauses, other processes), so ``fit`` reports how well it holds on steps it did not see: a seeded random
``holdout`` fraction is kept out of the fit and ``model.report`` gives R^2 and the relative error |pred - y| / y at
p50/p90 on those held-out steps (and R^2 on the training steps). ``evaluate(other_log)`` scores any other log.

Predictions, for a scheduler with a token budget (``max_num_batched_tokens``) and chunked prefill that serves the
running decodes first (vLLM's order) and then the waiting prompts first come, first served:

    predict_ttft(prompt_len, queue_tokens_ahead, budget, running_decodes, kv_tokens=0)
        cap = budget - running_decodes prefill tokens per step; the queue ahead and then this prompt are cut into
        chunks of cap, so the prompt's last chunk runs in step n = ceil((queue_tokens_ahead + prompt_len) / cap);
        TTFT = the sum of the n steps' predicted durations, step i (0-based) priced at
        predict(chunk_i, running_decodes, kv_tokens + i * running_decodes + tokens prefilled through step i).
        Closed form (``ttft_steps`` lists the steps). inf when cap <= 0 (the decodes eat the whole budget).
        Simplification, stated: the running batch is taken as fixed over the horizon (requests ahead that finish
        their prefill are not added to it, none finishes).
    predict_tpot(running_decodes, kv_tokens, prefill_tokens=0)
        one step with those decodes (and a prefill chunk sharing it): the time between two tokens of each sequence.

``AdmissionController(model, ttft_slo_s, tpot_slo_s).admit(prompt_len, engine_state)`` -> (ok, reason): rejects when
the predicted TTFT of the new prompt exceeds ``ttft_slo_s`` or the TPOT it would cause exceeds ``tpot_slo_s``: the
larger of the steady decode step once it (and every waiting request) decodes, and the mixed step that carries a chunk
of its prefill next to the running decodes. The reason names what broke and every predicted number.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy.optimize import nnls

from .._inputs import as_int

FEATURES = ("num_prefill_tokens", "num_decode_tokens", "kv_tokens")
REQUIRED_KEYS = ("duration_s", *FEATURES)


def _nonneg(v: Any, name: str) -> float:
    if isinstance(v, bool | np.bool_) or not isinstance(v, int | float | np.integer | np.floating):
        raise TypeError(f"{name}: expected a number >= 0, got {type(v).__name__} {v!r}")
    if not math.isfinite(float(v)) or v < 0:
        raise ValueError(f"{name}: expected a finite number >= 0, got {v!r}")
    return float(v)


def _count(v: Any, name: str, minimum: int = 0) -> int:
    return as_int(v, name, min=minimum)


def _log_arrays(step_log: Any) -> tuple[np.ndarray, np.ndarray]:
    """X [n, 4] (1, prefill, decode, kv) and y [n] seconds, every entry checked."""
    if isinstance(step_log, str | bytes | Mapping) or not isinstance(step_log, Sequence):
        raise TypeError(f"step_log: expected a list of step dicts, got {type(step_log).__name__}")
    if len(step_log) == 0:
        raise ValueError("step_log: empty; need at least one measured step to fit")
    x = np.ones((len(step_log), 4))
    y = np.empty(len(step_log))
    for i, s in enumerate(step_log):
        if not isinstance(s, Mapping):
            raise TypeError(f"step_log[{i}]: expected a dict, got {type(s).__name__}")
        missing = [k for k in REQUIRED_KEYS if k not in s]
        if missing:
            raise ValueError(f"step_log[{i}]: missing key(s) {missing}; a step needs {list(REQUIRED_KEYS)}")
        y[i] = _nonneg(s["duration_s"], f"step_log[{i}]['duration_s']")
        for j, k in enumerate(FEATURES):
            x[i, j + 1] = _nonneg(s[k], f"step_log[{i}]['{k}']")
    return x, y


def _scores(pred: np.ndarray, y: np.ndarray) -> dict[str, float]:
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(((y - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else float("nan")
    pos = y > 0
    rel = np.abs(pred[pos] - y[pos]) / y[pos]
    p50, p90 = (float(np.percentile(rel, q)) for q in (50, 90)) if rel.size else (float("nan"),) * 2
    return {"r2": r2, "rel_err_p50": p50, "rel_err_p90": p90, "n": int(y.size)}


class StepCostModel:
    """MODEL: duration_s ~= c0 + c_prefill*prefill_tokens + c_decode*decode_tokens + c_kv*kv_tokens (seconds).

    Build it with ``StepCostModel.fit(step_log)`` (measured steps) or from known coefficients. See the module
    docstring for the fit, the held-out report and the TTFT/TPOT predictions."""

    def __init__(
        self, c0: float, c_prefill: float, c_decode: float, c_kv: float, *, report: dict[str, Any] | None = None
    ) -> None:
        self.c0 = _nonneg(c0, "c0")
        self.c_prefill = _nonneg(c_prefill, "c_prefill")
        self.c_decode = _nonneg(c_decode, "c_decode")
        self.c_kv = _nonneg(c_kv, "c_kv")
        self.report: dict[str, Any] = dict(report or {})

    @property
    def coef(self) -> dict[str, float]:
        return {"c0": self.c0, "c_prefill": self.c_prefill, "c_decode": self.c_decode, "c_kv": self.c_kv}

    @classmethod
    def fit(cls, step_log: Sequence[Mapping[str, Any]], *, holdout: float = 0.25, seed: int = 0) -> StepCostModel:
        """NNLS fit on the log minus a random ``holdout`` fraction (kept when the log has >= 8 steps), scored on it.

        ``report``: n_train, n_holdout, r2_train, and on the held-out steps r2, rel_err_p50, rel_err_p90 (NaN when
        nothing was held out)."""
        x, y = _log_arrays(step_log)
        holdout = _nonneg(holdout, "holdout")
        if holdout >= 1:
            raise ValueError(f"holdout: expected a fraction in [0, 1), got {holdout!r}")
        n = len(y)
        n_hold = int(round(n * holdout)) if n >= 8 else 0
        perm = np.random.default_rng(as_int(seed, "seed")).permutation(n)
        test, train = perm[:n_hold], perm[n_hold:]
        scale = np.abs(x[train]).max(axis=0)
        scale[scale == 0] = 1.0  # an all-zero column (no prefill in the log): its coefficient is fitted as 0
        sol, _ = nnls(x[train] / scale, y[train])
        c = sol / scale
        report: dict[str, Any] = {"n_train": int(train.size), "n_holdout": int(test.size)}
        report["r2_train"] = _scores(x[train] @ c, y[train])["r2"]
        nan = {"r2": math.nan, "rel_err_p50": math.nan, "rel_err_p90": math.nan}
        held = _scores(x[test] @ c, y[test]) if n_hold else nan
        report.update(r2=held["r2"], rel_err_p50=held["rel_err_p50"], rel_err_p90=held["rel_err_p90"])
        return cls(*(float(max(v, 0.0)) for v in c), report=report)

    def evaluate(self, step_log: Sequence[Mapping[str, Any]]) -> dict[str, float]:
        """R^2 and relative error p50/p90 of this model on another measured log."""
        x, y = _log_arrays(step_log)
        return _scores(x @ np.array([self.c0, self.c_prefill, self.c_decode, self.c_kv]), y)

    def predict(self, num_prefill_tokens: int, num_decode_tokens: int, kv_tokens: int) -> float:
        """Predicted seconds of one step with those token counts."""
        p = _nonneg(num_prefill_tokens, "num_prefill_tokens")
        d = _nonneg(num_decode_tokens, "num_decode_tokens")
        kv = _nonneg(kv_tokens, "kv_tokens")
        return self.c0 + self.c_prefill * p + self.c_decode * d + self.c_kv * kv

    def ttft_steps(
        self, prompt_len: int, queue_tokens_ahead: int, budget: int, running_decodes: int, kv_tokens: int = 0
    ) -> list[tuple[int, int, int]]:
        """The (prefill_tokens, decode_tokens, kv_tokens) of each step until the prompt's last chunk (see module)."""
        prompt_len, queue, budget, running, kv = self._ttft_args(
            prompt_len, queue_tokens_ahead, budget, running_decodes, kv_tokens
        )
        cap = budget - running
        if cap <= 0:
            raise ValueError(
                f"running_decodes: {running} decodes fill the whole budget={budget}; the prompt is never scheduled"
            )
        total, done, steps = queue + prompt_len, 0, []
        while done < total:
            chunk = min(cap, total - done)
            steps.append((chunk, running, kv + len(steps) * running + done + chunk))
            done += chunk
        return steps

    def predict_ttft(
        self, prompt_len: int, queue_tokens_ahead: int, budget: int, running_decodes: int, kv_tokens: int = 0
    ) -> float:
        """Seconds until the step that schedules the prompt's last chunk ends (its first token); inf if never."""
        prompt_len, queue, budget, running, kv = self._ttft_args(
            prompt_len, queue_tokens_ahead, budget, running_decodes, kv_tokens
        )
        cap = budget - running
        if cap <= 0:
            return math.inf
        total = queue + prompt_len
        n = -(-total // cap)  # steps
        tri = n * (n - 1) // 2
        kv_sum = n * kv + running * tri + cap * tri + total  # sum_i (kv + i*running + min((i+1)*cap, total))
        return n * self.c0 + self.c_prefill * total + self.c_decode * running * n + self.c_kv * kv_sum

    @staticmethod
    def _ttft_args(prompt_len: Any, queue: Any, budget: Any, running: Any, kv: Any) -> tuple[int, ...]:
        return (
            _count(prompt_len, "prompt_len", 1),
            _count(queue, "queue_tokens_ahead"),
            _count(budget, "budget", 1),
            _count(running, "running_decodes"),
            _count(kv, "kv_tokens"),
        )

    def predict_tpot(self, running_decodes: int, kv_tokens: int, prefill_tokens: int = 0) -> float:
        """Seconds of one step decoding ``running_decodes`` sequences (plus a prefill chunk sharing the step)."""
        running = _count(running_decodes, "running_decodes", 1)
        return self.predict(_count(prefill_tokens, "prefill_tokens"), running, _count(kv_tokens, "kv_tokens"))

    def __repr__(self) -> str:
        r = self.report
        fit = ""
        if r.get("n_holdout"):
            fit = (
                f"; fitted on {r['n_train']} measured steps, on {r['n_holdout']} held-out steps R^2={r['r2']:.3f}, "
                f"rel err p50={r['rel_err_p50']:.1%} p90={r['rel_err_p90']:.1%}"
            )
        elif r:
            fit = f"; fitted on {r.get('n_train')} measured steps, training R^2={r.get('r2_train', math.nan):.3f}"
        return (
            f"StepCostModel(MODEL: duration_s ~= {self.c0:.3e} + {self.c_prefill:.3e}*prefill_tokens + "
            f"{self.c_decode:.3e}*decode_tokens + {self.c_kv:.3e}*kv_tokens{fit})"
        )


class AdmissionController:
    """Admission by a MODEL: admit a prompt only if its predicted TTFT and the TPOT it causes meet the SLOs.

    ``engine_state`` keys: "running_decodes", "kv_tokens", "budget" (or "max_num_batched_tokens"), optional
    "queue_tokens_ahead" (prefill tokens waiting ahead, default 0) and "num_waiting" (requests ahead, default 0)."""

    def __init__(self, model: StepCostModel, ttft_slo_s: float, tpot_slo_s: float) -> None:
        if not isinstance(model, StepCostModel):
            raise TypeError(f"model: expected a StepCostModel, got {type(model).__name__}")
        self.model = model
        for name, v in (("ttft_slo_s", ttft_slo_s), ("tpot_slo_s", tpot_slo_s)):
            if _nonneg(v, name) <= 0:
                raise ValueError(f"{name}: expected a positive number of seconds, got {v!r}")
        self.ttft_slo_s, self.tpot_slo_s = float(ttft_slo_s), float(tpot_slo_s)

    def predict(self, prompt_len: int, engine_state: Mapping[str, Any]) -> dict[str, float]:
        """The predicted TTFT, steady TPOT and mixed-step TPOT for admitting this prompt now."""
        if not isinstance(engine_state, Mapping):
            raise TypeError(f"engine_state: expected a dict, got {type(engine_state).__name__}")
        budget_key = "max_num_batched_tokens" if "budget" not in engine_state else "budget"
        for k in ("running_decodes", "kv_tokens", "budget"):
            if k not in engine_state and (k != "budget" or budget_key not in engine_state):
                also = " (or 'max_num_batched_tokens')" if k == "budget" else ""
                raise ValueError(f"engine_state: missing key {k!r}{also}; have {sorted(map(str, engine_state))}")
        prompt_len = _count(prompt_len, "prompt_len", 1)
        running = _count(engine_state["running_decodes"], "engine_state['running_decodes']")
        kv = _count(engine_state["kv_tokens"], "engine_state['kv_tokens']")
        budget = _count(engine_state[budget_key], f"engine_state[{budget_key!r}]", 1)
        queue = _count(engine_state.get("queue_tokens_ahead", 0), "engine_state['queue_tokens_ahead']")
        waiting = _count(engine_state.get("num_waiting", 0), "engine_state['num_waiting']")
        m = self.model
        ttft = m.predict_ttft(prompt_len, queue, budget, running, kv)
        steady = m.predict_tpot(running + waiting + 1, kv + queue + prompt_len)
        cap = budget - running
        mixed = m.predict_tpot(running, kv + min(cap, prompt_len), min(cap, prompt_len)) if running and cap > 0 else 0
        return {"ttft_s": ttft, "tpot_s": max(steady, mixed), "tpot_steady_s": steady, "tpot_mixed_s": mixed}

    def admit(self, prompt_len: int, engine_state: Mapping[str, Any]) -> tuple[bool, str]:
        """(True, why) or (False, why): the reason names the SLO(s) broken and the MODEL's predicted numbers."""
        p = self.predict(prompt_len, engine_state)
        bad = [
            n
            for n, v, slo in (("TTFT", p["ttft_s"], self.ttft_slo_s), ("TPOT", p["tpot_s"], self.tpot_slo_s))
            if v > slo
        ]
        ttft = "inf (the running decodes fill the token budget)" if math.isinf(p["ttft_s"]) else f"{p['ttft_s']:.4g} s"
        detail = (
            f"predicted TTFT {ttft} {'>' if 'TTFT' in bad else '<='} SLO {self.ttft_slo_s:.4g} s; predicted TPOT "
            f"{p['tpot_s']:.4g} s (steady {p['tpot_steady_s']:.4g} s, mixed step {p['tpot_mixed_s']:.4g} s) "
            f"{'>' if 'TPOT' in bad else '<='} SLO {self.tpot_slo_s:.4g} s (MODEL predictions)"
        )
        if bad:
            return False, f"reject ({' and '.join(bad)} SLO): {detail}"
        return True, f"admit: {detail}"

    def __repr__(self) -> str:
        slo = f"ttft_slo_s={self.ttft_slo_s}, tpot_slo_s={self.tpot_slo_s}"
        return f"AdmissionController(MODEL-based, {slo}, {self.model!r})"
