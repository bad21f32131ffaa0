"""Per-layer sparse-attention pattern search under a throughput budget [Q132].

``choose_layer_patterns`` (sparse_attention.py) picks, layer by layer, the sparsest pattern under an error
tolerance. This module solves the joint problem: one pattern per layer (local windows of several widths, local +
global tokens, strided, BigBird-style random blocks, dense) so that the whole model's attention error is smallest
while its attention time fits a budget:

    minimise  sum_l err[l, c_l]      subject to  sum_l cost[l, c_l] <= budget

    err[l, c]   the accuracy proxy: ||o_c - o_dense|| / ||o_dense|| of layer l's attention output with pattern c,
                on the layer's *real* q, k, v (``layer_qkv`` runs a TinyGPT and records them after RoPE), the
                maximum over the calibration batch
    cost[l, c]  either the measured time of the C++ block-sparse kernel (``time_ms``, tinylearn.bench.measure, the
                minimum of the repeats: the least disturbed sample on a shared machine) or
                the work it does, the number of non-empty (query block, key block) tiles (``nnz``: deterministic,
                proportional to the kernel's flops)

This is a multiple-choice knapsack. ``search_patterns(..., method="dp")`` solves it exactly on an integer cost
grid: dynamic programming over layers, ``best[b]`` = least total error of the layers so far at total cost b
(nnz is already integer; milliseconds are rounded *up* to ``resolution`` steps of the budget, so a DP answer never
exceeds the true budget). ``method="greedy"`` is the usual heuristic: start every layer at its most accurate
candidate, then repeatedly move one layer to the cheaper candidate with the smallest error increase per unit of
cost saved until the total fits (it can miss the optimum; the DP cannot). ``uniform_choice`` is the baseline that
uses one pattern for every layer.

Everything takes / returns plain numpy; ``score_patterns`` needs float32 inputs for the C++ kernel timing.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from .._inputs import as_int
from ..nn.sparse_attention import BlockPattern, block_sparse_attention, causal, dense

__all__ = [
    "PatternScores",
    "SearchResult",
    "brute_force",
    "layer_qkv",
    "score_patterns",
    "search_patterns",
    "uniform_choice",
]


def layer_qkv(model: Any, ids: Any) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per layer of a ``tl.inference.TinyGPT``, the (q, k, v) its attention sees on ``ids`` [B, T]: float32
    [B, H, T, hd] each, after RoPE, with grouped K/V heads repeated to the H query heads."""
    from ..autograd import no_grad
    from ..inference.model import TinyGPT, apply_rope, check_ids

    if not isinstance(model, TinyGPT):
        raise TypeError(f"model: must be a tl.inference.TinyGPT, got {type(model).__name__}")
    c = model.config
    ids = check_ids(ids, c.vocab_size)
    b, t = ids.shape
    if t > c.max_seq_len:
        raise ValueError(f"ids: {t} tokens exceed max_seq_len={c.max_seq_len}")
    out = []
    with no_grad():
        x = model.tok_emb(ids)
        if not c.rope:
            x = x + model.pos_emb(np.arange(t))
        for i, blk in enumerate(model.blocks):
            a, h = blk.attn, blk.ln1(x)
            q = a.q_proj(h).reshape(b, t, c.n_heads, c.head_dim).transpose(1, 2)
            k = a.k_proj(h).reshape(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
            v = a.v_proj(h).reshape(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
            if model._rope is not None:
                cos, sin = model._rope[0][:t], model._rope[1][:t]
                q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            rep = c.n_heads // c.kv_heads  # GQA: each K/V head serves rep query heads
            kr, vr = (np.repeat(np.asarray(z.data), rep, axis=1) for z in (k, v))
            out.append(tuple(np.ascontiguousarray(a, np.float32) for a in (q.data, kr, vr)))
            x = blk(x, model._rope, 0, None, i)
    return out


@dataclass
class PatternScores:
    """The error / cost table of ``score_patterns``: rows = layers, columns = candidate patterns."""

    candidates: list[BlockPattern]
    error: np.ndarray  # float [L, C]: relative output error vs dense (0 for dense)
    time_ms: np.ndarray  # float [L, C]: measured ms of the C++ kernel, min of the repeats (nan when not timed)
    nnz: np.ndarray  # int [L, C]: non-empty tiles (the work)
    density: np.ndarray  # float [L, C]: nnz / tiles of the dense (causal) reference
    dense_time_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [L]: the reference's time

    @property
    def n_layers(self) -> int:
        return int(self.error.shape[0])

    def cost(self, name: str) -> np.ndarray:
        if name not in ("time_ms", "nnz"):
            raise ValueError(f"cost: must be 'time_ms' or 'nnz', got {name!r}")
        return np.asarray(getattr(self, name), np.float64)


def score_patterns(
    calibration: Sequence[tuple[Any, Any, Any]],
    candidates: Sequence[BlockPattern],
    block_size: int = 64,
    *,
    is_causal: bool = False,
    time_it: bool = True,
    repeat: int = 5,
    threads: int | None = None,
) -> PatternScores:
    """Error vs dense attention and cost of every candidate on every layer's (q, k, v) ([..., T, D] each).

    With ``is_causal`` each candidate is intersected with the causal mask and the reference is causal attention.
    ``time_it=False`` skips the timing (time_ms is nan): the nnz cost is then the only cost. ``threads`` caps the
    kernel's OpenMP threads while timing (tinylearn._threads.limited_threads; None: as they are)."""
    if not candidates:
        raise ValueError("candidates: need at least one pattern")
    for i, c in enumerate(candidates):
        if not isinstance(c, BlockPattern):
            raise TypeError(f"candidates[{i}]: must be a BlockPattern, got {type(c).__name__}")
    if len(calibration) == 0:
        raise ValueError("calibration: need (q, k, v) for at least one layer")
    bs = as_int(block_size, "block_size", min=1)
    repeat = as_int(repeat, "repeat", min=1)
    from .._threads import limited_threads
    from ..bench.timing import measure

    with limited_threads(threads):
        return _score(calibration, candidates, bs, is_causal, time_it, repeat, measure)


def _score(
    calibration: Sequence[tuple[Any, Any, Any]],
    candidates: Sequence[BlockPattern],
    bs: int,
    is_causal: bool,
    time_it: bool,
    repeat: int,
    measure: Any,
) -> PatternScores:
    """score_patterns' loop (arguments already checked; the thread cap already applied)."""
    ref_p = causal() if is_causal else dense()
    cands = [(c | causal()) if is_causal else c for c in candidates]
    nl, nc = len(calibration), len(cands)
    err, tms, nnz, den = np.zeros((nl, nc)), np.full((nl, nc), np.nan), np.zeros((nl, nc), np.int64), np.zeros((nl, nc))
    dense_ms = np.full(nl, np.nan)
    for li, qkv in enumerate(calibration):
        if not (isinstance(qkv, (tuple, list)) and len(qkv) == 3):
            raise ValueError(f"calibration[{li}]: must be a (q, k, v) triple")
        q, k, v = (np.ascontiguousarray(np.asarray(a), np.float32) for a in qkv)
        nq, nk = q.shape[-2], k.shape[-2]
        ref_lay = ref_p.layout(nq, nk, bs)
        ref = block_sparse_attention(q, k, v, ref_lay)
        rn = max(float(np.linalg.norm(ref)), 1e-30)
        if time_it:
            dense_ms[li] = measure(partial(block_sparse_attention, q, k, v, ref_lay), repeat=repeat).min * 1e3
        for ci, p in enumerate(cands):
            lay = p.layout(nq, nk, bs)
            o = block_sparse_attention(q, k, v, lay)
            err[li, ci] = float(np.linalg.norm(o - ref)) / rn
            nnz[li, ci], den[li, ci] = lay.nnz, lay.nnz / max(1, ref_lay.nnz)
            if time_it:
                tms[li, ci] = measure(partial(block_sparse_attention, q, k, v, lay), repeat=repeat).min * 1e3
    return PatternScores(list(candidates), err, tms, nnz, den, dense_ms)


@dataclass(frozen=True)
class SearchResult:
    choice: tuple[int, ...]  # candidate index per layer
    error: float  # sum over layers of err[l, choice[l]]
    cost: float  # sum over layers of cost[l, choice[l]]
    feasible: bool  # cost <= budget

    def patterns(self, scores: PatternScores) -> list[BlockPattern]:
        return [scores.candidates[c] for c in self.choice]


def _table(scores: PatternScores | tuple[Any, Any], cost: str) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(scores, PatternScores):
        e, c = np.asarray(scores.error, np.float64), scores.cost(cost)
    elif isinstance(scores, tuple) and len(scores) == 2:
        e, c = np.asarray(scores[0], np.float64), np.asarray(scores[1], np.float64)
    else:
        raise TypeError(f"scores: must be a PatternScores or an (error, cost) pair, got {type(scores).__name__}")
    if e.ndim != 2 or e.shape != c.shape or e.size == 0:
        raise ValueError(f"scores: error and cost must be the same non-empty [L, C] shape, got {e.shape}, {c.shape}")
    if not (np.isfinite(e).all() and np.isfinite(c).all()):
        raise ValueError(f"scores: {cost} / error contain NaN or Inf (was the table timed? use cost='nnz')")
    if (c < 0).any():
        raise ValueError("scores: costs must be >= 0")
    return e, c


def _result(e: np.ndarray, c: np.ndarray, choice: Sequence[int], budget: float) -> SearchResult:
    ch = tuple(int(x) for x in choice)
    tot_c = float(sum(c[i, j] for i, j in enumerate(ch)))
    return SearchResult(ch, float(sum(e[i, j] for i, j in enumerate(ch))), tot_c, tot_c <= budget * (1 + 1e-12))


def _check_budget(budget: Any) -> float:
    if isinstance(budget, bool) or not isinstance(budget, (int, float, np.integer, np.floating)):
        raise TypeError(f"budget: must be a number, got {type(budget).__name__}")
    b = float(budget)
    if not (math.isfinite(b) and b >= 0):
        raise ValueError(f"budget: must be finite and >= 0, got {budget!r}")
    return b


def search_patterns(
    scores: PatternScores | tuple[Any, Any],
    budget: float,
    *,
    cost: str = "nnz",
    method: str = "dp",
    resolution: int = 2000,
) -> SearchResult:
    """One candidate per layer minimising the summed error with the summed ``cost`` <= ``budget``.

    ``scores``: a PatternScores (``cost`` picks its 'nnz' or 'time_ms' column) or an (error [L, C], cost [L, C])
    pair. ``method``: 'dp' (exact on the integer cost grid; ``resolution`` steps per budget for non-integer costs)
    or 'greedy'. When even the cheapest choice exceeds the budget, that choice is returned with feasible=False."""
    e, c = _table(scores, cost)
    b = _check_budget(budget)
    if method not in ("dp", "greedy"):
        raise ValueError(f"method: must be 'dp' or 'greedy', got {method!r}")
    nl = e.shape[0]
    cheapest = [int(np.lexsort((e[i], c[i]))[0]) for i in range(nl)]
    if c[np.arange(nl), cheapest].sum() > b * (1 + 1e-12):
        return _result(e, c, cheapest, b)
    if method == "greedy":
        ch = [int(np.lexsort((c[i], e[i]))[0]) for i in range(nl)]  # most accurate, cheapest among ties
        while c[np.arange(nl), ch].sum() > b * (1 + 1e-12):
            best = None
            for i in range(nl):
                for j in range(e.shape[1]):
                    saved = c[i, ch[i]] - c[i, j]
                    if saved > 0:
                        rate = (e[i, j] - e[i, ch[i]]) / saved
                        if best is None or rate < best[0]:
                            best = (rate, i, j)
            assert best is not None  # the cheapest choice fits, so some layer can still get cheaper
            ch[best[1]] = best[2]
        return _result(e, c, ch, b)
    integer = np.allclose(c, np.round(c)) and b <= 10 * resolution * max(1, nl)
    if integer:
        ci, cap = np.round(c).astype(np.int64), int(math.floor(b + 1e-9))
    else:
        res = as_int(resolution, "resolution", min=1)
        step = b / res if b > 0 else 1.0
        ci, cap = np.ceil(c / step - 1e-9).astype(np.int64), res
    inf = math.inf
    best = np.full(cap + 1, inf)
    best[0] = 0.0
    back = np.zeros((nl, cap + 1), np.int64)
    for i in range(nl):
        nxt = np.full(cap + 1, inf)
        arg = np.zeros(cap + 1, np.int64)
        for j in range(e.shape[1]):
            w = int(ci[i, j])
            if w > cap:
                continue
            cand = np.full(cap + 1, inf)
            cand[w:] = best[: cap + 1 - w] + e[i, j]
            better = cand < nxt
            nxt[better], arg[better] = cand[better], j
        best, back[i] = nxt, arg
    if not np.isfinite(best).any():  # the grid rounding made the cheapest choice infeasible
        return _result(e, c, cheapest, b)
    pos = int(np.argmin(best))
    ch = [0] * nl
    for i in range(nl - 1, -1, -1):
        ch[i] = int(back[i, pos])
        pos -= int(ci[i, ch[i]])
    return _result(e, c, ch, b)


def brute_force(scores: PatternScores | tuple[Any, Any], budget: float, *, cost: str = "nnz") -> SearchResult:
    """The exact optimum by enumerating all C^L choices (small tables only: the check for the DP)."""
    e, c = _table(scores, cost)
    b = _check_budget(budget)
    if e.shape[1] ** e.shape[0] > 2_000_000:
        raise ValueError(f"scores: {e.shape[1]}^{e.shape[0]} choices are too many to enumerate")
    best = None
    for ch in itertools.product(range(e.shape[1]), repeat=e.shape[0]):
        r = _result(e, c, ch, b)
        if r.feasible and (best is None or r.error < best.error - 1e-15):
            best = r
    if best is None:
        return _result(e, c, [int(np.lexsort((e[i], c[i]))[0]) for i in range(e.shape[0])], b)
    return best


def uniform_choice(scores: PatternScores | tuple[Any, Any], budget: float, *, cost: str = "nnz") -> SearchResult:
    """The baseline: the same candidate on every layer, the most accurate one that fits the budget."""
    e, c = _table(scores, cost)
    b = _check_budget(budget)
    nl = e.shape[0]
    best = None
    for j in range(e.shape[1]):
        r = _result(e, c, [j] * nl, b)
        if r.feasible and (best is None or r.error < best.error):
            best = r
    return best if best is not None else _result(e, c, [int(np.argmin(c.sum(axis=0)))] * nl, b)
