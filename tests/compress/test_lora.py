"""LoRALinear / apply_lora [Q100]: init, forward, merge/unmerge, freezing, adapter-only state dicts, errors."""

import math

import numpy as np
import pytest

import tinylearn as tl
from tinylearn.compress.lora import (
    LoRALinear,
    apply_lora,
    load_lora_state_dict,
    lora_state_dict,
    merge_lora,
    trainable_parameters,
    unmerge_lora,
)


def mlp(seed=0):
    tl.manual_seed(seed)
    return tl.nn.Sequential(tl.nn.Linear(16, 32), tl.nn.ReLU(), tl.nn.Linear(32, 8))


def randomize_b(model, seed=1):
    rng = np.random.default_rng(seed)
    for _, m in model.named_modules():
        if isinstance(m, LoRALinear):
            m.lora_B.data[...] = 0.1 * rng.standard_normal(m.lora_B.shape).astype(np.float32)


def test_init_starts_at_base_and_a_is_kaiming_sqrt5():
    tl.manual_seed(0)
    base = tl.nn.Linear(64, 32)
    x = tl.Tensor(np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32))
    y0 = base(x).numpy()
    layer = LoRALinear(base, r=4, alpha=8)
    assert layer.scaling == 2.0
    assert layer.lora_A.shape == (4, 64) and layer.lora_B.shape == (32, 4)
    assert np.all(layer.lora_B.data == 0)
    assert np.abs(layer.lora_A.data).max() <= 1 / math.sqrt(64) + 1e-7  # kaiming_uniform(a=sqrt(5)) bound
    assert np.abs(layer.lora_A.data).max() > 0.8 / math.sqrt(64)
    np.testing.assert_array_equal(layer(x).numpy(), y0)


def test_forward_is_base_plus_scaled_low_rank_update_3d_input():
    tl.manual_seed(0)
    layer = LoRALinear(tl.nn.Linear(12, 10), r=3, alpha=6)
    rng = np.random.default_rng(1)
    layer.lora_B.data[...] = rng.standard_normal((10, 3)).astype(np.float32)
    x = rng.standard_normal((2, 4, 12)).astype(np.float32)
    w, b = layer.base_layer.weight.data, layer.base_layer.bias.data
    want = x @ w.T + b + 2.0 * (x @ layer.lora_A.data.T) @ layer.lora_B.data.T
    np.testing.assert_allclose(layer(tl.Tensor(x)).numpy(), want, rtol=1e-5, atol=1e-5)
    xt = np.ascontiguousarray(x.transpose(2, 1, 0)).transpose(2, 1, 0)  # non-contiguous view, same values
    assert not xt.flags.c_contiguous
    np.testing.assert_allclose(layer(tl.Tensor(xt)).numpy(), want, rtol=1e-5, atol=1e-5)
    xb = np.broadcast_to(x[:1, :1], (2, 4, 12))  # broadcast (stride-0) input
    np.testing.assert_allclose(
        layer(tl.Tensor(xb)).numpy(), np.broadcast_to(want[:1, :1], (2, 4, 10)), rtol=1e-5, atol=1e-5
    )


def test_merge_unmerge_roundtrip_and_errors():
    tl.manual_seed(0)
    layer = LoRALinear(tl.nn.Linear(20, 15), r=4, alpha=16)
    layer.lora_B.data[...] = np.random.default_rng(2).standard_normal((15, 4)).astype(np.float32)
    w0 = layer.base_layer.weight.data.copy()
    x = tl.Tensor(np.random.default_rng(3).standard_normal((7, 20)).astype(np.float32))
    y = layer(x).numpy()
    layer.merge()
    np.testing.assert_allclose(layer(x).numpy(), y, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="already merged"):
        layer.merge()
    layer.unmerge()
    np.testing.assert_allclose(layer.base_layer.weight.data, w0, rtol=1e-6, atol=1e-6)
    with pytest.raises(RuntimeError, match="not merged"):
        layer.unmerge()


