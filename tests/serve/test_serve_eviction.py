"""Scored eviction [Q193, Q220]: exact small cases, semantic+decay and the learned predictor beat LRU on a synthetic
topic-drift trace over 5 seeds, the predictor's held-out AUC, and argument errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from tinylearn.serve.eviction import (
    Entry,
    LFUScorer,
    LinearAccessPredictor,
    LRUScorer,
    ScoredCache,
    SemanticDecayScorer,
    access_dataset,
    features,
    replay,
    roc_auc,
    topic_drift_trace,
)

E2 = [np.array([1.0, 0.0]), np.array([0.0, 1.0]), np.array([1.0, 1.0])]


def _fill(scorer, cap: int = 30) -> ScoredCache:
    c = ScoredCache(cap, scorer)
    for key, emb in zip("abc", E2, strict=True):
        assert c.get(key, nbytes=10) is None
        assert c.put(Entry(key, 10, emb)) == []
    return c  # a, b, c inserted at clock 1, 2, 3


def test_lru_evicts_least_recent():
    c = _fill(LRUScorer())
    c.get("a")  # clock 4: order by recency is now b, c, a
    assert c.victim_order() == ["b", "c", "a"]
    assert [e.key for e in c.put(Entry("d", 10, E2[0]))] == ["b"]
    assert [e.key for e in c.put(Entry("e", 20, E2[0]))] == ["c", "a"]
    st = c.stats()
    assert (st["hits"], st["misses"], st["evictions"], st["used_bytes"]) == (1, 3, 3, 30)
    assert st["byte_hit_rate"] == pytest.approx(10 / 40)


def test_lfu_evicts_least_frequent_ties_by_recency():
    c = _fill(LFUScorer())
    c.get("c"), c.get("c"), c.get("a")  # freq a=2, b=1, c=3
    assert c.victim_order() == ["b", "a", "c"]
    c.get("b")  # freq a=2 (last 6), b=2 (last 7): tie -> a older
    assert c.victim_order() == ["a", "b", "c"]


def test_semantic_decay_scores_by_hand():
    s = SemanticDecayScorer(alpha=0.6, half_life=2.0)
    c = _fill(s)
    c.get("zz", context=np.array([0.0, 1.0]))  # a miss at clock 4, sets the context to b's direction
    es = [c.entries[k] for k in "abc"]
    want = [
        0.6 * cos + 0.4 * math.exp(-math.log(2) * age / 2.0) for cos, age in ((0.0, 3), (1.0, 2), (1 / math.sqrt(2), 1))
    ]
    np.testing.assert_allclose(s.score(es, c.now, c.context), want, rtol=1e-12)
    assert c.victim_order() == ["a", "c", "b"]  # a: 0.141, c: 0.707, b: 0.8
    # alpha=0 is pure exponential decay: the same order as LRU
    c.scorer = SemanticDecayScorer(alpha=0.0, half_life=2.0)
    assert c.victim_order() == ["a", "b", "c"]


def test_predictor_evicts_lowest_probability():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((400, 4))
    y = (X[:, 2] + 0.3 * rng.standard_normal(400) > 0).astype(float)  # only context relevance matters
    p = LinearAccessPredictor(epochs=500).fit(X, y)
    assert p.coef_[2] > 2 * np.abs(p.coef_[[0, 1, 3]]).max()
    c = _fill(p)
    c.get("q", context=np.array([1.0, 0.0]))
    es = [c.entries[k] for k in "abc"]
    probs = p.predict_proba(features(es, c.now, c.context))
    assert c.victim_order() == [es[i].key for i in np.argsort(probs)] == ["b", "c", "a"]


def test_gradient_descent_matches_sklearn_and_auc_matches_sklearn():
    X, y = access_dataset(topic_drift_trace(1500, 100), window=50)
    p = LinearAccessPredictor(epochs=3000, l2=0.0).fit(X, y)
    Z = (X - p.mean_) / p.std_
    sk = LogisticRegression(C=1e6, max_iter=5000).fit(Z, y)
    assert np.abs(p.predict_proba(X) - sk.predict_proba(Z)[:, 1]).max() < 0.01
    assert p.loss_history[-1] <= p.loss_history[0]
    prob = p.predict_proba(X)
    assert roc_auc(y, prob) == pytest.approx(roc_auc_score(y, prob), abs=1e-12)
    ties = np.array([0.1, 0.5, 0.5, 0.5, 0.9, 0.2])
    yt = np.array([0, 1, 0, 1, 1, 0])
    assert roc_auc(yt, ties) == pytest.approx(roc_auc_score(yt, ties), abs=1e-12)


def test_semantic_and_learned_beat_lru_on_topic_drift_over_seeds():
    """Byte hit rate on held-out SYNTHETIC traces, 5 seeds x 2 capacities; the margin 0.02 was the smallest margin
    that held with room to spare (measured minimum: semantic +0.036, learned +0.039, at 512 KiB)."""
    for seed in range(5):
        pred = LinearAccessPredictor(window=50).fit_trace(topic_drift_trace(3000, 100 + seed))
        test = topic_drift_trace(3000, seed)
        X, y = access_dataset(test, window=50)
        assert roc_auc(y, pred.predict_proba(X)) > 0.6
        for cap in (256 << 10, 512 << 10):
            lru = replay(test, cap, LRUScorer())["byte_hit_rate"]
            sem = replay(test, cap, SemanticDecayScorer(alpha=0.5, half_life=50))["byte_hit_rate"]
            lin = replay(test, cap, pred)["byte_hit_rate"]
            assert sem > lru + 0.02, (seed, cap, lru, sem)
            assert lin > lru + 0.02, (seed, cap, lru, lin)


def test_trace_is_seeded_and_has_the_advertised_structure():
    a, b = topic_drift_trace(600, 3), topic_drift_trace(600, 3)
    assert [r.key for r in a] == [r.key for r in b]
    oneoffs = [r.key for r in a if r.key.startswith("oneoff")]
    assert len(oneoffs) == len(set(oneoffs)) > 100  # one-off documents are never requested again
    assert len({r.topic for r in a}) > 2  # the topic drifts
    conv = [r for r in a if r.kind == "kv"]
    assert all(np.dot(r.embedding, r.context) > 0.5 for r in conv)


def test_bad_arguments():
    with pytest.raises(ValueError, match="capacity_bytes"):
        ScoredCache(0, LRUScorer())
    with pytest.raises(TypeError, match="scorer"):
        ScoredCache(10, object())
    with pytest.raises(ValueError, match="alpha"):
        SemanticDecayScorer(alpha=1.5)
    with pytest.raises(ValueError, match="half_life"):
        SemanticDecayScorer(half_life=0)
    with pytest.raises(ValueError, match="nbytes"):
        Entry("a", 0, E2[0])
    with pytest.raises(ValueError, match="embedding"):
        Entry("a", 1, np.array([np.nan]))
    c = ScoredCache(10, LRUScorer())
    with pytest.raises(RuntimeError, match="empty"):
        c.evict()
    with pytest.raises(TypeError, match="entry"):
        c.put("a")
    assert c.put(Entry("big", 11, E2[0])) == [] and "big" not in c and c.rejected == 1
    c.put(Entry("a", 5, E2[0]))
    c.context = np.zeros(3)
    with pytest.raises(ValueError, match="context"):
        SemanticDecayScorer().score(list(c.entries.values()), 1.0, c.context)
    with pytest.raises(RuntimeError, match="fit"):
        LinearAccessPredictor().predict_proba(np.zeros((1, 4)))
    with pytest.raises(ValueError, match="X"):
        LinearAccessPredictor().fit(np.zeros((5, 3)), np.zeros(5))
    with pytest.raises(ValueError, match="y"):
        LinearAccessPredictor().fit(np.zeros((5, 4)), np.zeros(5))
    with pytest.raises(ValueError, match="y"):
        roc_auc(np.ones(3), np.ones(3))
    with pytest.raises(ValueError, match="p_conv"):
        topic_drift_trace(10, 0, p_conv=0.8, p_oneoff=0.5)
    with pytest.raises(ValueError, match="n_requests"):
        topic_drift_trace(0, 0)
