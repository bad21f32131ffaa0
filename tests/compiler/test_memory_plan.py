"""passes.memory_plan: lifetimes of kernel outputs, arena offsets without overlaps of live buffers (planner.check_plan),
results bit-identical with planning on and off (and across repeated calls: graph outputs never alias the arena),
in-place writes chosen only where legal."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import tinylearn as tl
import tinylearn.compiler as tc
import tinylearn.nn.functional as F
from tinylearn.compiler.passes import memory_plan
from tinylearn.memory import planner

BACKENDS = ["numpy", "cpp"] if any(shutil.which(c) for c in ("g++", "clang++", "c++")) else ["numpy"]


def _t(*shape: int, seed: int = 0, scale: float = 1.0) -> tl.Tensor:
    return tl.Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * scale)


def program(f, *args, backend="cpp"):
    c = tc.compile(f, backend=backend)
    c(*args)
    return c.graphs()[0].program


def chain(x, w):
    a = (x * 2.0).exp()
    b = a @ w
    c = (b + 1.0).relu()
    d = c @ w
    e = F.softmax(d, -1)
    g = e @ w
    return (g * 3.0).tanh() + 1.0


def inplace_case(x, w):
    a = (x * 0.5).exp()
    c = a + a @ w  # point-wise; a dies here (its only other reader, the matmul, ran before)
    return c @ w


def still_needed(x, w):
    a = (x * 0.5).exp()
    c = a + a @ w
    return (c @ w) * a  # a is read after c's kernel: c must not overwrite it


def run_both(prog, inputs):
    prog.memory = None
    ref = [o.copy() for o in prog.run(inputs)]
    memory_plan.attach(prog)
    return ref, prog.run(inputs), prog.run(inputs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_lifetimes_offsets_and_results_equal_with_planning_on_and_off(backend):
    x, w = _t(64, 64), _t(64, 64, seed=1, scale=0.1)
    prog = program(chain, x, w, backend=backend)
    spans, _ = memory_plan.lifetimes(prog)
    names = {n.name: v for n, v in spans.items()}
    # kernels at steps 0, 2, 4, 6, matmuls at 1, 3, 5: each kernel output is read by the next matmul only
    assert names == {"exp": (0, 1), "relu": (2, 3), "softmax": (4, 5), "add_1": (6, 6)}
    mp = memory_plan.plan_memory(prog)
    planner.check_plan(mp.lifetimes, mp.offsets)
    assert [s.node.name for s in mp.slots] == ["exp", "relu", "softmax"] and mp.excluded == [
        ("add_1", "a graph output")
    ]
    assert mp.arena_bytes == mp.lower_bound == 64 * 64 * 4 < mp.buffer_bytes == 3 * 64 * 64 * 4
    assert all(s.offset % 64 == 0 for s in mp.slots)
    text = mp.report()
    assert "arena 16384 B vs 49152 B allocated separately vs lower bound 16384 B" in text
    ref, got, again = run_both(prog, [x.data, w.data])
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(again[0], ref[0])
    assert got[0] is not again[0] and not np.shares_memory(got[0], again[0])  # outputs never live in the arena


def test_overlapping_lifetimes_get_disjoint_memory():
    def f(x, w):
        a = (x * 2.0).exp()
        b = (x * 3.0).sigmoid() @ w  # a lives across this kernel and matmul
        return (a @ w) + b

    x, w = _t(32, 32), _t(32, 32, seed=1, scale=0.1)
    prog = program(f, x, w)
    mp = memory_plan.plan_memory(prog)
    planner.check_plan(mp.lifetimes, mp.offsets)
    assert len(mp.slots) == 2 and mp.slots[0].offset != mp.slots[1].offset
    ref, got, _ = run_both(prog, [x.data, w.data])
    np.testing.assert_array_equal(got[0], ref[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_inplace_where_the_input_dies(backend):
    x, w = _t(16, 16), _t(16, 16, seed=1, scale=0.1)
    prog = program(inplace_case, x, w, backend=backend)
    mp = memory_plan.plan_memory(prog)
    assert mp.inplace() == [("add", "exp", 2)] and len(mp.lifetimes) == 1
    assert mp.slots[0].offset == mp.slots[1].offset and "in place over %exp" in mp.report()
    assert memory_plan.plan_memory(prog, inplace=False).inplace() == []
    ref, got, again = run_both(prog, [x.data, w.data])
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(again[0], ref[0])


def test_no_inplace_when_the_input_is_read_later_or_is_a_graph_input_or_output():
    x, w = _t(16, 16), _t(16, 16, seed=1, scale=0.1)
    prog = program(still_needed, x, w)
    mp = memory_plan.plan_memory(prog)
    assert mp.inplace() == []
    planner.check_plan(mp.lifetimes, mp.offsets)
    ref, got, _ = run_both(prog, [x.data, w.data])
    np.testing.assert_array_equal(got[0], ref[0])
    # graph input x: never overwritten; graph output (the kernel's result) never planned
    prog2 = program(lambda a: (a * 2.0).exp(), x)
    mp2 = memory_plan.plan_memory(prog2)
    assert mp2.slots == [] and mp2.inplace() == [] and memory_plan.attach(prog2).memory is None
    before = x.data.copy()
    prog2.run([x.data])
    np.testing.assert_array_equal(x.data, before)


def test_views_of_a_buffer_extend_its_lifetime_and_output_views_are_not_planned():
    def f(x, w):
        a = (x * 2.0).exp()
        v = a.T  # an extern view of a: a must live as long as v is read
        return v @ w, (a.reshape(-1) * 1.0).sum()

    x, w = _t(8, 8), _t(8, 8, seed=1)
    prog = program(f, x, w)
    spans, aliases = memory_plan.lifetimes(prog)
    exp = next(n for n in spans if n.name == "exp")
    readers = [i for i, s in enumerate(prog.steps) if exp in memory_plan._step_inputs(s)]
    assert spans[exp][1] >= max(readers)
    assert any(exp in al for n, al in aliases.items() if n is not exp)  # the transpose may be a view
    ref, got, _ = run_both(prog, [x.data, w.data])
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(a, b)

    def g(x):
        return (x * 2.0).exp().T  # the graph output is a view of the kernel's buffer: left out of the arena

    prog = program(g, x)
    mp = memory_plan.plan_memory(prog)
    assert mp.slots == [] and mp.excluded == [("exp", "a graph output may be a view of it")]


def test_compiled_kernel_out_argument_is_checked():
    from codegen_cases import inputs_for, softmax

    from tinylearn.compiler import codegen_cpp

    if "cpp" not in BACKENDS:
        pytest.skip("no C++ compiler")
    k = softmax(3, 5)
    ck = codegen_cpp.build(k)
    (x,) = inputs_for(k)
    out = np.empty((3, 5), np.float32)
    (y,) = ck(x, out=[out])
    assert y is out
    np.testing.assert_array_equal(out, ck(x)[0])
    with pytest.raises(ValueError, match=r"out\[0\] \('y'\): expected float32 \(3, 5\), got float64"):
        ck(x, out=[np.empty((3, 5))])
    with pytest.raises(ValueError, match=r"out\[0\] \('y'\): must be a writeable C-contiguous array"):
        ck(x, out=[np.empty((5, 3), np.float32).T])
    with pytest.raises(ValueError, match="out: kernel 'softmax' has 1 outputs, got 2"):
        ck(x, out=[out, out])


def test_concurrent_calls_get_their_own_arena():
    """One arena is cached per program; a call that finds it in use (another thread) allocates its own, so two
    threads running the same program concurrently never share intermediate buffers."""
    import threading

    x, w = _t(48, 48), _t(48, 48, seed=1, scale=0.1)
    prog = program(chain, x, w)
    ref, _, _ = run_both(prog, [x.data, w.data])
    xs = [np.random.default_rng(s).standard_normal((48, 48)).astype(np.float32) for s in range(4)]
    prog.memory = None
    refs = [prog.run([a, w.data])[0].copy() for a in xs]
    memory_plan.attach(prog)
    errors: list[str] = []

    def worker(j: int) -> None:
        for _ in range(30):
            got = prog.run([xs[j], w.data])[0]
            if not np.array_equal(got, refs[j]):
                errors.append(f"thread {j}")

    threads = [threading.Thread(target=worker, args=(j,)) for j in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(prog.memory._free) == 1
