"""tl.compile end to end: results equal eager and torch, gradients and training steps equal eager, guards and
recompiles, mark_dynamic, graph breaks, bad arguments, show_code.

Tolerances: fp32 rtol 1e-5 / atol 1e-5 (fused kernels may reorder an expression), fp64 rtol 1e-10 / atol 1e-12;
the autograd path replays eager's own ops, so its gradients are compared at the same tolerances (they are equal
in practice)."""

from __future__ import annotations

import shutil
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import tinylearn as tl
import tinylearn.compiler as tc
import tinylearn.nn as nn
import tinylearn.nn.functional as F
from tinylearn.compiler.runtime import KernelStep

F32 = {"rtol": 1e-5, "atol": 1e-5}
F64 = {"rtol": 1e-10, "atol": 1e-12}
HAS_CXX = any(shutil.which(c) for c in ("g++", "clang++", "c++"))


def _a(*shape: int, seed: int = 0, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _t(*shape: int, seed: int = 0, dtype=np.float32, rg: bool = False) -> tl.Tensor:
    return tl.Tensor(_a(*shape, seed=seed, dtype=dtype), requires_grad=rg)


class Block(nn.Module):
    """LayerNorm -> Linear -> GELU -> Linear, plus the residual (a transformer MLP block)."""

    def __init__(self, d: int = 8, dtype=np.float32) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        if dtype != np.float32:
            for p in self.parameters():
                p.data = p.data.astype(dtype)

    def forward(self, x: tl.Tensor) -> tl.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


def _backends() -> list[str]:
    return ["numpy", "cpp"] if HAS_CXX else ["numpy"]


@pytest.mark.parametrize("backend", _backends())
def test_elementwise_chain_equals_eager_and_torch(backend):
    def f(x, b):
        h = x + b
        return F.gelu(h, approximate="tanh") + h * h.sigmoid() + x

    x, b = _t(5, 40), _t(40, seed=1)
    c = tc.compile(f, backend=backend)
    first = c(x, b)  # the traced (eager) run
    got = c(x, b)
    assert c.stats["hits"] == 1 and [s.backend for s in c.graphs()[0].program.steps] == [backend]
    h = torch.from_numpy(x.data) + torch.from_numpy(b.data)
    expect = (TF.gelu(h, approximate="tanh") + TF.silu(h) + torch.from_numpy(x.data)).numpy()
    np.testing.assert_allclose(got.data, expect, **F32)
    np.testing.assert_allclose(got.data, first.data, **F32)


@pytest.mark.parametrize("backend", _backends())
def test_layernorm_gelu_softmax_non_contiguous_inputs(backend):
    def f(x, w):
        y = F.layer_norm(x, (16,), w, None)
        return F.gelu(y) + x, F.softmax(x * 3.0, -1)

    x = tl.Tensor(_a(16, 6).T)  # transposed view
    w = _t(16, seed=2)
    c = tc.compile(f, backend=backend)
    c(x, w)
    y, s = c(x, w)
    xt = torch.from_numpy(np.ascontiguousarray(x.data))
    ln = TF.layer_norm(xt, (16,), torch.from_numpy(w.data))
    np.testing.assert_allclose(y.data, (TF.gelu(ln) + xt).numpy(), **F32)
    np.testing.assert_allclose(s.data, TF.softmax(xt * 3.0, -1).numpy(), **F32)


def test_mlp_block_gradients_fp64_equal_eager_and_torch():
    tl.manual_seed(0)
    m = Block(dtype=np.float64)
    c = tc.compile(m, backend="numpy")
    x = _t(3, 8, dtype=np.float64, rg=True)
    c(x)  # compile
    x.grad = None
    m.zero_grad()
    out = c(x)
    (out * out).sum().backward()
    got = [x.grad.data] + [p.grad.data.copy() for p in m.parameters()]
    assert c.stats["hits"] == 1 and out.grad_fn is not None
    x.grad = None
    m.zero_grad()
    (m(x) ** 2).sum().backward()
    ref = [x.grad.data] + [p.grad.data for p in m.parameters()]
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, **F64)
    # torch: the same block
    xt = torch.tensor(x.data, requires_grad=True)
    ps = {n: torch.tensor(p.data, requires_grad=True) for n, p in m.named_parameters()}
    h = TF.layer_norm(xt, (8,), ps["ln.weight"], ps["ln.bias"])
    h = TF.linear(TF.gelu(TF.linear(h, ps["fc1.weight"], ps["fc1.bias"])), ps["fc2.weight"], ps["fc2.bias"])
    ((xt + h) ** 2).sum().backward()
    np.testing.assert_allclose(got[0], xt.grad.numpy(), **F64)
    np.testing.assert_allclose(got[1], ps["ln.weight"].grad.numpy(), **F64)


