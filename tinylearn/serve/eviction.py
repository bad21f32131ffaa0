"""Scored eviction for a serving cache of KV prefixes and retrieved documents [Q193, Q220].

A long-conversation serving cache holds two kinds of entries: the KV prefix of a conversation (large, reused at
the next turn) and retrieved documents (smaller, reused while the topic lasts). ``ScoredCache(capacity_bytes,
scorer)`` keeps them under a byte budget; when an insert does not fit it evicts the entry with the LOWEST score
(ties: least recently used first) until it does. Every ``get`` is one request and advances the logical clock.

Scorers (``score(entries, now, context) -> float array``, higher = keep):

    LRUScorer               last_access
    LFUScorer               freq (ties -> LRU)
    SemanticDecayScorer     [Q193]  alpha * cos(entry.embedding, context) + (1 - alpha) * exp(-ln2 * age / half_life)
                            age = now - last_access: relevance to what the conversation is about *now* plus a
                            recency term that halves every ``half_life`` requests
    LinearAccessPredictor   [Q220]  features (log1p age, log1p freq, cos to context, log2 nbytes) -> P(accessed in
                            the next ``window`` requests), logistic regression fitted by plain numpy gradient descent
                            on standardised features (``access_dataset`` labels a training trace); evict the lowest P

Workload: ``topic_drift_trace`` is a SYNTHETIC, seeded trace (not a measured one) built so that recency alone is the
wrong signal: the active topic switches every ~``phase_len`` requests (topic drift, old topics sometimes come back);
a request is a turn of one of the topic's conversations (KV prefix), a retrieval of one of the topic's documents
(Zipf popularity) or a one-off document with an unrelated embedding (never requested again -- a scan that
pollutes LRU). The context embedding of a request is its topic's embedding plus noise. ``replay`` reports request
and byte hit rates; the tests check, over 5 seeds, that the semantic+decay scorer and the learned predictor beat
LRU on held-out traces and that the predictor's held-out AUC is > 0.6.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np


def _num(name: str, v: Any, lo: float, hi: float = math.inf, lo_open: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating) or not math.isfinite(v):
        raise ValueError(f"{name}: expected a finite number, got {v!r}")
    if v < lo or v > hi or (lo_open and v == lo):
        raise ValueError(f"{name}: must be in {'(' if lo_open else '['}{lo}, {hi}], got {v!r}")
    return float(v)


def _int(name: str, v: Any, lo: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < lo:
        raise ValueError(f"{name}: must be an int >= {lo}, got {v!r}")
    return int(v)


@dataclass
class Entry:
    """One cached object: a conversation's KV prefix ("kv") or a retrieved document ("doc")."""

    key: str
    nbytes: int
    embedding: np.ndarray
    last_access: float = 0.0
    freq: int = 1
    created: float = 0.0
    kind: str = "kv"

    def __post_init__(self) -> None:
        self.nbytes = _int("nbytes", self.nbytes)
        emb = np.asarray(self.embedding, dtype=np.float64)
        if emb.ndim != 1 or emb.size == 0 or not np.all(np.isfinite(emb)):
            raise ValueError(f"embedding: expected a finite 1-D vector, got shape {emb.shape}")
        self.embedding = emb


class Scorer(Protocol):
    def score(self, entries: Sequence[Entry], now: float, context: np.ndarray | None) -> np.ndarray: ...


def cosine_to(entries: Sequence[Entry], context: np.ndarray | None) -> np.ndarray:
    """cos(entry.embedding, context) per entry (0 where there is no context or a zero vector)."""
    if context is None or not entries:
        return np.zeros(len(entries))
    e = np.stack([x.embedding for x in entries])
    c = np.asarray(context, dtype=np.float64)
    if c.shape != e.shape[1:]:
        raise ValueError(f"context: expected an embedding of shape {e.shape[1:]}, got {c.shape}")
    den = np.linalg.norm(e, axis=1) * np.linalg.norm(c)
    return np.divide(e @ c, den, out=np.zeros(len(entries)), where=den > 0)


class LRUScorer:
    """Least recently used goes first."""

    def score(self, entries: Sequence[Entry], now: float, context: np.ndarray | None) -> np.ndarray:
        return np.array([e.last_access for e in entries], dtype=np.float64)


class LFUScorer:
    """Least frequently used goes first (ties: least recently used)."""

    def score(self, entries: Sequence[Entry], now: float, context: np.ndarray | None) -> np.ndarray:
        return np.array([e.freq for e in entries], dtype=np.float64)


