"""tl.amp additions of issue 36 Part C: per-group loss scales (Q253), low-precision sharded Adam state with error
feedback (Q219), low-rank saved activations (Q102b)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tinylearn as tl
from tinylearn import amp

# -- PerGroupScaler / fp16_grad_roundtrip ------------------------------------------------------------------------


def test_fp16_roundtrip_underflow_and_overflow():
    g = np.array([1e-10, 1.0, 3e4], np.float32)
    out, inf = amp.fp16_grad_roundtrip(g, 1.0)
    assert out[0] == 0.0 and out[1] == 1.0 and not inf
    out, inf = amp.fp16_grad_roundtrip(g, 2.0**20)
    assert inf and out[0] != 0.0  # 1e-10 * 2^20 ~ 1e-4 survives, 3e4 * 2^20 overflows
    out, inf = amp.fp16_grad_roundtrip(g[:1], 2.0**30)
    assert not inf and abs(out[0] / 1e-10 - 1) < 1e-3


def test_per_group_scaler_matches_grad_scaler_per_group():
    flags = [[False, True], [False, False], [True, False], [False, False], [False, False]]
    per = amp.PerGroupScaler(2, init_scale=1024.0, growth_interval=2)
    singles = [amp.GradScaler(init_scale=1024.0, growth_interval=2) for _ in range(2)]
    p = tl.nn.Parameter(tl.ones(1))
    opt = tl.optim.SGD([p], lr=0.1)
    for step in flags:
        per.update(step)
        for s, bad in zip(singles, step):  # the GradScaler state machine on each group's own flags
            s.scale((p * 0).sum())
            p.grad = tl.Tensor(np.array([np.inf if bad else 1.0], np.float32))
            s.step(opt)
            s.update()
        assert per.get_scales() == [s.get_scale() for s in singles]
    assert per.n_skipped == [1, 1] and per.n_groups == 2


def test_per_group_scaler_keeps_small_group():
    rng = np.random.default_rng(0)
    glob, per = amp.PerGroupScaler(1, growth_interval=5), amp.PerGroupScaler(2, growth_interval=5)
    for _ in range(100):
        g = [(1e2 * rng.standard_normal(64)).astype(np.float32), (1e-10 * rng.standard_normal(64)).astype(np.float32)]
        outs = [amp.fp16_grad_roundtrip(x, glob.get_scales()[0]) for x in g]
        glob.update([any(o[1] for o in outs)])
        outs_p, inf_p = per.roundtrip(g)
        per.update(inf_p)
    assert np.mean(outs[1][0] == 0) > 0.9 and np.mean(outs_p[1] == 0) == 0.0


def _steps_to_clear(scaler, mags, steps=200, group=-1, rng_seed=1):
    """Steps until ``group``'s fp16 underflow fraction first drops to 0 (None if never)."""
    rng = np.random.default_rng(rng_seed)
    for t in range(steps):
        outs, infs = scaler.roundtrip([(m * rng.standard_normal(256)).astype(np.float32) for m in mags])
        if scaler.last_underflow[group] == 0.0:
            return t
        scaler.update(infs)
    return None