def test_training_steps_match_eager():
    tl.manual_seed(0)
    eager, comp = Block(), Block()
    comp.load_state_dict(eager.state_dict())
    c = tc.compile(comp, backend="numpy")
    opt_e = tl.optim.Adam(eager.parameters(), lr=1e-2)
    opt_c = tl.optim.Adam(comp.parameters(), lr=1e-2)
    rng = np.random.default_rng(0)
    for _ in range(4):
        x = tl.Tensor(rng.standard_normal((6, 8)).astype(np.float32))
        for model, opt in ((eager, opt_e), (c, opt_c)):
            opt.zero_grad()
            loss = (model(x) ** 2).mean()
            loss.backward()
            opt.step()
    assert c.stats == {**c.stats, "misses": 1, "hits": 3, "recompiles": 0}
    for (n, pe), (_, pc) in zip(eager.named_parameters(), comp.named_parameters()):
        np.testing.assert_allclose(pc.data, pe.data, **F32, err_msg=n)
    with tl.no_grad():  # grad mode is guarded: a new graph (the fused inference program)
        np.testing.assert_allclose(c(x).data, eager(x).data, **F32)
    assert c.stats["recompiles"] == 1


def test_tinygpt_block_forward_backward_and_whole_model_break():
    from tinylearn.inference.model import TinyGPT

    tl.manual_seed(0)
    gpt = TinyGPT(50, 32, 4, 1, 16).eval()
    blk = gpt.blocks[0]

    def f(x):
        return blk(x, gpt._rope, 0, None, 0)

    x = _t(2, 8, 32)
    with tl.no_grad():
        c = tc.compile(f, backend="numpy")
        c(x)
        got = c(x)
        ref = f(x)
    # fused: the two LayerNorms and the residual adds (attention is one extern op, the flash sdpa kernel)
    assert c.stats["hits"] == 1 and len(c.graphs()[0].kernels()) >= 3
    np.testing.assert_allclose(got.data, ref.data, **F32)
    xg = _t(2, 8, 32, seed=1, rg=True)
    c(xg)
    (c(xg) ** 2).sum().backward()
    got_g = [xg.grad.data.copy()] + [p.grad.data.copy() for p in blk.parameters()]
    xg.grad = None
    blk.zero_grad()
    (f(xg) ** 2).sum().backward()
    for a, r in zip(got_g, [xg.grad.data] + [p.grad.data for p in blk.parameters()]):
        np.testing.assert_allclose(a, r, **F32)
    # the whole model turns its ids into a numpy index (ids.data): refused, and eager's answer is returned
    ids = tl.Tensor(np.random.default_rng(0).integers(0, 50, (1, 5)))
    whole = tc.compile(gpt, backend="numpy")
    with pytest.warns(UserWarning, match="constant read by EmbeddingFn"):
        np.testing.assert_array_equal(whole(ids).data, gpt(ids).data)


def test_guards_count_hits_misses_and_recompiles():
    c = tc.compile(lambda x, k: x * k, backend="numpy")
    x = _t(3, 4)
    c(x, 2.0)
    c(x, 2.0)
    c(_t(3, 4, seed=1), 2.0)  # same shape class: a hit
    assert (c.stats["misses"], c.stats["hits"], c.stats["recompiles"]) == (1, 2, 0)
    c(_t(5, 4), 2.0)  # shape guard fails
    c(_t(3, 4, dtype=np.float64), 2.0)  # dtype guard fails
    out = c(x, 3.0)  # a Python argument is guarded by value
    assert c.stats["recompiles"] == 3 and c.stats["misses"] == 4
    np.testing.assert_array_equal(out.data, x.data * 3.0)


