"""An adaptive sampling temperature: a feedback controller on the repetition rate and perplexity of the output.

After every token the controller looks at the last ``window`` generated tokens:
    repetition = the fraction of them that repeat an earlier token of the window (1 - distinct / count);
    perplexity = exp(mean(-log p(token))) of the same tokens under the model's *untempered* distribution (T = 1),
        i.e. how surprising the text is to the model itself.
Too repetitive (repetition > target_repetition) -> temperature *= (1 + step) (flatter distribution, more
diversity); too surprising (perplexity > max_perplexity) -> temperature /= (1 + step) (sharper, more likely
tokens); otherwise the temperature stays. The perplexity rule wins when both fire: incoherent text is the worse
failure. The temperature is clamped to [t_min, t_max]. (Semantic consistency, the third signal of the question, would
need an embedding model; the same rule would add a third error term.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .checks import int_arg, real_arg, seed_arg, token_list
from .sampling import filter_probs, sample_from, softmax
from .session import open_session


def repetition_rate(tokens: Sequence[int]) -> float:
    """1 - distinct / count of ``tokens`` (0 for all-distinct, -> 1 for one token repeated)."""
    toks = token_list(tokens, "tokens")
    return 1.0 - len(set(toks)) / len(toks)


class TemperatureController:
    """Multiplicative temperature controller (see the module docstring)."""

    def __init__(
        self,
        t0: float = 0.3,
        target_repetition: float = 0.3,
        max_perplexity: float = 30.0,
        window: int = 16,
        step: float = 0.1,
        t_min: float = 0.05,
        t_max: float = 2.0,
    ) -> None:
        for name, v in (("t0", t0), ("target_repetition", target_repetition), ("max_perplexity", max_perplexity)):
            real_arg(v, name)
        for name, v in (("step", step), ("t_min", t_min), ("t_max", t_max)):
            real_arg(v, name)
        if not (0 < t_min <= t0 <= t_max and math.isfinite(t_max)):
            raise ValueError(f"t0: need 0 < t_min <= t0 <= t_max < inf, got t_min={t_min}, t0={t0}, t_max={t_max}")
        if not 0 <= target_repetition < 1:
            raise ValueError(f"target_repetition: must be in [0, 1), got {target_repetition!r}")
        if not (math.isfinite(max_perplexity) and max_perplexity > 1):
            raise ValueError(f"max_perplexity: must be finite and > 1, got {max_perplexity!r}")
        if int_arg(window, "window") < 2:
            raise ValueError(f"window: must be an int >= 2, got {window!r}")
        if not 0 < step < 1:
            raise ValueError(f"step: must be in (0, 1), got {step!r}")
        self.temperature, self.target_repetition, self.max_perplexity = float(t0), target_repetition, max_perplexity
        self.window, self.step, self.t_min, self.t_max = window, step, t_min, t_max
        self.tokens: list[int] = []
        self.nll: list[float] = []

    def update(self, token: int, logits: np.ndarray) -> float:
        """Record ``token`` sampled from ``logits`` and return the temperature for the next token."""
        p = softmax(np.asarray(logits, np.float64))
        self.tokens.append(int(token))
        self.nll.append(-math.log(max(float(p[int(token)]), 1e-300)))
        if len(self.tokens) >= self.window:
            rep = repetition_rate(self.tokens[-self.window :])
            ppl = math.exp(float(np.mean(self.nll[-self.window :])))
            if ppl > self.max_perplexity:
                self.temperature /= 1 + self.step
            elif rep > self.target_repetition:
                self.temperature *= 1 + self.step
            self.temperature = min(self.t_max, max(self.t_min, self.temperature))
        return self.temperature


def generate_adaptive(
    model: Any,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    controller: TemperatureController | None = None,
    temperature: float | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Sample ``max_new_tokens`` tokens with a ``controller`` (adaptive) or a fixed ``temperature`` (exactly one).

    Returns tokens, the temperature used for each token, and over the whole output: repetition (mean of the
    per-window repetition rate over sliding windows of 16 tokens) and perplexity (untempered, see the module
    docstring)."""
    if (controller is None) == (temperature is None):
        raise ValueError(f"controller, temperature: give exactly one, got {controller!r}, {temperature!r}")
    if temperature is not None and not (math.isfinite(real_arg(temperature, "temperature")) and temperature > 0):
        raise ValueError(f"temperature: must be finite and > 0, got {temperature!r}")
    if int_arg(max_new_tokens, "max_new_tokens") < 16:
        raise ValueError(f"max_new_tokens: must be an int >= 16 (one measurement window), got {max_new_tokens!r}")
    if controller is not None and not isinstance(controller, TemperatureController):
        raise TypeError(f"controller: expected a TemperatureController, got {type(controller).__name__}")
    seed = seed_arg(seed)
    prompt = token_list(prompt_ids, "prompt_ids")
    rng = np.random.default_rng(seed)
    sess = open_session(model, True)
    logits = sess.extend(prompt)[-1]
    t = controller.temperature if controller is not None else float(temperature)
    toks: list[int] = []
    temps: list[float] = []
    nll: list[float] = []
    for _ in range(max_new_tokens):
        tok = sample_from(filter_probs(logits, t, None, None), rng)
        toks.append(tok)
        temps.append(t)
        nll.append(-math.log(max(float(softmax(np.asarray(logits, np.float64))[tok]), 1e-300)))
        if controller is not None:
            t = controller.update(tok, logits)
        if len(toks) < max_new_tokens:
            logits = sess.extend([tok])[-1]
    reps = [repetition_rate(toks[i : i + 16]) for i in range(len(toks) - 15)]
    return dict(
        tokens=toks, temperatures=temps, repetition=float(np.mean(reps)), perplexity=math.exp(float(np.mean(nll)))
    )
