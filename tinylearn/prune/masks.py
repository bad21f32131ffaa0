"""Mask computations on numpy arrays: the math behind every pruning method (mask 1 = keep, 0 = pruned).

``amount`` (as in torch.nn.utils.prune): a float in [0, 1] is the *fraction* of entries (or channels) to prune,
rounded with Python's ``round`` (half to even: round(0.5 * 5) = 2); an int is the absolute *number* to prune and
must not exceed the number of entries. Anything else -> ValueError / TypeError naming ``amount`` and its value.

Selection and ties: torch picks the entries with ``torch.topk`` whose order among equal values is unspecified.
Here selection uses a *stable* sort, so among equal scores the entry with the **lower flat index is pruned first**
(unstructured) and the channel with the **lower index is kept first** (structured, N:M). For inputs without
ties (random floats) the masks equal torch's exactly; tests check that.

- l1_unstructured_mask:  prune the k entries with smallest |t|.
- random_unstructured_mask: prune k entries chosen uniformly at random (seeded numpy Generator).
- ln_structured_mask:  score channel c along ``dim`` by ||t[c]||_n (norm over all other dims), keep the
  size-k channels with the largest norm, zero whole slices.
- n_m_mask:  split ``dim`` into consecutive groups of m; in each group keep the n entries with largest |t|:
  exactly n ones per group (NVIDIA 2:4 = n=2, m=4 along the reduction dim, i.e. dim=1 of Linear/Conv weights).
- combine (PruningContainer semantics): a new method only sees the entries (unstructured) or channels
  (structured) that are still unpruned, so ``amount`` is relative to what is left and masks only ever shrink.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from .._inputs import as_array


def validate_amount_type(amount: Any) -> None:
    """Range/type check at construction time: float in [0, 1] or non-negative int."""
    if isinstance(amount, bool) or not isinstance(amount, numbers.Real):
        raise TypeError(f"amount: expected an int or a float, got {type(amount).__name__} {amount!r}")
    if isinstance(amount, numbers.Integral):
        if amount < 0:
            raise ValueError(f"amount: an int amount must be non-negative, got {amount}")
    elif not (0.0 <= float(amount) <= 1.0) or np.isnan(float(amount)):
        raise ValueError(f"amount: a float amount must be in [0, 1], got {amount}")


def nparams_to_prune(amount: Any, size: int) -> int:
    """Number of entries to prune for ``amount`` out of ``size`` (torch's rounding: Python round)."""
    validate_amount_type(amount)
    if isinstance(amount, numbers.Integral):
        k = int(amount)
        if k > size:
            raise ValueError(f"amount: cannot prune {k} entries, the tensor has only {size}")
        return k
    return int(round(float(amount) * size))


def _check_mask(t: np.ndarray, default_mask: np.ndarray | None) -> np.ndarray:
    if default_mask is None:
        return np.ones(t.shape, dtype=t.dtype if np.issubdtype(t.dtype, np.floating) else np.float32)
    default_mask = np.asarray(default_mask)
    if default_mask.shape != t.shape:
        raise ValueError(f"default_mask: shape {default_mask.shape} differs from the tensor's {t.shape}")
    return default_mask


def smallest_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Flat indices of the k smallest scores (stable: ties -> lower index first)."""
    return np.argsort(scores.reshape(-1), kind="stable")[:k]


def l1_unstructured_mask(t: np.ndarray, amount: Any, default_mask: np.ndarray | None = None) -> np.ndarray:
    t = np.asarray(t)
    mask = _check_mask(t, default_mask).copy()
    k = nparams_to_prune(amount, t.size)
    if k:
        mask.reshape(-1)[smallest_k(np.abs(t), k)] = 0
    return mask


def random_unstructured_mask(
    t: np.ndarray, amount: Any, default_mask: np.ndarray | None = None, rng: np.random.Generator | None = None
) -> np.ndarray:
    t = np.asarray(t)
    mask = _check_mask(t, default_mask).copy()
    k = nparams_to_prune(amount, t.size)
    if k:
        rng = rng if rng is not None else np.random.default_rng()
        mask.reshape(-1)[rng.permutation(t.size)[:k]] = 0
    return mask


def _norm(t: np.ndarray, n: Any, dim: int) -> np.ndarray:
    axes = tuple(d for d in range(t.ndim) if d != dim)
    a = np.abs(t.astype(np.float64))
    if n == "fro":
        n = 2
    if n in (np.inf, float("inf")):
        return a.max(axis=axes) if a.size else np.zeros(t.shape[dim])
    if n in (-np.inf, float("-inf")):
        return a.min(axis=axes) if a.size else np.zeros(t.shape[dim])
    if not isinstance(n, numbers.Real) or isinstance(n, bool):
        raise ValueError(f"n: expected a number, inf, -inf or 'fro', got {n!r}")
    if n == 0:
        return (a != 0).sum(axis=axes).astype(np.float64)
    return (a**n).sum(axis=axes) ** (1.0 / n)


def check_dim(t: np.ndarray, dim: int) -> int:
    if not isinstance(dim, numbers.Integral) or isinstance(dim, bool):
        raise TypeError(f"dim: expected an int, got {type(dim).__name__}")
    if not -t.ndim <= dim < t.ndim:
        raise ValueError(f"dim: {dim} is out of range for a tensor of shape {t.shape}")
    return int(dim) % t.ndim


def ln_structured_mask(
    t: np.ndarray, amount: Any, n: Any, dim: int, default_mask: np.ndarray | None = None
) -> np.ndarray:
    t = np.asarray(t)
    if t.ndim <= 1:
        raise ValueError(f"t: structured pruning needs a tensor with >= 2 dims, got shape {t.shape}")
    dim = check_dim(t, dim)
    default_mask = _check_mask(t, default_mask)
    size = t.shape[dim]
    k = nparams_to_prune(amount, size)
    if k == 0:
        return default_mask.copy()
    norm = _norm(t, n, dim)
    keep = np.argsort(-norm, kind="stable")[: size - k]
    mask = np.zeros_like(default_mask)
    idx: list[Any] = [slice(None)] * t.ndim
    idx[dim] = keep
    mask[tuple(idx)] = 1
    return mask * default_mask


def random_structured_mask(
    t: np.ndarray, amount: Any, dim: int, default_mask: np.ndarray | None = None, rng: np.random.Generator | None = None
) -> np.ndarray:
    t = np.asarray(t)
    if t.ndim <= 1:
        raise ValueError(f"t: structured pruning needs a tensor with >= 2 dims, got shape {t.shape}")
    dim = check_dim(t, dim)
    default_mask = _check_mask(t, default_mask)
    k = nparams_to_prune(amount, t.shape[dim])
    if k == 0:
        return default_mask.copy()
    rng = rng if rng is not None else np.random.default_rng()
    keep = rng.permutation(t.shape[dim])[k:]
    mask = np.zeros_like(default_mask)
    idx: list[Any] = [slice(None)] * t.ndim
    idx[dim] = keep
    mask[tuple(idx)] = 1
    return mask * default_mask


def check_n_m(shape: tuple[int, ...], n: Any, m: Any, dim: int) -> None:
    for name, v in (("n", n), ("m", m)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError(f"{name}: expected an int, got {type(v).__name__} {v!r}")
    if m < 1 or n < 0:
        raise ValueError(f"n, m: need m >= 1 and n >= 0, got n={n}, m={m}")
    if n > m:
        raise ValueError(f"n: cannot keep n={n} entries out of groups of m={m} (n > m)")
    if shape[dim] % m:
        raise ValueError(f"m: group size m={m} does not divide dim {dim} of size {shape[dim]} (shape {tuple(shape)})")


def n_m_mask(t: np.ndarray, n: int = 2, m: int = 4, dim: int = -1, scores: np.ndarray | None = None) -> np.ndarray:
    """Keep the n largest-|t| (or largest ``scores``) of every m consecutive entries along ``dim``."""
    t = np.asarray(t)
    if t.ndim == 0:
        raise ValueError("t: N:M sparsity needs at least 1 dimension, got a scalar")
    dim = check_dim(t, dim)
    check_n_m(t.shape, n, m, dim)
    s = np.abs(t) if scores is None else np.asarray(scores, dtype=np.float64)
    moved = np.moveaxis(s, dim, -1)
    groups = moved.reshape(moved.shape[:-1] + (moved.shape[-1] // m, m))
    order = np.argsort(-groups, axis=-1, kind="stable")
    keep = np.zeros(groups.shape, dtype=bool)
    np.put_along_axis(keep, order[..., :n], True, axis=-1)
    mask = np.moveaxis(keep.reshape(moved.shape), -1, dim)
    return mask.astype(t.dtype if np.issubdtype(t.dtype, np.floating) else np.float32)


def sparsity_of(a: Any) -> float:
    """Fraction of exactly-zero entries."""
    a = as_array(a, "module_or_array", dtypes=("f", "i", "u", "b", "c"))
    return float(np.count_nonzero(a == 0) / a.size) if a.size else 0.0