def test_mark_dynamic_keeps_one_shape_class():
    c = tc.compile(lambda x: F.softmax(x, -1) * 2.0, backend="numpy")
    for n in (3, 5, 7, 5):
        x = tc.mark_dynamic(_t(n, 6, seed=n), 0)
        np.testing.assert_allclose(c(x).data, (F.softmax(x, -1) * 2.0).data, **F32)
    assert c.stats["recompiles"] == 0 and c.stats["misses"] == 1
    assert c.stats["size_specializations"] == 2 and c.stats["hits"] == 1
    with pytest.raises(ValueError, match="dim: expected an int in \\[-2, 2\\), got 2"):
        tc.mark_dynamic(_t(2, 2), 2)
    assert tc.mark_dynamic(_t(2, 2), np.int8(-1))._tl_dynamic == {1}  # numpy integers are ints
    with pytest.raises(ValueError, match="dim: expected an int in \\[-0, 0\\), got 0"):
        tc.mark_dynamic(tl.Tensor(np.float32(1.0)), 0)


def test_graph_break_warns_with_the_reason_and_runs_eagerly():
    def f(x):
        if x.sum() > 0:
            return x * 2
        return x * 3

    c = tc.compile(f, backend="numpy")
    pos, neg = tl.Tensor(np.ones(3, np.float32)), tl.Tensor(-np.ones(3, np.float32))
    with pytest.warns(UserWarning, match=r"graph break \(data-dependent control flow: Tensor.__bool__"):
        np.testing.assert_array_equal(c(pos).data, pos.data * 2)
    with pytest.warns(UserWarning, match="graph break"):
        np.testing.assert_array_equal(c(neg).data, neg.data * 3)
    assert c.stats["graph_breaks"] == 1 and c.stats["eager_calls"] == 2

    drop = tc.compile(lambda x: F.dropout(x, 0.5), backend="numpy")
    with pytest.warns(UserWarning, match="op DropoutFn"):
        drop(pos)


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="backend: expected one of .* got 'tpu'"):
        tc.compile(lambda x: x, backend="tpu")
    with pytest.raises(ValueError, match="mode: expected one of .* got 'turbo'"):
        tc.compile(lambda x: x, mode="turbo")
    with pytest.raises(TypeError, match="fn: expected a callable"):
        tc.compile(3)
    with pytest.raises(TypeError, match="compiled: expected what tl.compile returns"):
        tc.show_code(lambda x: x)


def test_show_code_prints_every_kernel(capsys):
    c = tc.compile(lambda x, w: (x @ w).relu() * 2.0, backend="numpy")
    c(_t(4, 4), _t(4, 4, seed=1))
    text = tc.show_code(c)
    assert "extern MatMul" in text and "kernel fused_0_relu_mul" in text and "r1 = relu r0" in text
    assert capsys.readouterr().out.strip() == text.strip()
    if HAS_CXX:
        cc = tc.compile(lambda x: (x * 2.0).exp(), backend="cpp")
        cc(_t(4, 4))
        steps = [s for s in cc.graphs()[0].program.steps if isinstance(s, KernelStep)]
        assert steps[0].backend == "cpp" and 'extern "C"' in tc.show_code(cc)


def test_module_compile_sees_parameter_updates_without_recompiling():
    lin = nn.Linear(4, 2)
    c = tc.compile(lin, backend="numpy")
    x = _t(3, 4)
    with tl.no_grad():
        c(x)
        lin.weight.data = lin.weight.data * 2.0  # replaced array, as some optimizers do
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            np.testing.assert_allclose(c(x).data, lin(x).data, **F32)
    assert c.stats["recompiles"] == 0


def test_multi_output_ops_list_outputs_and_gradients():
    def f(x, y):
        v, _ = x.max(1)
        return [v * y.sum() + 1.0, x, F.log_softmax(x, -1).exp()]

    x, y = _t(4, 5, dtype=np.float64, rg=True), _t(3, seed=1, dtype=np.float64, rg=True)
    c = tc.compile(f, backend="numpy")
    c(x, y)
    outs = c(x, y)
    assert isinstance(outs, list) and len(outs) == 3 and c.stats["hits"] == 1
    sum((o * o).sum() for o in outs).backward()
    got = (x.grad.data.copy(), y.grad.data.copy())
    x.grad = y.grad = None
    sum((o * o).sum() for o in f(x, y)).backward()
    np.testing.assert_allclose(got[0], x.grad.data, **F64)
    np.testing.assert_allclose(got[1], y.grad.data, **F64)


