"""Multi-LoRA serving [Q245]: grouped / gather-BMM multi-adapter matmul vs per-row loop vs merged weights;
differential encoding, SimHash index, LRU dynamic loading (synthetic trace)."""

import numpy as np
import pytest

import tinylearn as tl
from tinylearn.compress.multi_lora import (
    AdapterCache,
    MultiLoRALinear,
    SimHashIndex,
    decode_delta,
    encode_delta,
    synthetic_trace,
)


def make(n_adapters=4, d_in=24, d_out=20, ranks=(2, 4, 3, 8), seed=0):
    tl.manual_seed(seed)
    rng = np.random.default_rng(seed)
    ads = {}
    for i in range(n_adapters):
        r = ranks[i % len(ranks)]
        ads[f"ad{i}"] = (
            rng.standard_normal((r, d_in)).astype(np.float32) * 0.3,
            rng.standard_normal((d_out, r)).astype(np.float32) * 0.3,
            2.0 / r,
        )
    return MultiLoRALinear(tl.nn.Linear(d_in, d_out), ads)


def test_grouped_gather_loop_merged_agree():
    m = make()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((33, 24)).astype(np.float32)
    ids = [None if i % 7 == 0 else f"ad{rng.integers(0, 4)}" for i in range(33)]
    y_loop = m.forward(x, ids, method="loop")
    for method in ("grouped", "gather_bmm"):
        np.testing.assert_allclose(m.forward(x, ids, method=method), y_loop, rtol=1e-5, atol=1e-5, err_msg=method)
    for n, a in enumerate(ids):
        want = m.base_forward(x[n : n + 1]) if a is None else m.merged_forward(x[n : n + 1], a)
        np.testing.assert_allclose(y_loop[n], want[0], rtol=1e-5, atol=1e-5)
    # a row's output depends only on its own adapter: permuting the batch permutes the output
    perm = rng.permutation(33)
    np.testing.assert_allclose(m.forward(x[perm], [ids[i] for i in perm]), y_loop[perm], rtol=1e-5, atol=1e-5)


def test_multi_lora_matches_lora_linear():
    from tinylearn.compress.lora import LoRALinear

    m = make()
    layer = LoRALinear(m.base, r=4, alpha=2.0)
    a, b, s = m.adapters["ad1"]
    layer.lora_A.data[...] = a
    layer.lora_B.data[...] = b
    assert s == layer.scaling
    x = np.random.default_rng(2).standard_normal((5, 24)).astype(np.float32)
    np.testing.assert_allclose(m.forward(x, ["ad1"] * 5), layer(tl.Tensor(x)).numpy(), rtol=1e-5, atol=1e-5)


def test_bad_input():
    m = make()
    x = np.zeros((3, 24), np.float32)
    with pytest.raises(KeyError, match=r"adapter_ids\[1\].*'nope'"):
        m.forward(x, ["ad0", "nope", None])
    with pytest.raises(ValueError, match="adapter_ids: expected 3"):
        m.forward(x, ["ad0"])
    with pytest.raises(ValueError, match=r"x: expected shape \[N, 24\]"):
        m.forward(np.zeros((3, 5)), [None] * 3)
    with pytest.raises(ValueError, match="method"):
        m.forward(x, [None] * 3, method="fast")
    with pytest.raises(ValueError, match=r"adapters\['bad'\]"):
        m.add_adapter("bad", (np.zeros((2, 5)), np.zeros((20, 2)), 1.0))


def similar(ad, frac=0.05, seed=0, scale=1e-2):
    rng = np.random.default_rng(seed)
    a, b, s = ad[0].copy(), ad[1].copy(), ad[2]
    for arr in (a, b):
        mask = rng.random(arr.shape) < frac
        arr[mask] += scale * rng.standard_normal(mask.sum()).astype(np.float32)
    return a, b, s


def test_delta_encoding_exact_and_bounded():
    ad0 = make().adapters["ad3"]
    ad1 = similar(ad0, seed=1)
    d = encode_delta(ad0, ad1, "ad3")
    a, b, s = decode_delta(ad0, d)
    np.testing.assert_array_equal(a, ad1[0])
    np.testing.assert_array_equal(b, ad1[1])
    full = ad1[0].nbytes + ad1[1].nbytes
    assert d.nbytes < 0.2 * full  # ~5% of entries differ, 8 bytes each
    dl = encode_delta(ad0, ad1, "ad3", tol=5e-3)
    a2, b2, _ = decode_delta(ad0, dl)
    assert np.abs(a2 - ad1[0]).max() <= 5e-3 and np.abs(b2 - ad1[1]).max() <= 5e-3
    assert dl.nbytes < d.nbytes
    with pytest.raises(ValueError, match="tol"):
        encode_delta(ad0, ad1, "ad3", tol=-1)


