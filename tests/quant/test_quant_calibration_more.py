"""Online re-calibration under drift (Q238), error-budget allocation across segments (Q208), the learnable
activation shift / scale with folding (Q196)."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest

import tinylearn as tl
from tinylearn.quant import error_budget as EB
from tinylearn.quant.online_calib import OnlineRecalibrator, saturation_rate
from tinylearn.quant.shift_scale import LearnableShiftScale, fold_shift_scale, quantized_block

Q = tl.quant


# ------------------------------------------------------------------------------------------------ online recalib
def test_saturation_rate_counts_clipped_elements_only():
    s, z = Q.calculate_qparams(0.0, 2.55, "uint8")  # grid 0 .. 2.55, step 0.01
    x = np.array([0.0, 1.0, 2.55, 2.554, 2.556, 3.0, -0.004, -0.006], np.float32)
    # 2.554 and -0.004 round onto the end codes (within half a step 0.005); 2.556, 3.0, -0.006 are clipped
    assert saturation_rate(x, s, z, "uint8") == pytest.approx(3 / 8)
    assert saturation_rate(np.ones(4, np.float32), s, z, "uint8") == 0.0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"x": np.zeros(0, np.float32)}, "x"),
        ({"scale": 0.0}, "scale"),
        ({"scale": float("nan")}, "scale"),
        ({"zero_point": 300}, "zero_point"),
        ({"dtype": "int3"}, "dtype"),
    ],
)
def test_saturation_rate_bad_input(kwargs, match):
    args = {"x": np.ones(3, np.float32), "scale": 0.1, "zero_point": 0, "dtype": "uint8"} | kwargs
    with pytest.raises(ValueError, match=match):
        saturation_rate(**args)


def _stream(gains, rng):
    return [(g * np.maximum(rng.standard_normal((128, 32)), 0)).astype(np.float32) for g in gains]


def test_recalibrates_after_drift_not_on_an_outlier_batch():
    rng = np.random.default_rng(0)
    gains = np.r_[np.ones(10), 3.0 * np.ones(10), 0.5 * np.ones(10)]
    gains[4] = 4.0  # one outlier batch: patience=2 must ignore it
    rec = OnlineRecalibrator("uint8", patience=2, cooldown=3)
    rec.calibrate(np.maximum(rng.standard_normal((512, 32)), 0).astype(np.float32))
    s0, z0 = rec.scale, rec.zero_point
    stale, online = [], []
    for xb in _stream(gains, rng):
        online.append(float(np.mean((rec(xb) - xb) ** 2)))
        stale.append(float(np.mean((Q.quantize_dequantize(xb, s0, z0, "uint8") - xb) ** 2)))
    assert rec.recalibrations == [11, 21]  # drift at 10 and 20, two alarmed batches each
    assert rec.history[4]["alarm"] and not rec.history[4]["recalibrated"]
    assert np.mean(online[12:20]) < 0.01 * np.mean(stale[12:20])  # upward drift: stale clips
    assert np.mean(online[22:]) < 0.5 * np.mean(stale[22:])  # downward drift: stale step too coarse
    assert len(rec.history) == 30 and all(h["mse_ratio"] >= 0 for h in rec.history)


def test_hysteresis_keeps_alarm_between_thresholds():
    rec = OnlineRecalibrator("uint8", sat_high=0.1, sat_low=0.01, ratio_high=1e9, ratio_low=1e9, patience=3)
    rec.calibrate(np.linspace(0, 1, 101, dtype=np.float32))
    x_hi = np.r_[np.linspace(0, 1, 80), np.full(20, 5.0)].astype(np.float32)  # 20 % clipped > sat_high
    x_mid = np.r_[np.linspace(0, 1, 95), np.full(5, 5.0)].astype(np.float32)  # 5 %: between the thresholds
    rec(x_hi)
    rec(x_mid)
    assert rec.history[-1]["alarm"]  # stays on between the thresholds
    rec(x_mid)  # third alarmed batch in a row -> refit
    assert rec.recalibrations == [2]
    one_threshold = OnlineRecalibrator("uint8", sat_high=0.1, sat_low=0.1, ratio_high=1e9, ratio_low=1e9, patience=3)
    one_threshold.calibrate(np.linspace(0, 1, 101, dtype=np.float32))
    for xb in (x_hi, x_mid, x_mid):
        one_threshold(xb)
    assert one_threshold.recalibrations == []


def test_uncalibrated_recalibrator_calibrates_on_first_batch():
    rec = OnlineRecalibrator("int8", symmetric=True)
    x = np.linspace(-2, 2, 64, dtype=np.float32)
    out = rec(x)
    s, z = Q.calculate_qparams(-2.0, 2.0, "int8", symmetric=True)
    assert (rec.scale, rec.zero_point) == (s, z)
    np.testing.assert_array_equal(out, Q.quantize_dequantize(x, s, z, "int8"))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"dtype": "int7"}, "dtype"),
        ({"sat_low": 0.2, "sat_high": 0.1}, "sat_low"),
        ({"ratio_low": 0.5}, "ratio_low"),
        ({"patience": 0}, "patience"),
        ({"cooldown": -1}, "cooldown"),
        ({"headroom": -0.1}, "headroom"),
    ],
)
def test_recalibrator_bad_args(kwargs, match):
    with pytest.raises(ValueError, match=match):
        OnlineRecalibrator(**kwargs)


def test_recalibrator_bad_batch():
    rec = OnlineRecalibrator()
    with pytest.raises(ValueError, match="x"):
        rec(np.array([1.0, np.nan], np.float32))
    with pytest.raises(ValueError, match="x"):
        rec.calibrate(np.zeros(0, np.float32))


# ------------------------------------------------------------------------------------------------ error budget
def test_lagrange_split_is_proportional_to_size_over_sensitivity():
    w, n = np.array([1.0, 4.0, 2.0]), np.array([100.0, 100.0, 800.0])
    m = EB.allocate_error_budget(0.5, w, n)
    assert np.sum(w * m) == pytest.approx(0.5)
    np.testing.assert_allclose(w * m, 0.5 * n / n.sum())
    mu = EB.allocate_error_budget(0.5, w, n, "uniform")
    np.testing.assert_allclose(w * mu, [0.5 / 3] * 3)


def test_lagrange_minimises_continuous_bits():
    w, n, c = np.array([1.0, 4.0, 2.0]), np.array([100.0, 100.0, 800.0]), np.array([1.0, 2.0, 0.5])
    opt = EB.predicted_bits(1e-3, w, n, c)
    assert opt < EB.predicted_bits(1e-3, w, n, c, "uniform")
    rng = np.random.default_rng(0)
    for _ in range(50):  # any other split of the same budget needs at least as many bits
        share = rng.dirichlet(np.ones(3)) * 1e-3
        other = float(np.sum(n * 0.5 * np.log2(c * w / share)))
        assert other >= opt - 1e-9


def test_box_constraints_redistribute_the_budget():
    w, n = np.array([1.0, 1.0]), np.array([10.0, 990.0])
    floors, ceilings = np.array([1e-3, 1e-6]), np.array([1.0, 1.0])
    m = EB.allocate_error_budget(0.1, w, n, floors=floors, ceilings=ceilings)
    assert m[0] == pytest.approx(1e-3)  # its share 0.001 hits the floor exactly
    assert np.sum(w * m) == pytest.approx(0.1, rel=1e-9)
    m2 = EB.allocate_error_budget(0.05, w, n, floors=np.array([0.01, 1e-6]), ceilings=ceilings)
    assert m2[0] == pytest.approx(0.01) and np.sum(w * m2) == pytest.approx(0.05, rel=1e-9)
    np.testing.assert_array_equal(EB.allocate_error_budget(5.0, w, n, floors=floors, ceilings=ceilings), ceilings)
    with pytest.raises(ValueError, match="budget"):
        EB.allocate_error_budget(1e-4, w, n, floors=floors, ceilings=ceilings)


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        ((0.0, [1.0], [1.0]), {}, "budget"),
        ((float("inf"), [1.0], [1.0]), {}, "budget"),
        ((1.0, [1.0, -1.0], [1.0, 1.0]), {}, "sensitivities"),
        ((1.0, [1.0, 1.0], [1.0]), {}, "sizes"),
        ((1.0, [1.0], [1.0]), {"policy": "greedy"}, "policy"),
        ((1.0, [1.0], [1.0]), {"floors": [2.0], "ceilings": [1.0]}, "floors"),
    ],
)
def test_allocate_error_budget_bad_input(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        EB.allocate_error_budget(*args, **kwargs)


def test_fake_quantize_bits_matches_int8_symmetric_grid():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 9)).astype(np.float32)
    out = EB.fake_quantize_bits(w, 8)
    s = np.abs(w).max(1, keepdims=True) / 127
    np.testing.assert_allclose(out, np.clip(np.rint(w / s), -127, 127) * s, rtol=1e-6)
    assert len(np.unique(EB.fake_quantize_bits(w, 2, axis=None))) <= 3
    err = [np.mean((EB.fake_quantize_bits(w, b) - w) ** 2) for b in (2, 4, 6, 8)]
    assert all(a > b for a, b in zip(err, err[1:]))
    with pytest.raises(ValueError, match="bits"):
        EB.fake_quantize_bits(w, 1)
    with pytest.raises(ValueError, match="axis"):
        EB.fake_quantize_bits(w, 4, axis=2)


def _mlp():
    tl.manual_seed(0)
    return tl.nn.Sequential(tl.nn.Linear(6, 16), tl.nn.ReLU(), tl.nn.Linear(16, 32), tl.nn.ReLU(), tl.nn.Linear(32, 3))


def test_segment_helpers_on_a_model():
    model = _mlp()
    segs = ["0", ["2", "4"]]
    np.testing.assert_array_equal(EB.segment_sizes(model, segs), [96, 512 + 96])
    tab = EB.weight_error_table(model, segs, (2, 4, 8))
    assert tab.shape == (2, 3) and np.all(np.diff(tab, axis=1) < 0)
    qm = EB.quantize_segments(model, segs, [8, 2])
    assert len(np.unique(qm.get_submodule("4").weight.data[0])) <= 3
    np.testing.assert_array_equal(model.get_submodule("0").weight.data, _mlp().get_submodule("0").weight.data)
    X = np.random.default_rng(2).standard_normal((64, 6)).astype(np.float32)
    w = EB.measure_sensitivities(model, segs, X, probe_bits=4)
    assert w.shape == (2,) and np.all(w > 0)
    with pytest.raises(ValueError, match="segments"):
        EB.segment_sizes(model, ["9"])
    with pytest.raises(ValueError, match="segments"):
        EB.segment_sizes(model, ["1"])  # ReLU has no weight
    with pytest.raises(ValueError, match="segments"):
        EB.weight_error_table(model, [], (4,))
    with pytest.raises(ValueError, match="bits"):
        EB.quantize_segments(model, segs, [8])


def test_choose_bits_and_allocate_bits_against_exhaustive_search():
    bits = (2, 3, 4, 6, 8)
    rng = np.random.default_rng(3)
    c = rng.uniform(0.5, 2.0, 4)
    table = c[:, None] * 4.0 ** -np.array(bits, float)[None, :] * rng.uniform(0.8, 1.2, (4, len(bits)))
    w, n = rng.uniform(0.5, 5, 4), np.array([50.0, 400.0, 100.0, 1000.0])
    for budget in (1e-3, 3e-3, 1e-2, 0.1):
        got, err = EB.allocate_bits(budget, w, n, table, bits)
        assert err <= budget and err == pytest.approx(np.sum(w * table[range(4), [bits.index(b) for b in got]]))
        best = min(
            int(np.dot(cand, n))
            for cand in itertools.product(bits, repeat=4)
            if np.sum(w * table[range(4), [bits.index(b) for b in cand]]) <= budget
        )
        assert np.dot(got, n) <= 1.05 * best
        uni = EB.choose_bits(table, bits, EB.allocate_error_budget(budget, w, n, "uniform", table[:, -1], table[:, 0]))
        assert np.sum(w * table[range(4), [bits.index(b) for b in uni]]) <= budget * (1 + 1e-9)
        assert np.dot(got, n) <= np.dot(uni, n)
    with pytest.raises(ValueError, match="bounds"):
        EB.choose_bits(table, bits, np.full(4, 1e-12))
    with pytest.raises(ValueError, match="error_table"):
        EB.choose_bits(table[:, :2], bits, np.ones(4))
    with pytest.raises(ValueError, match="budget"):
        EB.allocate_bits(1e-12, w, n, table, bits)
    with pytest.raises(ValueError, match="error_table"):
        EB.allocate_bits(0.1, w, n, table[:3], bits)


# ------------------------------------------------------------------------------------------------ shift / scale
def _skewed_block(seed=0):
    rng = np.random.default_rng(seed)
    tl.manual_seed(seed)
    prod, cons = tl.nn.Linear(8, 12), tl.nn.Linear(12, 4)
    prod.weight.data = prod.weight.data * np.exp(rng.uniform(-3, 0, 12)).astype(np.float32)[:, None]
    prod.bias.data = rng.uniform(-10, 10, 12).astype(np.float32)
    return prod, cons, rng.standard_normal((256, 8)).astype(np.float32)


def test_fold_is_exact_in_float_and_matches_the_module_quantized():
    prod, cons, X = _skewed_block()
    act = prod(tl.Tensor(X)).data
    mod = LearnableShiftScale(12, "int4").init_from(act)
    np.testing.assert_allclose(mod.transform(act).max(0) + mod.transform(act).min(0), 0, atol=1e-4)  # centred
    p2, c2 = fold_shift_scale(prod, mod, cons)
    ref = cons(prod(tl.Tensor(X))).data
    np.testing.assert_allclose(c2(p2(tl.Tensor(X))).data, ref, rtol=1e-4, atol=1e-4)
    with tl.no_grad():
        via_module = cons(mod(prod(tl.Tensor(X)))).data
    out, codes = quantized_block(p2, c2, X, mod.q_scale, mod.q_zero_point, "int4")
    expect = Q.quantize(mod.transform(act), mod.q_scale, mod.q_zero_point, "int4")
    assert np.mean(codes == expect) > 0.999
    assert np.mean(np.abs(out - via_module)) < 1e-3
    s, z = Q.calculate_qparams(act.min(), act.max(), "int4")
    plain = cons(tl.Tensor(Q.quantize_dequantize(act, s, z, "int4"))).data
    assert np.mean((out - ref) ** 2) < 0.1 * np.mean((plain - ref) ** 2)


def test_shift_scale_is_trainable_and_identity_at_init():
    prod, cons, X = _skewed_block(1)
    act = prod(tl.Tensor(X)).data
    mod = LearnableShiftScale(12, "int8")
    mod.calibrate(act)
    out = mod(tl.Tensor(act))
    s, z = Q.calculate_qparams(act.min(), act.max(), "int8", symmetric=True)
    np.testing.assert_allclose(out.data, Q.quantize_dequantize(act, s, z, "int8"), rtol=1e-6, atol=1e-6)
    mod.init_from(act)
    before = copy.deepcopy(mod.log_scale.data)
    opt = tl.optim.Adam([mod.shift, mod.log_scale], lr=1e-2)
    loss = ((cons(mod(tl.Tensor(act))) - tl.Tensor(cons(tl.Tensor(act)).data)) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    assert mod.log_scale.grad is not None and np.any(mod.log_scale.grad.data != 0)
    opt.step()
    assert np.any(mod.log_scale.data != before)


def test_shift_scale_bad_input():
    with pytest.raises(ValueError, match="num_features"):
        LearnableShiftScale(0)
    with pytest.raises(ValueError, match="dtype"):
        LearnableShiftScale(4, "int5")
    mod = LearnableShiftScale(4)
    with pytest.raises(ValueError, match="x"):
        mod.init_from(np.zeros((3, 5), np.float32))
    prod, cons, X = _skewed_block()
    with pytest.raises(ValueError, match="module"):
        fold_shift_scale(prod, mod, cons)  # 4 channels vs 12
    with pytest.raises(ValueError, match="producer"):
        fold_shift_scale(tl.nn.ReLU(), mod, cons)
    with pytest.raises(ValueError, match="module"):
        fold_shift_scale(prod, object(), cons)
    with pytest.raises(ValueError, match="x"):
        quantized_block(prod, cons, X[:, :3], 0.1, 0)


# ------------------------------------------------------------------------------------------------ autotuner (Q80)
class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _kernel(clock, cost, result=1):
    def fn(*args):
        clock.t += cost[0]
        return result

    return fn


def test_autotuner_picks_fastest_caches_and_remeasures_on_drift():
    from tinylearn.quant.autotune import KernelAutotuner

    clock = _Clock()
    cost_a, cost_b = [2e-3], [1e-3]
    tuner = KernelAutotuner(
        {"a": _kernel(clock, cost_a), "b": _kernel(clock, cost_b)}, repeat=3, window=4, drift=0.5, timer=clock
    )
    x = np.zeros((4, 4))
    assert tuner.choice(x) is None
    tuner(x)
    rec = tuner.cache[tuner.key(x)]
    assert tuner.choice(x) == "b" and rec.times == pytest.approx({"a": 2e-3, "b": 1e-3}) and rec.measurements == 1
    for _ in range(10):  # steady: no re-measurement
        tuner(x)
    assert rec.measurements == 1 and rec.calls == 11
    cost_b[0] = 5e-3  # "b" got slow (contention): after a window of slow calls the key is measured again
    for _ in range(4):
        tuner(x)
    assert tuner.choice(x) == "a" and tuner.cache[tuner.key(x)].measurements == 2
    y = np.zeros((8, 4))
    tuner(y)
    assert tuner.choice(y) == "a"  # "b" stays slow
    assert tuner.key(y) in tuner.cache and len(tuner.cache) == 2  # one entry per shape


def test_autotuner_rejects_a_wrong_candidate():
    from tinylearn.quant.autotune import KernelAutotuner

    clock = _Clock()
    tuner = KernelAutotuner(
        {"ref": _kernel(clock, [2e-3], 1), "fast_wrong": _kernel(clock, [1e-4], 2)},
        check=lambda a, b: a == b,
        timer=clock,
    )
    assert tuner(np.zeros(3)) == 1 and tuner.choice(np.zeros(3)) == "ref" and "fast_wrong" in tuner.rejected


def test_int8_gemm_autotuner_is_exact():
    from tinylearn.quant.autotune import int8_gemm_autotuner

    rng = np.random.default_rng(4)
    a = rng.integers(-128, 128, (5, 33), dtype=np.int8)
    b = rng.integers(-128, 128, (33, 7), dtype=np.int8)
    tuner = int8_gemm_autotuner(repeat=1)
    np.testing.assert_array_equal(tuner(a, b), a.astype(np.int32) @ b.astype(np.int32))
    assert tuner.choice(a, b) in tuner.candidates and not tuner.rejected


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"candidates": {}}, "candidates"),
        ({"candidates": {"a": 3}}, "candidates"),
        ({"repeat": 0}, "repeat"),
        ({"window": 0}, "window"),
        ({"warmup": -1}, "warmup"),
        ({"drift": 0.0}, "drift"),
        ({"stat": "mean"}, "stat"),
    ],
)
def test_autotuner_bad_args(kwargs, match):
    from tinylearn.quant.autotune import KernelAutotuner

    args = {"candidates": {"a": lambda: 0}} | kwargs
    with pytest.raises(ValueError, match=match):
        KernelAutotuner(**args)


def test_autotuner_min_statistic_ignores_one_interrupted_run():
    from tinylearn.quant.autotune import KernelAutotuner

    clock = _Clock()
    costs = iter([1e-3, 1e-3, 9e-3, 1e-3] + [2e-3] * 4)  # "a": warm-up, then one run hit by a co-runner
    tuner = KernelAutotuner(
        {"a": lambda: setattr(clock, "t", clock.t + next(costs)), "b": _kernel(clock, [2e-3])},
        repeat=3,
        stat="min",
        timer=clock,
    )
    tuner.measure()
    assert tuner.choice() == "a" and tuner.cache[()].times["a"] == pytest.approx(1e-3)
