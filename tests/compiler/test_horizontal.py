"""Horizontal GEMM fusion (passes/horizontal.py): Linear ops on one input become one stacked GEMM when the cost rule
says so; the rewritten graph computes eager's values; LinearGroup's gradients by fp64 gradcheck."""

from __future__ import annotations

import numpy as np
import pytest

import tinylearn as tl
import tinylearn.nn as nn
from tinylearn.autograd import gradcheck
from tinylearn.compiler import trace
from tinylearn.compiler.passes import dce, horizontal
from tinylearn.compiler.passes.horizontal import MIN_ROWS, LinearGroup
from tinylearn.compiler.runtime import run_graph


def _x(*shape: int, seed: int = 0) -> tl.Tensor:
    return tl.Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _qkv(bias: bool = True) -> tuple[nn.Linear, nn.Linear, nn.Linear]:
    tl.manual_seed(0)
    return nn.Linear(16, 16, bias=bias), nn.Linear(16, 4, bias=bias), nn.Linear(16, 4, bias=bias)


def _attn_like(q: nn.Linear, k: nn.Linear, v: nn.Linear):
    def f(x):
        # the projections' outputs are reshaped and transposed as attention does (views of the stacked product)
        qq, kk, vv = q(x).reshape(2, 20, 4, 4).transpose(1, 2), k(x), v(x)
        return qq.sum(-1), (kk * vv).relu()

    return f


def test_qkv_projections_become_one_gemm_and_compute_eagers_values():
    q, k, v = _qkv()
    f = _attn_like(q, k, v)
    x = _x(2, 20, 16)
    g = trace(f, x)
    rep = horizontal.run(g)
    dce.run(g)
    ops = [n.op for n in g.nodes if n.kind == "call"]
    assert ops.count("linear_group") == 1 and "Linear" not in ops
    assert len(rep.changes) == 1 and "one [40, 16] x [16, 24] GEMM" in rep.changes[0]
    grp = next(n for n in g.nodes if n.op == "linear_group")
    assert grp.target is LinearGroup and grp.n_out == 3
    assert [n.target for n in g.nodes if n.kind == "getitem"] == [0, 1, 2]
    outs = run_graph(g, [x.data])
    for got, want in zip(outs, f(x), strict=True):
        np.testing.assert_allclose(got, want.data, rtol=1e-5, atol=1e-5)


def test_compiled_attention_block_uses_the_group_and_matches_eager():
    q, k, v = _qkv()
    f = _attn_like(q, k, v)
    x = _x(2, 20, 16, seed=1)
    c = tl.compile(f)
    with tl.no_grad():
        got = c(x)
    want = f(x)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a.data, b.data, rtol=1e-5, atol=1e-5)
    assert "linear_group" in c.explain()


def test_few_rows_are_kept_apart_and_say_why():
    q, k, v = _qkv()
    x = _x(1, MIN_ROWS - 1, 16)
    g = trace(lambda x: (q(x), k(x), v(x)), x)
    rep = horizontal.run(g)
    assert [n.op for n in g.nodes if n.kind == "call"] == ["Linear"] * 3
    assert "kept" in rep.changes[0] and f"{MIN_ROWS - 1} row(s) < {MIN_ROWS}" in rep.changes[0]


def test_mixed_biases_are_kept_apart_and_a_lone_linear_is_untouched():
    tl.manual_seed(0)
    a, b = nn.Linear(8, 8), nn.Linear(8, 8, bias=False)
    x = _x(32, 8)
    g = trace(lambda x: (a(x), b(x)), x)
    rep = horizontal.run(g)
    assert [n.op for n in g.nodes if n.kind == "call"] == ["Linear", "Linear"] and "mixed biases" in rep.changes[0]
    g = trace(lambda x: a(x).relu(), x)
    assert horizontal.run(g).changes == []


@pytest.mark.parametrize("bias", [True, False])
def test_linear_group_gradients(bias):
    rng = np.random.default_rng(0)
    x = tl.Tensor(rng.standard_normal((2, 3, 4)), requires_grad=True)
    ws = [tl.Tensor(rng.standard_normal((o, 4)), requires_grad=True) for o in (3, 2)]
    bs = [tl.Tensor(rng.standard_normal(o), requires_grad=True) for o in (3, 2)] if bias else []
    assert gradcheck(lambda x, *wb: LinearGroup.apply(x, *wb, n=2, has_bias=bias), [x, *ws, *bs])
