"""Tracing: one node per Function.apply, placeholders / params / constants, and the graph breaks."""

from __future__ import annotations

import numpy as np
import pytest

import tinylearn as tl
import tinylearn.nn as nn
import tinylearn.nn.functional as F
from tinylearn.autograd import function as _function
from tinylearn.compiler import GraphBreak, trace
from tinylearn.compiler.runtime import run_graph
from tinylearn.compiler.trace import check_reproducible, run_traced


def _x(*shape: int, seed: int = 0) -> tl.Tensor:
    return tl.Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def test_ops_become_nodes_with_shape_dtype_and_kwargs():
    def f(x, w):
        return F.softmax(F.gelu(x @ w, approximate="tanh"), -1).mean(dim=0)

    g = trace(f, _x(3, 4), _x(4, 5))
    ops = [n.op for n in g.nodes if n.kind == "call"]
    assert ops == ["MatMul", "GELU", "Softmax", "Mean"]
    gelu = next(n for n in g.nodes if n.op == "GELU")
    assert gelu.kwargs == {"approximate": "tanh"} and gelu.shape == (3, 5) and gelu.dtype == np.float32
    assert g.outputs[0].shape == (5,)
    assert _function._trace_hook is None  # uninstalled


def test_module_parameters_are_param_nodes_read_at_call_time():
    tl.manual_seed(0)
    lin = nn.Linear(4, 3)
    x = _x(2, 4)
    g = trace(lin, x)
    params = g.params()
    assert [p.target for p in params] == ["weight", "bias"]
    assert [p.name for p in params] == ["p_weight", "p_bias"]
    ref = lin(x).data
    np.testing.assert_array_equal(run_graph(g, [x.data])[0], ref)
    with tl.no_grad():
        lin.weight -= 1.0  # an optimizer step: the graph must see it
    np.testing.assert_array_equal(run_graph(g, [x.data])[0], lin(x).data)
    assert not np.array_equal(lin(x).data, ref)


def test_other_tensors_are_constants_and_multi_output_ops_get_getitems():
    c = tl.Tensor(np.arange(4, dtype=np.float32))

    def f(x):
        v, i = x.max(1)
        return v + c.sum(), i

    g = trace(f, _x(4, 4))
    kinds = [n.kind for n in g.nodes]
    assert kinds.count("constant") == 1 and kinds.count("getitem") == 2
    assert g.out_struct == "tuple"
    out = run_graph(g, [_x(4, 4).data])
    np.testing.assert_array_equal(out[0], f(_x(4, 4))[0].data)


def test_data_dependent_branch_is_a_graph_break_naming_the_method():
    def f(x):
        return x * 2 if x.sum() > 0 else x * 3

    with pytest.raises(GraphBreak, match=r"Tensor\.__bool__\(\)") as e:
        trace(f, _x(3))
    assert e.value.op == "__bool__"
    assert _function._trace_hook is None
    for what, fn in (("item", lambda x: x * x.sum().item()), ("numpy", lambda x: tl.Tensor(x.exp().numpy()))):
        with pytest.raises(GraphBreak, match=what):
            trace(fn, _x(3))


def test_inplace_mutation_and_unreplayable_ops_break():
    def inplace(x):
        y = x * 2
        y += 1
        return y

    with pytest.raises(GraphBreak, match="in-place mutation of %mul"):
        trace(inplace, _x(3))

    def mutate_input(x):
        x += 1.0
        return x * 2

    with pytest.raises(GraphBreak, match=r"in-place mutation of %x0 \(placeholder\)"):
        trace(mutate_input, _x(3))
    with pytest.raises(GraphBreak, match="DropoutFn"):
        trace(lambda x: F.dropout(x, 0.5, training=True), _x(3))
    with pytest.raises(GraphBreak, match="numpy array"):
        trace(lambda x: x, np.zeros(3))
    with pytest.raises(GraphBreak, match="unsupported output"):
        trace(lambda x: {"y": x}, _x(3))


def test_values_read_through_data_are_caught_by_the_second_trace():
    def leaky(x):  # F.leaky_relu builds its mask from x.data: a constant in a single trace
        return F.leaky_relu(x, 0.1)

    x = _x(16)
    g, _ = run_traced(leaky, (x,))
    with pytest.raises(GraphBreak, match="constant read by Where"):
        check_reproducible(leaky, (x,), g)
    ok = (lambda x: x.relu() * 2,)
    g2, _ = run_traced(ok[0], (x,))
    check_reproducible(ok[0], (x,), g2)  # no exception: a pure graph


def test_capture_runs_the_function_once_and_continues_eagerly_after_a_break():
    from tinylearn.autograd.methods import TensorMethods
    from tinylearn.compiler.trace import capture

    seen = []

    def f(x):
        seen.append(1)
        h = x.exp()
        if h.sum() > 3.0:  # the break: recording stops here
            h = h * 2.0
        return h + 1.0, h < 5.0  # the comparison after the break is an eager one

    x = _x(4)
    lt = TensorMethods.__lt__
    cap = capture(f, (x,))
    assert seen == [1] and cap.graph is None and cap.broken.op == "__bool__"
    assert "Tensor.__bool__() on %compare" in cap.broken.reason
    assert TensorMethods.__lt__ is lt and _function._trace_hook is None  # the eager comparison is back
    ref = f(x)
    np.testing.assert_array_equal(cap.out[0].data, ref[0].data)
    np.testing.assert_array_equal(cap.out[1].data, ref[1].data)
    # breaks found before fn starts or after it returns still run it exactly once
    for fn, what in ((lambda a: {"y": a * 2}, "unsupported output"), (lambda a: F.dropout(a, 0.5), "DropoutFn")):
        seen.clear()
        cap = capture(lambda a, fn=fn: seen.append(1) or fn(a), (x,))
        assert seen == [1] and what in cap.broken.reason
    cap = capture(lambda a: np.exp(a), (np.zeros(3),))
    assert "numpy array" in cap.broken.reason and np.array_equal(cap.out, np.ones(3))
    cap = capture(lambda a: a.exp() * 2.0, (x,))
    assert cap.broken is None and [n.op for n in cap.graph.calls()] == ["Exp", "Mul"]
