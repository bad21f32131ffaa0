"""Low-bit formats: FP4 E2M1 (vs ml_dtypes), INT2 + STE, MX block scaling (OCP MX v1.0), Hutchinson trace and
bit allocation."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tinylearn as tl
from tinylearn.amp import (
    allocate_bits,
    fake_quant_fp4,
    fake_quant_int2,
    fp4_decode,
    fp4_encode,
    hutchinson_trace,
    int2_quantize,
    mx_bits_per_element,
    mx_quantize,
    mx_round,
)


def test_fp4_encode_bit_exact_vs_ml_dtypes():
    x = np.concatenate(
        [
            np.linspace(-9, 9, 7201, dtype=np.float32),  # includes every midpoint (ties) and saturation
            np.random.default_rng(0).standard_normal(5000).astype(np.float32) * 3,
            np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, 1e30, -0.0], np.float32),
        ]
    )
    ref = x.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
    np.testing.assert_array_equal(fp4_encode(x), ref)
    np.testing.assert_array_equal(fp4_decode(np.arange(16)), np.arange(16, dtype=np.uint8).view(
        ml_dtypes.float4_e2m1fn).astype(np.float32))  # fmt: skip
    with pytest.raises(ValueError, match="NaN"):
        fp4_encode(np.array([np.nan]))
    with pytest.raises(ValueError, match="codes"):
        fp4_decode(np.array([16]))


def test_int2_codes_and_ste_gradient():
    x = np.array([-3.0, -1.6, -0.4, 0.0, 0.5, 0.6, 1.4, 2.0], np.float32)
    np.testing.assert_array_equal(int2_quantize(x, 1.0), [-2, -2, 0, 0, 0, 1, 1, 1])
    t = tl.Tensor(x, requires_grad=True)
    y = fake_quant_int2(t, 1.0)
    np.testing.assert_array_equal(y.data, [-2, -2, 0, 0, 0, 1, 1, 1])
    y.sum().backward()
    np.testing.assert_array_equal(t.grad.data, [0, 1, 1, 1, 1, 1, 1, 0])  # clipped (|q| out of range): no grad
    t2 = tl.Tensor(np.array([0.3, 5.0, -13.0], np.float32), requires_grad=True)
    y2 = fake_quant_fp4(t2, 2.0)
    # 0.3/2 = 0.15 -> 0; 5/2 = 2.5 is a tie between 2 (code 100) and 3 (code 101): even code -> 2 -> 4.0; -6.5 -> -6
    np.testing.assert_array_equal(y2.data, [0.0, 4.0, -12.0])
    y2.sum().backward()
    np.testing.assert_array_equal(t2.grad.data, [1, 1, 0])
    with pytest.raises(ValueError, match="scale"):
        fake_quant_int2(t, 0.0)


def _mx_reference(x: np.ndarray, fmt: str) -> np.ndarray:
    """Block by block, straight from the spec text (section 6.3), FP4 and FP8 elements via ml_dtypes."""
    emax, vmax, elem = {"fp4_e2m1": (2, 6.0, ml_dtypes.float4_e2m1fn), "fp8_e4m3": (8, 448.0, ml_dtypes.float8_e4m3fn)}[
        fmt
    ]
    out = np.empty_like(x)
    for r in range(x.shape[0]):
        for b in range(0, x.shape[1], 32):
            v = x[r, b : b + 32]
            amax = np.abs(v).max()
            e = int(np.floor(np.log2(amax))) - emax if amax > 0 else -127
            s = 2.0**e
            out[r, b : b + 32] = np.clip(v / s, -vmax, vmax).astype(elem).astype(np.float32) * s
    return out


@pytest.mark.parametrize("fmt", ["fp4_e2m1", "fp8_e4m3"])
def test_mx_matches_spec_reference(fmt):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((6, 96)) * np.exp(rng.uniform(-8, 8, (6, 1)))).astype(np.float32)
    x[2, :32] = 0  # an all-zero block
    np.testing.assert_array_equal(mx_round(x, fmt), _mx_reference(x, fmt))
    e, p = mx_quantize(x, fmt)
    assert e.shape == (6, 3) and p.shape == (6, 3, 32) and e[2, 0] == -127
    # the shared scale is a power of two that puts each block's max at the top binade of the element format
    emax = {"fp4_e2m1": 2, "fp8_e4m3": 8}[fmt]
    amax = np.abs(x.reshape(6, 3, 32)).max(-1)
    nz = amax > 0
    assert np.all((amax[nz] / 2.0 ** e[nz] >= 2.0**emax) & (amax[nz] / 2.0 ** e[nz] < 2.0 ** (emax + 1)))
    assert mx_bits_per_element(fmt) == {"fp4_e2m1": 4.25, "fp8_e4m3": 8.25}[fmt]


def test_mx_axis_padding_and_errors():
    x = np.random.default_rng(2).standard_normal((40, 3)).astype(np.float32)
    r = mx_round(x, "int8", axis=0)
    assert r.shape == x.shape
    np.testing.assert_array_equal(r[:, 1], mx_round(x[:, 1], "int8"))
    assert np.abs(r - x).max() <= np.abs(x).max() * 2**-6  # MXINT8: 1.6 fixed point, step 2^-6 of the scale
    with pytest.raises(ValueError, match="fmt"):
        mx_round(x, "fp3")
    with pytest.raises(ValueError, match="finite"):
        mx_round(np.array([np.inf, 1.0]))


def test_hutchinson_trace_on_a_quadratic():
    rng = np.random.default_rng(0)
    a1 = rng.standard_normal((6, 6))
    h1 = a1 @ a1.T  # SPD Hessian of block 1
    h2 = np.diag(rng.uniform(1, 3, 4))
    w1 = tl.Tensor(rng.standard_normal(6), requires_grad=True)
    w2 = tl.Tensor(rng.standard_normal(4), requires_grad=True)
    c = tl.Tensor(rng.standard_normal(6))

    def loss():  # L = 1/2 w1' H1 w1 + 1/2 w2' H2 w2 + (c . w1)(sum w2): cross terms must not bias the traces
        return 0.5 * (w1 @ tl.Tensor(h1) @ w1) + 0.5 * (w2 @ tl.Tensor(h2) @ w2) + (c * w1).sum() * w2.sum()

    est = hutchinson_trace(loss, [w1, w2], n_samples=400, eps=1e-3, seed=0)
    # the full Hessian, to get the estimator's spread by simulating it in numpy
    h = np.zeros((10, 10))
    h[:6, :6], h[6:, 6:] = h1, h2
    h[:6, 6:] = np.outer(c.data, np.ones(4))
    h[6:, :6] = h[:6, 6:].T
    v = rng.choice([-1.0, 1.0], size=(4000, 10))
    hv = v @ h
    for blk, e, hb in [(slice(0, 6), est[0], h1), (slice(6, 10), est[1], h2)]:
        samples = np.sum(v[:, blk] * hv[:, blk], axis=1)
        assert abs(samples.mean() - np.trace(hb)) < 4 * samples.std() / np.sqrt(4000)  # unbiased
        assert abs(e - np.trace(hb)) < 4 * samples.std() / np.sqrt(400) + 1e-6, (e, np.trace(hb))
    assert w1.grad is None  # parameters restored, grads cleared


def test_allocate_bits_respects_budget_and_prefers_sensitive_layers():
    rng = np.random.default_rng(0)
    ws = [rng.standard_normal(100), rng.standard_normal(100), rng.standard_normal(100)]
    bits, info = allocate_bits([100.0, 1.0, 0.01], ws, avg_bits=4.0, candidates=(2, 4, 8))
    assert info["avg_bits"] <= 4.0
    assert bits[0] >= bits[1] >= bits[2] and bits[0] == 8
    bits2, _ = allocate_bits([0.01, 1.0, 100.0], ws, avg_bits=4.0)
    assert bits2 == bits[::-1]
    with pytest.raises(ValueError, match="avg_bits"):
        allocate_bits([1.0], ws[:1], avg_bits=1.0)


# -- activation bit allocation (Hutchinson through a zero probe) ---------------------------------------------------
def test_activation_traces_match_the_exact_hessian_of_a_quadratic():
    from tinylearn.amp import activation_traces

    rng = np.random.default_rng(0)
    w = rng.standard_normal((5, 3)).astype(np.float32)
    x = tl.Tensor(rng.standard_normal((4, 5)).astype(np.float32))
    layers = [lambda h: h * 1.0, lambda h: h @ tl.Tensor(w)]
    # loss = 1/2 ||h W||^2 with h the activation entering layer 1: Hessian w.r.t. h is I_batch (x) W W^T
    traces, acts = activation_traces(layers, x, lambda o: (o * o).sum() * 0.5, [1], n_samples=64, eps=1e-2)
    assert acts[0].shape == (4, 5)
    # the central difference is exact for a quadratic: each sample is v^T H v for the Rademacher v drawn by seed 0
    rng = np.random.default_rng(0)
    w64 = w.astype(np.float64)
    vs = [rng.choice(np.array([-1.0, 1.0]), size=(4, 5)) for _ in range(64)]
    expected = np.mean([np.sum((v @ w64) ** 2) for v in vs])
    np.testing.assert_allclose(traces[0], expected, rtol=1e-3)
    assert abs(traces[0] / (4 * np.trace(w64 @ w64.T)) - 1) < 0.15  # and near the true trace
    with pytest.raises(ValueError, match="points"):
        activation_traces(layers, x, lambda o: o.sum(), [3])


def test_forward_quantized_activations_widths():
    from tinylearn.amp import forward_quantized_activations, quantize_symmetric

    x = tl.Tensor(np.linspace(-1, 1, 24, dtype=np.float32).reshape(3, 8))
    ident = [lambda h: h]
    np.testing.assert_array_equal(forward_quantized_activations(ident, x, [0], [32]).data, x.data)
    q2 = forward_quantized_activations(ident, x, [0], [2]).data
    np.testing.assert_allclose(q2, quantize_symmetric(x.data, 2), rtol=1e-6)
    mixed = forward_quantized_activations(ident, x, [0], [np.array([8] * 4 + [2] * 4)]).data
    np.testing.assert_allclose(mixed[:, 4:], quantize_symmetric(x.data[:, 4:], 2), rtol=1e-6)
    assert len(np.unique(mixed[:, :4])) > len(np.unique(mixed[:, 4:]))


# -- per-layer precision planner ---------------------------------------------------------------------------------
def _stats(name, n=1000, act=500, gmax=1e-3, gsmall=1e-6, amax=10.0, snr=1.0, err=0.004):
    return {"name": name, "n_params": n, "act_elems": act, "act_absmax": amax, "grad_absmax": gmax,
            "grad_small": gsmall, "grad_snr": snr, "int8_err": err}  # fmt: skip


def test_allowed_formats_gates():
    from tinylearn.amp import allowed_formats

    assert allowed_formats(_stats("a")) == ["fp32", "bf16", "fp16", "int8"]
    assert "fp16" not in allowed_formats(_stats("a", gsmall=1e-9))  # small grads would round to 0 in fp16
    assert "fp16" in allowed_formats(_stats("a", gsmall=1e-9), loss_scale=2.0**10)
    assert "fp16" not in allowed_formats(_stats("a", amax=9000.0))  # 9000 * margin 8 > 65504
    assert "bf16" not in allowed_formats(_stats("a", snr=1e3))  # gradient spread below bf16 rounding
    assert "int8" not in allowed_formats(_stats("a", err=0.05))
    assert allowed_formats(_stats("a"), fp32_pinned=True) == ["fp32"]


def test_plan_precision_speed_and_memory_pressure():
    from tinylearn.amp import plan_precision

    st = [_stats("a", n=4000, act=1000), _stats("b", n=1000, act=4000), _stats("c", n=100, act=100)]
    slow = plan_precision(st, speed={"bf16": 1.5, "fp16": 1.5}, fp32_layers=["c"])
    assert slow["formats"] == {"a": "fp32", "b": "fp32", "c": "fp32"} and slow["time"] == 1.0
    fast = plan_precision(st, speed={"bf16": 0.5, "fp16": 0.6})
    assert set(fast["formats"].values()) == {"bf16"} and fast["time"] == pytest.approx(0.5)
    fp32_bytes = sum(4 * (s["n_params"] + s["act_elems"]) for s in st)
    tight = plan_precision(st, speed={"bf16": 1.5, "fp16": 1.5}, mem_budget=0.5 * fp32_bytes, fp32_layers=["c"])
    assert tight["fits"] and tight["bytes"] <= 0.5 * fp32_bytes and tight["formats"]["c"] == "fp32"
    assert tight["formats"]["a"] == "int8"  # weight-heavy layer: int8 weights cost no time in this model
    impossible = plan_precision(st, mem_budget=10)
    assert not impossible["fits"]
    with pytest.raises(ValueError, match="speed"):
        plan_precision(st, speed={"fp8": 0.5})
