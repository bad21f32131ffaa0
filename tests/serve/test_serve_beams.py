"""[Q224] merging beam / speculative branches with a shared suffix over a PagedKVCache (real TinyGPT branches)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.distance import jensenshannon
from scipy.stats import entropy

from tinylearn.inference import TinyGPT
from tinylearn.serve.beams import BranchSet, js_distance, kl_divergence, merge_decision, tv_distance

PROMPT = list(range(1, 11))  # 10 tokens: blocks of 4 -> 2 full blocks + 1 partial (2 tokens)
SUFFIX = [5, 9, 13, 2, 7, 7]


@pytest.fixture(scope="module")
def model():
    np.random.seed(0)
    return TinyGPT(64, 64, 4, 2, 128, n_kv_heads=2)


def test_distances_match_scipy_and_hand_values():
    rng = np.random.default_rng(0)
    for _ in range(20):
        p, q = rng.dirichlet(np.ones(50)), rng.dirichlet(np.ones(50))
        p[rng.integers(0, 50, 5)] = 0.0  # zeros: 0 log 0 = 0
        p /= p.sum()
        assert js_distance(p, q) == pytest.approx(jensenshannon(p, q, base=2), rel=1e-12, abs=1e-15)
        assert js_distance(p, q, base=np.e) == pytest.approx(jensenshannon(p, q), rel=1e-12, abs=1e-15)
        assert kl_divergence(p, q) == pytest.approx(entropy(p, q), rel=1e-12)
        assert tv_distance(p, q) == pytest.approx(0.5 * np.abs(p - q).sum(), rel=1e-12)
    # hand values: disjoint supports are 1 apart in JS (base 2) and TV; KL is infinite
    a, b = np.array([0.5, 0.5, 0.0, 0.0]), np.array([0.0, 0.0, 0.5, 0.5])
    assert js_distance(a, b) == pytest.approx(1.0) and tv_distance(a, b) == 1.0 and kl_divergence(a, b) == np.inf
    c = np.array([0.75, 0.25])
    d = np.array([0.25, 0.75])
    assert tv_distance(c, d) == pytest.approx(0.5)
    assert kl_divergence(c, d) == pytest.approx(0.75 * np.log(3) + 0.25 * np.log(1 / 3))
    assert js_distance(c, c) == 0.0


def test_merge_decision_threshold():
    p, q = np.array([0.75, 0.25]), np.array([0.25, 0.75])
    assert merge_decision(p, q, metric="tv", threshold=0.5)  # distance 0.5 <= 0.5
    assert not merge_decision(p, q, metric="tv", threshold=0.49)
    d = merge_decision(p, q, metric="js", threshold=1.0)
    assert d.merge and d.distance == pytest.approx(jensenshannon(p, q, base=2)) and d.metric == "js"


def test_blocks_freed_exact_and_identical_merge_is_exact(model):
    bs = BranchSet(model, PROMPT, num_blocks=64, block_size=4)
    assert bs.cache.stats()["blocks_used"] == 3
    a = bs.fork(bs.root, [20, *SUFFIX])
    c = bs.fork(bs.root, [20, *SUFFIX])  # the same tokens, e.g. two draft branches that sampled alike
    # 17 tokens = 5 blocks: 2 full prompt blocks shared, the partial one copied on write, 2 new -> 3 private
    assert bs.private_blocks(a) == bs.private_blocks(c) == 3
    assert bs.cache.stats()["blocks_used"] == 3 + 3 + 3
    assert bs.continuation_error(a, c, [3, 4, 5, 6, 8]) == 0.0  # identical KV: continuation logits equal exactly
    free0 = bs.cache.blocks_free
    la, lc = bs.branches[a].logprob, bs.branches[c].logprob
    d = bs.merge(a, c, suffix_len=len(SUFFIX), metric="js", threshold=0.0)
    assert d and d.distance == 0.0
    assert bs.cache.blocks_free - free0 == 3 and bs.blocks_freed == 3
    survivor = bs.merges[0][0]
    assert bs.branches[survivor].logprob == pytest.approx(np.logaddexp(la, lc))
    assert bs.cache.refcount[bs.cache.block_table(bs.branches[survivor].seq_id)].max() == 2  # root + survivor
    with pytest.raises(ValueError, match="not a live branch"):
        bs.extend(bs.merges[0][1], [1])


def test_never_merges_different_suffixes(model):
    bs = BranchSet(model, PROMPT)
    a = bs.fork(bs.root, [20, *SUFFIX])
    b = bs.fork(bs.root, [20, *SUFFIX[:-1], 8])  # last token differs
    c = bs.fork(bs.root, [21, *SUFFIX])  # same suffix after a different token
    d = bs.decide(a, b, suffix_len=1, metric="tv", threshold=1.0)  # any distance would pass
    assert not d and "differ" in d.reason
    used = bs.cache.stats()["blocks_used"]
    assert bs.merge_all(suffix_len=len(SUFFIX), metric="tv", threshold=1.0) == 1  # only a with c
    assert sorted(bs.live()) == sorted([bs.root, b, a if bs.branches[a].merged_into is None else c])
    assert bs.cache.stats()["blocks_used"] == used - 3
    # a suffix longer than the branch never matches
    assert not bs.decide(bs.root, b, suffix_len=100, threshold=1.0)


def test_merge_error_measured_on_real_branches(model):
    """Same suffix, different earlier token: the merge is approximate; its error shrinks as the shared suffix grows
    (the differing token's share of attention is diluted) and the JS decision tracks it."""
    rng = np.random.default_rng(1)
    errs, dists = [], []
    for n in (2, 8, 24):
        bs = BranchSet(model, PROMPT)
        suf = rng.integers(0, 64, n).tolist()
        a, b = bs.fork(bs.root, [20, *suf]), bs.fork(bs.root, [33, *suf])
        errs.append(bs.continuation_error(a, b, [3, 4, 5]))
        dists.append(bs.decide(a, b, suffix_len=n, threshold=1.0).distance)
    assert all(e > 0 for e in errs)
    assert errs[-1] < errs[0] and dists[-1] < dists[0]
    print(f"\n[Q224] suffix 2/8/24: max|dlogp| {np.round(errs, 4).tolist()}, JS {np.round(dists, 4).tolist()}")


def test_bad_args(model):
    p = np.array([0.5, 0.5])
    with pytest.raises(ValueError, match="metric"):
        merge_decision(p, p, metric="l2", threshold=0.1)
    with pytest.raises(ValueError, match="threshold"):
        merge_decision(p, p, threshold=-1.0)
    with pytest.raises(TypeError, match="threshold"):
        merge_decision(p, p, threshold="low")
    with pytest.raises(ValueError, match="p, q"):
        js_distance(p, np.array([0.2, 0.3, 0.5]))
    with pytest.raises(ValueError):
        tv_distance(np.array([0.5, -0.5]), p)
    with pytest.raises(TypeError, match="model"):
        BranchSet(object(), [1, 2])
    with pytest.raises(TypeError, match="cache"):
        BranchSet(model, [1, 2], cache="paged")
    bs = BranchSet(model, PROMPT)
    a = bs.fork(bs.root, [1])
    with pytest.raises(ValueError, match="suffix_len"):
        bs.decide(a, bs.root, suffix_len=0, threshold=0.1)
    with pytest.raises(ValueError, match="itself"):
        bs.merge(a, a, suffix_len=1, threshold=0.1)
    with pytest.raises(ValueError, match="not a live branch"):
        bs.fork(99)
