"""FP8 (E4M3) KV blocks beside int8: the cache's codec against torch's float8_e4m3fn cast, the byte count, and the
engine on fp8 blocks (invariants, swap restores the exact bytes, greedy tokens close to fp32 KV's)."""

from __future__ import annotations

import _serve_models
import numpy as np
import pytest
import torch

from tinylearn.inference import TinyGPT
from tinylearn.inference.paged import paged_attention_batch
from tinylearn.inference.paged_cache import PagedKVCache
from tinylearn.serve.engine import Engine
from tinylearn.serve.types import SamplingParams


def make_model(seed: int = 0) -> TinyGPT:
    return _serve_models.make_model(seed, n_kv_heads=2)


def test_fp8_cache_matches_torch_float8_and_int8_bytes() -> None:
    rng = np.random.default_rng(0)
    k = (rng.standard_normal((11, 2, 16)) * np.exp(rng.standard_normal((11, 2, 1)))).astype(np.float32)
    v = rng.standard_normal((11, 2, 16)).astype(np.float32)
    k[3, 1] = 0.0  # an all-zero row: scale 1, codes 0
    c8 = PagedKVCache(2, 2, 16, num_blocks=8, block_size=4, dtype="fp8_e4m3")
    ci = PagedKVCache(2, 2, 16, num_blocks=8, block_size=4, dtype="int8")
    for c in (c8, ci):
        sid = c.new_sequence()
        for layer in range(2):
            c.append(sid, layer, k, v)
    kg, vg = c8.gather(0, 1)
    for x, got in ((k, kg), (v, vg)):  # the reference: torch's E4M3 cast of x / (max|x| / 448) per (token, head)
        amax = np.abs(x).max(-1, keepdims=True)
        scale = np.where(amax > 0, amax / np.float32(448), 1).astype(np.float32)
        ref = torch.from_numpy(x / scale).to(torch.float8_e4m3fn).to(torch.float32).numpy() * scale
        np.testing.assert_array_equal(got, ref)
        big = np.abs(x) >= amax / 8  # normal E4M3 range: relative error <= 2^-4
        assert np.all(np.abs(got - x)[big] <= 2.0**-4 * np.abs(x)[big] + 1e-7)
    assert np.all(kg[3, 1] == 0)
    assert c8.stats()["bytes_per_token"] == ci.stats()["bytes_per_token"] == 2 * 2 * 2 * (16 + 4)
    # attention over fp8 blocks through the numpy paged path (the C++ kernel reads fp32 / int8 only): near int8
    q = rng.standard_normal((1, 4, 16)).astype(np.float32)
    out = paged_attention_batch(q, c8, [0], 1, backend="numpy")
    ref_out = paged_attention_batch(q, ci, [0], 1, backend="numpy")
    assert np.abs(out - ref_out).max() < 0.1
    with pytest.raises(ValueError, match="dtype"):
        PagedKVCache(2, 2, 16, num_blocks=8, dtype="fp8")
    with pytest.raises(ValueError, match="fp8_e4m3 KV quantisation needs finite values"):
        c8.append(c8.new_sequence(), 0, np.full((1, 2, 16), np.inf, np.float32), v[:1])


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_engine_on_fp8_blocks(preemption: str) -> None:
    m = make_model(1)
    rng = np.random.default_rng(3)
    ps = [rng.integers(0, 64, int(n)).tolist() for n in rng.integers(4, 40, 10)]
    p = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    ref = [o.token_ids for o in Engine(m, block_size=4, kv_dtype="fp8_e4m3").generate(ps, p)]
    e = Engine(m, block_size=4, num_blocks=24, kv_dtype="fp8_e4m3", preemption=preemption, max_num_batched_tokens=48)
    rids = [e.add_request(x, p) for x in ps]
    final = {}
    while e.has_unfinished():
        for o in e.step():
            if o.finished:
                final[o.request_id] = o.token_ids
        e.check_invariants()
    st = e.stats()
    assert st["preemptions_recompute"] + st["preemptions_swap"] > 0 and st["kv_blocks_used"] == st["kv_blocks_cached"]
    got = [final[r] for r in rids]
    if preemption == "swap":  # swap moves the raw fp8 codes + scales: exactly the unconstrained fp8 run
        assert got == ref
    # fp8 K/V perturbs the logits: the first greedy token agrees with fp32 KV for most requests
    f32 = [o.token_ids for o in Engine(m, block_size=4).generate(ps, p)]
    assert sum(a[0] == b[0] for a, b in zip(got, f32)) >= 7
