"""tl.memory.estimate vs tl.memory.measure_peak (within 10%) for the digits MLP/CNN, the breakdown, checkpoint
segments, and the large-model formulas."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import tinylearn as tl
from tinylearn.memory import estimate, measure_peak, transformer_memory
from tinylearn.nn.models import DigitsCNN, DigitsMLP

F = tl.nn.functional


def _step(make, batch, optimizer="adam", amp=None):
    def f():
        tl.manual_seed(0)
        m = make()
        opt = tl.optim.Adam(m.parameters()) if optimizer == "adam" else tl.optim.SGD(m.parameters(), lr=0.1)
        x = tl.randn(batch, 1, 8, 8)
        y = tl.Tensor(np.zeros(batch, np.int64))
        with tl.autocast(amp) if amp else contextlib.nullcontext():
            loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()

    return f


CASES = {
    "mlp": (lambda: DigitsMLP((512, 512)), 256),
    "mlp_wide": (lambda: DigitsMLP((1024, 1024, 1024)), 64),
    "mlp_deep": (lambda: DigitsMLP([256] * 8), 512),
    "cnn": (lambda: DigitsCNN(32, 64), 256),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_estimate_within_10_percent_of_measured(name, optimizer):
    make, batch = CASES[name]
    est = estimate(make(), (batch, 1, 8, 8), optimizer=optimizer)
    meas = measure_peak(_step(make, batch, optimizer))
    assert abs(est["peak"] / meas - 1) < 0.10, (est, meas)


def test_estimate_amp_bf16_adam_within_10_percent():
    make, batch = CASES["cnn"]
    est = estimate(make(), (batch, 1, 8, 8), amp="bfloat16")
    meas = measure_peak(_step(make, batch, amp="bfloat16"))
    assert abs(est["peak"] / meas - 1) < 0.10, (est, meas)


def test_estimate_breakdown():
    m = DigitsMLP((100,))
    n = 64 * 100 + 100 + 100 * 10 + 10
    est = estimate(m, (32, 1, 8, 8), optimizer="adam")
    assert est["params"] == est["grads"] == 4 * n and est["optimizer_state"] == 8 * n
    assert estimate(m, (32, 1, 8, 8), optimizer="sgd")["optimizer_state"] == 0
    half = estimate(m, (32, 1, 8, 8), dtype="bfloat16")
    assert half["params"] == 2 * n
    # activations scale with the batch
    a1 = estimate(m, (32, 1, 8, 8))["activations"]
    a2 = estimate(m, (64, 1, 8, 8))["activations"]
    assert 1.8 < a2 / a1 <= 2.0
    assert est["peak"] >= est["params"] + est["grads"] + est["optimizer_state"]
    with pytest.raises(ValueError, match="optimizer"):
        estimate(m, (32, 1, 8, 8), optimizer="lion")
    with pytest.raises(ValueError, match="input_shape"):
        estimate(m, (32, -1))


def test_estimate_checkpoint_segments_fewer_activations():
    make, batch = CASES["mlp_deep"]
    full = estimate(make(), (batch, 1, 8, 8))
    ck = estimate(make(), (batch, 1, 8, 8), checkpoint_segments=4)
    assert ck["activations"] < full["activations"]
    with pytest.raises(ValueError, match="checkpoint_segments"):
        estimate(make(), (batch, 1, 8, 8), checkpoint_segments=0)


def test_transformer_memory_formulas():
    # 7B-class (LLaMA-7B-like): 16 bytes/param of model states = 112 GB
    r = transformer_memory(7e9, n_layers=32, hidden=4096, heads=32, seq=2048, micro_batch=1)
    assert r["model_states"] == 16 * 7e9 == 112e9
    per_layer = 2048 * 4096 * (34 + 5 * 32 * 2048 / 4096)
    assert r["activations"] == pytest.approx(32 * per_layer)
    ck = transformer_memory(7e9, n_layers=32, hidden=4096, heads=32, seq=2048, micro_batch=1, checkpoint=True)
    assert ck["activations"] == 32 * 2 * 2048 * 4096
    with pytest.raises(ValueError):
        transformer_memory(0, 1, 1, 1, 1, 1)


def test_measure_peak_counts_a_known_allocation():
    def f():
        a = np.ones(1 << 20, np.float32)  # 4 MiB
        b = a * 2  # another 4 MiB while a is alive
        del a, b

    assert 8 << 20 <= measure_peak(f) < (8 << 20) + 4096
    with pytest.raises(TypeError, match="fn"):
        measure_peak(3)
