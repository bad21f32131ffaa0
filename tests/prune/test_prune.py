"""tinylearn.prune against torch.nn.utils.prune: masks (L1 / Ln-structured / global / iterative composition),
reparameterisation (weight_orig, weight_mask, pre-hook, zero gradients), remove, N:M invariant, AGP schedule,
importance scores, sensitivity scan, lottery rewinding, channel surgery, and the bad-input errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.utils.prune as tprune

import tinylearn as tl
from tinylearn import prune
from tinylearn.nn.models import DigitsCNN, DigitsMLP
from tinylearn.prune import finetune, lottery, scores, sensitivity, surgery
from tinylearn.testing import assert_close


def twin_linear(i=20, o=12, seed=0):
    tl.manual_seed(seed)
    a = tl.nn.Linear(i, o)
    b = torch.nn.Linear(i, o)
    with torch.no_grad():
        b.weight.copy_(torch.from_numpy(a.weight.data))
        b.bias.copy_(torch.from_numpy(a.bias.data))
    return a, b


def twin_conv(ci=3, co=8, k=3, seed=0):
    tl.manual_seed(seed)
    a = tl.nn.Conv2d(ci, co, k, padding=1)
    b = torch.nn.Conv2d(ci, co, k, padding=1)
    with torch.no_grad():
        b.weight.copy_(torch.from_numpy(a.weight.data))
        b.bias.copy_(torch.from_numpy(a.bias.data))
    return a, b


def same_mask(a, b, name="weight"):
    np.testing.assert_array_equal(getattr(a, name + "_mask").data, getattr(b, name + "_mask").numpy())


@pytest.mark.parametrize("amount", [0.0, 0.1, 0.3, 0.5, 0.77, 1.0, 0, 7, 100, 240])
@pytest.mark.parametrize("make", [twin_linear, twin_conv])
def test_l1_unstructured_matches_torch(amount, make):
    a, b = make()
    if isinstance(amount, int) and amount > a.weight.data.size:
        pytest.skip("amount larger than the tensor")
    prune.l1_unstructured(a, "weight", amount)
    tprune.l1_unstructured(b, "weight", amount)
    same_mask(a, b)
    assert_close(a.weight.data, b.weight.detach().numpy(), "float32")


@pytest.mark.parametrize("n", [1, 2, float("inf"), -float("inf"), 3])
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("amount", [0.25, 0.5, 2])
def test_ln_structured_matches_torch(n, dim, amount):
    a, b = twin_conv(co=8)
    prune.ln_structured(a, "weight", amount, n=n, dim=dim)
    tprune.ln_structured(b, "weight", amount, n=n, dim=dim)
    same_mask(a, b)


@pytest.mark.parametrize(
    "steps",
    [
        [("l1", 0.3), ("l1", 0.5)],
        [("l1", 0.2), ("ln", 0.5, 0)],
        [("ln", 0.25, 0), ("l1", 0.4), ("ln", 0.5, 1)],
        [("l1", 5), ("l1", 10)],
    ],
)
def test_iterative_composition_matches_pruning_container(steps):
    a, b = twin_conv(ci=4, co=8)
    for st in steps:
        if st[0] == "l1":
            prune.l1_unstructured(a, "weight", st[1])
            tprune.l1_unstructured(b, "weight", st[1])
        else:
            prune.ln_structured(a, "weight", st[1], n=2, dim=st[2])
            tprune.ln_structured(b, "weight", st[1], n=2, dim=st[2])
        same_mask(a, b)
    hook = next(h for h in a._forward_pre_hooks.values() if isinstance(h, prune.BasePruningMethod))
    assert isinstance(hook, prune.PruningContainer) and len(hook) == len(steps)


@pytest.mark.parametrize("amount", [0.3, 0.8, 50])
def test_global_unstructured_matches_torch(amount):
    (a1, b1), (a2, b2) = twin_linear(10, 8, seed=1), twin_linear(8, 6, seed=2)
    (a3, b3) = twin_conv(seed=3)
    prune.global_unstructured([(a1, "weight"), (a2, "weight"), (a3, "weight")], amount=amount)
    tprune.global_unstructured(
        [(b1, "weight"), (b2, "weight"), (b3, "weight")], pruning_method=tprune.L1Unstructured, amount=amount
    )
    for a, b in ((a1, b1), (a2, b2), (a3, b3)):
        same_mask(a, b)
    # again, composing with the existing masks; torch's call form is accepted too
    prune.global_unstructured([(a1, "weight"), (a2, "weight")], prune.L1Unstructured, amount=0.5)
    tprune.global_unstructured([(b1, "weight"), (b2, "weight")], pruning_method=tprune.L1Unstructured, amount=0.5)
    same_mask(a1, b1)
    same_mask(a2, b2)


def test_global_with_importance_scores_matches_torch():
    (a1, b1), (a2, b2) = twin_linear(10, 8, seed=1), twin_linear(8, 6, seed=2)
    rng = np.random.default_rng(0)
    s1, s2 = rng.random((8, 10)), rng.random((6, 8))
    prune.global_unstructured(
        [(a1, "weight"), (a2, "weight")], 0.6, importance_scores={(a1, "weight"): s1, (a2, "weight"): s2}
    )
    tprune.global_unstructured(
        [(b1, "weight"), (b2, "weight")],
        tprune.L1Unstructured,
        importance_scores={(b1, "weight"): torch.from_numpy(s1), (b2, "weight"): torch.from_numpy(s2)},
        amount=0.6,
    )
    same_mask(a1, b1)
    same_mask(a2, b2)


def test_importance_scores_drive_local_pruning():
    a, b = twin_linear()
    s = np.random.default_rng(5).random(a.weight.shape)
    prune.l1_unstructured(a, "weight", 0.4, importance_scores=s)
    tprune.l1_unstructured(b, "weight", 0.4, importance_scores=torch.from_numpy(s))
    same_mask(a, b)


def test_reparameterisation_forward_and_zero_gradients():
    a, b = twin_linear()
    prune.l1_unstructured(a, "weight", 0.6)
    tprune.l1_unstructured(b, "weight", 0.6)
    assert list(a.state_dict()) == list(b.state_dict()) == ["bias", "weight_orig", "weight_mask"]
    assert [n for n, _ in a.named_parameters()] == ["bias", "weight_orig"]
    x = np.random.default_rng(0).standard_normal((5, 20)).astype(np.float32)
    out = a(tl.Tensor(x))
    tout = b(torch.from_numpy(x))
    assert_close(out.data, tout.detach().numpy(), "float32")
    (out**2).sum().backward()
    (tout**2).sum().backward()
    assert_close(a.weight_orig.grad.data, b.weight_orig.grad.numpy(), "float32")
    assert np.all(a.weight_orig.grad.data[a.weight_mask.data == 0] == 0)


def test_masks_persist_through_training():
    from tinylearn.data import load_digits
    from tinylearn.nn.training import fit

    X, y = load_digits()
    tl.manual_seed(0)
    m = DigitsMLP(32)
    params = finetune.prunable_weights(m)
    prune.global_unstructured(params, amount=0.7)
    masks = [mod.weight_mask.data.copy() for mod, _ in params]
    fit(m, X[:256], y[:256], epochs=2, lr=1e-2, optimizer="sgd")
    for (mod, _), mk in zip(params, masks):
        np.testing.assert_array_equal(mod.weight_mask.data, mk)
        assert np.all(mod.weight.data[mk == 0] == 0)
        assert np.all(mod.weight_orig.grad.data[mk == 0] == 0)
    assert prune.sparsity(m) > 0.6


def test_remove_and_is_pruned():
    a, b = twin_linear()
    prune.l1_unstructured(a, "weight", 0.5)
    prune.l1_unstructured(a, "bias", 3)
    tprune.l1_unstructured(b, "weight", 0.5)
    assert prune.is_pruned(a) and prune.is_pruned(tl.nn.Sequential(a))
    expect = a.weight.data.copy()
    prune.remove(a, "weight")
    tprune.remove(b, "weight")
    assert isinstance(a.weight, tl.nn.Parameter)
    np.testing.assert_array_equal(a.weight.data, expect)
    np.testing.assert_array_equal(a.weight.data, b.weight.detach().numpy())
    assert "weight_orig" not in a._parameters and "weight_mask" not in a._buffers
    assert prune.is_pruned(a)  # the bias is still pruned
    prune.remove(a, "bias")
    assert not prune.is_pruned(a)
    assert prune.sparsity(a.weight) == pytest.approx(0.5)


def test_restore_undoes_pruning():
    a, _ = twin_linear()
    w = a.weight.data.copy()
    prune.l1_unstructured(a, "weight", 0.9)
    prune.restore(a, "weight")
    np.testing.assert_array_equal(a.weight.data, w)
    assert not prune.is_pruned(a) and sorted(a.state_dict()) == ["bias", "weight"]


def test_random_unstructured_count_and_seed():
    a, _ = twin_linear()
    prune.random_unstructured(a, "weight", 0.35, seed=3)
    n = a.weight.data.size
    assert int((a.weight_mask.data == 0).sum()) == round(0.35 * n)
    c, _ = twin_linear()
    prune.random_unstructured(c, "weight", 0.35, seed=3)
    np.testing.assert_array_equal(a.weight_mask.data, c.weight_mask.data)


def test_tie_handling_is_documented_rule():
    lin = tl.nn.Linear(4, 2)
    lin.weight.data[:] = 1.0
    prune.l1_unstructured(lin, "weight", 3)
    np.testing.assert_array_equal(lin.weight_mask.data.reshape(-1), [0, 0, 0, 1, 1, 1, 1, 1])  # lowest index first
    conv = tl.nn.Conv2d(1, 4, 1)
    conv.weight.data[:] = 1.0
    prune.ln_structured(conv, "weight", 2, n=1, dim=0)
    np.testing.assert_array_equal(conv.weight_mask.data.reshape(-1), [1, 1, 0, 0])  # lowest index kept first


def test_amount_rounding_like_torch():
    for size, amount in ((5, 0.5), (7, 0.5), (3, 0.5), (9, 0.25), (10, 0.05)):
        a, b = twin_linear(size, 1)
        prune.l1_unstructured(a, "weight", amount)
        tprune.l1_unstructured(b, "weight", amount)
        same_mask(a, b)


@pytest.mark.parametrize("n,m", [(2, 4), (1, 4), (4, 8), (0, 2), (3, 3), (1, 1)])
@pytest.mark.parametrize("dim", [None, 0, -1])
def test_n_m_invariant(n, m, dim):
    tl.manual_seed(1)
    conv = tl.nn.Conv2d(8, 24, 3)  # weight (24, 8, 3, 3)
    if conv.weight.shape[1 if dim is None else dim] % m:
        with pytest.raises(ValueError, match=f"m={m}"):
            prune.n_m_sparsity(conv, "weight", n=n, m=m, dim=dim)
        return
    w = conv.weight.data.copy()
    prune.n_m_sparsity(conv, "weight", n=n, m=m, dim=dim)
    d = 1 if dim is None else dim
    mk = np.moveaxis(conv.weight_mask.data, d, -1)
    groups = mk.reshape(mk.shape[:-1] + (mk.shape[-1] // m, m))
    assert np.all(groups.sum(-1) == n)
    # the kept entries are the n largest |w| of each group
    aw = np.moveaxis(np.abs(w), d, -1).reshape(groups.shape)
    kept_min = np.where(groups == 1, aw, np.inf).min(-1)
    dropped_max = np.where(groups == 0, aw, -np.inf).max(-1)
    assert np.all(kept_min >= dropped_max)
    assert prune.sparsity(conv.weight) == pytest.approx(1 - n / m)


def test_n_m_composes_with_previous_mask():
    tl.manual_seed(2)
    lin = tl.nn.Linear(16, 6)
    prune.l1_unstructured(lin, "weight", 0.5)
    prune.n_m_sparsity(lin, "weight", 2, 4)
    groups = (lin.weight.data != 0).reshape(6, 4, 4).sum(-1)
    assert np.all(groups <= 2)


def test_n_m_mask_function_2_4_along_rows():
    w = np.array([[1.0, -5.0, 3.0, 0.5, 2.0, 2.0, -2.0, 1.0]])
    np.testing.assert_array_equal(prune.n_m_mask(w, 2, 4, dim=1), [[0, 1, 1, 0, 1, 1, 0, 0]])


def test_agp_schedule_formula():
    s = prune.AGPSchedule(0.0, 0.9, start_step=100, end_step=1100, frequency=100)
    assert s(0) == 0.0 and s(99) == 0.0 and s(100) == 0.0
    assert s(1100) == pytest.approx(0.9) and s(5000) == pytest.approx(0.9)
    for t in range(100, 1100, 100):
        assert s(t) == pytest.approx(0.9 + (0.0 - 0.9) * (1 - (t - 100) / 1000) ** 3)
    assert s(150) == s(100) and s(650) == s(600)  # held between updates
    vals = [s(t) for t in range(0, 1200, 10)]
    assert all(b >= a for a, b in zip(vals, vals[1:]))  # increases from s_i to s_f
    assert s(200) - s(100) > s(1000) - s(900)  # fast first, slow at the end
    assert s.should_update(100) and s.should_update(1100) and not s.should_update(150)
    s2 = prune.AGPSchedule(0.2, 0.8, 0, 10, 1)
    assert s2(5) == pytest.approx(0.8 - 0.6 * 0.5**3)


def test_agp_schedule_bad_input():
    with pytest.raises(ValueError, match="final_sparsity.*0.3"):
        prune.AGPSchedule(0.5, 0.3, 0, 10, 1)
    with pytest.raises(ValueError, match="end_step.*5"):
        prune.AGPSchedule(0.0, 0.5, 10, 5, 1)
    with pytest.raises(ValueError, match="frequency.*0"):
        prune.AGPSchedule(0.0, 0.5, 0, 10, 0)
    with pytest.raises(ValueError, match="initial_sparsity.*1.5"):
        prune.AGPSchedule(1.5, 0.5, 0, 10, 1)


def test_amount_to_reach():
    assert prune.amount_to_reach(0.5, 0.75) == pytest.approx(0.5)
    assert prune.amount_to_reach(0.8, 0.5) == 0.0


def test_bad_input_errors():
    a, _ = twin_linear()
    with pytest.raises(ValueError, match="1.5"):
        prune.l1_unstructured(a, "weight", 1.5)
    with pytest.raises(ValueError, match="-0.1"):
        prune.l1_unstructured(a, "weight", -0.1)
    with pytest.raises(ValueError, match="-3"):
        prune.random_unstructured(a, "weight", -3)
    with pytest.raises(ValueError, match="241.*240"):
        prune.l1_unstructured(a, "weight", 241)
    assert not prune.is_pruned(a) and isinstance(a.weight, tl.nn.Parameter)  # a failed prune leaves no trace
    with pytest.raises(ValueError, match="'wieght'"):
        prune.l1_unstructured(a, "wieght", 0.5)
    with pytest.raises(ValueError, match="'weight'"):
        prune.remove(a, "weight")
    prune.l1_unstructured(a, "weight", 0.2)
    with pytest.raises(ValueError, match="241"):
        prune.l1_unstructured(a, "weight", 241)  # container rolled back
    hook = next(h for h in a._forward_pre_hooks.values() if isinstance(h, prune.BasePruningMethod))
    assert not isinstance(hook, prune.PruningContainer) or len(hook) == 1
    prune.remove(a, "weight")
    with pytest.raises(ValueError, match="already removed"):
        prune.remove(a, "weight")
    with pytest.raises(ValueError, match="n=5.*m=4"):
        prune.n_m_sparsity(a, "weight", n=5, m=4)
    with pytest.raises(ValueError, match="m=3.*20"):
        prune.n_m_sparsity(a, "weight", n=2, m=3)
    with pytest.raises(ValueError, match="dim: 3"):
        prune.ln_structured(a, "weight", 0.5, n=2, dim=3)
    with pytest.raises(TypeError, match="amount"):
        prune.l1_unstructured(a, "weight", "half")
    with pytest.raises(ValueError, match="2 dims"):
        prune.ln_structured(a, "bias", 0.5, n=2, dim=0)


def _model_with_stats(seed=0):
    tl.manual_seed(seed)
    m = DigitsCNN(8, 16)
    rng = np.random.default_rng(seed)
    for mod in m.modules():
        if isinstance(mod, tl.nn.BatchNorm2d):
            mod.running_mean.data[:] = rng.standard_normal(mod.num_features)
            mod.running_var.data[:] = rng.random(mod.num_features) + 0.5
            mod.weight.data[:] = rng.standard_normal(mod.num_features)
            mod.bias.data[:] = rng.standard_normal(mod.num_features)
    return m.eval()


@pytest.mark.parametrize("amount", [0.25, 0.5, 0.75])
def test_surgery_preserves_outputs_cnn(amount):
    m = _model_with_stats()
    x = tl.Tensor(np.random.default_rng(1).random((16, 1, 8, 8)).astype(np.float32))
    surgery.mask_channels(m, amount)
    small = surgery.shrink(m)
    assert_close(small(x).data, m(x).data, "float32")
    convs = [mod for mod in small.modules() if isinstance(mod, tl.nn.Conv2d)]
    assert [c.weight.shape[0] for c in convs] == [8 - round(8 * amount), 16 - round(16 * amount)]
    assert not prune.is_pruned(small) and prune.is_pruned(m)
    assert surgery.count_parameters(small) < surgery.count_parameters(m)


def test_surgery_preserves_outputs_mlp_and_strict_check():
    tl.manual_seed(3)
    m = DigitsMLP([32, 16]).eval()
    x = tl.Tensor(np.random.default_rng(1).random((8, 1, 8, 8)).astype(np.float32))
    surgery.mask_channels(m, 0.5)
    small = surgery.shrink(m)
    assert_close(small(x).data, m(x).data, "float32")
    assert [lin.weight.shape for lin in small.modules() if isinstance(lin, tl.nn.Linear)] == [
        (16, 64),
        (8, 16),
        (10, 8),
    ]
    m2 = _model_with_stats(2)
    prune.ln_structured(m2.features[0], "weight", 0.5, n=2, dim=0)  # filters only: bias/BN still leak
    with pytest.raises(ValueError, match="still feed"):
        surgery.shrink(m2)


def test_scores_match_torch_autograd():
    tl.manual_seed(0)
    m = DigitsMLP(16).eval()
    tm = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10))
    with torch.no_grad():
        for tli, ti in ((1, 1), (3, 3)):
            tm[ti].weight.copy_(torch.from_numpy(m.net[tli].weight.data))
            tm[ti].bias.copy_(torch.from_numpy(m.net[tli].bias.data))
    rng = np.random.default_rng(0)
    X = rng.random((12, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, 12)
    params = finetune.prunable_weights(m)
    loss = torch.nn.functional.cross_entropy(tm(torch.from_numpy(X)), torch.from_numpy(y))
    tg = torch.autograd.grad(loss, [tm[1].weight, tm[3].weight])
    tw = [tm[1].weight.detach().numpy(), tm[3].weight.detach().numpy()]
    sc = scores.compute_scores(m, params, X, y, "taylor")
    for p, g, w in zip(params, tg, tw):
        assert_close(sc[p], np.abs(w * g.numpy()), "float32")
    sn = scores.compute_scores(m, params, X, y, "snip")
    assert sum(v.sum() for v in sn.values()) == pytest.approx(1.0)
    gr = scores.compute_scores(m, params, X, y, "gradient")
    assert_close(gr[params[0]], np.abs(tg[0].numpy()), "float32")
    fi = scores.compute_scores(m, params, X, y, "fisher", n_fisher_samples=12)
    per = [
        torch.autograd.grad(
            torch.nn.functional.cross_entropy(tm(torch.from_numpy(X[i : i + 1])), torch.from_numpy(y[i : i + 1])),
            tm[1].weight,
        )[0]
        for i in range(12)
    ]
    fisher = torch.stack(per).pow(2).mean(0).numpy()
    assert_close(fi[params[0]], 0.5 * fisher * tw[0] ** 2, "float32")
    assert all(v.shape == getattr(mod, n).shape for (mod, n), v in fi.items())
    with pytest.raises(ValueError, match="grasp"):
        scores.compute_scores(m, params, X, y, "grasp")


def test_sensitivity_scan_restores_model():
    tl.manual_seed(0)
    m = DigitsMLP(16).eval()
    x = tl.Tensor(np.random.default_rng(0).random((4, 1, 8, 8)).astype(np.float32))
    before = m(x).data.copy()
    layers = {"fc1": (m.net[1], "weight"), "fc2": (m.net[3], "weight")}
    seen = []
    scan = sensitivity.sensitivity_scan(m, layers, [0.0, 0.5, 1.0], lambda mod: seen.append(1) or prune.sparsity(mod))
    assert len(seen) == 6 and scan["fc1"][0] < scan["fc1"][1] < scan["fc1"][2]
    np.testing.assert_array_equal(m(x).data, before)
    assert not prune.is_pruned(m)
    r = sensitivity.choose_ratios({"a": [0.9, 0.89, 0.5], "b": [0.9, 0.7, 0.6]}, [0.0, 0.5, 0.9], 0.9, 0.02)
    assert r == {"a": 0.5, "b": 0.0}


def test_lottery_rewind_and_schedule_training():
    from tinylearn.data import load_digits

    X, y = load_digits()
    tl.manual_seed(0)
    m = DigitsMLP(32)
    params = finetune.prunable_weights(m)
    init = lottery.snapshot(m)
    hist = lottery.iterative_magnitude_pruning(
        m, params, lambda mod: tl.nn.training.fit(mod, X[:200], y[:200], epochs=1), rounds=3, final_sparsity=0.8
    )
    assert [h["round"] for h in hist] == [1, 2, 3]
    assert hist[-1]["sparsity"] == pytest.approx(0.8, abs=0.01)
    for mod, _ in params:  # survivors rewound to their initial values
        w0 = init[[k for k in init if k.endswith("weight")][params.index((mod, "weight"))]]
        np.testing.assert_array_equal(mod.weight_orig.data, w0)
    tl.manual_seed(0)
    m2 = DigitsMLP(32)
    p2 = finetune.prunable_weights(m2)
    h = finetune.train_with_schedule(m2, p2, X[:256], y[:256], prune.AGPSchedule(0.0, 0.75, 0, 6, 2), epochs=2)
    assert h["sparsity"][-1] == pytest.approx(0.75, abs=0.005)


def test_bench_torch_twin_matches_shrunk_model():
    from tinylearn.prune.bench import torch_chain

    m = _model_with_stats(4)
    surgery.mask_channels(m, 0.5)
    small = surgery.shrink(m)
    x = np.random.default_rng(2).random((4, 1, 8, 8)).astype(np.float32)
    with torch.no_grad():
        expect = torch_chain(small)(torch.from_numpy(x)).numpy()
    assert_close(small(tl.Tensor(x)).data, expect, "float32")