def test_per_group_scaler_grows_early_on_underflow_weighted_by_sensitivity():
    mags = [1e-2, 1e-10, 1e-10]
    plain = amp.PerGroupScaler(3, init_scale=1.0, growth_interval=10)
    adaptive = amp.PerGroupScaler(3, init_scale=1.0, growth_interval=10, sensitivity=[1, 1, 4], underflow_tol=0.05)
    t_plain, t_adapt = _steps_to_clear(plain, mags), _steps_to_clear(adaptive, mags)
    assert t_plain is not None and t_adapt is not None and t_adapt * 4 < t_plain
    assert adaptive.n_early_growth[2] > 0 and plain.n_early_growth == [0, 0, 0]
    # equal gradients, different sensitivity (relative to the mean: 0.5 and 1.5, tolerances 0.1 and 0.033): at 4%
    # underflow the sensitive group grows early, the insensitive one keeps its scale
    s = amp.PerGroupScaler(2, init_scale=2.0**14, growth_interval=1000, sensitivity=[1, 3], underflow_tol=0.05)
    g = np.full(1000, 1e-12, np.float32)
    g[:40] = 1.0  # 96% of the entries underflow at any scale below ~2^15: both groups above tolerance
    s.roundtrip([g, g])
    assert s.last_underflow[0] == s.last_underflow[1] > 0.9
    g2 = np.concatenate([np.full(960, 1.0, np.float32), np.full(40, 1e-12, np.float32)])  # 4% underflow
    s.roundtrip([g2, g2])
    s.update([False, False])
    assert s.get_scales() == [2.0**14, 2.0**15] and s.n_early_growth == [0, 1]
    with pytest.raises(ValueError, match="sensitivity: expected 2 finite values > 0"):
        amp.PerGroupScaler(2, sensitivity=[1.0, 0.0])
    with pytest.raises(ValueError, match="sensitivity: expected 2"):
        amp.PerGroupScaler(2, sensitivity=[1.0])
    with pytest.raises(ValueError, match="underflow_tol: must be a number > 0"):
        amp.PerGroupScaler(2, underflow_tol=0)


def test_per_group_scaler_bad_input():
    with pytest.raises(ValueError, match="n_groups"):
        amp.PerGroupScaler(0)
    with pytest.raises(ValueError, match="init_scale"):
        amp.PerGroupScaler(1, init_scale=-1.0)
    with pytest.raises(ValueError, match="growth_factor"):
        amp.PerGroupScaler(1, growth_factor=1.0)
    with pytest.raises(ValueError, match="backoff_factor"):
        amp.PerGroupScaler(1, backoff_factor=1.5)
    with pytest.raises(ValueError, match="growth_interval"):
        amp.PerGroupScaler(1, growth_interval=0)
    s = amp.PerGroupScaler(2)
    with pytest.raises(ValueError, match="grads"):
        s.roundtrip([np.ones(2, np.float32)])
    with pytest.raises(ValueError, match="found_inf"):
        s.update([True])
    with pytest.raises(ValueError, match="scale"):
        amp.fp16_grad_roundtrip(np.ones(2, np.float32), 0.0)
    with pytest.raises(ValueError, match="grad"):
        amp.fp16_grad_roundtrip(np.ones(2, np.int32), 1.0)


# -- quantize_state / ShardedLowPrecisionAdam ----------------------------------------------------------------------


def test_quantize_state_formats():
    x = np.array([1.0, 1.0 + 2.0**-10, -0.3, 1e-3], np.float32)
    assert np.array_equal(amp.quantize_state(x, "fp32"), x)
    assert np.array_equal(amp.quantize_state(x, "bf16"), torch.tensor(x).bfloat16().float().numpy())
    assert np.array_equal(amp.quantize_state(x, "fp16"), x.astype(np.float16).astype(np.float32))
    q = amp.quantize_state(x, "int8")
    amax = float(np.abs(x).max())
    assert np.abs(q - x).max() <= amax / 254 * (1 + 1e-5) and q[1] == x[1]  # absmax is exact
    assert np.array_equal(amp.quantize_state(np.zeros(3, np.float32), "int8"), np.zeros(3))


