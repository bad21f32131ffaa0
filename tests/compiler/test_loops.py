"""loops: the plan (coalesced dims, levels), the lowered nest's shape, the schedule transforms (each checked by
running the scheduled C++ against kernel_ir.evaluate, fp32 rtol 1e-5 / atol 1e-5) and their refusals."""

from __future__ import annotations

import numpy as np
import pytest
from codegen_cases import Body, contiguous, gelu_residual, group_norm, inputs_for, layer_norm, softmax, transposed_add

from tinylearn.compiler import codegen_cpp
from tinylearn.compiler.kernel_ir import Buffer, FusedKernel, evaluate
from tinylearn.compiler.loops import (
    PARALLEL_MIN_WORK,
    ROW_BUFFER_MAX_BYTES,
    Keep,
    Loop,
    Reduce,
    RowBuffers,
    default_schedule,
    keep_rule,
    lower,
    plan,
)


def run_matches(kernel, schedule) -> codegen_cpp.CompiledKernel:
    ck = codegen_cpp.build(kernel, schedule)
    xs = inputs_for(kernel)
    for g, r in zip(ck(*xs), evaluate(kernel, xs)):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)
    return ck


def test_contiguous_dims_coalesce_to_a_flat_loop_or_rows_by_cols():
    k = softmax(6, 10)
    shape = (2, 3, 1, 10)
    b = Body()
    b.store(b.op("exp", b.load(0)), 0)
    buf = [Buffer("x", shape, "float32", contiguous(shape))]
    flat = FusedKernel("flat", shape, 0, buf, [Buffer("y", shape, "float32", contiguous(shape))], b.instrs)
    assert [(d.var, d.extent) for d in plan(flat).dims] == [("i0", 60)]
    assert [(d.var, d.extent, d.reduce) for d in plan(k).dims] == [("i0", 6, False), ("j0", 10, True)]
    # the bias (stride 0 over rows) keeps rows and cols apart; the transposed input keeps two dims with its strides
    assert [d.extent for d in plan(gelu_residual(4, 5)).dims] == [4, 5]
    p = plan(transposed_add(4, 5))
    assert p.in_strides == [(1, 4), (5, 1)] and p.out_strides == [(5, 1)]


def test_group_norm_plan_levels_and_row_outputs():
    p = plan(group_norm(2, 4, 3, 10))
    assert [d.extent for d in p.row_dims] == [2, 4] and [d.extent for d in p.red_dims] == [3, 10]
    assert p.out_strides[1] == (4, 1, 0, 0)  # mean (N, G, 1, 1): one value per row
    assert {p.level[i.out] for i in p.kernel.body if i.op == "const"} == {"const"}
    assert [s.attr for s in p.row_stores] == [1] and [s.attr for s in p.elem_stores] == [0]


def test_softmax_nest_one_loop_per_reduction_then_the_store_loop():
    nest = lower(softmax(4, 16))
    (rows,) = nest.body
    assert isinstance(rows, Loop) and rows.var == "i0"
    loops = [n for n in rows.body if isinstance(n, Loop)]
    assert [lp.var for lp in loops] == ["j0", "j0", "j0"]
    assert [lp.reductions()[0].op for lp in loops[:2]] == ["max_reduce", "sum"] and not loops[2].reductions()
    # the exp is computed once, in the sum loop, and kept in a row buffer the store loop reloads (keep_rule)
    exps = [sum(1 for n in lp.body if getattr(n, "instr", None) and n.instr.op == "exp") for lp in loops]
    assert exps == [0, 1, 0]
    assert [type(n).__name__ for n in loops[2].body] == ["Reload", "Compute", "Store"]
    assert any(isinstance(n, Keep) and n.reg == 3 for n in loops[1].body) and nest.kept() == [3]
    assert isinstance(rows.body[0], RowBuffers) and isinstance(rows.body[1], Reduce) and rows.body[1].phase == "init"
    # with no row-buffer budget: recomputed in the sum loop and in the store loop (Inductor style)
    rec = [n for n in lower(softmax(4, 16), row_buffer_bytes=0).body[0].body if isinstance(n, Loop)]
    assert [sum(1 for n in lp.body if getattr(n, "instr", None) and n.instr.op == "exp") for lp in rec] == [0, 1, 1]


