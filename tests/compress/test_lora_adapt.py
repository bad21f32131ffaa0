"""Gated LoRA [Q195] and the rank advisor / exact resize [Q218]."""

import numpy as np
import pytest

import tinylearn as tl
from tinylearn.compress.lora import LoRALinear, apply_lora
from tinylearn.compress.lora_adapt import (
    GatedLoRA,
    RankAdvisor,
    difficulty_labels,
    digits_gating_experiment,
    lora_flops,
    resize_rank,
)
from tinylearn.testing import assert_close


def layer(r=4, d_in=24, d_out=20, seed=0, alpha=8.0):
    tl.manual_seed(seed)
    m = LoRALinear(tl.nn.Linear(d_in, d_out), r=r, alpha=alpha)
    m.lora_B.data[...] = np.random.default_rng(seed).standard_normal((d_out, r)).astype(np.float32)
    return m


def test_resize_up_preserves_outputs():
    m = layer()
    x = tl.Tensor(np.random.default_rng(1).standard_normal((6, 24)).astype(np.float32))
    y, dw, s = m(x).numpy(), m.delta_weight(), m.scaling
    resize_rank(m, 9)
    assert m.r == 9 and m.lora_A.shape == (9, 24) and m.lora_B.shape == (20, 9) and m.scaling == s
    assert np.all(m.lora_B.data[:, 4:] == 0) and np.abs(m.lora_A.data[4:]).max() > 0
    # the new directions contribute exact zeros; only the BLAS summation order of the longer inner product (K = 9 vs
    # 4, a different kernel remainder path per CPU) can move the last bit
    assert_close(m.delta_weight(), dw, np.float32)
    assert_close(m(x).numpy(), y, np.float32)
    m(x).sum().backward()
    assert m.lora_A.grad is not None and m.lora_B.grad.shape == (20, 9)


def test_resize_down_is_eckart_young():
    m = layer(r=8, seed=2)
    dw = m.delta_weight().astype(np.float64)
    sv = np.linalg.svd(dw, compute_uv=False)
    np.testing.assert_allclose(RankAdvisor.spectrum(m), sv[:8], rtol=1e-5, atol=1e-6)
    resize_rank(m, 3)
    err = np.linalg.norm(dw - m.delta_weight().astype(np.float64))
    np.testing.assert_allclose(err, np.sqrt(np.sum(sv[3:] ** 2)), rtol=1e-4)
    # no other rank-3 factorisation does better: a random rank-3 truncation of the original factors is worse
    m2 = layer(r=8, seed=2)
    worse = np.linalg.norm(dw - m2.scaling * m2.lora_B.data[:, :3] @ m2.lora_A.data[:3])
    assert err < worse


def test_resize_errors():
    m = layer()
    with pytest.raises(ValueError, match="new_r"):
        resize_rank(m, 0)
    with pytest.raises(ValueError, match="new_r"):
        resize_rank(m, 21)
    m.merge()
    with pytest.raises(RuntimeError, match="merged"):
        resize_rank(m, 2)


def two_layer_model():
    tl.manual_seed(0)
    model = apply_lora(tl.nn.Sequential(tl.nn.Linear(16, 32), tl.nn.ReLU(), tl.nn.Linear(32, 16)), ["0", "2"], 8, 8)
    rng = np.random.default_rng(0)
    # layer 0: full-rank update (all 8 directions used); layer 2: update of rank 2
    model[0].lora_A.data[...] = np.linalg.qr(rng.standard_normal((16, 8)))[0].T  # flat spectrum
    model[0].lora_B.data[...] = np.linalg.qr(rng.standard_normal((32, 8)))[0]
    model[2].lora_B.data[...] = rng.standard_normal((16, 2)) @ rng.standard_normal((2, 8))
    return model