def test_sharded_adam_fp32_matches_torch_adam():
    rng = np.random.default_rng(1)
    p0 = rng.standard_normal(10).astype(np.float32)
    grads = rng.standard_normal((5, 10)).astype(np.float32)
    th = p0.copy()
    opt = amp.ShardedLowPrecisionAdam(10, lr=1e-2, state_format="fp32", error_feedback=False, world_size=3)
    tp = torch.nn.Parameter(torch.tensor(p0))
    topt = torch.optim.Adam([tp], lr=1e-2)
    for g in grads:
        opt.step(th, g)
        tp.grad = torch.tensor(g)
        topt.step()
    np.testing.assert_allclose(th, tp.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert [s.stop - s.start for s in opt.shards] == [3, 3, 4]


def test_sharded_adam_sharding_is_exact_in_bf16():
    rng = np.random.default_rng(2)
    grads = rng.standard_normal((20, 12)).astype(np.float32)
    outs = []
    for ws in (1, 4):
        th = np.zeros(12, np.float32)
        opt = amp.ShardedLowPrecisionAdam(12, state_format="bf16", world_size=ws)
        for g in grads:
            opt.step(th, g)
        outs.append(th)
    assert np.array_equal(outs[0], outs[1])  # elementwise formats: sharding changes nothing


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "int8"])
def test_error_feedback_reduces_drift(fmt):
    rng = np.random.default_rng(3)
    n = 64
    h = np.diag(rng.uniform(0.5, 2.0, n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    noise = (0.5 * rng.standard_normal((150, n))).astype(np.float32)

    def run(f, ef):
        th = np.zeros(n, np.float32)
        opt = amp.ShardedLowPrecisionAdam(n, lr=1e-2, state_format=f, error_feedback=ef, world_size=2)
        for t in range(150):
            opt.step(th, h @ th - b + noise[t])
        return th, opt.state_bytes()

    ref, bytes32 = run("fp32", False)
    (a, bytes_plain), (c, bytes_ef) = run(fmt, False), run(fmt, True)
    assert np.linalg.norm(c - ref) < 0.1 * np.linalg.norm(a - ref)
    assert bytes_plain < bytes32 and bytes_ef == 2 * bytes_plain


def test_sharded_adam_bad_input():
    with pytest.raises(ValueError, match="numel"):
        amp.ShardedLowPrecisionAdam(0)
    with pytest.raises(ValueError, match="lr"):
        amp.ShardedLowPrecisionAdam(4, lr=0.0)
    with pytest.raises(ValueError, match="betas"):
        amp.ShardedLowPrecisionAdam(4, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="state_format"):
        amp.ShardedLowPrecisionAdam(4, state_format="fp8")
    with pytest.raises(ValueError, match="world_size"):
        amp.ShardedLowPrecisionAdam(4, world_size=5)
    opt = amp.ShardedLowPrecisionAdam(4)
    with pytest.raises(ValueError, match="param"):
        opt.step(np.zeros(4, np.float64), np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="grad"):
        opt.step(np.zeros(4, np.float32), np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="fmt"):
        amp.quantize_state(np.zeros(2, np.float32), "int4")
    with pytest.raises(ValueError, match="x"):
        amp.quantize_state(np.zeros(2, np.int8), "bf16")


# -- lowrank_factors / lowrank_linear ------------------------------------------------------------------------------


def test_lowrank_factors_rank_and_tolerance():
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((40, 5)) @ rng.standard_normal((5, 30))).astype(np.float32)
    us, vt = amp.lowrank_factors(x, 1e-4)
    assert us.shape == (40, 5) and vt.shape == (5, 30)
    np.testing.assert_allclose(us @ vt, x, atol=1e-4)
    y = rng.standard_normal((40, 30)).astype(np.float32)
    for tol in (0.1, 0.5):
        us, vt = amp.lowrank_factors(y, tol)
        assert np.linalg.norm(us @ vt - y) <= tol * np.linalg.norm(y) * (1 + 1e-5)
        assert np.linalg.norm(us[:, :-1] @ vt[:-1] - y) > tol * np.linalg.norm(y)  # smallest such rank
    us, vt = amp.lowrank_factors(np.zeros((3, 4), np.float32), 0.1)
    assert us.shape == (3, 0) and vt.shape == (0, 4)


def test_lowrank_linear_matches_linear():
    rng = np.random.default_rng(5)
    xv = (rng.standard_normal((32, 4)) @ rng.standard_normal((4, 16))).astype(np.float32)
    grads = []
    for fn in (lambda x, w, b: amp.lowrank_linear(x, w, b, tol=1e-5), tl.nn.functional.linear):
        x = tl.Tensor(xv, requires_grad=True)
        w = tl.Tensor(rng.standard_normal((8, 16)).astype(np.float32) if not grads else grads[0][3], requires_grad=True)
        b = tl.Tensor(np.arange(8, dtype=np.float32), requires_grad=True)
        y = fn(x, w, b)
        (y * y).sum().backward()
        grads.append((y.data, x.grad.data, w.grad.data, w.data, b.grad.data))
    (y1, gx1, gw1, _, gb1), (y2, gx2, gw2, _, gb2) = grads
    np.testing.assert_allclose(y1, y2, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gx1, gx2, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(gw1, gw2, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(gb1, gb2, rtol=1e-5, atol=1e-4)
    x = tl.Tensor(xv)
    w = tl.Tensor(np.ones((8, 16), np.float32), requires_grad=True)
    out = amp.lowrank_linear(x, w, tol=1e-5)
    out.sum().backward()
    assert out.grad_fn.saved_elems == 4 * (32 + 16) and w.grad.shape == (8, 16)


def test_lowrank_bad_input():
    w = tl.Tensor(np.ones((3, 4), np.float32))
    with pytest.raises(ValueError, match="x"):
        amp.lowrank_linear(tl.ones(4), w)
    with pytest.raises(ValueError, match="weight"):
        amp.lowrank_linear(tl.ones(2, 5), w)
    with pytest.raises(ValueError, match="tol"):
        amp.lowrank_linear(tl.ones(2, 4), w, tol=1.0)
    with pytest.raises(ValueError, match="x"):
        amp.lowrank_factors(np.ones(4, np.float32), 0.1)
    with pytest.raises(ValueError, match="tol"):
        amp.lowrank_factors(np.ones((2, 2), np.float32), -0.1)


# -- recompute_priority / select_by_priority ----------------------------------------------------------------------


def test_recompute_priority_and_selection():
    m, r, c = [64, 48, 64], [0.5, 0.1, 2.5], [0.0, 3.0, 0.0]
    p = amp.recompute_priority(m, r, c, alpha=0.05, beta=1.0, gamma=1.0)
    np.testing.assert_allclose(p, [3.2 - 0.5, 2.4 - 0.1 - 3.0, 3.2 - 2.5])
    sel = amp.select_by_priority(m, p, budget=64)
    assert sel == {"recompute": [0, 2], "kept": 48.0}
    p0 = amp.recompute_priority(m, r, c, alpha=0.05, gamma=0.0)
    assert amp.select_by_priority(m, p0, budget=64)["recompute"] == [0, 1]  # ignores the all-gather
    assert amp.select_by_priority(m, p, budget=1000) == {"recompute": [], "kept": 176.0}


def test_recompute_priority_bad_input():
    with pytest.raises(ValueError, match="recompute"):
        amp.recompute_priority([1, 2], [1], [0, 0])
    with pytest.raises(ValueError, match="mem"):
        amp.recompute_priority([-1], [1], [0])
    with pytest.raises(ValueError, match="gamma"):
        amp.recompute_priority([1], [1], [0], gamma=-1.0)
    with pytest.raises(ValueError, match="priority"):
        amp.select_by_priority([1, 2], [1.0], 1)
    with pytest.raises(ValueError, match="budget"):
        amp.select_by_priority([1, 2], [1.0, 2.0], -1)


def test_step_ratio_times_both_steps_and_checks_its_arguments():
    from tinylearn.amp.bench import step_ratio

    r = step_ratio("mlp", 32, 16, rounds=2)
    assert 0.05 < r < 20  # a ratio of two real step times (bf16 / fp32), not a constant
    for kw in ({"kind": "rnn"}, {"width": 0}, {"batch": True}, {"rounds": 1.5}):
        args = {"kind": "mlp", "width": 32, "batch": 16, "rounds": 2, **kw}
        with pytest.raises(ValueError, match=next(iter(kw))):
            step_ratio(**args)