class SemanticDecayScorer:
    """[Q193] alpha * cos(embedding, context) + (1 - alpha) * exp(-ln2 * (now - last_access) / half_life)."""

    def __init__(self, alpha: float = 0.5, half_life: float = 50.0) -> None:
        self.alpha = _num("alpha", alpha, 0.0, 1.0)
        self.half_life = _num("half_life", half_life, 0.0, lo_open=True)

    def score(self, entries: Sequence[Entry], now: float, context: np.ndarray | None) -> np.ndarray:
        age = np.array([now - e.last_access for e in entries], dtype=np.float64)
        decay = np.exp(-math.log(2.0) * age / self.half_life)
        return self.alpha * cosine_to(entries, context) + (1.0 - self.alpha) * decay


FEATURES = ("log1p_age", "log1p_freq", "cos_context", "log2_nbytes")


def features(entries: Sequence[Entry], now: float, context: np.ndarray | None) -> np.ndarray:
    """[n, 4] float64: recency, frequency, context relevance, size (see ``FEATURES``)."""
    age = np.array([max(now - e.last_access, 0.0) for e in entries], dtype=np.float64)
    freq = np.array([e.freq for e in entries], dtype=np.float64)
    size = np.array([e.nbytes for e in entries], dtype=np.float64)
    return np.stack([np.log1p(age), np.log1p(freq), cosine_to(entries, context), np.log2(size)], axis=1)


class LinearAccessPredictor:
    """[Q220] P(access within the next ``window`` requests) = sigmoid(w . standardise(features) + b).

    ``fit(X, y)``: full-batch gradient descent on the mean log loss + ``l2``/2 * |w|^2 (plain numpy)."""

    def __init__(self, window: int = 50, lr: float = 1.0, epochs: int = 1000, l2: float = 1e-4) -> None:
        self.window = _int("window", window)
        self.lr = _num("lr", lr, 0.0, lo_open=True)
        self.epochs = _int("epochs", epochs)
        self.l2 = _num("l2", l2, 0.0)
        self.coef_: np.ndarray | None = None
        self.intercept_ = 0.0
        self.loss_history: list[float] = []

    def fit(self, X: np.ndarray, y: np.ndarray) -> LinearAccessPredictor:
        X, y = np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != len(FEATURES) or X.shape[0] < 2:
            raise ValueError(f"X: expected [n >= 2, {len(FEATURES)}] features, got {X.shape}")
        if y.shape != (X.shape[0],) or not np.all((y == 0) | (y == 1)):
            raise ValueError(f"y: expected {X.shape[0]} labels in {{0, 1}}, got shape {y.shape}")
        if y.min() == y.max():
            raise ValueError(f"y: needs both classes to fit, got only {int(y[0])}")
        self.mean_, self.std_ = X.mean(0), X.std(0) + 1e-12
        Z = (X - self.mean_) / self.std_
        w, b, n = np.zeros(Z.shape[1]), 0.0, len(y)
        self.loss_history = []
        for _ in range(self.epochs):
            p = 1.0 / (1.0 + np.exp(-(Z @ w + b)))
            g = p - y
            w -= self.lr * (Z.T @ g / n + self.l2 * w)
            b -= self.lr * g.mean()
            eps = 1e-12
            self.loss_history.append(float(-np.mean(y * np.log(p + eps) + (1 - y) * np.log(1 - p + eps))))
        self.coef_, self.intercept_ = w, b
        return self

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        if self.coef_ is None:
            raise RuntimeError("LinearAccessPredictor: call fit() (or fit_trace()) before predicting")
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != len(FEATURES):
            raise ValueError(f"X: expected [n, {len(FEATURES)}] features, got {X.shape}")
        return 1.0 / (1.0 + np.exp(-(((X - self.mean_) / self.std_) @ self.coef_ + self.intercept_)))

    def fit_trace(self, trace: Sequence[Request], **kw: Any) -> LinearAccessPredictor:
        X, y = access_dataset(trace, window=self.window, **kw)
        return self.fit(X, y)

    def score(self, entries: Sequence[Entry], now: float, context: np.ndarray | None) -> np.ndarray:
        return self.predict_proba(features(entries, now, context))


