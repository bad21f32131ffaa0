"""Store-vs-recompute priority with communication (``tl.amp.recompute_priority``) -- seed question Q239.

Per saved tensor i: m_i bytes freed if it is recomputed, r_i seconds to recompute it, and c_i seconds of extra
communication the recomputation causes on a multi-node run (a tensor-parallel layer's recomputation repeats its
all-gather / reduce-scatter; a pipeline stage's may re-fetch an input). The priority

    P_i = alpha * m_i - beta * r_i - gamma * c_i

ranks tensors for recomputation: high P = much memory for little extra time. ``select_by_priority`` recomputes in
decreasing P until the kept bytes fit the budget. With gamma = 0 (a single-node rule) a tensor whose
recomputation costs a collective looks free and is chosen first.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .._inputs import as_array
from .args import real_arg

__all__ = ["recompute_priority", "select_by_priority"]


def _vec(name: str, v: Sequence[float], n: int | None = None) -> np.ndarray:
    a = np.asarray(as_array(v, name, dtypes=("f", "i", "u")), dtype=np.float64)
    if a.ndim != 1 or (n is not None and a.shape[0] != n):
        raise ValueError(
            f"{name}: expected a 1-D sequence of length {n if n is not None else 'n'}, got shape {a.shape}"
        )
    if (a < 0).any() or not np.isfinite(a).all():
        raise ValueError(f"{name}: expected finite values >= 0, got {a.tolist()}")
    return a


def recompute_priority(
    mem: Sequence[float],
    recompute: Sequence[float],
    comm: Sequence[float],
    alpha: float = 1.0,
    beta: float = 1.0,
    gamma: float = 1.0,
) -> np.ndarray:
    """P_i = alpha * mem_i - beta * recompute_i - gamma * comm_i (float64 array)."""
    m = _vec("mem", mem)
    r, c = _vec("recompute", recompute, len(m)), _vec("comm", comm, len(m))
    for name, w in (("alpha", alpha), ("beta", beta), ("gamma", gamma)):
        if not (np.isfinite(w) and w >= 0):
            raise ValueError(f"{name}: must be finite and >= 0, got {w}")
    return alpha * m - beta * r - gamma * c


def select_by_priority(mem: Sequence[float], priority: Sequence[float], budget: float) -> dict:
    """Recompute tensors in decreasing ``priority`` until the kept bytes fit ``budget``.

    Returns {"recompute": sorted indices, "kept": bytes kept}.
    """
    m = _vec("mem", mem)
    p = np.asarray(as_array(priority, "priority", dtypes=("f", "i", "u")), dtype=np.float64)
    if p.shape != m.shape:
        raise ValueError(f"priority: expected shape {m.shape}, got {p.shape}")
    if np.isnan(p).any():
        raise ValueError("priority: NaN priorities cannot be ranked")
    if not (np.isfinite(real_arg(budget, "budget")) and budget >= 0):
        raise ValueError(f"budget: must be finite and >= 0, got {budget}")
    kept, chosen = float(m.sum()), []
    for i in np.argsort(-p, kind="stable"):
        if kept <= budget:
            break
        chosen.append(int(i))
        kept -= float(m[i])
    return {"recompute": sorted(chosen), "kept": kept}
