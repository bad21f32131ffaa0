"""The joint forward + backward program (joint.py, derivatives.py): compiled gradients equal eager and torch, the
backward program is fused, training steps match eager, the recompute-vs-save rule, and the replay fallback.

Tolerances: fp32 rtol 1e-5 / atol 1e-5 (fused kernels may reorder an expression), fp64 rtol 1e-10 / atol 1e-10."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import tinylearn as tl
import tinylearn.compiler as tc
import tinylearn.nn as nn
import tinylearn.nn.functional as F
from tinylearn.autograd.gradcheck import gradcheck
from tinylearn.autograd.ops_shape import Where
from tinylearn.compiler.api import _backend_fn
from tinylearn.compiler.autograd import explain_joint
from tinylearn.compiler.joint import JointProgram, build_joint

F32 = {"rtol": 1e-5, "atol": 1e-5}
F64 = {"rtol": 1e-10, "atol": 1e-10}
HAS_CXX = any(shutil.which(c) for c in ("g++", "clang++", "c++"))
BACKEND = "cpp" if HAS_CXX else "numpy"  # the training-step tests; the op table runs on numpy (no C++ builds)


def _t(*shape: int, seed: int = 0, dtype=np.float64, rg: bool = True, pos: bool = False) -> tl.Tensor:
    a = np.random.default_rng(seed).standard_normal(shape)
    return tl.Tensor((np.abs(a) + 0.5 if pos else a).astype(dtype), requires_grad=rg)


def _grads(fn, xs, params=()):
    for t in (*xs, *params):
        t.grad = None
    out = fn(*xs)
    outs = out if isinstance(out, tuple | list) else (out,)
    sum(((o * o).sum() for o in outs), tl.Tensor(np.zeros((), outs[0].dtype))).backward()
    return [None if t.grad is None else t.grad.data.copy() for t in (*xs, *params)]


def _compiled_vs_eager(fn, xs, params=(), backend=BACKEND, tol=F64):
    c = tc.compile(fn, backend=backend)
    c(*xs)  # traces (an eager run)
    got = _grads(c, xs, params)
    ref = _grads(fn, xs, params)
    assert c.stats["hits"] == 1
    for g, r in zip(got, ref):
        assert (g is None) == (r is None)
        if g is not None:
            np.testing.assert_allclose(g, r, **tol)
    return c, got


def _joint(c) -> JointProgram:
    (jp,) = c.graphs()[0].joint.values()
    assert isinstance(jp, JointProgram), jp
    return jp


POINTWISE = {
    "add_sub_mul_div": lambda a, b: (a + b) * (a - b) / (b * b + 1.0),
    "exp_log_sqrt": lambda a, b: (a.abs() + 1.0).log() + (b * 0.1).exp() + (a * a + 1.0).sqrt(),
    "tanh_sigmoid_relu_neg": lambda a, b: a.tanh() * b.sigmoid() - (-a).relu(),
    "gelu_exact_and_tanh": lambda a, b: F.gelu(a) + F.gelu(b, approximate="tanh"),
    "max_min_pow_clip": lambda a, b: tl.maximum(a, b) + tl.minimum(a, b * 2.0) + a**3 + b.clip(-0.5, 0.5),
    "where_abs": lambda a, b: Where.apply(a > b, a * 2.0, b.abs()),
    "softmax_logsoftmax": lambda a, b: F.softmax(a * b, -1) + F.log_softmax(a, -1),
    "sum_mean": lambda a, b: a.sum(-1, keepdim=True) * b + a.mean(0) + b.mean(),
    "layer_norm": lambda a, b: F.layer_norm(a + b, (7,), b[0], b[1] * 0.5),
    "permute_reshape_expand": lambda a, b: a.permute(1, 0).reshape(4, 7) * b.sum(0, keepdim=True).expand(4, 7),
}


@pytest.mark.parametrize("name", sorted(POINTWISE))
def test_table_ops_compiled_grads_equal_eager_fp64(name):
    fn = POINTWISE[name]
    a, b = _t(4, 7), _t(4, 7, seed=1)
    c, _ = _compiled_vs_eager(fn, [a, b], backend="numpy")
    jp = _joint(c)
    assert not jp.ctx_nodes or name == "layer_norm"  # every op has a table rule (indexing b[0] has none)


def test_gradients_equal_torch_and_gradcheck_through_the_compiled_fn():
    def f(x, w):
        h = x * w + w  # broadcast w [6] over x [3, 6], w read twice
        return F.softmax(F.gelu(h, approximate="tanh") * h.sigmoid(), -1) - h.tanh()

    x, w = _t(3, 6), _t(6, seed=1)
    c, got = _compiled_vs_eager(f, [x, w], backend="numpy")
    xt, wt = torch.tensor(x.data, requires_grad=True), torch.tensor(w.data, requires_grad=True)
    h = xt * wt + wt
    o = TF.softmax(TF.gelu(h, approximate="tanh") * h.sigmoid(), -1) - h.tanh()
    (o * o).sum().backward()
    np.testing.assert_allclose(got[0], xt.grad.numpy(), **F64)
    np.testing.assert_allclose(got[1], wt.grad.numpy(), **F64)
    assert gradcheck(c, [x, w])


def test_broadcast_param_used_twice_and_linear_in_the_middle_fp32():
    tl.manual_seed(0)
    lin = nn.Linear(6, 6)

    def f(x, b):
        h = (x + b).sigmoid() * b  # b [6] broadcast, used twice
        y = lin(h)  # non-fusible: its own backward, ctx kept by the forward program
        return F.gelu(y) + y * lin.weight[0]  # a parameter read twice (by Linear and by the epilogue)

    x, b = _t(5, 6, dtype=np.float32), _t(6, seed=1, dtype=np.float32)
    c, _ = _compiled_vs_eager(f, [x, b], list(lin.parameters()), backend="numpy", tol=F32)
    jp = _joint(c)
    assert [n.op for n in jp.ctx_nodes] == ["Linear"] or "Linear" in [n.op for n in jp.ctx_nodes]
    assert jp.backward.n_kernels() >= 2  # the epilogue's VJP and the sigmoid chain's VJP, on either side of Linear


class MLPBlock(nn.Module):
    """Linear -> GELU -> Linear, residual, LayerNorm (a post-norm transformer MLP block)."""

    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.fc1, self.fc2, self.ln = nn.Linear(d, hidden), nn.Linear(hidden, d), nn.LayerNorm(d)

    def forward(self, x: tl.Tensor) -> tl.Tensor:
        return self.ln(x + self.fc2(F.gelu(self.fc1(x))))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gelu_residual_layernorm_block_grads_equal_eager(dtype):
    tl.manual_seed(0)
    m = MLPBlock(16, 32)
    for p in m.parameters():
        p.data = p.data.astype(dtype)
    x = _t(4, 16, dtype=dtype)
    tol = F32 if dtype == np.float32 else F64
    c, got = _compiled_vs_eager(m, [x], list(m.parameters()), BACKEND if dtype == np.float32 else "numpy", tol)
    jp = _joint(c)
    assert jp.backward.n_kernels() >= 2  # LayerNorm's VJP (a row-reduction kernel) and GELU's VJP
    assert any(k.reduce_dims == 1 for k, _, _ in jp.backward.plan.kernels)
    if dtype == np.float64:  # torch
        xt = torch.tensor(x.data, requires_grad=True)
        ps = {n: torch.tensor(p.data, requires_grad=True) for n, p in m.named_parameters()}
        h = TF.linear(TF.gelu(TF.linear(xt, ps["fc1.weight"], ps["fc1.bias"])), ps["fc2.weight"], ps["fc2.bias"])
        o = TF.layer_norm(xt + h, (16,), ps["ln.weight"], ps["ln.bias"])
        (o * o).sum().backward()
        np.testing.assert_allclose(got[0], xt.grad.numpy(), **F64)
        for (n, _), g in zip(m.named_parameters(), got[1:]):
            np.testing.assert_allclose(g, ps[n].grad.numpy(), **F64, err_msg=n)


def test_five_sgd_steps_of_an_mlp_match_eager():
    tl.manual_seed(0)
    eager, comp = MLPBlock(8, 32), MLPBlock(8, 32)
    comp.load_state_dict(eager.state_dict())
    c = tc.compile(comp, backend=BACKEND)
    opt_e = tl.optim.SGD(eager.parameters(), lr=0.1)
    opt_c = tl.optim.SGD(comp.parameters(), lr=0.1)
    rng = np.random.default_rng(0)
    for _ in range(5):
        x = tl.Tensor(rng.standard_normal((6, 8)).astype(np.float32))
        for model, opt in ((eager, opt_e), (c, opt_c)):
            opt.zero_grad()
            (model(x) ** 2).mean().backward()
            opt.step()
    assert (c.stats["misses"], c.stats["hits"]) == (1, 4)
    assert _joint(c).backward.n_kernels() >= 2
    for (n, pe), (_, pc) in zip(eager.named_parameters(), comp.named_parameters()):
        np.testing.assert_allclose(pc.data, pe.data, **F32, err_msg=n)


def test_the_backward_of_a_pointwise_chain_is_one_fused_kernel_and_recomputes_its_cone():
    def f(x, b):
        h = x + b
        return F.gelu(h) + h * h.sigmoid() + x

    x, b = _t(6, 33, dtype=np.float32), _t(33, seed=1, dtype=np.float32)
    c, _ = _compiled_vs_eager(f, [x, b], tol=F32)
    jp = _joint(c)
    assert jp.forward.n_kernels() == 1 and jp.backward.n_kernels() == 1
    (k, ins, outs) = jp.backward.plan.kernels[0]
    assert {n.name for n in ins} == {"grad_add_2", "saved_x0", "saved_x1"}  # inputs only: h and sigmoid recomputed
    assert sorted(jp.recomputed) == ["add", "sigmoid"] and [n.name for n in jp.saved] == ["x0", "x1"]
    assert "Erf" in k.meta["ops"] and "d_sum" in [s.node.name for s in jp.backward.steps if hasattr(s, "node")]
    # without recomputation the forward stores h and sigmoid(h) for the backward
    jp2, _ = build_joint(c.graphs()[0].train_graph, (True, True), 2, _backend_fn, "numpy", recompute=False)
    assert {n.name for n in jp2.saved} == {"add", "sigmoid"} and jp2.recomputed == []
    got = jp2.run_backward([np.ones((6, 33), np.float32)], *jp2.run_forward([x.data, b.data])[1:])
    x.grad = b.grad = None
    f(x, b).sum().backward()
    np.testing.assert_allclose(got[0], x.grad.data, **F32)
    np.testing.assert_allclose(got[1], b.grad.data, **F32)


def test_explain_prints_both_graphs_saved_values_and_kernels():
    c, _ = _compiled_vs_eager(lambda a, b: (a * b).exp() + b, [_t(3, 4), _t(3, 4, seed=1)], backend="numpy")
    text = explain_joint(c)
    assert "-- forward graph --" in text and "-- backward graph --" in text
    assert "backward fusion (default): 1 kernel(s)" in text and "saved for backward" in text
    assert "rule: a saved point-wise value is recomputed" in text


def test_multi_output_op_falls_back_to_replay_with_the_reason():
    def f(x):
        v, _ = x.max(1)
        return v * 2.0 + x.sum(1)

    x = _t(4, 5)
    c, _ = _compiled_vs_eager(f, [x], backend="numpy")
    (reason,) = c.graphs()[0].joint.values()
    assert isinstance(reason, str) and "op MaxDim (%maxdim) has 2 outputs" in reason
    assert "joint graph refused, backward replays eager's ops" in explain_joint(c)


def test_inputs_not_requiring_grad_and_frozen_params_get_none():
    tl.manual_seed(0)
    lin = nn.Linear(4, 4)
    lin.bias.requires_grad = False
    x, y = _t(3, 4), _t(3, 4, seed=1, rg=False)
    c, got = _compiled_vs_eager(lambda x, y: lin(x * y).tanh(), [x, y], list(lin.parameters()), backend="numpy")
    assert got[1] is None and got[3] is None and got[0] is not None and got[2] is not None