def test_simhash_finds_near_duplicates_and_ignores_factorisation():
    m = make(n_adapters=8, ranks=(4,))
    idx = SimHashIndex(24, 20, bits=128, seed=0)
    for k, v in m.adapters.items():
        idx.add(k, v)
    a, b, s = m.adapters["ad5"]
    assert idx.query((a * 3.0, b / 3.0, s))[0] == ("ad5", 0)  # same dW, different factors
    near = similar(m.adapters["ad5"], frac=0.1, seed=2, scale=1e-3)
    top = idx.query(near)
    assert top[0][0] == "ad5" and top[0][1] <= 8
    others = [d for n, d in top if n != "ad5"]
    assert min(others) > 30 and 40 < np.mean(others) < 88  # unrelated: ~bits/2
    assert [n for n, _ in idx.query(near, max_distance=8)] == ["ad5"]


def test_adapter_cache_lru_dedup_and_synthetic_trace(tmp_path):
    m = make(n_adapters=4, ranks=(4,))
    cache = AdapterCache(str(tmp_path), budget_bytes=6 * (4 * 24 + 20 * 4) * 4, in_features=24, out_features=20)
    ads = dict(m.adapters)
    for i in range(4):  # 4 near-duplicates of each base adapter
        for j in range(4):
            ads[f"ad{i}v{j}"] = similar(m.adapters[f"ad{i}"], frac=0.05, seed=10 * i + j)
    kinds = {n: cache.put(n, ad) for n, ad in ads.items()}
    assert sum(k == "delta" for k in kinds.values()) == 16 and kinds["ad0"] == "full"
    for n, ad in ads.items():  # lossless mode: every adapter comes back bit-exact
        got = cache.get(n)
        np.testing.assert_array_equal(got[0], ad[0])
        np.testing.assert_array_equal(got[1], ad[1])
        assert cache.bytes_resident <= cache.budget_bytes
    trace = synthetic_trace(list(ads), 400, seed=0)  # SYNTHETIC Zipf trace
    plain = AdapterCache(str(tmp_path / "plain"), cache.budget_bytes, 24, 20, max_hamming=-1)  # no dedup
    for n, ad in ads.items():
        assert plain.put(n, ad) == "full"
    cache.hits = cache.misses = 0
    for n in trace:
        cache.get(n)
        plain.get(n)
    st, sp = cache.stats(), plain.stats()
    assert st["hits"] + st["misses"] == 400 and sp["evictions"] > 0
    # delta entries are ~10x smaller, so the same budget keeps more adapters resident: more hits (all 20 fit here)
    assert st["hit_rate"] > sp["hit_rate"] + 0.2, (st, sp)
    assert st["bytes_resident"] <= cache.budget_bytes
    assert st["disk_bytes"] < 0.45 * sum(a.nbytes + b.nbytes for a, b, _ in ads.values())
    with pytest.raises(KeyError, match="unknown adapter"):
        cache.get("missing")
    with pytest.raises(ValueError, match="budget_bytes"):
        AdapterCache(str(tmp_path), 0, 24, 20)
    tiny = AdapterCache(str(tmp_path / "t"), 100, 24, 20)
    tiny.put("a", m.adapters["ad0"])
    with pytest.raises(MemoryError, match="budget_bytes"):
        tiny.get("a")


def test_bench_multi_lora_runs_and_checks_agreement():
    from tinylearn.compress.multi_lora import bench_multi_lora

    r = bench_multi_lora(n_rows=16, n_adapters=3, d=32, r=4, repeat=1)
    assert {"grouped_s", "gather_bmm_s", "loop_s", "merged_per_adapter_s", "base_only_s"} <= set(r)
    assert r["weight_bytes_merged"] == 3 * 32 * 32 * 4 and r["weight_bytes_adapters"] == 3 * 2 * 4 * 32 * 4


# ---- model-level named adapters: apply_lora + add_adapter, per-request selection with autograd -----------------


def _multi_model(qlora: bool = False, seed: int = 0) -> tl.nn.Module:
    from tinylearn.compress.lora import apply_lora, lora_layers
    from tinylearn.compress.lora_named import add_adapter
    from tinylearn.compress.qlora import apply_qlora

    tl.manual_seed(seed)
    model = tl.nn.Sequential(tl.nn.Linear(16, 32), tl.nn.ReLU(), tl.nn.Linear(32, 8))
    if qlora:
        apply_qlora(model, ["0", "2"], r=4, alpha=8, block_size=16)
    else:
        apply_lora(model, ["0", "2"], r=4, alpha=8)
    add_adapter(model, "a", r=2, alpha=4)
    add_adapter(model, "b", r=4, alpha=16, target_modules=["2"])  # "b" only on the last layer
    rng = np.random.default_rng(seed + 1)
    for _, m in lora_layers(model):
        for name in m.adapter_names():
            ad = m.adapter(name)
            ad.lora_B.data[:] = rng.standard_normal(ad.lora_B.shape).astype(np.float32) * 0.3
    return model


