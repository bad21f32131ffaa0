"""DeltaKVStore, the delta-compressed host tier of swap preemption (Q137): a lossless round trip at threshold 0
through a real Engine run with preemption (greedy outputs equal to running each request alone, the arena's bytes
back bit for bit), the error bound of a lossy threshold, the stored-byte accounting by arithmetic, and bad input."""

from __future__ import annotations

from types import SimpleNamespace

import _serve_models
import numpy as np
import pytest

from tinylearn.inference import TinyGPT, generate
from tinylearn.inference.kv_delta import delta_compress, delta_stats
from tinylearn.serve.block_manager import BlockManager
from tinylearn.serve.delta_tier import DeltaKVStore
from tinylearn.serve.engine import Engine
from tinylearn.serve.types import SamplingParams

PARAMS = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def make_model(seed: int = 0) -> TinyGPT:
    return _serve_models.make_model(seed, n_kv_heads=2)


@pytest.fixture(scope="module")
def model() -> TinyGPT:
    return make_model()


def prompts(n: int, seed: int) -> list[list[int]]:
    return _serve_models.prompts(n, seed, lo=10, hi=30)


def test_threshold_zero_round_trip_through_engine_preemption(model: TinyGPT) -> None:
    ps = prompts(6, seed=5)
    alone = [generate(model, p, PARAMS.max_tokens, temperature=0) for p in ps]  # each request run by itself
    store = DeltaKVStore(threshold=0.0, keyframe_every=3)
    eng = Engine(model, block_size=4, num_blocks=14, preemption="swap", host_store=store)
    outs = eng.generate(ps, PARAMS)
    assert [o.token_ids for o in outs] == alone
    st, ds = eng.stats(), store.stats()
    assert st["preemptions_swap"] > 0 and st["swapped_blocks_out"] == st["swapped_blocks_in"] > 0
    assert ds["puts"] == st["swapped_blocks_out"] and ds["gets"] == st["swapped_blocks_in"]
    assert ds["blocks"] == 0 and ds["held_stored_bytes"] == 0  # every block came back in and was popped
    assert ds["max_abs_error"] == 0.0 and ds["raw_bytes"] == ds["puts"] * np.prod(eng.host_block_shape) * 4
    assert 0 < ds["stored_bytes"] <= ds["raw_bytes"]  # never more than raw: a dear delta row falls back to a full row
    eng.check_invariants()


def _seq(rid: str) -> SimpleNamespace:
    return SimpleNamespace(
        request_id=rid, cache_id=None, num_computed=0, tokens=[], swapped_blocks=[], registered_blocks=0
    )


def test_threshold_zero_restores_the_arena_bit_for_bit() -> None:
    bm = BlockManager(2, 2, 8, num_blocks=6, block_size=4, host_store=DeltaKVStore(0.0, keyframe_every=2))
    s = _seq("r0")
    s.tokens = list(range(10))
    bm.admit(s)
    bm.reserve(s, 10)
    rng = np.random.default_rng(0)
    data = rng.standard_normal(bm.cache._data.shape).astype(np.float32)
    data[..., 1, :, :3] = data[..., 0, :, :3]  # some entries unchanged between adjacent tokens: real delta rows
    table = list(bm.cache.block_table(s.cache_id))
    b0, b1 = table[0], table[1]
    data[b0, 0, 0, 3] = data[b0, 0, 0, 2]  # token 3 repeats token 2 (a cheap delta row) ...
    data[b0, 0, 0, 2, 0, 0], data[b0, 0, 0, 3, 0, 0] = 0.0, -0.0  # ... but for a -0.0 after a 0.0: other bits
    data[b1, 1, 1, 1, 1, 1] = np.nan
    bm.cache._data[...] = data
    before = bm.cache._data[table].copy()
    s.num_computed = 10
    assert bm.swap_out(s) == 3
    bm.cache._data[...] = 7.0  # the freed blocks are overwritten meanwhile
    assert bm.swap_in(s) == 3
    after = bm.cache._data[bm.cache.block_table(s.cache_id)]
    assert after.tobytes() == before.tobytes()  # NaN and -0.0 included
    st = bm.host.stats()
    assert st["raw_slices"] == 1 and st["patched_entries"] == 1  # the NaN slice kept raw, the -0.0 patched
    assert st["kept_fraction"] < 1 and st["stored_bytes"] < st["raw_bytes"]
    bm.check([s], [])


