"""codegen_cpp: FusedKernels compiled to C++ match kernel_ir.evaluate and torch (fp32: rtol 1e-5, atol 1e-5;
fp64: rtol 1e-12, atol 1e-12), on broadcast, transposed (strided) and odd-sized inputs, with numpy's NaN rules."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from codegen_cases import (
    Body,
    all_ops,
    gelu_residual,
    group_norm,
    inputs_for,
    layer_norm,
    row_max,
    softmax,
    transposed_add,
)

from tinylearn.compiler import codegen_cpp
from tinylearn.compiler.kernel_ir import Buffer, FusedKernel, evaluate
from tinylearn.compiler.loops import lower

TOL = {"float32": {"rtol": 1e-5, "atol": 1e-5}, "float64": {"rtol": 1e-12, "atol": 1e-12}}


def check(kernel, xs=None) -> list[np.ndarray]:
    xs = inputs_for(kernel) if xs is None else xs
    got = codegen_cpp.build(kernel)(*xs)
    ref = evaluate(kernel, xs)
    for g, r, b in zip(got, ref, kernel.outputs):
        assert g.dtype == np.dtype(kernel.dtype) and g.shape == b.shape, b.name
        np.testing.assert_allclose(g, r, **TOL[kernel.dtype], err_msg=f"{kernel.name}: output {b.name}")
    return got


def t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(a)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gelu_residual_with_broadcast_bias_matches_torch(dtype):
    k = gelu_residual(33, 70, dtype)
    x, bias, res = xs = inputs_for(k)
    (y,) = check(k, xs)
    np.testing.assert_allclose(y, (F.gelu(t(x) + t(bias)) + t(res)).numpy(), **TOL[dtype])


@pytest.mark.parametrize("rows,cols", [(5, 1000), (1, 1), (7, 1), (1, 7), (3, 4099)])
def test_softmax_matches_torch(rows, cols):
    k = softmax(rows, cols)
    xs = inputs_for(k)
    (y,) = check(k, xs)
    np.testing.assert_allclose(y, torch.softmax(t(xs[0]), -1).numpy(), **TOL["float32"])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_layer_norm_with_mean_and_rstd_rows_matches_torch(dtype):
    k = layer_norm(7, 300, dtype)
    x, w, b = xs = inputs_for(k)
    x *= 3
    x += 1  # an offset mean: the centred variance matters
    y, mean, rstd = check(k, xs)
    np.testing.assert_allclose(y, F.layer_norm(t(x), (300,), t(w), t(b), 1e-5).numpy(), **TOL[dtype])
    var, mu = torch.var_mean(t(x), -1, correction=0, keepdim=True)
    np.testing.assert_allclose(mean, mu.numpy(), **TOL[dtype])
    np.testing.assert_allclose(rstd, torch.rsqrt(var + 1e-5).numpy(), **TOL[dtype])


def test_group_norm_reduces_two_trailing_dims_matches_torch():
    n, g, cg, hw = 2, 4, 3, 10
    k = group_norm(n, g, cg, hw)
    x, w = xs = inputs_for(k)
    y, mean = check(k, xs)
    ref = F.group_norm(t(x).reshape(n, g * cg, hw), g, weight=t(w).reshape(-1), eps=1e-5)
    np.testing.assert_allclose(y, ref.reshape(y.shape).numpy(), **TOL["float32"])
    np.testing.assert_allclose(mean, x.mean(axis=(2, 3), keepdims=True), **TOL["float32"])
    assert [d.extent for d in lower(k).plan.red_dims] == [cg, hw]  # the weight keeps the reduced dims apart


def test_transposed_input_strides_match_torch():
    k = transposed_add(17, 33)
    at, c = xs = inputs_for(k)
    (y,) = check(k, xs)
    np.testing.assert_allclose(y, (2 * t(at).T + t(c)).numpy(), **TOL["float32"])


@pytest.mark.parametrize("size", [1, 7, 1000003])
def test_odd_sizes_flat_pointwise(size):
    k = gelu_residual(1, size)
    check(k)


def test_odd_sizes_many_rows_one_column():
    check(gelu_residual(1000003, 1))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_op_matches_evaluate_including_nan_and_inf(dtype):
    k = all_ops(101, dtype)
    a, p = inputs_for(k)
    a[:6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0]
    p[:6] = [1.0, np.nan, 2.0, 0.0, 3.0, -np.inf]
    p[50:60] = np.abs(p[50:60])
    check(k, [a, p])


def test_max_propagates_nan_like_numpy():
    k = row_max(6, 37)
    (x,) = inputs_for(k)
    x[0, 0] = np.nan  # first element
    x[1, 17] = np.nan  # mid-row (inside a SIMD chunk)
    x[2, 36] = np.nan  # last element (the scalar tail)
    x[3, :] = -np.inf
    x[4, 5] = np.inf
    m, z = check(k, [x])
    assert np.isnan(m[:3, 0]).all() and m[3, 0] == -np.inf and m[4, 0] == np.inf
    assert np.isnan(z[0, 0]) and np.isnan(z[1, 17]) and np.isnan(z[2, 36])
    np.testing.assert_allclose(m[5, 0], torch.max(t(x[5])).item(), rtol=0, atol=0)


def test_inputs_are_converted_and_made_contiguous():
    k = gelu_residual(8, 16)
    x, bias, res = inputs_for(k, seed=1)
    wide = np.zeros((8, 32), np.float64)
    wide[:, ::2] = x  # a float64, non-contiguous view
    ints = np.arange(16, dtype=np.int32)
    (y,) = codegen_cpp.build(k)(wide[:, ::2], ints, res)
    (ref,) = evaluate(k, [x, ints.astype(np.float32), res])
    np.testing.assert_allclose(y, ref, **TOL["float32"])


def test_bad_arguments_name_the_argument():
    k = layer_norm(4, 8)
    ck = codegen_cpp.build(k)
    x, w, b = inputs_for(k)
    with pytest.raises(ValueError, match=r"takes 3 inputs \['x', 'w', 'b'\], got 2"):
        ck(x, w)
    with pytest.raises(ValueError, match=r"arrays\[1\] \('w'\): shape \(9,\), kernel expects \(8,\)"):
        ck(x, np.zeros(9, np.float32), b)
    with pytest.raises(ValueError, match=r"arrays\[0\] \('x'\): dtype complex64"):
        ck(x.astype(np.complex64), w, b)


def test_source_is_one_extern_c_function_with_openmp_and_cmath():
    k32, k64 = gelu_residual(512, 512), layer_norm(4, 8, "float64")
    src32, src64 = codegen_cpp.build(k32).source, codegen_cpp.build(k64).source
    assert 'extern "C" void tl_gelu_residual(const float* __restrict in0' in src32
    assert "int64_t n_i0, int64_t n_i1)" in src32 and "erff(" in src32  # the broadcast bias keeps rows x cols
    assert "#pragma omp parallel for schedule(static)\n  for (int64_t i0" in src32
    flat = codegen_cpp.build(all_ops(8192)).source  # contiguous everywhere: one loop, threads and SIMD
    assert "int64_t n_i0)" in flat and "#pragma omp parallel for simd schedule(static)" in flat
    assert "const double* __restrict in0" in src64 and "sqrt(" in src64 and "sqrtf(" not in src64
    assert "#pragma omp simd reduction(+:acc" in src64


def test_schedule_argument_forms():
    k = transposed_add(40, 50)
    xs = inputs_for(k)
    (ref,) = evaluate(k, xs)
    tiled = codegen_cpp.build(k, lambda n: n.tile("i0", 8).tile("i1", 16).reorder("i0_o", "i1_o", "i0", "i1"))
    assert "tl_imin(" in tiled.source and "i1_o += 16" in tiled.source
    np.testing.assert_allclose(tiled(*xs)[0], ref, **TOL["float32"])
    nest = lower(k).unroll("i1", 4).parallelize("i0")
    ck = codegen_cpp.build(k, nest)
    assert "#pragma GCC unroll 4" in ck.source and ck.nest is nest
    np.testing.assert_allclose(ck(*xs)[0], ref, **TOL["float32"])
    with pytest.raises(ValueError, match="schedule: a loop nest of kernel 'softmax'"):
        codegen_cpp.build(k, lower(softmax(2, 2)))
    with pytest.raises(ValueError, match="schedule: expected None, a LoopNest or a callable, got str"):
        codegen_cpp.build(k, "fast")


def test_own_float32_exp_erf_tanh_within_3_ulp_and_special_values():
    """float32 exp/erf/tanh/sigmoid are the vectorisable tl_expf/tl_erff/tl_tanhf (not libm): within 3 ulp of a
    float64 reference on normal results; NaN, +-inf, -0 as numpy; tiny results within one denormal step."""
    from scipy.special import erf

    n = 200_003
    x = np.concatenate([np.linspace(-110, 95, n // 2), np.linspace(-6, 6, n - n // 2)]).astype(np.float32)
    x[:8] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 88.72, -103.9, 1e-30]
    b = Body()
    r = b.load(0)
    ops = ["exp", "erf", "tanh", "sigmoid"]
    for j, op in enumerate(ops):
        b.store(b.op(op, r), j)
    outs = [Buffer(f"o{j}", (n,), "float32", (1,)) for j in range(len(ops))]
    k = FusedKernel("math32", (n,), 0, [Buffer("x", (n,), "float32", (1,))], outs, b.instrs)
    ck = codegen_cpp.build(k)
    assert "tl_erff(r0)" in ck.source and "erff(" not in ck.source.replace("tl_erff(", "")
    xd = x.astype(np.float64)
    with np.errstate(all="ignore"):
        refs = [np.exp(xd), erf(xd), np.tanh(xd), 1 / (1 + np.exp(-xd))]
        got = ck(x)
        r32s = [r.astype(np.float32) for r in refs]
    for op, g, ref, r32 in zip(ops, got, refs, r32s):
        normal = np.isfinite(r32) & (np.abs(r32) >= np.finfo(np.float32).tiny)
        ulp = np.abs(g[normal] - ref[normal]) / np.spacing(np.abs(r32[normal]))
        assert ulp.max() <= 3, f"{op}: {ulp.max():.2f} ulp at x={x[normal][ulp.argmax()]}"
        np.testing.assert_array_equal(g[:5], r32[:5], err_msg=f"{op}: nan, inf, -inf, 0, -0")
        assert np.signbit(g[4]) == (op in ("erf", "tanh")), f"{op}(-0)"
    tiny = ~np.isfinite(r32s[0]) | (r32s[0] < np.finfo(np.float32).tiny)  # exp's overflow and denormal results
    np.testing.assert_allclose(got[0][tiny], r32s[0][tiny], rtol=0, atol=2e-45)


def test_float32_sums_are_blocked_and_accurate_on_long_rows():
    """float32 sums: float per-lane partial sums within SUM_BLOCK blocks, block totals in double: a 1M-element
    row of same-sign values (the worst case for naive float summation) within 1e-6 of the float64 sum."""
    n = 1 << 20
    b = Body()
    b.store(b.op("sum", b.op("exp", b.load(0))), 0)
    k = FusedKernel(
        "rowsum",
        (2, n),
        1,
        [Buffer("x", (2, n), "float32", (n, 1))],
        [Buffer("s", (2, 1), "float32", (1, 0))],
        b.instrs,
    )
    ck = codegen_cpp.build(k)
    assert f"j0_b += {codegen_cpp.SUM_BLOCK}" in ck.source and "float bacc2 = 0;" in ck.source
    assert "double acc2 = 0;" in ck.source and "#pragma omp simd reduction(+:bacc2)" in ck.source
    x = np.random.default_rng(0).uniform(-1, 1, (2, n)).astype(np.float32)
    (s,) = ck(x)
    np.testing.assert_allclose(s[:, 0], np.exp(x.astype(np.float64)).sum(1), rtol=1e-6)


@pytest.mark.skipif("g++" not in codegen_cpp.cc.compiler() and "gcc" not in codegen_cpp.cc.compiler(), reason="gcc")
@pytest.mark.parametrize("level", ["scalar", "avx2", None])
def test_gcc_vectorises_every_loop_of_softmax_and_gelu(level):
    """-fopt-info-vec-optimized at each instruction-set level (SSE2 baseline, AVX2, native): every innermost loop
    of the softmax kernel (max; exp + sum; store) and the GELU point-wise loop are reported vectorised (an
    unvectorised loop is 4-16x slower; without -fno-trapping-math the erf/exp loops stayed scalar on SSE2/AVX2)."""
    import re
    import subprocess

    if level is not None and codegen_cpp.cc.platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("x86-64 instruction-set levels")
    for kernel, lines in ((softmax(64, 2048), 3), (gelu_residual(64, 2048), 1)):
        src = codegen_cpp.emit(codegen_cpp.default_schedule(codegen_cpp.lower(kernel)))
        fn_line = next(i for i, x in enumerate(src.splitlines(), 1) if x.startswith('extern "C"'))
        cmd = [codegen_cpp.cc.compiler(), *codegen_cpp.cc.flags(level), "-fopt-info-vec-optimized", "-x", "c++", "-"]
        proc = subprocess.run([*cmd, "-o", "/dev/null"], input=src, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[:2000]
        vec = {int(m) for m in re.findall(r"<stdin>:(\d+):\d+: optimized: loop vectorized", proc.stderr)}
        assert len([v for v in vec if v > fn_line]) >= lines, (kernel.name, level, proc.stderr[:2000])