def test_advisor_on_constructed_gradient_streams():
    model = two_layer_model()
    adv = RankAdvisor(model, window=5, energy=0.95, hot_factor=1.5)  # hot: >= 1.5 x median
    for _ in range(10):  # layer 0 hot (energy 10), layer 2 cold (0.1)
        adv.observe({"0": 10.0, "2": 0.1})
    s = adv.suggest()
    assert s["0"]["action"] == "up" and s["0"]["suggested_r"] == 16 and s["0"]["energy_rank"] == 8
    assert s["2"]["action"] == "down" and s["2"]["suggested_r"] == 2 and s["2"]["energy_rank"] == 2
    # the window forgets: after layer 0 cools down and layer 2 heats up, the advice flips
    for _ in range(5):
        adv.observe({"0": 0.1, "2": 10.0})
    s = adv.suggest()
    assert s["0"]["action"] == "keep" and s["2"]["action"] == "keep"  # hot but not saturated: rank 2 suffices
    # applying the advice: resize layer 2 to 2 loses nothing (its update has rank 2)
    x = tl.Tensor(np.random.default_rng(3).standard_normal((4, 16)).astype(np.float32))
    y = model(x).numpy()
    resize_rank(model[2], 2)
    np.testing.assert_allclose(model(x).numpy(), y, rtol=1e-4, atol=1e-4)


def test_advisor_observes_real_gradients():
    model = two_layer_model()
    adv = RankAdvisor(model, window=3)
    x = tl.Tensor(np.random.default_rng(3).standard_normal((4, 16)).astype(np.float32))
    model(x).sum().backward()
    adv.observe()
    g0 = sum(float(np.sum(p.grad.numpy().astype(np.float64) ** 2)) for p in (model[0].lora_A, model[0].lora_B))
    assert adv.history["0"][-1] == pytest.approx(g0) and g0 > 0
    with pytest.raises(ValueError, match="window"):
        RankAdvisor(model, window=0)
    with pytest.raises(ValueError, match="energy"):
        RankAdvisor(model, energy=1.5)


def test_difficulty_labels_and_gate_errors():
    logits = np.array([[5.0, 0.0], [0.0, 5.0], [0.1, 0.0]])
    np.testing.assert_array_equal(difficulty_labels(logits, np.array([0, 0, 0]), threshold=1.0), [0, 1, 0])
    np.testing.assert_array_equal(difficulty_labels(logits, signal="entropy", threshold=0.5), [0, 0, 1])
    with pytest.raises(ValueError, match="signal"):
        difficulty_labels(logits, signal="margin")
    with pytest.raises(ValueError, match="model"):
        GatedLoRA(tl.nn.Linear(4, 4), 4)
    with pytest.raises(ValueError, match="threshold"):
        GatedLoRA(two_layer_model(), 16, threshold=1.0)


def test_gate_fallback_paths_match_base_and_lora():
    model = two_layer_model()
    g = GatedLoRA(model, 16, hidden=4)
    x = np.random.default_rng(5).standard_normal((10, 16)).astype(np.float32)
    g.gate_fc2.bias.data[...] = 100.0  # gate always on -> LoRA path
    np.testing.assert_allclose(g(x).numpy(), model(tl.Tensor(x)).numpy(), rtol=1e-6, atol=1e-6)
    assert g.stats()["routed_fraction"] == 1.0
    g.gate_fc2.bias.data[...] = -100.0  # gate always off -> base path
    base = model[2].base_layer(tl.nn.functional.relu(model[0].base_layer(tl.Tensor(x)))).numpy()
    np.testing.assert_allclose(g(x).numpy(), base, rtol=1e-6, atol=1e-6)
    assert g.stats()["lora_flops_saved_fraction"] == 1.0 and lora_flops(model) == 8 * (16 + 32) + 8 * (32 + 16)


def test_digits_gating_routes_hard_inputs():
    """Digits, clean (easy) vs rotated 90 degrees (hard); a labelled small demo, seeded."""
    r = digits_gating_experiment(seed=0)
    assert r["routed_shifted"] > 0.8 and r["routed_clean"] < 0.1  # hard inputs routed, easy ones not
    assert r["acc_always_on"] > r["acc_always_off"] + 0.3
    assert r["acc_gated"] > r["acc_always_on"] - 0.03  # near always-on accuracy ...
    assert r["lora_flops_saved_fraction"] > 0.4 and r["net_macs_saved_per_row"] > 0  # ... at half the LoRA FLOPs
