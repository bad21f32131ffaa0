"""Each pass changes what it should and nothing else; the rewritten graph computes eager's values (fp32: exact
here, the passes only remove or re-wire nodes)."""

from __future__ import annotations

import numpy as np
import pytest

import tinylearn as tl
import tinylearn.nn as nn
import tinylearn.nn.functional as F
from tinylearn.autograd import gradcheck
from tinylearn.compiler import trace
from tinylearn.compiler.passes import cse, dce, fold, patterns, run_pipeline, shape_infer, simplify
from tinylearn.compiler.passes.patterns import ConvAct, LinearAct
from tinylearn.compiler.runtime import run_graph


def _x(*shape: int, seed: int = 0) -> tl.Tensor:
    return tl.Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _ops(g) -> list[str]:
    return [n.op for n in g.nodes if n.kind == "call"]


def test_shape_infer_checks_every_known_op_and_flags_a_wrong_record():
    def f(x, w):
        y = (x @ w).reshape(2, -1).permute(1, 0).expand(2, 6, 2)
        return y.sum(dim=(1, 2), keepdim=True), F.layer_norm(x, (4,)), x.mean(0)

    g = trace(f, _x(3, 4), _x(4, 4))
    rep = shape_infer.run(g)
    assert rep.stats == {"checked": 7, "unchecked": 0, "mismatch": 0} and rep.changes == []
    g.nodes[-1].shape = (9,)  # a corrupted record
    rep = shape_infer.run(g)
    assert rep.stats["mismatch"] == 1 and "rule says [4]" in rep.changes[0]


def test_dce_removes_only_dead_nodes():
    def f(x):
        x.exp()  # dead
        return x.tanh()

    g = trace(f, _x(3))
    rep = dce.run(g)
    assert rep.changes == ["removed %exp (Exp)"]
    assert _ops(g) == ["Tanh"] and g.placeholders()


def test_cse_merges_equal_calls_and_keeps_different_kwargs():
    def f(x):
        return x.exp() + x.exp() + x.sum(0) + x.sum(1).sum() + x.sum(0)

    x = _x(3, 3)
    g = trace(f, x)
    rep = cse.run(g)
    assert len(rep.changes) == 2  # the second exp and the second sum(0); sum(1) stays
    assert _ops(g).count("Exp") == 1 and _ops(g).count("Sum") == 3
    np.testing.assert_array_equal(run_graph(g, [x.data])[0], f(x).data)


def test_fold_evaluates_constant_subgraphs_once_and_never_params():
    c = tl.Tensor(np.arange(3, dtype=np.float32))
    p = nn.Parameter(np.ones(3, np.float32))

    def f(x):
        return x + (c * 2.0).exp() + p * 2.0

    x = _x(3)
    g = trace(f, x)
    rep = fold.run(g)
    dce.run(g)
    assert len(rep.changes) == 2 and "Mul of constants" in rep.changes[0]
    assert _ops(g) == ["Add", "Mul", "Add"]  # the param's Mul stays
    np.testing.assert_allclose(run_graph(g, [x.data])[0], f(x).data, rtol=0, atol=0)


def test_simplify_identities_and_nothing_else():
    def f(x):
        a = (x * 1) + 0
        b = a.permute(1, 0).permute(1, 0)  # identity
        c = b.reshape(6).reshape(2, 3)  # reshape of reshape
        d = x * 0  # not folded: NaN * 0 is NaN
        e = x.reshape(2, 3).expand(2, 3)  # no-op expand
        return c + d + e.reshape(2, 3).sum() + x.transpose(0, 1).permute(1, 0) / 1

    x = _x(2, 3)
    g = trace(f, x)
    before = run_graph(g, [x.data])[0]
    rep = simplify.run(g)
    dce.run(g)
    text = str(rep)
    for needle in (
        "%mul (Mul) is the identity",
        "%add (Add) is the identity",
        "permute of permute",
        "reshape of reshape",
    ):
        assert needle in text
    assert "%mul_1" not in text  # x * 0 untouched
    assert _ops(g).count("Mul") == 1 and _ops(g).count("Permute") == 0
    np.testing.assert_array_equal(run_graph(g, [x.data])[0], before)


def test_simplify_keeps_a_broadcasting_identity():
    def f(x):
        return x + tl.Tensor(np.zeros((2, 3), np.float32))  # x [3] + 0 [2, 3] broadcasts: not an identity

    g = trace(f, _x(3))
    assert simplify.run(g).changes == []


@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_linear_act_pattern_fuses_linear_bias_act_into_one_call(act):
    tl.manual_seed(0)
    lin = nn.Linear(4, 5)
    w2 = _x(4, 5, seed=3)
    b2 = tl.Tensor(np.ones(5, np.float32))

    def f(x):
        y = lin(x)
        z = x @ w2 + b2
        return (y.relu() if act == "relu" else F.gelu(y)) + (z.relu() if act == "relu" else F.gelu(z))

    x = _x(3, 4)
    g = trace(f, x)
    rep = patterns.run(g)
    dce.run(g)
    assert len(rep.changes) == 2
    assert _ops(g) == ["linear_act", "linear_act", "Add"]
    assert all(n.target is LinearAct for n in g.nodes if n.op == "linear_act")
    np.testing.assert_allclose(run_graph(g, [x.data])[0], f(x).data, rtol=1e-6, atol=1e-6)


def test_linear_act_does_not_fire_when_the_linear_has_another_reader():
    lin = nn.Linear(4, 4)
    g = trace(lambda x: lin(x).relu() + lin(x) * 0 + lin.forward(x), _x(2, 4))
    cse.run(g)
    assert patterns.run(g).changes == []


def test_pipeline_reports_and_unknown_pass():
    g = trace(lambda x: (x * 1).exp(), _x(3))
    reports = run_pipeline(g)
    assert [r.name for r in reports] == ["shape_infer", "simplify", "fold", "cse", "dce"]
    assert "(dce) removed %mul (Mul)" in str(reports[1])
    with pytest.raises(ValueError, match="names: unknown pass 'nope'"):
        run_pipeline(g, ("nope",))


def test_conv_relu_pattern_and_the_fused_functions_gradients():
    rng = np.random.default_rng(0)
    x = tl.Tensor(rng.standard_normal((2, 3, 6, 6)), requires_grad=True)
    w = tl.Tensor(rng.standard_normal((4, 3, 3, 3)), requires_grad=True)
    b = tl.Tensor(rng.standard_normal(4), requires_grad=True)

    def f(x):
        return F.conv2d(x, w, b, padding=1).relu() * 2.0

    g = trace(f, x)
    rep = patterns.run(g)
    dce.run(g)
    assert _ops(g) == ["conv_act", "Mul"] and "conv_act" in str(rep)
    np.testing.assert_allclose(run_graph(g, [x.data])[0], f(x).data, rtol=1e-12, atol=1e-12)
    conv = next(n for n in trace(f, x).nodes if n.op == "ConvNdFunction")
    kw = {"conv": conv.target, "conv_kw": dict(conv.kwargs)}
    assert gradcheck(lambda x, w, b: ConvAct.apply(x, w, b, **kw), [x, w, b])
    xs = tl.Tensor(rng.standard_normal((3, 4)), requires_grad=True)
    ws = tl.Tensor(rng.standard_normal((5, 4)), requires_grad=True)
    bs = tl.Tensor(rng.standard_normal(5), requires_grad=True)
    for act in ("ReLU", "GELU"):
        assert gradcheck(lambda x, w, b, act=act: LinearAct.apply(x, w, b, act=act), [xs, ws, bs])
