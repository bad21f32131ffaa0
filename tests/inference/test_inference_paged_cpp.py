"""The C++ paged-attention decode kernel (cpp_src/inference_paged_decode.cpp) behind paged_attention(_batch):
cpp (simd and scalar) against the numpy block loop and torch SDPA on the gathered K/V, ragged batches, GQA/MHA,
float32/int8/fp8 (E4M3) caches, shared (forked) blocks, the forced scalar path, and bad input."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from tinylearn import backends
from tinylearn.inference import PagedKVCache, paged_attention
from tinylearn.inference.paged import paged_attention_batch
from tinylearn.testing import assert_close

pytestmark = pytest.mark.skipif(not backends.C_available("inference"), reason="tinylearn._C.inference not built")

OP = "inference.paged_attention"
D, BS = 32, 16
LENS = (1, 15, 16, 17, 100)


def ragged_cache(hkv: int, dtype: str, lens: tuple[int, ...] = LENS, seed: int = 0) -> tuple[PagedKVCache, list[int]]:
    """Sequences of the given lengths in 2 layers, plus a fork of the longest (shares its blocks) and a fork that
    appended 3 tokens (copy-on-write of its last block)."""
    rng = np.random.default_rng(seed)
    cache = PagedKVCache(2, hkv, D, num_blocks=sum(-(-n // BS) for n in lens) + 2, block_size=BS, dtype=dtype)
    ids = []
    for n in lens:
        sid = cache.new_sequence()
        for layer in range(2):
            cache.append(sid, layer, *(rng.standard_normal((n, hkv, D)) for _ in range(2)))
        ids.append(sid)
    shared, cow = cache.fork(ids[-1]), cache.fork(ids[-1])
    for layer in range(2):
        cache.append(cow, layer, *(rng.standard_normal((3, hkv, D)) for _ in range(2)))
    assert cache.stats()["shared_blocks"] > 0 and cache.cow_copies > 0
    return cache, ids + [shared, cow]


def torch_decode(q: np.ndarray, cache: PagedKVCache, seq_ids: list[int], layer: int) -> np.ndarray:
    """torch SDPA per query over the gathered (dequantized) contiguous K/V, KV heads repeated for GQA."""
    out = []
    for qb, sid in zip(q, seq_ids):
        k, v = (torch.from_numpy(a).transpose(0, 1) for a in cache.gather(sid, layer))  # [H, S, D]
        g = qb.shape[0] // k.shape[0]
        k, v = k.repeat_interleave(g, 0), v.repeat_interleave(g, 0)
        out.append(torch.nn.functional.scaled_dot_product_attention(torch.from_numpy(qb)[:, None], k, v)[:, 0])
    return torch.stack(out).numpy()


@pytest.mark.parametrize("dtype", ["float32", "int8", "fp8_e4m3"])
@pytest.mark.parametrize(("hq", "hkv"), [(8, 2), (4, 4), (6, 1)])
@pytest.mark.parametrize("version", ["simd", "scalar"])
def test_cpp_matches_numpy_and_torch(dtype: str, hq: int, hkv: int, version: str) -> None:
    cache, ids = ragged_cache(hkv, dtype)
    q = np.random.default_rng(1).standard_normal((len(ids), hq, D)).astype(np.float32)
    for layer in range(2):
        got = paged_attention_batch(q, cache, ids, layer, backend="cpp", version=version)
        assert got.shape == (len(ids), hq, D) and got.dtype == np.float32
        assert_close(got, paged_attention_batch(q, cache, ids, layer, backend="numpy"), np.float32)
        assert_close(got, torch_decode(q, cache, ids, layer), np.float32)


def test_single_query_api_routes_through_the_registry() -> None:
    cache, ids = ragged_cache(2, "float32")
    q = np.random.default_rng(2).standard_normal((8, D)).astype(np.float32)
    assert backends.versions(OP) == {"numpy": ["default"], "cpp": ["simd", "scalar"]}
    assert backends.resolve(OP)[:2] == ("cpp", "simd")  # the kernel is the default where it is built
    for sid in ids:
        want = paged_attention(q, cache, sid, 1, backend="numpy")
        assert_close(paged_attention(q, cache, sid, 1), want, np.float32)
        assert_close(paged_attention(q, cache, sid, 1, backend="cpp", version="scalar"), want, np.float32)
    with backends.use(OP, backend="numpy"):
        assert backends.resolve(OP)[:2] == ("numpy", "default")


def test_threads_strided_query_and_a_compact_copy_of_the_arena() -> None:
    """A batch big enough for the OpenMP team (>= 2 x 2^20 products), a non-contiguous q, and a deep copy of the
    cache (its arena copied without the per-block padding: other strides) all give the reference result."""
    cache, ids = ragged_cache(2, "int8", lens=(1200, 1100, 1000))
    wide = np.random.default_rng(3).standard_normal((len(ids), 32, D)).astype(np.float32)
    q = wide[:, ::2]
    assert not q.flags.c_contiguous
    want = paged_attention_batch(q, cache, ids, 0, backend="numpy")
    assert_close(paged_attention_batch(q, cache, ids, 0, backend="cpp"), want, np.float32)
    twin = copy.deepcopy(cache)
    assert twin._data.strides != cache._data.strides
    assert_close(paged_attention_batch(q, twin, ids, 0, backend="cpp"), want, np.float32)


def test_forced_scalar_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """TINYLEARN_CPU_FEATURES=scalar makes the default (simd) version run the scalar code, bit for bit."""
    cache, ids = ragged_cache(2, "int8")
    q = np.random.default_rng(4).standard_normal((len(ids), 8, D)).astype(np.float32)
    scalar = paged_attention_batch(q, cache, ids, 0, backend="cpp", version="scalar")
    kernel = backends.load_C("inference").paged_decode
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", "scalar")
    assert np.array_equal(paged_attention_batch(q, cache, ids, 0, backend="cpp", version="simd"), scalar)
    tables = np.array([cache.block_table(ids[0])], np.int32)
    with pytest.raises(ValueError, match=r"path 'avx2' is not available.*TINYLEARN_CPU_FEATURES=scalar"):
        kernel(q[:1], cache._data, cache._scale, tables, np.array([1], np.int32), 0, "avx2")


def test_bad_input_raises_naming_the_argument() -> None:
    cache, ids = ragged_cache(2, "float32", lens=(5, 20))
    q = np.zeros((2, 4, D), np.float32)
    with pytest.raises(ValueError, match=r"q: expected shape \[Hq"):
        paged_attention(q, cache, ids[0], 0)
    with pytest.raises(ValueError, match=r"q: expected shape \[B, Hq"):
        paged_attention_batch(np.zeros((2, 3, D), np.float32), cache, ids[:2], 0)
    with pytest.raises(ValueError, match="seq_ids: expected a list of 2"):
        paged_attention_batch(q, cache, ids[:1], 0)
    with pytest.raises(ValueError, match="seq_id: 99 is not a live sequence"):
        paged_attention_batch(q, cache, [ids[0], 99], 0, backend="cpp")
    with pytest.raises(ValueError, match="layer"):
        paged_attention_batch(q, cache, ids[:2], 2)
    empty = cache.new_sequence()
    with pytest.raises(ValueError, match="has no cached tokens"):
        paged_attention(q[0], cache, empty, 0, backend="cpp")
    with pytest.raises(TypeError, match="cache: expected a PagedKVCache"):
        paged_attention_batch(q, None, ids[:2], 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="version"):
        paged_attention(q[0], cache, ids[0], 0, backend="cpp", version="avx9")
    # the kernel's own checks (what a caller passing arrays directly gets)
    kernel = backends.load_C("inference").paged_decode
    tables = np.array([cache.block_table(ids[1])], np.int32)
    ok = dict(q=q[:1], data=cache._data, scales=None, block_tables=tables, lens=np.array([20], np.int32), layer=0)
    assert_close(kernel(**ok), paged_attention(q[0], cache, ids[1], 0, backend="numpy")[None], np.float32)
    bad = [
        (dict(block_tables=np.array([[tables[0, 0], 99]], np.int32)), "block_tables: block id 99 at \\[0, 1\\]"),
        (dict(lens=np.array([33], np.int32)), "lens: lens\\[0\\] = 33 outside \\[1, 32\\]"),
        (dict(lens=np.array([0], np.int32)), "lens: lens\\[0\\] = 0"),
        (dict(lens=np.array([20, 20], np.int32)), "block_tables, lens"),
        (dict(layer=2), "layer: must be in \\[0, 2\\)"),
        (dict(scales=np.ones((4, 2, 2, BS, 2), np.float32)), "scales: a float32 cache has no scales"),
        (dict(q=np.zeros((1, 3, D), np.float32)), "q: Hq must be a positive multiple"),
        (dict(data=cache._data[..., :8]), "data: expected \\[num_blocks"),
        (dict(data=cache._data.astype(np.float64)), "data: expected float32, int8 or uint8"),
    ]
    for change, msg in bad:
        with pytest.raises(ValueError, match=msg):
            kernel(**{**ok, **change})
    i8, i8_ids = ragged_cache(2, "int8", lens=(5,))
    with pytest.raises(ValueError, match="scales: an int8 cache needs"):
        kernel(q[:1], i8._data, None, np.array([i8.block_table(i8_ids[0])], np.int32), np.array([5], np.int32), 0)
    f8, f8_ids = ragged_cache(2, "fp8_e4m3", lens=(5,))
    with pytest.raises(ValueError, match="scales: an fp8 cache needs"):
        kernel(q[:1], f8._data, None, np.array([f8.block_table(f8_ids[0])], np.int32), np.array([5], np.int32), 0)


@pytest.mark.parametrize("version", ["simd", "scalar"])
def test_fp8_codes_are_widened_exactly(version: str) -> None:
    """Every one of the 254 finite E4M3 codes as a K/V element (one key and one value row per code, scale 1): the
    cache decodes them to torch's float8_e4m3fn values (asserted bit for bit), and the kernel, which widens the
    codes through its own 256-entry table, gives the numpy reference's output on them."""
    cache = PagedKVCache(1, 1, 8, num_blocks=40, block_size=BS, dtype="fp8_e4m3")
    sid = cache.new_sequence()
    cache.append(sid, 0, np.zeros((254, 1, 8), np.float32), np.zeros((254, 1, 8), np.float32))
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], np.uint8)  # drop the two NaN codes
    table = np.array(cache.block_table(sid))
    slots = np.arange(254)
    vals = torch.from_numpy(codes.copy()).view(torch.float8_e4m3fn).float().numpy()
    for kv in (0, 1):
        cache._data[table[slots // BS], 0, kv, slots % BS, 0, :] = codes[:, None]
        cache._scale[table[slots // BS], 0, kv, slots % BS, 0] = 1.0
    k, v = cache.gather(sid, 0)
    assert np.array_equal(k[:, 0, 0], vals) and np.array_equal(v[:, 0, 0], vals)
    q = np.full((1, 1, 8), 1e-3, np.float32)  # small q: softmax weights stay in range over the +-448 keys
    got = paged_attention_batch(q, cache, [sid], 0, backend="cpp", version=version)
    assert_close(got, paged_attention_batch(q, cache, [sid], 0, backend="numpy"), np.float32)
