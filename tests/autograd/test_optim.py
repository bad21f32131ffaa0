"""tinylearn.optim vs torch.optim: identical parameters + gradients -> identical updates (to 1e-6) over steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tinylearn as tl
from tinylearn import optim
from tinylearn.backends import load_C

BACKENDS = ["numpy", "cpp"] if optim.optimizer.has_fused_steps() else ["numpy"]


def _run(tl_cls, th_cls, kwargs, steps=6, dtype=np.float32, backend="numpy"):
    rng = np.random.default_rng(0)
    shapes = [(5, 4), (4,)]
    init = [rng.standard_normal(s).astype(dtype) for s in shapes]
    grads = [[rng.standard_normal(s).astype(dtype) for s in shapes] for _ in range(steps)]
    ps = [tl.Tensor(a.copy(), requires_grad=True) for a in init]
    tps = [torch.tensor(a.copy(), requires_grad=True) for a in init]
    opt, topt = tl_cls(ps, backend=backend, **kwargs), th_cls(tps, **kwargs)
    assert opt.backend == backend
    for gs in grads:
        for p, tp, g in zip(ps, tps, gs):
            p.grad = tl.Tensor(g.copy())
            tp.grad = torch.from_numpy(g.copy())
        opt.step()
        topt.step()
        for p, tp in zip(ps, tps):
            np.testing.assert_allclose(p.data, tp.detach().numpy(), rtol=1e-6, atol=1e-6)
    return opt, topt


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(lr=0.1),
        dict(lr=0.1, momentum=0.9),
        dict(lr=0.05, momentum=0.9, nesterov=True),
        dict(lr=0.1, momentum=0.5, weight_decay=0.01, dampening=0.1),
        dict(lr=0.1, weight_decay=0.1),
        dict(lr=0.1, momentum=0.9, maximize=True),
    ],
)
@pytest.mark.parametrize("backend", BACKENDS)
def test_sgd_matches_torch(kwargs, backend):
    _run(optim.SGD, torch.optim.SGD, kwargs, backend=backend)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(lr=1e-2),
        dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6),
        dict(lr=1e-2, weight_decay=0.1),
        dict(lr=1e-2, amsgrad=True),
    ],
)
@pytest.mark.parametrize("backend", BACKENDS)
def test_adam_matches_torch(kwargs, backend):
    _run(optim.Adam, torch.optim.Adam, kwargs, steps=8, backend=backend)


@pytest.mark.parametrize("kwargs", [dict(lr=1e-2), dict(lr=1e-2, weight_decay=0.1)])
@pytest.mark.parametrize("backend", BACKENDS)
def test_adamw_matches_torch(kwargs, backend):
    _run(optim.AdamW, torch.optim.AdamW, kwargs, steps=8, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float64_params_stay_float64(backend):
    opt, _ = _run(optim.Adam, torch.optim.Adam, dict(lr=1e-2), dtype=np.float64, backend=backend)
    assert all(p.dtype == np.float64 for g in opt.param_groups for p in g["params"])
    _run(optim.SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True), dtype=np.float64, backend=backend)


def test_backends_agree_on_non_contiguous_params_and_reject_unknown():
    w0 = np.asfortranarray(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32))
    outs = []
    for backend in BACKENDS:
        p = tl.Tensor(w0.copy(order="F"), requires_grad=True)
        opt = optim.Adam([p], lr=0.1, backend=backend)
        for _ in range(3):
            p.grad = tl.Tensor(np.ones((4, 3), np.float32))
            opt.step()
        outs.append(p.data.copy())
    assert all(np.allclose(o, outs[0], atol=1e-6) for o in outs)
    with pytest.raises(ValueError, match="backend"):
        optim.SGD([tl.Tensor(np.ones(2, np.float32), requires_grad=True)], lr=0.1, backend="gpu")


def test_schedulers_match_torch():
    for make, tmake in [
        (lambda o: optim.StepLR(o, step_size=3, gamma=0.5), lambda o: torch.optim.lr_scheduler.StepLR(o, 3, 0.5)),
        (
            lambda o: optim.CosineAnnealingLR(o, T_max=5, eta_min=0.01),
            lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=5, eta_min=0.01),
        ),
    ]:
        p = tl.Tensor(np.zeros(2, np.float32), requires_grad=True)
        tp = torch.zeros(2, requires_grad=True)
        o, to = optim.SGD([p], lr=0.1), torch.optim.SGD([tp], lr=0.1)
        s, ts = make(o), tmake(to)
        for _ in range(12):
            assert abs(o.param_groups[0]["lr"] - to.param_groups[0]["lr"]) < 1e-9
            assert s.get_last_lr() == pytest.approx(ts.get_last_lr(), abs=1e-9)
            o.step()
            to.step()
            s.step()
            ts.step()


def test_param_groups_zero_grad_state_dict_and_errors():
    a = tl.Tensor(np.ones(2, np.float32), requires_grad=True)
    b = tl.Tensor(np.ones(3, np.float32), requires_grad=True)
    opt = optim.SGD([{"params": [a]}, {"params": [b], "lr": 0.5}], lr=0.1, momentum=0.9)
    a.grad, b.grad = tl.ones(2), tl.ones(3)
    opt.step()
    assert np.allclose(a.data, 0.9) and np.allclose(b.data, 0.5)
    sd = opt.state_dict()
    opt2 = optim.SGD([{"params": [a]}, {"params": [b], "lr": 0.5}], lr=0.1, momentum=0.9)
    opt2.load_state_dict(sd)
    assert np.allclose(opt2.state[a]["momentum_buffer"], 1.0)
    opt.zero_grad()
    assert a.grad is None and b.grad is None
    opt.step()  # no grads: no-op
    with pytest.raises(ValueError, match="empty"):
        optim.SGD([], lr=0.1)
    with pytest.raises(ValueError, match="lr"):
        optim.SGD([a], lr=-1)
    with pytest.raises(ValueError, match="betas"):
        optim.Adam([a], betas=(1.0, 0.9))
    with pytest.raises(ValueError, match="Nesterov"):
        optim.SGD([a], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="require grad"):
        optim.SGD([tl.Tensor(np.ones(2))], lr=0.1)


def test_training_reduces_loss_end_to_end():
    tl.manual_seed(0)
    from tinylearn import nn
    from tinylearn.nn import functional as F

    rng = np.random.default_rng(0)
    X = rng.standard_normal((64, 5)).astype(np.float32)
    y = (X[:, 0] + X[:, 1] > 0).astype(np.int64)
    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = optim.AdamW(list(model.parameters()), lr=0.05)
    losses = []
    for _ in range(30):
        loss = F.cross_entropy(model(tl.Tensor(X)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.3 * losses[0]


def test_updates_dispatch_through_the_backend_registry():
    from tinylearn import backends

    for op in ("optim.sgd_step", "optim.adam_step"):
        assert set(backends.registered(op)) == {"numpy", "cpp"}
    p = tl.Tensor(np.ones(3, np.float32), requires_grad=True)
    assert optim.SGD([p], lr=0.1, backend=None).backend == BACKENDS[-1]  # None/"auto": the fastest available
    if "cpp" in BACKENDS:
        assert optim.Adam([p], backend="cpu").backend == "cpp"  # "cpu" is the alias of "cpp"
        # the optimizer kernels live in _C.optim (not in _C.autograd, which now holds only the scatter-add)
        assert hasattr(load_C("optim"), "adam_step") and not hasattr(getattr(load_C(), "autograd", None), "adam_step")


@pytest.mark.skipif("cpp" not in BACKENDS, reason="tinylearn._C.optim not built")
@pytest.mark.parametrize("n", [512 * 784, (1 << 22) + 3])  # below / above the fused kernels' OpenMP threshold
@pytest.mark.parametrize(
    "cls, kwargs",
    [(optim.SGD, dict(lr=0.01, momentum=0.9)), (optim.Adam, dict(lr=1e-3, weight_decay=0.01))],
    ids=["sgd", "adam"],
)
def test_fused_step_on_large_params_matches_numpy_passes(n, cls, kwargs):
    # issue 18: the fused update runs on one thread up to 4M elements (OpenMP only above); both sides of the
    # threshold compute the same update as the numpy passes and torch
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal(n).astype(np.float32)
    grads = [rng.standard_normal(n).astype(np.float32) for _ in range(2)]
    ws = {b: tl.Tensor(w0.copy(), requires_grad=True) for b in ("numpy", "cpp")}
    tw = torch.tensor(w0.copy(), requires_grad=True)
    th_cls = {optim.SGD: torch.optim.SGD, optim.Adam: torch.optim.Adam}[cls]
    opts = {b: cls([ws[b]], backend=b, **kwargs) for b in ws}
    topt = th_cls([tw], **kwargs)
    for g in grads:
        for b in ws:
            ws[b].grad = tl.Tensor(g)
            opts[b].step()
        tw.grad = torch.from_numpy(g.copy())
        topt.step()
    np.testing.assert_allclose(ws["cpp"].data, ws["numpy"].data, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(ws["cpp"].data, tw.detach().numpy(), rtol=1e-6, atol=1e-7)
    assert not np.array_equal(ws["cpp"].data, w0)
