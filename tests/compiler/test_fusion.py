"""Fusion: which nodes share a kernel, the cost rule, and the fused results against eager and torch.

Tolerances: fp32 rtol 1e-5 / atol 1e-5 after fusion (the kernels compute in the graph's dtype but may reorder
an expression, e.g. softmax's division), fp64 rtol 1e-10 / atol 1e-12."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import tinylearn as tl
import tinylearn.nn.functional as F
from tinylearn.compiler import fusion, trace
from tinylearn.compiler.api import build
from tinylearn.compiler.kernel_ir import REDUCE

TOL = {np.float32: {"rtol": 1e-5, "atol": 1e-5}, np.float64: {"rtol": 1e-10, "atol": 1e-12}}


def _a(*shape: int, seed: int = 0, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _compiled(fn, *arrays, mode="default"):
    """(compiled graph, fused results, eager results) of fn on Tensors made from arrays."""
    ts = [tl.Tensor(a) for a in arrays]
    cg, _ = build(trace(fn, *ts), "numpy", mode)
    got = cg.program.run([t.data for t in ts])
    ref = fn(*ts)
    ref = [r.data for r in (ref if isinstance(ref, tuple) else (ref,))]
    return cg, got, ref


def _kernels(cg):
    return cg.kernels()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gelu_silu_residual_chain_is_one_kernel_equal_to_torch(dtype):
    def f(x, b):
        h = x + b
        return F.gelu(h) + h * h.sigmoid() + x

    x, b = _a(6, 33, dtype=dtype), _a(33, seed=1, dtype=dtype)
    cg, got, ref = _compiled(f, x, b)
    (k,) = _kernels(cg)
    assert k.reduce_dims == 0 and k.meta["nodes"] == ["add", "gelu", "sigmoid", "mul", "add_1", "add_2"]
    assert [i.strides for i in k.inputs] == [(33, 1), (0, 1)]  # the bias is broadcast over rows
    xt, bt = torch.from_numpy(x), torch.from_numpy(b)
    h = xt + bt
    expect = (TF.gelu(h) + TF.silu(h) + xt).numpy()
    np.testing.assert_allclose(got[0], expect, **TOL[dtype])
    np.testing.assert_allclose(got[0], ref[0], **TOL[dtype])


def test_layernorm_gelu_residual_is_one_reduction_kernel():
    def f(x, w, b):
        return F.gelu(F.layer_norm(x, (64,), w, b)) + x

    x, w, b = _a(4, 5, 64), _a(64, seed=1), _a(64, seed=2)
    cg, got, ref = _compiled(f, x, w, b)
    (k,) = _kernels(cg)
    assert k.reduce_dims == 1 and k.shape == (4, 5, 64)
    assert sum(i.op == "sum" for i in k.body) == 2  # mean and variance
    expect = TF.gelu(TF.layer_norm(torch.from_numpy(x), (64,), torch.from_numpy(w), torch.from_numpy(b)))
    np.testing.assert_allclose(got[0], (expect + torch.from_numpy(x)).numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, atol=1e-5)


def test_softmax_logsoftmax_and_row_reductions():
    def f(x):
        y = x * 0.5
        return F.softmax(y, -1), F.log_softmax(x, -1), x.mean(-1, keepdim=True), x.sum(dim=(1, 2)), x.exp().max()

    x = _a(3, 4, 50)
    cg, got, ref = _compiled(f, x)
    ks = _kernels(cg)
    assert {i.op for k in ks for i in k.body} >= {"max_reduce", "sum"}
    assert all(o.shape == r.shape for o, r in zip(got, ref))
    xt = torch.from_numpy(x)
    expect = [TF.softmax(xt * 0.5, -1), TF.log_softmax(xt, -1), xt.mean(-1, keepdim=True), xt.sum(dim=(1, 2))]
    for o, e in zip(got, expect):
        np.testing.assert_allclose(o, e.numpy(), rtol=1e-5, atol=1e-5)
    for o, r in zip(got, ref):
        np.testing.assert_allclose(o, r, rtol=1e-5, atol=1e-5)


def test_matmul_is_never_fused_but_its_epilogue_is():
    def f(x, w, b):
        h = x @ w  # matmul, not Linear: no pattern rewrite
        return (h + b).tanh() * 2.0 + h

    x, w, b = _a(8, 16), _a(16, 12, seed=1), _a(12, seed=2)
    cg, got, ref = _compiled(f, x, w, b)
    (k,) = _kernels(cg)
    assert "MatMul" not in k.meta["ops"] and k.meta["ops"] == ["Add", "Tanh", "Mul", "Add"]
    assert [n.op for n in cg.plan.kernels[0][1]][:1] == ["MatMul"]  # the kernel loads the GEMM's output
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, atol=1e-5)


def test_non_contiguous_and_broadcast_inputs():
    def f(xt, col):
        return (xt * col).exp() - xt

    base = _a(7, 5)
    xt = base.T  # a transposed (non-contiguous) view [5, 7]
    col = _a(5, 1, seed=3)
    cg, got, ref = _compiled(f, xt, col)
    (k,) = _kernels(cg)
    assert k.inputs[1].strides == (1, 0)
    np.testing.assert_allclose(got[0], np.exp(xt * col) - xt, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-6, atol=1e-6)


def test_cost_rule_stores_a_long_chain_and_max_fusion_recomputes_it():
    def f(x, y):
        a = ((x.exp() * 2.0 + 1.0).sigmoid() * 3.0).tanh()  # 6 ops: dearer to recompute than to store
        b = y.tanh()
        return a + b  # joins tanh(y)'s kernel (the latest producer group), so the chain is read from outside

    x, y = _a(8, 8), _a(8, 8, seed=1)
    cg, got, ref = _compiled(f, x, y)
    assert len(_kernels(cg)) == 2 and "store %tanh" in cg.plan.explain()
    cg2, got2, _ = _compiled(f, x, y, mode="max-fusion")
    (k,) = _kernels(cg2)
    assert k.meta["recomputed"] == ["tanh"] and "recompute %tanh (6 op(s))" in cg2.plan.explain()
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got2[0], ref[0], rtol=1e-6, atol=1e-6)


def test_a_cheap_producer_is_recomputed_by_default():
    def f(x, y):
        return y.tanh() + x.exp()

    cg, got, ref = _compiled(f, _a(4, 4), _a(4, 4, seed=1))
    (k,) = _kernels(cg)
    assert k.meta["recomputed"] in (["exp"], ["tanh"])
    assert "no kernel for" in cg.plan.explain()
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-6, atol=1e-6)


def test_a_join_that_would_make_a_cycle_is_refused():
    def f(x, w):
        p = x.exp()
        return p + p @ w  # p's kernel must run before the matmul, the add after it

    x, w = _a(4, 4), _a(4, 4, seed=1)
    cg, got, ref = _compiled(f, x, w)
    ks = _kernels(cg)
    assert len(ks) == 2 and ks[0].meta["nodes"] == ["exp"] and ks[1].meta["nodes"] == ["add"]
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-6, atol=1e-6)


def test_explain_names_nodes_and_bytes_and_bad_mode():
    cg, _, _ = _compiled(lambda x: (x * 2.0).relu() + 1.0, _a(16, 16))
    text = cg.plan.explain()
    assert "fused_0_mul_relu_add <- mul, relu, add" in text.replace(": domain [16, 16] reduce 0", "")
    assert cg.plan.bytes_saved() == 2 * 1024 * 2  # mul and relu: one write and one read each avoided
    with pytest.raises(ValueError, match="mode: expected one of"):
        fusion.plan(cg.infer_graph, "fast")
    assert all(i.op not in REDUCE for i in _kernels(cg)[0].body)


def test_kernel_listing_shows_buffers_instructions_and_provenance():
    from tinylearn.compiler.listing import kernel_listing

    cg, _, _ = _compiled(lambda x, b: (x + b).relu(), _a(3, 4), _a(4, seed=1))
    text = kernel_listing(cg.kernels()[0]).splitlines()
    assert text[0] == "kernel fused_0_add_relu: domain [3, 4], reduce over last 0, float32"
    assert "  in1  x1: [4] strides [0, 1]" in text and "  r2 = add r0, r1" in text
    assert text[-2:] == ["  store out0 <- r3", "  # fused graph nodes: add, relu"]


def test_an_expand_is_a_stride_zero_load_of_its_input():
    def f(x, b):
        return x * b.reshape(1, 5).expand(4, 5) + 1.0

    x, b = _a(4, 5), _a(5, seed=1)
    cg, got, ref = _compiled(f, x, b)
    (k,) = _kernels(cg)
    assert [n.op for n in cg.plan.kernels[0][1]] == ["placeholder", "Reshape"]  # not the Expand
    assert k.inputs[1].shape == (1, 5) and k.inputs[1].strides == (0, 1)
    np.testing.assert_array_equal(got[0], ref[0])


def test_group_level_dependencies_refuse_a_join_that_closes_a_cycle_through_an_earlier_member():
    # the backward of (a+b)*(a-b)/(b*b+1) in forward form: group A (sub, mul, dm) and group B (m1, a1, d, dd) each
    # read the other once dd joins B; m4 = d * sub must not join A (A would wait for B, which waits for A)
    def f(a, b, g):
        add, sub = a + b, a - b
        mul = add * sub
        a1 = b * b + 1.0
        d = g / a1
        dm = g * mul
        dd = dm / (a1 * a1)
        m4 = d * sub
        return m4 + dd + d * add

    a, b, g = _a(4, 7), _a(4, 7, seed=1), _a(4, 7, seed=2)
    cg, got, ref = _compiled(f, a, b, g)
    assert len(_kernels(cg)) >= 2
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, atol=1e-6)


def test_a_zero_dim_value_is_loaded_as_one_element():
    def f(x, y):
        return x * y.mean() + x.sum(-1, keepdim=True)

    x, y = _a(4, 7), _a(3, 5, seed=1)
    cg, got, ref = _compiled(f, x, y)
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, atol=1e-6)
