"""Merging speculative / beam branches that share a suffix, over a paged KV cache [Q224].

Several branches grow from one prompt (beam search, a speculative draft tree, parallel sampling); ``fork`` lets
them share the prompt's KV blocks (refcounts), and each branch then owns the blocks of its own tokens. When two
branches end in the same tokens they are candidates for *hypothesis recombination* (as in phrase-based MT and
beam-search dedup): keep one, free the other's private blocks, and add its probability mass to the survivor
(score = logaddexp of the two cumulative log-probs). The decision rule:

    merge(a, b)  iff  the last ``suffix_len`` tokens of a and b are identical           (never merge other tokens)
                 and  distance(p_a, p_b) <= threshold                                   (their futures look alike)

with p_a, p_b the branches' next-token distributions and the distance one of
    js:  Jensen-Shannon distance sqrt(JSD), JSD = (KL(p||m) + KL(q||m)) / 2, m = (p + q) / 2 (scipy's
         ``jensenshannon``; base 2 by default, so it lies in [0, 1]); symmetric, bounded, a metric
    tv:  total variation 0.5 * sum |p - q| in [0, 1]: the largest difference in probability of any event
    kl:  KL(p_a || p_b) (asymmetric, unbounded; inf where p_b = 0 < p_a)

What a merge costs: the survivor's KV was computed from ITS context, so the merged branch continues as the
survivor does. Identical full token sequences => identical KV => the merge is exact (continuation logits equal
bit for bit); identical suffixes after different earlier tokens => an approximation, measured by
``continuation_error`` = max over a continuation of |log p_merged - log p_separate| from real TinyGPT forwards.
Blocks saved are counted exactly: freeing a branch returns the blocks whose refcount was 1 (its private ones);
shared prompt blocks only lose a reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..inference import PagedKVCache
from ..inference.checks import prob_vector, token_list

_METRICS = ("js", "tv", "kl")


def _pair(p: Any, q: Any) -> tuple[np.ndarray, np.ndarray]:
    p, q = prob_vector(p, "p"), prob_vector(q, "q")
    if p.shape != q.shape:
        raise ValueError(f"p, q: expected distributions over the same vocabulary, got shapes {p.shape}, {q.shape}")
    return p / p.sum(), q / q.sum()


def kl_divergence(p: Any, q: Any, base: float = np.e) -> float:
    """KL(p || q) = sum p log(p / q) (0 log 0 = 0; inf where q = 0 < p)."""
    p, q = _pair(p, q)
    nz = p > 0
    if np.any(q[nz] == 0):
        return float("inf")
    return float(np.sum(p[nz] * np.log(p[nz] / q[nz])) / np.log(base))


def js_distance(p: Any, q: Any, base: float = 2.0) -> float:
    """Jensen-Shannon distance sqrt(JSD(p, q)) in ``base`` (scipy.spatial.distance.jensenshannon's definition)."""
    p, q = _pair(p, q)
    m = 0.5 * (p + q)
    js = 0.5 * (kl_divergence(p, m, base) + kl_divergence(q, m, base))
    return float(np.sqrt(max(js, 0.0)))


def tv_distance(p: Any, q: Any) -> float:
    """Total variation 0.5 * sum |p - q|."""
    p, q = _pair(p, q)
    return float(0.5 * np.abs(p - q).sum())


@dataclass(frozen=True)
class MergeDecision:
    merge: bool
    distance: float
    metric: str
    reason: str = ""

    def __bool__(self) -> bool:
        return self.merge


def merge_decision(p_a: Any, p_b: Any, *, metric: str = "js", threshold: float) -> MergeDecision:
    """Merge two branches' futures iff distance(p_a, p_b) <= threshold (see the module docstring)."""
    if metric not in _METRICS:
        raise ValueError(f"metric: expected one of {_METRICS}, got {metric!r}")
    if isinstance(threshold, bool) or not isinstance(threshold, int | float | np.integer | np.floating):
        raise TypeError(f"threshold: expected a real number, got {type(threshold).__name__} {threshold!r}")
    if not threshold >= 0:
        raise ValueError(f"threshold: must be >= 0, got {threshold!r}")
    d = {"js": js_distance, "tv": tv_distance, "kl": kl_divergence}[metric](p_a, p_b)
    ok = d <= threshold
    return MergeDecision(ok, d, metric, f"{metric} {d:.4g} {'<=' if ok else '>'} {threshold:.4g}")


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


@dataclass
class Branch:
    """One live branch: its paged sequence, token ids (prompt included), cumulative log-prob of its generated
    tokens, and the next-token log-probs after its last token."""

    id: int
    seq_id: int
    tokens: list[int]
    logprob: float
    next_logp: np.ndarray
    merged_into: int | None = None


class BranchSet:
    """Branches of one prompt on a PagedKVCache, driven by a real TinyGPT. ``cache`` None: a fresh cache with
    ``num_blocks`` blocks of ``block_size`` tokens sized for the model."""

    def __init__(
        self, model: Any, prompt: Any, cache: PagedKVCache | None = None, num_blocks: int = 64, block_size: int = 4
    ) -> None:
        c = getattr(model, "config", None)
        if c is None or not callable(model):
            raise TypeError(f"model: expected a TinyGPT, got {type(model).__name__}")
        if cache is None:
            cache = PagedKVCache(c.n_layers, c.kv_heads, c.head_dim, num_blocks, block_size)
        elif not isinstance(cache, PagedKVCache):
            raise TypeError(f"cache: expected a PagedKVCache, got {type(cache).__name__}")
        self.model, self.cache = model, cache
        self.branches: dict[int, Branch] = {}
        self._next = 0
        self.blocks_freed = 0
        self.merges: list[tuple[int, int, MergeDecision, int]] = []  # (survivor, merged, decision, blocks freed)
        ids = token_list(prompt, "prompt")
        sid = cache.new_sequence()
        logp = self._forward(sid, ids)
        self.root = self._add(Branch(0, sid, ids, 0.0, logp[-1]))

    def _forward(self, seq_id: int, ids: list[int]) -> np.ndarray:
        from ..autograd import no_grad

        with no_grad():
            logits = self.model(np.asarray(ids, dtype=np.int64)[None], cache=self.cache.model_cache(seq_id))
        return log_softmax(logits.data[0])

    def _add(self, b: Branch) -> int:
        b.id = self._next
        self.branches[b.id] = b
        self._next += 1
        return b.id

    def _live(self, bid: Any) -> Branch:
        b = self.branches.get(bid) if isinstance(bid, int | np.integer) else None
        if b is None or b.merged_into is not None:
            raise ValueError(f"branch: {bid!r} is not a live branch (live: {self.live()})")
        return b

    def live(self) -> list[int]:
        return [i for i, b in self.branches.items() if b.merged_into is None]

    def extend(self, bid: int, tokens: Any) -> None:
        """Append ``tokens`` to branch ``bid`` (one TinyGPT forward over them, KV written to its blocks)."""
        b = self._live(bid)
        toks = token_list(tokens, "tokens")
        logp = self._forward(b.seq_id, toks)
        b.logprob += float(b.next_logp[toks[0]] + sum(logp[i, t] for i, t in enumerate(toks[1:])))
        b.tokens += toks
        b.next_logp = logp[-1]

    def fork(self, bid: int, tokens: Any = ()) -> int:
        """A new branch sharing ``bid``'s blocks (``PagedKVCache.fork``), then extended by ``tokens``."""
        b = self._live(bid)
        nb = self._add(Branch(0, self.cache.fork(b.seq_id), list(b.tokens), b.logprob, b.next_logp.copy()))
        if len(tokens):
            self.extend(nb, tokens)
        return nb

    def private_blocks(self, bid: int) -> int:
        """Blocks only this branch references (refcount 1): what freeing it returns to the allocator."""
        table = self.cache.block_table(self._live(bid).seq_id)
        return int(sum(self.cache.refcount[x] == 1 for x in table))

    def decide(self, a: int, b: int, *, suffix_len: int, metric: str = "js", threshold: float) -> MergeDecision:
        """The merge rule for branches a and b (no side effect)."""
        ba, bb = self._live(a), self._live(b)
        if a == b:
            raise ValueError(f"b: cannot merge branch {a} with itself")
        if isinstance(suffix_len, bool) or not isinstance(suffix_len, int) or suffix_len < 1:
            raise ValueError(f"suffix_len: must be an int >= 1, got {suffix_len!r}")
        sa, sb = ba.tokens[-suffix_len:], bb.tokens[-suffix_len:]
        if len(sa) < suffix_len or sa != sb:
            d = merge_decision(np.exp(ba.next_logp), np.exp(bb.next_logp), metric=metric, threshold=threshold)
            return MergeDecision(False, d.distance, metric, f"last {suffix_len} tokens differ")
        return merge_decision(np.exp(ba.next_logp), np.exp(bb.next_logp), metric=metric, threshold=threshold)

    def merge(self, a: int, b: int, *, suffix_len: int, metric: str = "js", threshold: float) -> MergeDecision:
        """Apply the rule; on a merge the lower-scoring branch is freed (its private blocks return to the pool) and
        its probability mass added to the survivor. Returns the decision."""
        d = self.decide(a, b, suffix_len=suffix_len, metric=metric, threshold=threshold)
        if not d:
            return d
        keep, drop = (a, b) if self.branches[a].logprob >= self.branches[b].logprob else (b, a)
        kb, db = self.branches[keep], self.branches[drop]
        freed = self.private_blocks(drop)
        before = self.cache.blocks_free
        self.cache.free(db.seq_id)
        assert self.cache.blocks_free - before == freed
        kb.logprob = float(np.logaddexp(kb.logprob, db.logprob))
        db.merged_into = keep
        self.blocks_freed += freed
        self.merges.append((keep, drop, d, freed))
        return d

    def merge_all(self, *, suffix_len: int, metric: str = "js", threshold: float) -> int:
        """Greedily merge every mergeable pair of live branches (best-scoring survivor first); returns merges."""
        n = 0
        for a in sorted(self.live(), key=lambda i: -self.branches[i].logprob):
            for b in self.live():
                if a != b and self.branches[a].merged_into is None and self.branches[b].merged_into is None:
                    n += bool(self.merge(a, b, suffix_len=suffix_len, metric=metric, threshold=threshold))
        return n

    def continuation_error(self, a: int, b: int, continuation: Any) -> float:
        """MEASURED error of continuing branch b from branch a's KV: max over the continuation's positions and the
        vocabulary of |log p(. | a's context + cont) - log p(. | b's context + cont)| (both from real forwards on
        temporary forks, freed afterwards). 0 exactly when a and b hold identical token sequences."""
        ba, bb = self._live(a), self._live(b)
        cont = token_list(continuation, "continuation")
        fa, fb = self.cache.fork(ba.seq_id), self.cache.fork(bb.seq_id)
        try:
            la, lb = self._forward(fa, cont), self._forward(fb, cont)
        finally:
            self.cache.free(fa)
            self.cache.free(fb)
        la = np.vstack([ba.next_logp[None], la])
        lb = np.vstack([bb.next_logp[None], lb])
        return float(np.max(np.abs(la - lb)))

    def __repr__(self) -> str:
        return (
            f"BranchSet({len(self.live())} live branches, {len(self.merges)} merges, {self.blocks_freed} blocks freed, "
            f"{self.cache!r})"
        )
