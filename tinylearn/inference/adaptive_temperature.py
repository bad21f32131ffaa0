"""An adaptive sampling temperature: a feedback controller on the repetition rate, perplexity and semantic
consistency of the output.

After every token the controller looks at the last ``window`` generated tokens:
    repetition = the fraction of them that repeat an earlier token of the window (1 - distinct / count);
    perplexity = exp(mean(-log p(token))) of the same tokens under the model's *untempered* distribution (T = 1),
        i.e. how surprising the text is to the model itself;
    consistency = the cosine similarity between the mean token embedding of the window and the mean token embedding
        of the text before it (the prompt given to ``set_context`` plus the tokens generated before the window):
        does the recent text stay on the subject of what came before? Measured with the model's own token embedding
        table (``TinyGPT.tok_emb.weight``, [V, d]), only when the controller was given ``embeddings``.
Rules, in order of precedence:
    1. too surprising (perplexity > max_perplexity) or drifting (consistency < min_consistency)
       -> temperature /= (1 + step) (sharper, more likely tokens); one step even when both fire;
    2. otherwise too repetitive (repetition > target_repetition) -> temperature *= (1 + step) (flatter, more diverse);
    3. otherwise the temperature stays.
The lowering rules win over the raising one: incoherent or off-topic text is the worse failure. The temperature is
clamped to [t_min, t_max]. ``min_consistency=None`` (the default) switches the consistency rule off, and the
controller then behaves exactly as before the rule existed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._inputs import to_numpy
from .checks import int_arg, real_arg, seed_arg, token_list
from .model import TinyGPT
from .sampling import filter_probs, sample_from, softmax
from .session import open_session

CONSISTENCY_WINDOW = 16  # tokens per window of generate_adaptive's repetition and consistency measurements


def repetition_rate(tokens: Sequence[int]) -> float:
    """1 - distinct / count of ``tokens`` (0 for all-distinct, -> 1 for one token repeated)."""
    toks = token_list(tokens, "tokens")
    return 1.0 - len(set(toks)) / len(toks)


def embedding_table(embeddings: Any, name: str = "embeddings") -> np.ndarray:
    """``embeddings`` ([V, d] real, finite: an array, tl.Tensor or torch tensor) as a float64 array."""
    a = to_numpy(embeddings, name)
    if a.ndim != 2 or 0 in a.shape or a.dtype.kind not in "fiu":
        raise ValueError(f"{name}: expected a non-empty real [V, d] token embedding table, got {a.dtype} {a.shape}")
    a = np.asarray(a, np.float64)
    if not np.isfinite(a).all():
        raise ValueError(f"{name}: the embedding table holds NaN or Inf")
    return a


def semantic_consistency(embeddings: Any, context: Sequence[int], window: Sequence[int]) -> float:
    """Cosine similarity of the mean embedding of ``window`` and the mean embedding of ``context`` (token ids into the
    [V, d] table ``embeddings``), in [-1, 1]; 0.0 when either mean is the zero vector."""
    table = embedding_table(embeddings)
    means = []
    for name, ids in (("context", context), ("window", window)):
        toks = token_list(ids, name)
        if max(toks) >= table.shape[0]:
            raise ValueError(f"{name}: token id {max(toks)} is outside the embedding table's {table.shape[0]} rows")
        means.append(table[toks].mean(axis=0))
    return _cosine(*means)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return 0.0 if na == 0 or nb == 0 else float(np.clip(a @ b / (na * nb), -1.0, 1.0))


class TemperatureController:
    """Multiplicative temperature controller (see the module docstring).

    ``min_consistency`` (None: rule off) needs ``embeddings``, the model's [V, d] token embedding table; with
    ``embeddings`` alone the consistency is measured (``self.consistency``) but does not steer."""

    def __init__(
        self,
        t0: float = 0.3,
        target_repetition: float = 0.3,
        max_perplexity: float = 30.0,
        window: int = 16,
        step: float = 0.1,
        t_min: float = 0.05,
        t_max: float = 2.0,
        *,
        min_consistency: float | None = None,
        embeddings: Any = None,
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
        if min_consistency is not None and not -1 <= real_arg(min_consistency, "min_consistency") < 1:
            raise ValueError(
                f"min_consistency: must be in [-1, 1) (a cosine similarity) or None, got {min_consistency!r}"
            )
        if min_consistency is not None and embeddings is None:
            raise ValueError("embeddings: min_consistency needs the model's [V, d] token embedding table, got None")
        self.temperature, self.target_repetition, self.max_perplexity = float(t0), target_repetition, max_perplexity
        self.window, self.step, self.t_min, self.t_max = window, step, t_min, t_max
        self.min_consistency = None if min_consistency is None else float(min_consistency)
        self.embeddings = None if embeddings is None else embedding_table(embeddings)
        self.context: list[int] = []
        self.tokens: list[int] = []
        self.nll: list[float] = []
        self.consistency: list[float] = []  # one reading per update (NaN until a window and a context exist)

    def set_context(self, tokens: Sequence[int]) -> None:
        """The tokens before the generated ones (the prompt): the reference of the consistency signal."""
        self.context = self._checked(token_list(tokens, "tokens", allow_empty=True), "tokens")

    def _checked(self, toks: list[int], name: str) -> list[int]:
        if self.embeddings is not None and toks and max(toks) >= self.embeddings.shape[0]:
            raise ValueError(f"{name}: token id {max(toks)} is outside the embedding table's rows")
        return toks

    def _consistency(self) -> float:
        before = self.context + self.tokens[: -self.window]
        if self.embeddings is None or len(self.tokens) < self.window or not before:
            return math.nan
        e = self.embeddings
        return _cosine(e[before].mean(axis=0), e[self.tokens[-self.window :]].mean(axis=0))

    def update(self, token: int, logits: np.ndarray) -> float:
        """Record ``token`` sampled from ``logits`` and return the temperature for the next token."""
        p = softmax(np.asarray(logits, np.float64))
        self.tokens += self._checked([int_arg(token, "token")], "token")
        self.nll.append(-math.log(max(float(p[int(token)]), 1e-300)))
        cons = self._consistency()
        self.consistency.append(cons)
        if len(self.tokens) >= self.window:
            rep = repetition_rate(self.tokens[-self.window :])
            ppl = math.exp(float(np.mean(self.nll[-self.window :])))
            drifting = self.min_consistency is not None and cons < self.min_consistency  # NaN: no reading, no rule
            if ppl > self.max_perplexity or drifting:
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
    embeddings: Any = None,
) -> dict[str, Any]:
    """Sample ``max_new_tokens`` tokens with a ``controller`` (adaptive) or a fixed ``temperature`` (exactly one).

    Returns tokens, the temperature used for each token, and over the whole output: repetition (mean of the
    per-window repetition rate over sliding windows of 16 tokens) and perplexity (untempered, see the module
    docstring). ``consistency``: per generated token, the semantic consistency of the 16 tokens ending there with the
    text before them (the prompt and earlier tokens; NaN for the first 15 tokens), measured with ``embeddings``
    (default: a TinyGPT's own ``tok_emb.weight``; None for a model without one, e.g. TableLM)."""
    if (controller is None) == (temperature is None):
        raise ValueError(f"controller, temperature: give exactly one, got {controller!r}, {temperature!r}")
    if temperature is not None and not (math.isfinite(real_arg(temperature, "temperature")) and temperature > 0):
        raise ValueError(f"temperature: must be finite and > 0, got {temperature!r}")
    if int_arg(max_new_tokens, "max_new_tokens") < CONSISTENCY_WINDOW:
        raise ValueError(f"max_new_tokens: must be an int >= 16 (one measurement window), got {max_new_tokens!r}")
    if controller is not None and not isinstance(controller, TemperatureController):
        raise TypeError(f"controller: expected a TemperatureController, got {type(controller).__name__}")
    seed = seed_arg(seed)
    prompt = token_list(prompt_ids, "prompt_ids")
    if embeddings is None and isinstance(model, TinyGPT):
        embeddings = model.tok_emb.weight
    table = None if embeddings is None else embedding_table(embeddings)
    if controller is not None:
        controller.set_context(prompt)
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
    w = CONSISTENCY_WINDOW
    reps = [repetition_rate(toks[i : i + w]) for i in range(len(toks) - w + 1)]
    cons = None
    if table is not None:
        text = prompt + toks
        cons = [math.nan] * (w - 1)
        cons += [
            semantic_consistency(table, text[: len(prompt) + i - w + 1], toks[i - w + 1 : i + 1])
            for i in range(w - 1, len(toks))
        ]
    return dict(
        tokens=toks,
        temperatures=temps,
        repetition=float(np.mean(reps)),
        perplexity=math.exp(float(np.mean(nll))),
        consistency=cons,
    )