def test_lossy_threshold_error_bound_and_saving(model: TinyGPT) -> None:
    # a slowly varying K/V sequence (a random walk along tokens): the premise of Q137 holds, deltas are sparse
    rng = np.random.default_rng(1)
    steps = rng.standard_normal((2, 2, 32, 2, 16)) * (rng.random((2, 2, 32, 2, 16)) < 0.1)
    block = np.cumsum(steps, axis=2).astype(np.float32)
    thr = 0.05
    store = DeltaKVStore(thr, keyframe_every=16)
    store.put("b", block)
    back = store.get("b")
    err = np.abs(back - block)
    assert err.max() <= np.float32(thr) and store.stats()["max_abs_error"] == err.max() > 0
    assert store.stats()["ratio"] > 3  # ~10% of the entries move per token: far fewer bytes than raw
    # lossless at 0 on the same block: exact, and the saving is smaller than the lossy one's
    exact = DeltaKVStore(0.0, keyframe_every=16)
    exact.put("b", block)
    assert np.array_equal(exact.get("b"), block) and 1 < exact.stats()["ratio"] < store.stats()["ratio"]
    # through the engine: preemption with a lossy tier still satisfies the invariants and the measured bound
    lossy = DeltaKVStore(0.2, keyframe_every=4)
    eng = Engine(model, block_size=4, num_blocks=14, preemption="swap", host_store=lossy)
    eng.generate(prompts(6, seed=5), PARAMS)
    ds = lossy.stats()
    assert eng.stats()["preemptions_swap"] > 0 and ds["puts"] > 0 and 0 < ds["max_abs_error"] <= np.float32(0.2)
    eng.check_invariants()


def test_bytes_stored_by_arithmetic() -> None:
    T, D = 8, 16  # block [1 layer, K/V, 8 tokens, 1 head, 16 dims]: each (layer, K/V) slice is [8, 16]
    base = np.arange(D, dtype=np.float32)
    rows = [base.copy()]
    for t in range(1, T):
        r = rows[-1].copy()
        r[[t % D, (t + 5) % D]] += 1.0  # exactly 2 entries change per token
        rows.append(r)
    x = np.stack(rows)
    block = np.stack([x, x + 100]).reshape(1, 2, T, 1, D)
    for ke, keys in ((16, 1), (4, 2)):
        store = DeltaKVStore(0.0, keyframe_every=ke)
        store.put(0, block)
        # a keyframe row: D float32; a delta row: a 2-byte count + 2 kept entries of (4-byte value, 2-byte index)
        per_slice = keys * D * 4 + (T - keys) * (2 + 2 * (4 + 2))
        st = store.stats()
        assert st["stored_bytes"] == st["held_stored_bytes"] == 2 * per_slice
        assert st["raw_bytes"] == st["held_raw_bytes"] == block.nbytes == 2 * T * D * 4
        assert st["ratio"] == block.nbytes / (2 * per_slice) and st["kept_fraction"] == 2 / D
        assert st["stored_bytes"] == 2 * delta_stats(delta_compress(x, 0.0, ke))["stored_bytes"]  # kv_delta's count
        assert np.array_equal(store.pop(0), block)
        assert store.stats()["held_stored_bytes"] == 0 and store.stats()["stored_bytes"] == 2 * per_slice
    # incompressible rows (every entry changes) fall back to full rows: stored == raw, never more
    noise = np.random.default_rng(2).standard_normal((1, 2, T, 1, D)).astype(np.float32)
    store = DeltaKVStore(0.0)
    store.put(1, noise)
    st = store.stats()
    assert st["stored_bytes"] == noise.nbytes and st["fallback_rows"] == 2 * (T - 1) and st["kept_fraction"] == 1.0


def test_bad_input_names_the_argument() -> None:
    for bad in (-0.1, float("nan"), float("inf"), "0.1", True):
        with pytest.raises(ValueError, match="threshold"):
            DeltaKVStore(bad)
    for bad in (0, -3):
        with pytest.raises(ValueError, match="keyframe_every"):
            DeltaKVStore(0.0, keyframe_every=bad)
    with pytest.raises(TypeError, match="keyframe_every"):
        DeltaKVStore(0.0, keyframe_every=2.5)
    store = DeltaKVStore(0.0)
    with pytest.raises(TypeError, match="block.*uint8"):  # an int8/fp8 engine's raw slot bytes have no token axis
        store.put("k", np.zeros(64, np.uint8))
    with pytest.raises(TypeError, match="block"):
        store.put("k", [[0.0]])
    with pytest.raises(ValueError, match="block"):
        store.put("k", np.zeros((2, 4), np.float32))  # no axis after the token axis 2
    with pytest.raises(KeyError, match="missing"):
        store.get("missing")
    store.discard("missing")  # as HostStore: discarding an absent key is a no-op
    assert "missing" not in store and len(store) == 0