def test_keep_rule_keeps_costly_registers_that_fit_and_recomputes_cheap_ones():
    regs, why = keep_rule(softmax(4, 1000))
    assert regs == [3] and "4000 B per row <= 131072 B" in why
    assert keep_rule(softmax(4, ROW_BUFFER_MAX_BYTES // 4 + 1))[0] == []  # a row over the budget: recompute
    regs, why = keep_rule(layer_norm(4, 64))  # x - mean is one subtraction: recomputed from x
    assert regs == [] and "no costly" in why
    assert keep_rule(gelu_residual(4, 4))[0] == [] and "point-wise" in keep_rule(gelu_residual(4, 4))[1]


@pytest.mark.parametrize("schedule", [None, lambda n: n.tile("j0", 7).parallelize("i0"), lambda n: n.unroll("j0", 2)])
def test_kept_rows_match_evaluate_under_schedules(schedule):
    k = softmax(9, 1037)
    ck = run_matches(k, schedule)
    assert "tl_scratch(0, sizeof(float) * (size_t)(n_j0))" in ck.source and "rb3[j0] = r3;" in ck.source
    g = group_norm(2, 3, 4, 5)  # the weight keeps two reduced dims: the kept register's row index is j0*5 + j1
    b = Body()
    e = b.op("exp", b.load(0))
    b.store(b.op("div", b.op("mul", e, b.load(1)), b.op("sum", e)), 0)
    k2 = FusedKernel("norm_exp", g.shape, 2, g.inputs, g.outputs[:1], b.instrs)
    src = run_matches(k2, schedule and (lambda n: n.reorder("j1", "j0"))).source
    assert "rb1[j0*5 + j1]" in src and "(size_t)(n_j0 * n_j1)" in src


def test_constants_are_hoisted_into_the_prologue():
    nest = lower(layer_norm(3, 8))
    assert [c.instr.op for c in nest.prologue] == ["const", "const"]
    assert "r1 = 0.125" in str(nest).splitlines()[1]


def test_str_shows_the_nest_and_its_annotations():
    nest = default_schedule(lower(softmax(512, 1000)))
    text = str(nest)
    assert (
        text.splitlines()[0]
        == "kernel 'softmax' float32: domain (512, 1000) -> loops over n_i0=512, n_j0=1000 (reduced)"
    )
    assert "for i0 in [0, n_i0):  # parallel" in text
    assert "  for j0 in [0, n_j0):  # simd, reduces r1" in text
    assert "acc1 = max(acc1, r0)" in text and "y[i0*1000 + j0] = r5" in text
    assert "  row buffers rb3[1000]" in text and "rb3[j0] = r3" in text and "    r3 = rb3[j0]" in text
    tiled = lower(gelu_residual(64, 64)).tile("i1", 16).unroll("i1", 4)
    assert "for i1_o in [0, n_i1) step 16:" in str(tiled)
    assert "for i1 in [i1_o, min(n_i1, i1_o + 16)):  # unroll 4" in str(tiled)


def test_default_schedule_threshold_for_threads():
    small, big = default_schedule(lower(softmax(4, 16))), default_schedule(lower(softmax(256, 1024)))
    assert 4 * 16 * len(small.kernel.body) < PARALLEL_MIN_WORK <= 256 * 1024 * len(big.kernel.body)
    assert not any(lp.parallel for lp in small.loops()) and big.loops("i0")[0].parallel
    assert all(lp.simd for lp in small.loops("j0"))
    tiny = default_schedule(lower(softmax(4, 3)))  # too short to vectorise
    assert not any(lp.simd for lp in tiny.loops())


def test_full_reduction_is_not_parallelised():
    b = Body()
    b.store(b.op("sum", b.load(0)), 0)
    k = FusedKernel(
        "total",
        (1000, 1000),
        2,
        [Buffer("x", (1000, 1000), "float32", (1000, 1))],
        [Buffer("s", (1, 1), "float32", (0, 0))],
        b.instrs,
    )
    nest = default_schedule(lower(k))
    assert [d.extent for d in nest.plan.dims] == [1000000] and not any(lp.parallel for lp in nest.loops())
    with pytest.raises(ValueError, match="loop 'j0': carries reduction"):
        nest.parallelize("j0")
    xs = inputs_for(k)
    np.testing.assert_allclose(codegen_cpp.build(k, nest)(*xs)[0], xs[0].sum(dtype=np.float64), rtol=1e-5)


@pytest.mark.parametrize(
    "name,schedule",
    [
        ("tile+parallel+vectorize", lambda n: n.tile("j0", 64).parallelize("i0").vectorize("j0")),
        ("tile-rows", lambda n: n.tile("i0", 3).parallelize("i0_o").unroll("j0", 4)),
        ("none", lambda n: None),
    ],
)
def test_schedules_do_not_change_results(name, schedule):
    run_matches(layer_norm(10, 130), schedule)


def test_two_dim_tiling_of_a_transpose():
    k = transposed_add(37, 45)
    sched = lambda n: n.tile("i0", 8).tile("i1", 8).reorder("i0_o", "i1_o", "i0", "i1").parallelize("i0_o")
    ck = run_matches(k, sched)
    order = [lp.var for lp in ck.nest.loops()]
    assert order == ["i0_o", "i1_o", "i0", "i1"]


def test_transform_refusals_name_the_loop():
    nest = lower(softmax(8, 8))
    with pytest.raises(ValueError, match=r"loop 'k0': no such loop in kernel 'softmax' \(loops: \['i0', 'j0'\]\)"):
        nest.vectorize("k0")
    with pytest.raises(ValueError, match="loop 'i0': only an innermost loop can be vectorised"):
        nest.vectorize("i0")
    with pytest.raises(ValueError, match="vectorise or unroll it, not both"):
        nest.vectorize("j0").unroll("j0", 2)
    with pytest.raises(ValueError, match="factor: expected a positive int, got 0"):
        nest.tile("i0", 0)
    with pytest.raises(ValueError, match="loop 'j0': carries reduction"):
        nest.parallelize("j0")
    nest.parallelize("i0")
    t = lower(transposed_add(8, 8)).tile("i0", 4)
    with pytest.raises(ValueError, match=r"loop 'i0' bounds use \['i0_o'\], which would run inside it"):
        t.reorder("i0", "i0_o")
    with pytest.raises(ValueError, match="do not form a perfect nest"):
        lower(softmax(8, 8)).reorder("j0", "i0")
    pn = lower(transposed_add(8, 8)).parallelize("i0")
    with pytest.raises(ValueError, match="inside a parallel loop already"):
        pn.parallelize("i1")


def test_plan_rejects_malformed_buffers():
    k = softmax(4, 8)
    k.outputs[0] = Buffer("y", (4, 9), "float32", (9, 1))
    with pytest.raises(ValueError, match=r"outputs\[0\] \('y'\): shape \(4, 9\), expected \(4, 8\) or \(4, 1\)"):
        plan(k)
    k = softmax(4, 8)
    k.inputs[0] = Buffer("x", (4, 8), "float32", (8, 2))
    with pytest.raises(ValueError, match=r"inputs\[0\] \('x'\): strides \(8, 2\) over domain \(4, 8\) read past"):
        plan(k)
    k = softmax(4, 8)
    k.outputs[0] = Buffer("y", (4, 1), "float32", (1, 0))
    with pytest.raises(ValueError, match="an element-level register stored into shape"):
        plan(k)


def test_reorder_applies_to_every_occurrence_of_the_nest():
    k = group_norm(2, 3, 4, 5)
    nest = lower(k).reorder("j1", "j0")
    inner = [lp for lp in nest.loops() if lp.var in ("j0", "j1")]
    assert len(inner) == 6 and all(lp.body[0].var == "j0" for lp in inner if lp.var == "j1")
    run_matches(k, nest)