IDS = ["a", "b", "default", None, "b", "a", "a"]


def _rows_alone(model, x: np.ndarray, g: np.ndarray, merged: bool):
    """Each request alone with its adapter (merged into a copy of the model, or selected unmerged): outputs, and the
    summed gradients of every adapter parameter and of x."""
    import copy

    from tinylearn.compress.lora import merge_lora
    from tinylearn.compress.lora_named import use_adapters

    ys, grads, gx = [], {}, []
    for i, a in enumerate(IDS):
        m = copy.deepcopy(model) if merged else model
        if merged and a is not None:
            merge_lora(m, adapter=a)  # "b" lives on layer 2 only: merged there, layer 0 runs its base
        xi = tl.Tensor(x[i : i + 1], requires_grad=True)
        with use_adapters(m, a):
            y = m(xi)
        if not merged:
            for p in m.parameters():
                p.grad = None
            y.backward(tl.Tensor(g[i : i + 1]))
            grads_i = {n: p.grad.data.copy() for n, p in m.named_parameters() if p.grad is not None}
            for n, v in grads_i.items():
                grads[n] = grads.get(n, 0) + v
            gx.append(xi.grad.data)
        ys.append(y.data)
    return np.concatenate(ys), grads, (np.concatenate(gx) if gx else None)


@pytest.mark.parametrize("qlora", [False, True])
def test_per_request_adapters_match_each_request_alone(qlora: bool) -> None:
    from tinylearn.compress.lora_named import adapter_names, use_adapters

    model = _multi_model(qlora)
    assert adapter_names(model) == ["default", "a", "b"]
    rng = np.random.default_rng(3)
    x = rng.standard_normal((len(IDS), 16)).astype(np.float32)
    g = rng.standard_normal((len(IDS), 8)).astype(np.float32)
    xt = tl.Tensor(x, requires_grad=True)
    with use_adapters(model, IDS):
        y = model(xt)
    for p in model.parameters():
        p.grad = None
    y.backward(tl.Tensor(g))
    mixed_grads = {n: p.grad.data.copy() for n, p in model.named_parameters() if p.grad is not None}
    if not qlora:  # reference 1: each request alone through the model with its adapter merged into the base
        y_merged, _, _ = _rows_alone(model, x, g, merged=True)
        np.testing.assert_allclose(y.data, y_merged, rtol=1e-5, atol=1e-5)
    y_alone, grads_alone, gx_alone = _rows_alone(model, x, g, merged=False)  # reference 2: alone, unmerged
    np.testing.assert_allclose(y.data, y_alone, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(xt.grad.data, gx_alone, rtol=1e-5, atol=1e-6)
    assert sorted(mixed_grads) == sorted(grads_alone)
    assert {"0.adapters.a.lora_B", "2.adapters.b.lora_A", "2.lora_B"} <= set(mixed_grads)
    for n in mixed_grads:
        np.testing.assert_allclose(mixed_grads[n], grads_alone[n], rtol=1e-5, atol=1e-6, err_msg=n)
    # the rows differ by adapter (a selection that did nothing would make rows 0 and 2 agree with the base)
    with use_adapters(model, None):
        y_base = model(tl.Tensor(x)).data
    np.testing.assert_allclose(y.data[3], y_base[3], rtol=1e-6, atol=1e-6)  # the None row: base only
    assert (np.abs(y.data[[0, 1, 2]] - y_base[[0, 1, 2]]).max(axis=1) > 1e-3).all()


def test_per_request_adapters_sequence_input_and_errors() -> None:
    from tinylearn.compress.lora_named import add_adapter, use_adapters

    model = _multi_model()
    x = np.random.default_rng(4).standard_normal((3, 5, 16)).astype(np.float32)  # [requests, tokens, features]
    with use_adapters(model, ["b", None, "a"]):
        y = model(tl.Tensor(x)).data
    for i, a in enumerate(["b", None, "a"]):
        with use_adapters(model, a):
            np.testing.assert_allclose(y[i], model(tl.Tensor(x[i : i + 1])).data[0], rtol=1e-5, atol=1e-6)
    assert model[0].active == "default" and model[0].row_ids is None  # the selection is restored on exit
    with pytest.raises(ValueError, match="3 adapter ids for an input of 2 rows"):
        with use_adapters(model, ["a", "a", "b"]):
            model(tl.Tensor(x[:2]))
    with pytest.raises(KeyError, match="'nope'"):
        with use_adapters(model, ["a", "nope"]):
            pass
    with pytest.raises(ValueError, match="already exists"):
        add_adapter(model, "a", r=2, alpha=4)
    with pytest.raises(ValueError, match="r"):
        add_adapter(model, "c", r=0, alpha=4)
    model[2].merge("b")
    with pytest.raises(RuntimeError, match="merged"):
        with use_adapters(model, ["a", "b", None]):
            model(tl.Tensor(x))