def test_a_compiled_function_inside_a_trace_is_inlined_and_kernels_are_shared():
    from tinylearn.compiler.api import KERNEL_CACHE

    inner = tc.compile(lambda a: a.exp(), backend="numpy")
    outer = tc.compile(lambda a: inner(a) * 2.0, backend="numpy")
    x = _t(4, 4)
    outer(x)
    np.testing.assert_allclose(outer(x).data, np.exp(x.data) * 2.0, **F32)
    assert inner.stats["calls"] == 0  # inlined: its ops joined the outer graph
    (k,) = outer.graphs()[0].kernels()
    assert k.meta["ops"] == ["Exp", "Mul"]
    hits = KERNEL_CACHE["hits"]
    again = tc.compile(lambda b: b.exp() * 2.0, backend="numpy")
    again(x)
    assert KERNEL_CACHE["hits"] == hits + 1  # the same kernel structure: built once


class CountingBN(nn.Module):
    """BatchNorm (running statistics), a call counter and a data-dependent branch: side effects a re-run doubles."""

    def __init__(self) -> None:
        super().__init__()
        self.bn, self.count = nn.BatchNorm1d(4), 0

    def forward(self, x: tl.Tensor) -> tl.Tensor:
        self.count += 1
        h = self.bn(x)
        if (h * h).sum() > 1e9:  # never true; still a graph break (the value leaves the graph)
            return h * 3.0
        return h.relu() * 2.0


def test_graph_break_runs_the_function_exactly_once_per_call():
    tl.manual_seed(0)
    comp, ref = CountingBN(), CountingBN()
    c = tc.compile(comp, backend="numpy")
    rng = np.random.default_rng(0)
    for i in range(3):
        x = tl.Tensor(rng.standard_normal((6, 4)).astype(np.float32))
        with pytest.warns(UserWarning, match=r"graph break \(data-dependent control flow: Tensor.__bool__"):
            got = c(x)
        np.testing.assert_allclose(got.data, ref(x).data, **F32)
        assert comp.count == ref.count == i + 1
    np.testing.assert_allclose(comp.bn.running_mean.data, ref.bn.running_mean.data, **F32)
    np.testing.assert_allclose(comp.bn.running_var.data, ref.bn.running_var.data, **F32)
    assert (c.stats["graph_breaks"], c.stats["eager_calls"], c.stats["traces"]) == (1, 3, 1)
    xt = torch.from_numpy(x.data)  # torch's batch norm in training mode, then relu * 2
    np.testing.assert_allclose(got.data, (TF.relu(TF.batch_norm(xt, None, None, training=True)) * 2).numpy(), **F32)


def test_validate_false_runs_a_graph_once_on_the_first_call():
    m = CountingBN()
    m.forward = lambda x: (setattr(m, "count", m.count + 1), m.bn(x).relu())[1]  # no branch: a full graph
    for validate, runs in ((False, 1), (True, 2)):  # validate's second trace is a second run (documented)
        m.count = 0
        c = tc.compile(m, backend="numpy", validate=validate)
        c(_t(5, 4))
        assert m.count == runs and c.stats["traces"] == 1


def _stack(n_layers: int, d: int = 8, dtype=np.float32) -> list[Block]:
    tl.manual_seed(0)
    return [Block(d, dtype) for _ in range(n_layers)]