def test_apply_lora_freezes_base_and_trains_only_adapters():
    model = apply_lora(mlp(), target_modules=["0", "2"], r=4, alpha=8)
    assert isinstance(model[0], LoRALinear) and isinstance(model[2], LoRALinear)
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert names == {"0.lora_A", "0.lora_B", "2.lora_A", "2.lora_B"}
    rep = trainable_parameters(model)
    total = 16 * 32 + 32 + 32 * 8 + 8 + 4 * (16 + 32) + 4 * (32 + 8)
    assert rep["total"] == total and rep["trainable"] == 4 * (16 + 32) + 4 * (32 + 8)
    assert rep["fraction"] == pytest.approx(rep["trainable"] / total)
    randomize_b(model)
    x = tl.Tensor(np.random.default_rng(0).standard_normal((6, 16)).astype(np.float32))
    model(x).sum().backward()
    assert model[0].base_layer.weight.grad is None and model[2].base_layer.bias.grad is None
    assert model[0].lora_A.grad is not None and np.abs(model[0].lora_A.grad.numpy()).sum() > 0
    # a few SGD steps reduce a regression loss while base weights stay put
    w0 = model[0].base_layer.weight.data.copy()
    opt = tl.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.005)
    tgt = tl.Tensor(np.random.default_rng(4).standard_normal((6, 8)).astype(np.float32))
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = tl.nn.functional.mse_loss(model(x), tgt)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    np.testing.assert_array_equal(model[0].base_layer.weight.data, w0)


def test_suffix_matching_and_merge_model():
    model = apply_lora(mlp(), target_modules=["2"], r=2, alpha=2)
    assert isinstance(model[2], LoRALinear) and isinstance(model[0], tl.nn.Linear)
    randomize_b(model)
    x = tl.Tensor(np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32))
    y = model(x).numpy()
    merge_lora(model)
    np.testing.assert_allclose(model(x).numpy(), y, rtol=1e-5, atol=1e-5)
    unmerge_lora(model)
    np.testing.assert_allclose(model(x).numpy(), y, rtol=1e-5, atol=1e-5)


def test_lora_state_dict_only_adapters_roundtrip():
    a = apply_lora(mlp(0), ["0", "2"], r=4, alpha=8)
    randomize_b(a, 5)
    sd = lora_state_dict(a)
    assert list(sd) == ["0.lora_A", "0.lora_B", "2.lora_A", "2.lora_B"]
    b = apply_lora(mlp(0), ["0", "2"], r=4, alpha=8)
    load_lora_state_dict(b, {k: v.numpy().copy() for k, v in sd.items()})
    x = tl.Tensor(np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32))
    np.testing.assert_array_equal(a(x).numpy(), b(x).numpy())
    with pytest.raises(KeyError, match="missing"):
        load_lora_state_dict(b, {"0.lora_A": sd["0.lora_A"]})
    bad = {k: v.numpy() for k, v in sd.items()}
    bad["0.lora_A"] = np.zeros((3, 16), np.float32)
    with pytest.raises(ValueError, match="shape"):
        load_lora_state_dict(b, bad)


def test_bad_input():
    with pytest.raises(ValueError, match=r"target_modules.*Linear modules in the model: \['0', '2'\]"):
        apply_lora(mlp(), ["q_proj"], r=2, alpha=2)
    with pytest.raises(ValueError, match="r: rank"):
        apply_lora(mlp(), ["0"], r=0, alpha=2)
    with pytest.raises(ValueError, match=r"r: rank must be in \[1, .* = 16\]"):
        apply_lora(mlp(), ["0"], r=17, alpha=2)
    with pytest.raises(ValueError, match="alpha"):
        apply_lora(mlp(), ["0"], r=2, alpha=0)
    with pytest.raises(ValueError, match="alpha"):
        LoRALinear(tl.nn.Linear(4, 4), r=2, alpha=-1.0)
    with pytest.raises(ValueError, match="dropout"):
        LoRALinear(tl.nn.Linear(4, 4), r=2, alpha=1.0, dropout=1.0)
    with pytest.raises(TypeError, match="base"):
        LoRALinear(tl.nn.ReLU(), r=2, alpha=1.0)
    # nothing was modified by a failing call
    m = mlp()
    with pytest.raises(ValueError):
        apply_lora(m, ["0", "2"], r=9, alpha=2)  # 9 > min(32, 8) for layer 2
    assert isinstance(m[0], tl.nn.Linear) and all(p.requires_grad for p in m.parameters())


def test_dropout_only_in_training():
    tl.manual_seed(0)
    layer = LoRALinear(tl.nn.Linear(8, 8), r=2, alpha=2, dropout=0.5)
    layer.lora_B.data[...] = 1.0
    x = tl.Tensor(np.ones((4, 8), np.float32))
    layer.eval()
    y_eval = layer(x).numpy()
    want = layer.base_layer(x).numpy() + (np.ones((4, 8)) @ layer.lora_A.data.T) @ layer.lora_B.data.T
    np.testing.assert_allclose(y_eval, want, rtol=1e-5, atol=1e-5)
    layer.train()
    assert not np.allclose(layer(x).numpy(), y_eval)