class ScoredCache:
    """Byte-budgeted cache that evicts the lowest-scored entry; see the module docstring."""

    def __init__(self, capacity_bytes: int, scorer: Scorer) -> None:
        self.capacity_bytes = _int("capacity_bytes", capacity_bytes)
        if not callable(getattr(scorer, "score", None)):
            raise TypeError(f"scorer: expected an object with score(entries, now, context), got {scorer!r}")
        self.scorer = scorer
        self.entries: dict[str, Entry] = {}
        self.used_bytes = 0
        self.now = 0.0
        self.context: np.ndarray | None = None
        self.hits = self.misses = self.hit_bytes = self.miss_bytes = self.evictions = self.rejected = 0
        self.evicted: list[str] = []

    def __contains__(self, key: str) -> bool:
        return key in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, key: str, *, nbytes: int | None = None, context: np.ndarray | None = None) -> Entry | None:
        """One request (the clock advances): the entry on a hit (its last_access and freq updated), None on a miss.
        ``nbytes``: the size of the requested object, for byte accounting on a miss; ``context``: the embedding of
        what the conversation is about now (kept for later evictions)."""
        self.now += 1
        if context is not None:
            self.context = np.asarray(context, dtype=np.float64)
        e = self.entries.get(key)
        if e is None:
            self.misses += 1
            self.miss_bytes += 0 if nbytes is None else _int("nbytes", nbytes)
            return None
        e.last_access, e.freq = self.now, e.freq + 1
        self.hits += 1
        self.hit_bytes += e.nbytes
        return e

    def put(self, entry: Entry) -> list[Entry]:
        """Insert (or replace) ``entry`` stamped with the current clock; evicts lowest-scored entries until it fits.
        Returns the evicted entries. An entry larger than the whole cache is not cached (counted in ``rejected``)."""
        if not isinstance(entry, Entry):
            raise TypeError(f"entry: expected an Entry, got {type(entry).__name__}")
        old = self.entries.pop(entry.key, None)
        if old is not None:
            self.used_bytes -= old.nbytes
        if entry.nbytes > self.capacity_bytes:
            self.rejected += 1
            return []
        entry.last_access = self.now
        if old is None:
            entry.created = self.now
        out = []
        while self.used_bytes + entry.nbytes > self.capacity_bytes:
            out.append(self.evict())
        self.entries[entry.key] = entry
        self.used_bytes += entry.nbytes
        return out

    def victim_order(self) -> list[str]:
        """All keys, first to be evicted first (lowest score, ties by least recent access)."""
        es = list(self.entries.values())
        if not es:
            return []
        s = np.asarray(self.scorer.score(es, self.now, self.context), dtype=np.float64)
        if s.shape != (len(es),):
            raise ValueError(f"scorer: returned shape {s.shape} for {len(es)} entries")
        order = np.lexsort((np.array([e.last_access for e in es]), s))
        return [es[i].key for i in order]

    def evict(self) -> Entry:
        """Evict and return the lowest-scored entry."""
        if not self.entries:
            raise RuntimeError("ScoredCache: evict() on an empty cache")
        e = self.entries.pop(self.victim_order()[0])
        self.used_bytes -= e.nbytes
        self.evictions += 1
        self.evicted.append(e.key)
        return e

    def stats(self) -> dict[str, float]:
        n, nb = self.hits + self.misses, self.hit_bytes + self.miss_bytes
        return dict(
            hits=self.hits,
            misses=self.misses,
            hit_rate=self.hits / n if n else 0.0,
            byte_hit_rate=self.hit_bytes / nb if nb else 0.0,
            evictions=self.evictions,
            used_bytes=self.used_bytes,
        )


# -- synthetic workload --------------------------------------------------------------------------------------------
@dataclass
class Request:
    """One request of a synthetic trace: the object it needs and the context embedding at that moment."""

    key: str
    nbytes: int
    embedding: np.ndarray
    context: np.ndarray
    kind: str
    topic: int = field(default=-1)


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def topic_drift_trace(
    n_requests: int,
    seed: int,
    *,
    n_topics: int = 12,
    dim: int = 16,
    phase_len: int = 80,
    convs_per_topic: int = 3,
    docs_per_topic: int = 24,
    p_conv: float = 0.35,
    p_oneoff: float = 0.35,
    conv_bytes: tuple[int, int] = (32 << 10, 128 << 10),
    doc_bytes: int = 16 << 10,
    noise: float = 0.3,
) -> list[Request]:
    """A SYNTHETIC multi-turn conversation + retrieval trace with topic drift (see the module docstring).

    The topic universe (embeddings, conversation sizes) depends on ``seed`` only through the first draws, so two
    traces with different seeds are independent draws of the same kind of workload."""
    n_requests, n_topics, dim = _int("n_requests", n_requests), _int("n_topics", n_topics), _int("dim", dim)
    phase_len = _int("phase_len", phase_len)
    p_conv, p_oneoff = _num("p_conv", p_conv, 0.0, 1.0), _num("p_oneoff", p_oneoff, 0.0, 1.0)
    if p_conv + p_oneoff > 1:
        raise ValueError(f"p_conv + p_oneoff: must be <= 1, got {p_conv} + {p_oneoff}")
    rng = np.random.default_rng(seed)
    topics = _unit(rng.standard_normal((n_topics, dim)))
    conv_size = rng.integers(conv_bytes[0], conv_bytes[1] + 1, (n_topics, convs_per_topic))
    zipf = 1.0 / np.arange(1, docs_per_topic + 1)
    zipf /= zipf.sum()
    item_emb: dict[str, np.ndarray] = {}
    out: list[Request] = []
    topic, oneoff = int(rng.integers(n_topics)), 0
    for i in range(n_requests):
        if i and rng.random() < 1.0 / phase_len:
            topic = int(rng.integers(n_topics))
        ctx = _unit(topics[topic] + noise * rng.standard_normal(dim) / math.sqrt(dim))
        u = rng.random()
        if u < p_conv:
            c = int(rng.integers(convs_per_topic))
            key, nb, kind = f"conv{topic}.{c}", int(conv_size[topic, c]), "kv"
        elif u < p_conv + p_oneoff:
            key, nb, kind = f"oneoff{oneoff}", doc_bytes, "doc"
            oneoff += 1
            item_emb[key] = _unit(rng.standard_normal(dim))
        else:
            d = int(rng.choice(docs_per_topic, p=zipf))
            key, nb, kind = f"doc{topic}.{d}", doc_bytes, "doc"
        if key not in item_emb:
            item_emb[key] = _unit(topics[topic] + noise * rng.standard_normal(dim) / math.sqrt(dim))
        out.append(Request(key, nb, item_emb[key], ctx, kind, topic))
    return out