def test_pattern_cache_compiles_equal_kernels_of_different_layers_once():
    from tinylearn.compiler.kernel_cache import CACHE, pattern_hash

    layers = _stack(4)

    def model(x):
        for blk in layers:
            x = blk(x)
        return x

    CACHE.clear()
    c = tc.compile(model, backend=_backends()[-1])
    x = _t(3, 8)
    with tl.no_grad():
        c(x)
        np.testing.assert_allclose(c(x).data, model(x).data, **F32)
    ks = c.graphs()[0].kernels()
    n_patterns = len({pattern_hash(k) for k in ks})
    # LayerNorm, then (residual add + next LayerNorm) x 3, then the last add: 5 kernels, 3 patterns, 3 builds
    assert (len(ks), n_patterns, CACHE.stats["builds"]) == (5, 3, 3)
    assert f"{len(ks)} fused kernels, {n_patterns} distinct patterns" in c.kernel_summary()
    # another compiled function with the same layer structure builds nothing new
    other = tc.compile(layers[0], backend=_backends()[-1])
    with tl.no_grad():
        other(x)
    assert CACHE.stats["builds"] == n_patterns
    # a different dtype or a different body is a separate build
    f64 = tc.compile(_stack(1, dtype=np.float64)[0], backend=_backends()[-1])
    with tl.no_grad():
        f64(_t(3, 8, dtype=np.float64))
    assert len(f64.graphs()[0].kernels()) == 2  # its LayerNorm and add: the float32 patterns in float64
    assert CACHE.stats["builds"] == n_patterns + 2
    with tl.no_grad():
        tc.compile(lambda a: F.gelu(a) * 3.0, backend=_backends()[-1])(_t(3, 8))
    assert CACHE.stats["builds"] == n_patterns + 3


def test_register_numbering_does_not_change_the_pattern():
    from dataclasses import replace

    from tinylearn.compiler.kernel_cache import pattern_hash, pattern_key
    from tinylearn.compiler.kernel_ir import Instr

    c = tc.compile(lambda a: (a * 2.0).exp(), backend="numpy")
    c(_t(3, 4))
    (k,) = c.graphs()[0].kernels()
    shifted = replace(
        k,
        name="other",
        body=[Instr(i.out + 10 if i.out >= 0 else -1, i.op, tuple(a + 10 for a in i.args), i.attr) for i in k.body],
    )
    assert pattern_key(shifted) == pattern_key(k) and pattern_hash(shifted) == pattern_hash(k)
    assert pattern_hash(replace(k, dtype="float64")) != pattern_hash(k)


def test_incremental_revision_rebuilds_only_the_layer_whose_shape_changed():
    from tinylearn.compiler.kernel_cache import CACHE

    def two(x, y):  # layer A reads x [., 8] (softmax rows of 8), layer B reads y (LayerNorm rows of 16)
        return F.softmax(x * 2.0, -1), F.layer_norm(y, (y.shape[-1],)).relu()

    backend = _backends()[-1]
    CACHE.clear()
    c = tc.compile(two, backend=backend)
    with tl.no_grad():
        c(_t(4, 8), _t(4, 16))
        first = CACHE.stats["builds"]
        assert first == 2
        a, b = c(_t(4, 8), _t(4, 24))  # B's row length changed: a recompile of the graph
    assert c.stats["recompiles"] == 1 and CACHE.stats["builds"] == first + 1  # only B's kernel is new
    np.testing.assert_allclose(b.data, TF.layer_norm(torch.from_numpy(_a(4, 24)), (24,)).relu().numpy(), **F32)
    np.testing.assert_allclose(a.data, TF.softmax(torch.from_numpy(_a(4, 8)) * 2.0, -1).numpy(), **F32)


def test_missing_cxx_falls_back_to_numpy_with_a_warning(monkeypatch, tmp_path):
    """No C++ compiler (``$CXX`` names a program that does not exist, as on a box without a toolchain): the fused
    kernels run on the numpy reference, the warning names the backend and the reason, and results stay right."""
    from tinylearn.compiler import cc
    from tinylearn.compiler.kernel_cache import CACHE

    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    monkeypatch.setenv("TINYLEARN_CACHE_DIR", str(tmp_path / "cache"))
    cc.clear_memory_cache()
    CACHE.clear()
    f = tc.compile(lambda x: (x * 3.0).tanh() + 1.0, backend="cpp")
    x = tl.Tensor(np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32))
    with pytest.warns(UserWarning, match=r"backend 'cpp' unavailable \(RuntimeError: C\+\+ compiler .* cannot run"):
        f(x)  # traces, then builds the kernels: the compiler is missing
    got = f(x)
    np.testing.assert_allclose(got.numpy(), np.tanh(x.numpy() * 3.0) + 1.0, rtol=1e-5, atol=1e-6)
    assert f.graphs()[0].backends == ["numpy"] and CACHE.stats["fallbacks"] == 1
