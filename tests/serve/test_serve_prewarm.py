"""Lazy shard loading and Markov prewarming [Q162]: estimates equal hand counts, a cycle is predicted exactly,
prewarming lowers the number of cold loads on the critical path of a Markov trace, argument errors."""

from __future__ import annotations

import os

import numpy as np
import pytest
from safetensors.numpy import load_file

from tinylearn.inference import TinyGPT
from tinylearn.serve.prewarm import (
    LazyModel,
    MarkovPrewarmer,
    ShardedCheckpoint,
    markov_trace,
    replay,
    shard_by_layer,
)


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("shards")
    rng = np.random.default_rng(0)
    state = {f"m{i}.w{j}": rng.standard_normal((64, 64)).astype(np.float32) for i in range(8) for j in range(2)}
    ShardedCheckpoint.save(state, d, lambda n: n.split(".")[0])
    return d, state


def test_save_writes_one_safetensors_file_per_shard_and_lazy_get_reads_it(ckpt_dir):
    d, state = ckpt_dir
    ck = ShardedCheckpoint(d)
    assert ck.shards == [f"m{i}" for i in range(8)]
    assert sorted(f for f in os.listdir(d) if f.endswith(".safetensors")) == [f"m{i}.safetensors" for i in range(8)]
    assert set(load_file(ck.path("m3"))) == {"m3.w0", "m3.w1"}
    with LazyModel(d, capacity=2) as m:
        assert m.resident() == []
        np.testing.assert_array_equal(m.get("m3.w1"), state["m3.w1"])
        m.get("m3.w0")  # same shard: a hit
        m.get("m0.w0")
        m.get("m1.w0")  # capacity 2: m3 is evicted (LRU)
        assert m.resident() == ["m0", "m1"]
        m.drop("m0")
        m.get("m0.w1")
        st = m.stats()
    assert (st["accesses"], st["hits"], st["cold_loads"]) == (5, 1, 4)
    assert len(m.load_times["m0"]) == 2 and all(t > 0 for t in m.load_times["m0"])


def test_tinygpt_state_dict_sharded_per_layer(tmp_path):
    model = TinyGPT(vocab_size=64, d_model=32, n_heads=4, n_layers=3, max_seq_len=32)
    sd = model.state_dict()
    ck = ShardedCheckpoint.save(sd, tmp_path, shard_by_layer)
    assert ck.shards == ["layer0", "layer1", "layer2", "shared"]
    with LazyModel(tmp_path) as m:
        np.testing.assert_array_equal(m.get("blocks.1.mlp.fc.weight"), sd["blocks.1.mlp.fc.weight"].numpy())
        assert m.resident() == ["layer1"]


def test_transition_estimates_equal_hand_counts():
    pw = MarkovPrewarmer(order=1).fit(list("abacab"))
    # a->b twice, a->c once, b->a once, c->a once
    assert pw.transition_probs(("a",)) == pytest.approx({"b": 2 / 3, "c": 1 / 3})
    assert pw.transition_probs(("b",)) == {"a": 1.0}
    np.testing.assert_allclose(
        pw.transition_matrix(list("abc")), [[0, 2 / 3, 1 / 3], [1, 0, 0], [1, 0, 0]], rtol=0, atol=1e-15
    )
    assert pw.predict(2, state=("a",)) == [("b", pytest.approx(2 / 3)), ("c", pytest.approx(1 / 3))]
    assert pw.transition_probs(("z",)) == {}
    pw2 = MarkovPrewarmer(order=2).fit(list("abacab"))
    assert pw2.transition_probs(("b", "a")) == {"c": 1.0}  # only b,a -> c (the later a,b ends the trace)
    assert pw2.transition_probs(("c", "a")) == {"b": 1.0}
    assert pw2.transition_probs(("z", "a")) == pytest.approx({"b": 2 / 3, "c": 1 / 3})  # backs off to order 1


def test_deterministic_cycle_is_predicted_exactly(ckpt_dir):
    d, _ = ckpt_dir
    cycle = [f"m{i}" for i in (0, 3, 5, 1, 6)]
    pw = MarkovPrewarmer().fit(cycle * 4)
    for i, s in enumerate(cycle):
        assert pw.predict(1, state=(s,)) == [(cycle[(i + 1) % 5], 1.0)]
    with LazyModel(d, capacity=2) as m:
        st = replay(m, cycle * 6, pw, k=1)
    assert st["hit_rate"] == 1.0
    assert st["cold_loads"] == 1  # only the very first access: every later shard was prefetched in time or waited on


def test_prewarming_reduces_cold_loads_on_a_markov_trace(ckpt_dir):
    """Cold loads on the critical path are a count fixed by the predictions and the capacity (the slot is reserved
    synchronously), so this holds regardless of timing; trace is SYNTHETIC."""
    d, _ = ckpt_dir
    for seed in range(3):
        trace, _ = markov_trace(8, 500, seed, prefix="m")
        train, test = trace[:300], trace[300:]
        with LazyModel(d, capacity=3) as m:
            base = replay(m, test)
        for k in (1, 2):
            with LazyModel(d, capacity=3) as m:
                warm = replay(m, test, MarkovPrewarmer().fit(train), k=k)
                assert len(m.resident()) <= 3
            assert warm["cold_loads"] < base["cold_loads"], (seed, k, warm["cold_loads"], base["cold_loads"])
            assert warm["hit_rate"] > 0.5
        assert base["cold_loads"] + base["hits"] == len(test)


def test_markov_trace_follows_its_matrix():
    trace, P = markov_trace(5, 4000, 1, branching=2, noise=0.1)
    np.testing.assert_allclose(P.sum(1), 1.0)
    est = MarkovPrewarmer().fit(trace).transition_matrix([f"shard{i}" for i in range(5)])
    assert np.abs(est - P).max() < 0.06


def test_bad_arguments(tmp_path, ckpt_dir):
    d, _ = ckpt_dir
    with pytest.raises(ValueError, match="model_state"):
        ShardedCheckpoint.save({}, tmp_path, str)
    with pytest.raises(TypeError, match="shard_of"):
        ShardedCheckpoint.save({"a": np.zeros(2)}, tmp_path, "x")
    with pytest.raises(ValueError, match="shard_of"):
        ShardedCheckpoint.save({"a": np.zeros(2)}, tmp_path, lambda n: "../evil")
    with pytest.raises(TypeError, match="model_state"):
        ShardedCheckpoint.save({"a": [1, 2]}, tmp_path, lambda n: "s")
    with pytest.raises(FileNotFoundError, match="dir"):
        LazyModel(tmp_path / "nothing")
    with pytest.raises(ValueError, match="capacity"):
        LazyModel(d, capacity=0)
    with LazyModel(d) as m:
        with pytest.raises(KeyError, match="shard"):
            m.access("nope")
        with pytest.raises(KeyError, match="name"):
            m.get("nope")
        with pytest.raises(ValueError, match="think_s"):
            replay(m, ["m0"], think_s=-1)
    with pytest.raises(ValueError, match="order"):
        MarkovPrewarmer(order=0)
    with pytest.raises(ValueError, match="state"):
        MarkovPrewarmer(order=1).transition_probs(("a", "b"))
    with pytest.raises(ValueError, match="k"):
        MarkovPrewarmer().predict(0)
    with pytest.raises(TypeError, match="shard"):
        MarkovPrewarmer().observe(3)
    with pytest.raises(ValueError, match="branching"):
        markov_trace(3, 10, 0, branching=4)
    with pytest.raises(ValueError, match="noise"):
        markov_trace(3, 10, 0, noise=1.5)