def replay(trace: Sequence[Request], capacity_bytes: int, scorer: Scorer) -> dict[str, float]:
    """Run ``trace`` through a ScoredCache (miss -> insert); its ``stats()``."""
    cache = ScoredCache(capacity_bytes, scorer)
    for r in trace:
        if cache.get(r.key, nbytes=r.nbytes, context=r.context) is None:
            cache.put(Entry(r.key, r.nbytes, r.embedding, kind=r.kind))
    return cache.stats()


def access_dataset(
    trace: Sequence[Request], window: int = 50, every: int = 5, horizon: int = 400, per_point: int = 64, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Training data for ``LinearAccessPredictor``: every ``every`` requests, up to ``per_point`` objects seen in the
    last ``horizon`` requests (the candidates a cache would hold) -> (features at that moment, 1 if the object is
    requested within the next ``window`` requests). Returns X [n, 4], y [n]."""
    window, every, horizon = _int("window", window), _int("every", every), _int("horizon", horizon)
    per_point = _int("per_point", per_point)
    rng = np.random.default_rng(seed)
    times: dict[str, list[int]] = {}
    for t, r in enumerate(trace):
        times.setdefault(r.key, []).append(t)
    state: dict[str, Entry] = {}
    X, y = [], []
    for t, r in enumerate(trace):
        now = t + 1.0
        e = state.get(r.key)
        if e is None:
            state[r.key] = Entry(r.key, r.nbytes, r.embedding, last_access=now, created=now, kind=r.kind)
        else:
            e.last_access, e.freq = now, e.freq + 1
        if t % every or t + window >= len(trace):
            continue
        cands = [e for e in state.values() if now - e.last_access <= horizon]
        if len(cands) > per_point:
            cands = [cands[i] for i in rng.choice(len(cands), per_point, replace=False)]
        X.append(features(cands, now, r.context))
        for e in cands:
            ts = times[e.key]
            j = np.searchsorted(ts, t, side="right")
            y.append(1.0 if j < len(ts) and ts[j] <= t + window else 0.0)
    if not X:
        raise ValueError(f"trace: too short ({len(trace)} requests) for window={window}")
    return np.concatenate(X), np.array(y)


def roc_auc(y: np.ndarray, p: np.ndarray) -> float:
    """Area under the ROC curve = P(score of a random positive > that of a random negative), ties count 1/2."""
    y, p = np.asarray(y, dtype=np.float64), np.asarray(p, dtype=np.float64)
    if y.shape != p.shape or y.ndim != 1:
        raise ValueError(f"y, p: expected two 1-D arrays of one length, got {y.shape}, {p.shape}")
    pos, neg = int((y == 1).sum()), int((y == 0).sum())
    if pos == 0 or neg == 0 or pos + neg != len(y):
        raise ValueError(f"y: needs labels in {{0, 1}} with both classes, got {pos} positives, {neg} negatives")
    order = np.argsort(p, kind="mergesort")
    ranks = np.empty(len(p))
    sp = p[order]
    i = 0
    while i < len(sp):  # average ranks over ties
        j = i
        while j + 1 < len(sp) and sp[j + 1] == sp[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return float((ranks[y == 1].sum() - pos * (pos + 1) / 2.0) / (pos * neg))
