"""Argument checks shared by the inference API: token ids, probability vectors, scalar sizes and switches.

Token ids are integers: Python ints, numpy/torch integer arrays or integer tl.Tensors. Floats are refused, not
truncated (``[1.7, 2.9]`` would silently become ``[1, 2]``), and so are bools and strings (numpy would turn
``[1, True]`` into ``[1, 1]``). Probability vectors follow ``torch.multinomial``: no NaN/Inf, no negative entry
and a positive sum, else ``InvalidDistributionError`` (a RuntimeError, like torch's, and a ValueError).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._inputs import as_int, to_numpy


class InvalidDistributionError(RuntimeError, ValueError):
    """A probability vector with NaN/Inf, a negative entry or no mass (torch.multinomial raises RuntimeError)."""


def int_arg(value: Any, name: str, *, minimum: int | None = None) -> int:
    """``value`` as a Python int (ints and numpy integers; bools, floats and strings are TypeErrors)."""
    return as_int(value, name, min=minimum)


def real_arg(value: Any, name: str) -> float:
    """``value`` as a float (ints, floats, numpy numbers; bools and strings are TypeErrors). NaN passes through."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}: expected a real number, got {type(value).__name__} {value!r}")
    return float(value)


def bool_arg(value: Any, name: str) -> bool:
    """``value`` as a bool (Python or numpy bools only: ``kv_cache="no"`` is an error, not True)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def seed_arg(value: Any, name: str = "seed") -> int:
    """A non-negative int seed for ``numpy.random.default_rng``."""
    return int_arg(value, name, minimum=0)


def token_list(ids: Any, name: str, *, allow_empty: bool = False) -> list[int]:
    """Token ids as a list of Python ints from an int, a list/tuple of ints, or a 1-D integer array/tensor [T].
    TypeError for floats, bools, strings; ValueError for negative ids, nested lists / 2-D arrays (a batch is not
    one prompt: pass ``ids[0]``) or (unless ``allow_empty``) no ids."""
    if isinstance(ids, (list, tuple)):
        bad = [e for e in ids if isinstance(e, (bool, np.bool_)) or not isinstance(e, (int, np.integer))]
        nested = [e for e in ids if isinstance(e, (list, tuple, np.ndarray))]
        if nested:
            got = type(nested[0]).__name__
            raise ValueError(f"{name}: expected one flat sequence of token ids, got a nested {got}")
        if bad:
            raise TypeError(f"{name}: token ids must be ints, got {type(bad[0]).__name__} {bad[0]!r}")
    elif isinstance(ids, (bool, np.bool_, str, bytes)):
        raise TypeError(f"{name}: token ids must be ints, got {type(ids).__name__} {ids!r}")
    try:
        a = to_numpy(ids, name)
    except TypeError as e:  # ragged nested lists and other non-arrays
        raise TypeError(f"{name}: expected token ids (ints or an integer array), got {type(ids).__name__}") from e
    except ValueError as e:
        raise TypeError(f"{name}: expected token ids (ints or an integer array), got {type(ids).__name__}") from e
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"{name}: token ids must be integers, got dtype {a.dtype}")
    if a.ndim > 1:
        raise ValueError(f"{name}: expected one 1-D sequence of token ids [T], got shape {a.shape}")
    out = [int(t) for t in a.reshape(-1)]
    if not out and not allow_empty:
        raise ValueError(f"{name}: need at least one token id")
    if out and min(out) < 0:
        raise ValueError(f"{name}: token ids must be >= 0, got {min(out)}")
    return out


def check_vocab(ids: list[int], session: Any, name: str) -> None:
    """ValueError naming ``name`` when an id is outside the session's vocabulary (if it reports one)."""
    v = getattr(session, "vocab_size", None)
    if v is not None and ids and max(ids) >= v:
        raise ValueError(f"{name}: token ids must lie in [0, {v}) (the model's vocab_size), got {max(ids)}")


def _float64_vector(v: Any, name: str, kind: str, shape: str) -> np.ndarray:
    """``v`` as a non-empty float64 [V] vector: TypeError for a non-numeric dtype, ValueError for another shape."""
    a = to_numpy(v, name)
    if a.dtype.kind not in "fiu" and a.dtype.name != "bfloat16":
        raise TypeError(f"{name}: expected {kind}, got dtype {a.dtype}")
    x = np.asarray(a, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"{name}: expected {shape}, got shape {x.shape}")
    return x


def prob_vector(probs: Any, name: str = "probs") -> np.ndarray:
    """A float64 [V] probability vector (V >= 1) that ``torch.multinomial`` would accept; unnormalised is fine."""
    p = _float64_vector(probs, name, "a numeric probability vector", "a non-empty 1-D vector [V]")
    if not np.isfinite(p).all() or (p < 0).any():
        raise InvalidDistributionError(f"{name}: probability tensor contains either `inf`, `nan` or element < 0")
    if not p.sum() > 0:
        raise InvalidDistributionError(f"{name}: invalid multinomial distribution (sum of probabilities <= 0)")
    return p


def logit_vector(logits: Any, name: str = "logits") -> np.ndarray:
    """A float64 [V] logits vector (V >= 1): NaN and +inf refused; -inf (a masked token) allowed if not all."""
    x = _float64_vector(logits, name, "numeric logits", "a non-empty [V] vector")
    if np.isnan(x).any() or (x == np.inf).any():
        raise InvalidDistributionError(f"{name}: contains NaN or +inf, so softmax has no distribution")
    if (x == -np.inf).all():
        raise InvalidDistributionError(f"{name}: every logit is -inf (every token masked), no distribution")
    return x
