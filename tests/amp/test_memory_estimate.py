"""tl.memory.estimate vs tl.memory.measure_peak (within 10%) for the digits MLP/CNN and TinyGPT, fp32 and bf16
autocast, SGD and Adam, the breakdown, checkpoint
segments, and the large-model formulas."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import tinylearn as tl
from tinylearn.inference import TinyGPT
from tinylearn.memory import estimate, measure_peak, transformer_memory
from tinylearn.nn.models import DigitsCNN, DigitsMLP

F = tl.nn.functional


def _step(make, shape, optimizer="adam", amp=None):
    def f():
        tl.manual_seed(0)
        m = make()
        opt = tl.optim.Adam(m.parameters()) if optimizer == "adam" else tl.optim.SGD(m.parameters(), lr=0.1)
        x = np.zeros(shape, np.int64) if len(shape) == 2 else tl.randn(*shape)  # token ids for TinyGPT
        with tl.autocast(amp) if amp else contextlib.nullcontext():
            out = m(x)
            if out.ndim == 3:  # [B, T, V] logits: next-token cross entropy over every position
                out = out.reshape(-1, out.shape[-1])
            loss = F.cross_entropy(out, tl.Tensor(np.zeros(out.shape[0], np.int64)))
        loss.backward()
        opt.step()

    return f


CASES = {
    "mlp": (lambda: DigitsMLP((512, 512)), (256, 1, 8, 8)),
    "mlp_wide": (lambda: DigitsMLP((1024, 1024, 1024)), (64, 1, 8, 8)),
    "mlp_deep": (lambda: DigitsMLP([256] * 8), (512, 1, 8, 8)),
    "cnn": (lambda: DigitsCNN(32, 64), (256, 1, 8, 8)),
    # the TinyGPT of notebook 09 (4 layers, d_model 64, GQA 4/2 heads) on 8 sequences of 128 tokens
    "tinygpt": (lambda: TinyGPT(64, 64, 4, 4, 256, n_kv_heads=2), (8, 128)),
}


def _check(name, optimizer, amp):
    make, shape = CASES[name]
    kw = {"input_dtype": "int64"} if len(shape) == 2 else {}
    est = estimate(make(), shape, optimizer=optimizer, amp=amp, **kw)
    meas = measure_peak(_step(make, shape, optimizer, amp))
    assert abs(est["peak"] / meas - 1) < 0.10, (name, optimizer, amp, est, meas)
    return est, meas


@pytest.mark.parametrize("amp", [None, "bfloat16"])
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
@pytest.mark.parametrize("name", ["mlp", "cnn", "tinygpt"])
def test_estimate_within_10_percent_of_measured(name, optimizer, amp):
    _check(name, optimizer, amp)


@pytest.mark.parametrize("name", ["mlp_wide", "mlp_deep"])
def test_estimate_within_10_percent_bf16_sgd_wide_and_deep(name):
    # bf16 + SGD: the backward peak holds a weight's bf16 GEMM gradient next to the fp32 copy its cast makes
    est, meas = _check(name, "sgd", "bfloat16")
    # workspace (beyond activations + all grads) is about one bf16 copy of the largest weight: half its fp32 bytes
    largest = max(p.data.nbytes for p in CASES[name][0]().parameters())
    assert est["workspace"] >= 0.45 * largest


def test_estimate_fp32_wide_and_deep():
    for name in ("mlp_wide", "mlp_deep"):
        for opt in ("adam", "sgd"):
            _check(name, opt, None)


def test_estimate_tinygpt_activations_dominated_by_attention():
    make, shape = CASES["tinygpt"]
    est = estimate(make(), shape, input_dtype="int64")
    b, t, layers, heads = shape[0], shape[1], 4, 4
    probs = b * heads * t * t * 4  # one fp32 [B, H, T, T] attention matrix per layer
    assert est["activations"] > layers * 2 * probs  # scores and softmax output at least, per layer
    assert est["activations"] < 0.6 * 2**20 * 128  # and not an order of magnitude more (< 77 MB)
    with pytest.raises(ValueError, match="input_dtype"):
        estimate(make(), shape, input_dtype="uint8")


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
    make, shape = CASES["mlp_deep"]
    full = estimate(make(), shape)
    ck = estimate(make(), shape, checkpoint_segments=4)
    assert ck["activations"] < full["activations"]
    with pytest.raises(ValueError, match="checkpoint_segments"):
        estimate(make(), shape, checkpoint_segments=0)


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


def test_transformer_memory_flash_attention_drops_the_attention_matrices():
    kw = dict(n_layers=32, hidden=4096, heads=32, seq=4096, micro_batch=2)
    std = transformer_memory(6.7e9, **kw)
    fa = transformer_memory(6.7e9, **kw, flash_attention=True)
    assert fa["activations"] == 32 * (4096 * 2 * 4096 * 34 + 4 * 32 * 4096 * 2)  # sbh*34 + fp32 log-sum-exp
    assert std["activations"] / fa["activations"] == pytest.approx((34 + 5 * 32 * 4096 / 4096) / (34 + 4 * 32 / 4096))
    assert fa["model_states"] == std["model_states"]


def test_estimate_checkpoint_tracks_measured_peak_and_sqrt_2n():
    """checkpoint_sequential keeps its last segment, whose activations are alive while the others are rebuilt:
    peak ~ k + 2n/k + 1 layer outputs, minimal at sqrt(2n) (= 8 for n = 32), and 2 segments cost more than 1."""

    def make():
        tl.manual_seed(0)
        return tl.nn.Sequential(*[m for _ in range(16) for m in (tl.nn.Linear(128, 128), tl.nn.ReLU())])

    def step(k):
        def f():
            net, x = make(), tl.randn(1024, 128)
            out = tl.autograd.checkpoint_sequential(net, k, x) if k > 1 else net(x)
            out.sum().backward()

        return f

    meas = {k: measure_peak(step(k)) for k in (1, 2, 4, 8, 16)}
    for k, m in meas.items():
        est = estimate(make(), (1024, 128), optimizer="sgd", checkpoint_segments=k if k > 1 else None,
                       loss=lambda o: o.sum())  # fmt: skip
        assert abs(est["peak"] / m - 1) < 0.01, (k, est["peak"], m)
    assert min(meas, key=meas.get) == 8 and meas[2] > meas[1]


def _brute_recompute(a, f, budget, working_set):
    best = None
    for mask in range(1 << len(a)):
        drop = [i for i in range(len(a)) if mask >> i & 1]
        peak = sum(a) - sum(a[i] for i in drop) + (max((a[i] for i in drop), default=0) if working_set else 0)
        cost = sum(f[i] for i in drop)
        if peak <= budget and (best is None or cost < best - 1e-12):
            best = cost
    return best


@pytest.mark.parametrize("working_set", [True, False])
def test_plan_recompute_is_optimal_and_greedy_fits(working_set):
    from tinylearn.memory.estimate import greedy_recompute, plan_recompute

    rng = np.random.default_rng(0)
    for _ in range(40):
        n = int(rng.integers(1, 9))
        a, f = rng.integers(1, 12, n).tolist(), rng.uniform(0.1, 5, n).round(3).tolist()
        budget = int(rng.integers(max(a), sum(a) + 2))
        plan = plan_recompute(a, f, budget, working_set=working_set)
        assert plan["recompute"] == pytest.approx(_brute_recompute(a, f, budget, working_set))
        assert plan["peak"] <= budget and sorted(plan["drop"] + plan["keep"]) == list(range(n))
        assert plan["step_time"] == pytest.approx(3 * sum(f) + plan["recompute"])
        g = greedy_recompute(a, f, budget, working_set=working_set)
        assert g["peak"] <= budget and g["recompute"] >= plan["recompute"] - 1e-9


def test_recompute_planners_validate():
    from tinylearn.memory.estimate import greedy_recompute, plan_recompute

    with pytest.raises(ValueError, match="budget"):
        plan_recompute([4, 4], [1, 1], 3)  # even dropping both leaves a 4-unit working set
    with pytest.raises(TypeError, match="integer"):
        plan_recompute([1.5, 2.0], [1, 1], 3)
    with pytest.raises(ValueError, match="lengths"):
        greedy_recompute([1, 2], [1], 3)
    assert plan_recompute([1, 2], [1, 1], 3)["drop"] == []  # everything fits: nothing recomputed
