"""Dynamic shapes: graph reuse across sizes (and when it is refused), shape buckets with padding [Q108], learned
buckets and their trade-off, the next-size predictor and prefetch [Q215]. Results are compared with eager at fp32
tolerances and with torch where an op is involved."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import tinylearn as tl
import tinylearn.compiler as tc
import tinylearn.nn as nn
import tinylearn.nn.functional as F
from tinylearn.compiler import shapes
from tinylearn.compiler.shapes import ShapePolicy, SizePredictor, learned_buckets, pow2_bucket

F32 = {"rtol": 1e-5, "atol": 1e-5}


def _dyn(*shape: int, seed: int = 0, dim: int = 0) -> tl.Tensor:
    t = tl.Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))
    return tc.mark_dynamic(t, dim)


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln, self.fc = nn.LayerNorm(6), nn.Linear(6, 5)

    def forward(self, x: tl.Tensor) -> tl.Tensor:
        return F.softmax(F.gelu(self.fc(self.ln(x))), -1) * 2.0


def test_new_sizes_reuse_the_traced_graph_without_tracing():
    tl.manual_seed(0)
    m = MLP()
    calls = []

    def f(x):
        calls.append(x.shape[0])
        return m(x)

    c = tc.compile(f, backend="numpy", validate=False)
    with tl.no_grad():
        for n in (3, 5, 7, 5):
            x = _dyn(n, 6, seed=n)
            np.testing.assert_allclose(c(x).data, m(x).data, **F32)
    assert calls == [3, 5]  # 5 traces to confirm the graph is size-free; 7 re-specialises it; the second 5 hits
    assert (c.stats["traces"], c.stats["reuses"], c.stats["hits"], c.stats["size_specializations"]) == (2, 1, 1, 2)
    g7 = next(cg for cg in c.graphs() if cg.graph.placeholders()[0].shape == (7, 6))
    assert g7.graph.outputs[0].shape == (7, 5)
    xt = torch.from_numpy(x.data)
    w, b = torch.from_numpy(m.fc.weight.data), torch.from_numpy(m.fc.bias.data)
    ref = TF.softmax(TF.gelu(TF.linear(TF.layer_norm(xt, (6,), torch.from_numpy(m.ln.weight.data)), w, b)), -1) * 2
    np.testing.assert_allclose(c(x).data, ref.numpy(), **F32)


def test_reuse_is_refused_with_a_reason_when_the_size_is_baked_in():
    def flat(x):  # the reshape target holds the traced size
        return (x * 2.0).reshape(x.shape[0] * 6)

    def scaled(x):  # x / n: the trace records the number 1/n, not the size
        return x.sum(0) * (1.0 / x.shape[0])

    for fn, why in ((flat, "Reshape.*literal baked in"), (scaled, r"trace at sizes \[\(5, 6\)\] differs.*%mul")):
        c = tc.compile(fn, backend="numpy")
        for n in (3, 5, 7):
            x = _dyn(n, 6, seed=n)
            np.testing.assert_allclose(c(x).data, fn(x).data, **F32)
        assert c.stats["traces"] == 3 and c.stats["reuses"] == 0
        assert re.search(why, c.explain()), c.explain()
    retrace = tc.compile(lambda x: x.exp(), backend="numpy", dynamic="retrace")
    retrace(_dyn(3, 2))
    retrace(_dyn(4, 2))
    assert retrace.stats["traces"] == 2


def test_reuse_keeps_gradients_exact():
    tl.manual_seed(0)
    lin = nn.Linear(4, 3)
    for p in lin.parameters():
        p.data = p.data.astype(np.float64)
    c = tc.compile(lambda x: (lin(x).tanh() * 3.0).sum(-1), backend="numpy")
    for n in (2, 6, 5):
        x = tc.mark_dynamic(tl.Tensor(np.random.default_rng(n).standard_normal((n, 4)), requires_grad=True), 0)
        c(x).sum().backward()
        got = (x.grad.data.copy(), lin.weight.grad.data.copy())
        x.grad = None
        lin.zero_grad()
        (lin(x).tanh() * 3.0).sum(-1).sum().backward()
        np.testing.assert_allclose(got[0], x.grad.data, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(got[1], lin.weight.grad.data, rtol=1e-10, atol=1e-12)
        x.grad = None
        lin.zero_grad()
    assert c.stats["reuses"] == 1 and c.stats["traces"] == 2


def test_pow2_buckets_share_one_graph_and_padding_keeps_results_exact():
    tl.manual_seed(0)
    m = MLP()
    c = tc.compile(m, backend="numpy", dynamic="pow2")
    with tl.no_grad():
        for n in (5, 6, 7, 8, 7, 3):
            x = _dyn(n, 6, seed=n)
            np.testing.assert_allclose(c(x).data, m(x).data, **F32)
    sizes = sorted(cg.graph.placeholders()[0].shape[0] for cg in c.graphs())
    assert sizes == [4, 5, 6, 8]  # 5 and 6 traced exactly (6 confirms reuse); 7, 8 share bucket 8; 3 pads to 4
    assert c.stats["padded_calls"] == 3 and c.stats["traces"] == 2  # 8 itself runs unpadded
    assert c.stats["pad_elements"] == 6 * ((8 - 7) * 2 + (4 - 3))
    text = c.explain()
    assert "6 calls, 5 sizes [3, 5, 6, 7, 8] -> 2 compiled sizes [4, 8]" in text and "compiles saved 3" in text, text


def test_padding_is_refused_when_rows_mix():
    def attn(q):  # softmax over the sequence axis: padded keys would change the real rows
        return F.softmax(q @ q.transpose(0, 1), -1)

    def total(x):
        return x.sum(0) * 2.0

    for fn, why in ((attn, "contracts over the padded axis|normalises over the padded axis"), (total, "reduces")):
        c = tc.compile(fn, backend="numpy", dynamic="pow2")
        for n in (3, 5, 6):
            x = _dyn(n, 4, seed=n)
            np.testing.assert_allclose(c(x).data, fn(x).data, **F32)
        assert c.stats["padded_calls"] == 0
        assert re.search(why, c.explain()), c.explain()


def test_pad_analysis_follows_the_axis_through_permute_and_matmul():
    def f(x, w):  # x [B, T, 4], dynamic B: permute moves it to axis 1; matmul keeps it (M axis)
        return (x.permute(1, 0, 2) @ w).relu()

    from tinylearn.compiler import trace

    g = trace(f, _dyn(3, 2, 4), tl.Tensor(np.ones((4, 5), np.float32)))
    plan = shapes.pad_analysis(g, {0: frozenset({0})})
    assert isinstance(plan, shapes.PadPlan) and plan.out_axes == [{1: (0, 0)}]
    assert "contracts" in shapes.pad_analysis(g, {0: frozenset({2})})


def test_learned_buckets_minimise_waste_plus_compiles():
    counts = {100: 50, 101: 50, 102: 50, 200: 10, 1000: 1}
    assert learned_buckets(counts, compile_cost=1e9) == [1000]  # compiles expensive: one bucket
    assert learned_buckets(counts, compile_cost=0) == [100, 101, 102, 200, 1000]  # free: exact sizes
    assert learned_buckets(counts, compile_cost=500) == [102, 200, 1000]  # pad 100, 101 up to 102 (150 elements)
    assert [pow2_bucket(n) for n in (1, 2, 3, 100)] == [1, 2, 4, 128] and pow2_bucket(3, minimum=16) == 16
    pol = ShapePolicy("learned", compile_cost=500, learn_after=len([1] * 8))
    for n in [100, 101, 102, 100, 101, 102, 200, 100]:
        pol.observe((0, 0), n)
    assert pol.bucket((0, 0), 101) == 102 and pol.bucket((0, 0), 150) == 200
    assert "compiles saved" in pol.report()
    with pytest.raises(ValueError, match="mode: expected one of .* got 'fast'"):
        ShapePolicy("fast")
    with pytest.raises(ValueError, match="dynamic: expected one of"):
        tc.compile(lambda x: x, dynamic="bogus")


def test_predictor_regression_successor_and_frequency():
    p = SizePredictor()
    for n in (16, 32, 48, 64):
        p.observe(n)
    assert p.predict() == (80, "regression")
    alt = SizePredictor()
    for n in (8, 30, 8, 30, 8):
        alt.observe(n)
    assert alt.predict() == (30, "successor")
    one = SizePredictor()
    one.observe(5)
    assert one.predict() == (5, "frequency")
    with pytest.raises(ValueError, match="window: expected an int >= 2, got 1"):
        SizePredictor(1)


def test_prefetch_builds_the_predicted_size_and_counts_hits():
    c = tc.compile(lambda x: (x * 2.0).exp(), backend="numpy")
    for n in (4, 8, 12):
        c(_dyn(n, 3, seed=n))
        c.prefetch()
    assert c.stats["prefetched"] == 1  # after 4 and 8 the prediction (frequency: 4) is built; after 12: 16
    before = c.stats["hits"]
    x = _dyn(16, 3)
    np.testing.assert_allclose(c(x).data, np.exp(x.data * 2.0), **F32)
    assert c.stats["hits"] == before + 1  # the prefetched graph served the call
    assert (c.stats["prediction_hits"], c.stats["predictions"]) == (1, 3)  # 4 -> 8 missed, 8 -> 12 missed


@pytest.mark.skipif(not any(shutil.which(c) for c in ("g++", "clang++", "c++")), reason="no C++ compiler")
def test_cpp_kernels_are_shared_across_sizes_of_a_dynamic_dim():
    from tinylearn.compiler.kernel_cache import CACHE

    CACHE.clear()
    c = tc.compile(lambda x: F.softmax(x * 2.5, -1) + x, backend="cpp", dynamic="pow2")
    with tl.no_grad():
        for n in (3, 5, 7, 12):
            x = _dyn(n, 6, seed=n)
            ref = TF.softmax(torch.from_numpy(x.data) * 2.5, -1) + torch.from_numpy(x.data)
            np.testing.assert_allclose(c(x).data, ref.numpy(), **F32)
    # graphs for 3, 5 (traced: confirms reuse), 8 (7 padded), 16 (12 padded): four kernels, one C++ library
    assert len(c.graphs()) == 4 and CACHE.stats["builds"] == 1 and CACHE.stats["hits"] == 3
    assert {s.backend for cg in c.graphs() for s in cg.program.steps if hasattr(s, "kernel")} == {"cpp"}
