"""passes.layout: a Permute read by fused kernels is folded into their load strides (no copy, the step dropped when
nothing else reads it), one read by two or more extern ops is materialised once, one extern reader keeps the view;
results equal the unrewritten program exactly, and the decisions print."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import tinylearn as tl
import tinylearn.compiler as tc
import tinylearn.nn.functional as F
from tinylearn.compiler import kernel_ir
from tinylearn.compiler.passes import layout, memory_plan
from tinylearn.compiler.runtime import ExternStep, KernelStep

HAS_CXX = any(shutil.which(c) for c in ("g++", "clang++", "c++"))


def _t(*shape: int, seed: int = 0) -> tl.Tensor:
    return tl.Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _build(backend: str):
    if backend == "cpp":
        from tinylearn.compiler import codegen_cpp

        return codegen_cpp.build
    return lambda k: lambda *a, k=k: kernel_ir.evaluate(k, list(a))


def compiled(f, *args, backend):
    """The compiled program as built without the layout pass (these tests apply it themselves)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TINYLEARN_LAYOUT", "0")
    try:
        c = tc.compile(f, backend=backend)
        c(*args)
    finally:
        mp.undo()
    prog = c.graphs()[0].program
    prog.memory = None
    return prog, [a.data for a in args]


@pytest.mark.parametrize("backend", ["numpy", "cpp"] if HAS_CXX else ["numpy"])
def test_permute_read_by_kernels_is_folded_and_dropped(backend):
    def f(x, y):
        xt = x.permute(0, 2, 1)
        return (xt * 2.0).exp() + y, F.softmax(xt, -1)  # two kernels read the transpose

    x, y = _t(3, 5, 7), _t(3, 7, 5, seed=1)
    prog, arrays = compiled(f, x, y, backend=backend)
    ref = [o.copy() for o in prog.run(arrays)]
    report = layout.apply(prog, _build(backend))
    (d,) = report.decisions
    assert d.action == "fold" and len(d.kernels) == 2 and d.externs == []
    assert not any(isinstance(s, ExternStep) and s.node.op == "Permute" for s in prog.steps)
    assert report.removed == [d.node.name]
    for s in (s for s in prog.steps if isinstance(s, KernelStep)):
        assert s.inputs[0].name == "x0" and s.kernel.inputs[0].shape == (3, 5, 7)
    k = next(s.kernel for s in prog.steps if isinstance(s, KernelStep) and s.kernel.reduce_dims == 0)
    assert k.inputs[0].strides == (35, 1, 7)  # domain (3, 7, 5) read from x (3, 5, 7): the last two dims swap
    got = prog.run(arrays)
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(a, b)
    text = str(report)
    assert "permute(%x0, (0, 2, 1)): fold" in text and "strides (35, 5, 1) -> %x0 (35, 1, 7)" in text


def test_two_extern_readers_materialise_once_one_keeps_the_view():
    def f(x, w):
        xt = x.T
        return xt @ w, xt @ (w * 2.0), (xt + 1.0).relu(), w.T @ x

    x, w = _t(6, 6), _t(6, 6, seed=1)
    prog, arrays = compiled(f, x, w, backend="numpy")
    ref = [o.copy() for o in prog.run(arrays)]
    report = layout.apply(prog, _build("numpy"))
    acts = {d.node.args[0].name: d.action for d in report.decisions}
    assert acts == {"x0": "fold+materialise", "x1": "view"}
    assert sum(isinstance(s, layout.ContiguousStep) for s in prog.steps) == 1
    got = prog.run(arrays)
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(a, b)
    assert "2 extern readers share one contiguous copy" in str(report) and "one extern reader" in str(report)
    # the memory planner treats the materialised copy as a possible view: results stay equal with planning on
    memory_plan.attach(prog)
    for a, b in zip(prog.run(arrays), ref):
        np.testing.assert_array_equal(a, b)


def test_analyse_changes_nothing_and_reports_no_permute():
    prog, arrays = compiled(lambda a: (a * 2.0).exp(), _t(4, 4), backend="numpy")
    steps = list(prog.steps)
    assert str(layout.analyse(prog)) == "layout: no permute in the program" and prog.steps == steps


def test_folded_strides_with_broadcast_dims():
    b = kernel_ir.Buffer("p", (4, 3), "float32", (0, 3, 1))  # a (4, 3) permute broadcast over a (2, 4, 3) domain
    assert layout.folded_strides(b, 3, (3, 4), (1, 0)) == (0, 1, 4)


def test_compile_applies_the_layout_pass():
    def f(x, y):
        xt = x.permute(0, 2, 1)
        return (xt * 2.0).exp() + y, F.softmax(xt, -1)

    x, y = _t(3, 5, 7), _t(3, 7, 5, seed=1)
    c = tc.compile(f, backend="numpy")
    c(x, y)
    got = c(x, y)
    prog = c.graphs()[0].program
    assert not any(isinstance(s, ExternStep) and s.node.op == "Permute" for s in prog.steps)  # folded in build()
    want = f(x, y)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-6)
