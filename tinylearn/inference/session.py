"""The decoding protocol ``generate`` and ``speculative_generate`` drive, and its implementations.

A *session* is one sequence being decoded by one model:

    sess.extend(tokens: list[int]) -> np.ndarray [len(tokens), V]   feed tokens; logits after each of them
    sess.truncate(length: int)                                      forget everything after the first ``length``
    sess.length                                                     tokens fed so far

``open_session(model, kv_cache)`` makes one from a TinyGPT (GPTSession: dense KV cache, truncation just moves the
cache's write position back; without a cache every call re-runs the whole prefix) or from any object with a
``session(kv_cache=True)`` method, e.g. ``TableLM``: a toy model defined by a fixed logits table (the next-token
logits depend on the last token only), fast enough for statistical tests of the sampling rules.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from .._inputs import to_numpy
from ..autograd import no_grad
from .checks import bool_arg, int_arg, token_list
from .model import TinyGPT


class Session(Protocol):
    length: int

    def extend(self, tokens: list[int]) -> np.ndarray: ...

    def truncate(self, length: int) -> None: ...


class GPTSession:
    """A TinyGPT decoding one sequence, with a dense KV cache (kv_cache=True) or full recompute (False)."""

    def __init__(self, model: TinyGPT, kv_cache: bool = True) -> None:
        if not isinstance(model, TinyGPT):
            raise TypeError(f"model: expected a TinyGPT, got {type(model).__name__}")
        self.model, self.kv_cache = model, bool_arg(kv_cache, "kv_cache")
        self.vocab_size = model.config.vocab_size
        self.cache = model.new_cache(1) if kv_cache else None
        self.tokens: list[int] = []
        self.forward_calls = 0

    @property
    def length(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: list[int]) -> np.ndarray:
        tokens = token_list(tokens, "tokens")
        self.forward_calls += 1
        with no_grad():
            if self.cache is not None:
                out = self.model(np.array([tokens]), self.cache).data[0]
            else:
                out = self.model(np.array([self.tokens + tokens])).data[0, -len(tokens) :]
        self.tokens += tokens
        return out

    def truncate(self, length: int) -> None:
        if not 0 <= int_arg(length, "length") <= self.length:
            raise ValueError(f"length: must be in [0, {self.length}], got {length}")
        del self.tokens[length:]
        if self.cache is not None:
            self.cache.length = length


class TableLM:
    """Toy language model: next-token logits = ``table[last_token]`` ([V, V]); ``bos_logits`` for an empty context.

    Any object with ``session(kv_cache=True)`` works with generate / speculative_generate; this one makes the
    target's exact sequence distribution computable (a Markov chain), so a chi-square test can check sampling."""

    def __init__(self, table: Any) -> None:
        a = to_numpy(table, "table")
        if a.dtype.kind not in "fiu":
            raise TypeError(f"table: expected a numeric [V, V] logits table, got dtype {a.dtype}")
        t = np.asarray(a, dtype=np.float64)
        if t.ndim != 2 or t.shape[0] != t.shape[1] or t.shape[0] == 0:
            raise ValueError(f"table: expected a square [V, V] logits table with V >= 1, got shape {t.shape}")
        if np.isnan(t).any() or (t == np.inf).any():
            raise ValueError("table: logits must not be NaN or +inf (-inf masks a token)")
        self.table = t
        self.vocab_size = t.shape[0]
        self.calls = 0

    def session(self, kv_cache: bool = True) -> _TableSession:
        bool_arg(kv_cache, "kv_cache")
        return _TableSession(self)


class _TableSession:
    def __init__(self, lm: TableLM) -> None:
        self.lm, self.tokens, self.vocab_size = lm, [], lm.vocab_size

    @property
    def length(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: list[int]) -> np.ndarray:
        tokens = token_list(tokens, "tokens")
        if max(tokens) >= self.vocab_size:
            raise ValueError(f"tokens: need >= 1 id in [0, {self.vocab_size}), got {tokens}")
        self.lm.calls += 1
        self.tokens += tokens
        return self.lm.table[tokens]

    def truncate(self, length: int) -> None:
        if not 0 <= int_arg(length, "length") <= self.length:
            raise ValueError(f"length: must be in [0, {self.length}], got {length}")
        del self.tokens[length:]


def open_session(model: Any, kv_cache: bool = True) -> Any:
    """A decoding session for ``model`` (TinyGPT or any object with ``session(kv_cache=...)``)."""
    kv_cache = bool_arg(kv_cache, "kv_cache")
    if isinstance(model, TinyGPT):
        return GPTSession(model, kv_cache)
    if callable(getattr(model, "session", None)):
        return model.session(kv_cache=kv_cache)
    got = type(model).__name__
    raise TypeError(f"model: expected a TinyGPT or an object with a session(kv_cache) method, got {got}")


def max_len(model: Any) -> int | None:
    c = getattr(model, "config", None)
    return getattr(c, "max_seq_len", None)
