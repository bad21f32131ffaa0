"""Property tests (hypothesis): random shapes (incl. empty dims) and strides, every backend against torch, and
random garbage that must raise the documented exception type. Small ``max_examples``: the run stays well under 60 s.

Issue 14's property suite: conv im2col and its adjoint col2im, kernels softmax and layer_norm (torch + shift/scale
invariance), sparse CSR/ELL matmul, quantize/dequantize (round-trip bound, monotonicity, torch bit-exactness), gemm
(every backend/version vs numpy on random shapes incl. 0-size dims and non-contiguous strides), allocator argument
types.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tinylearn as tl
import tinylearn.gemm  # noqa: F401  (registers the gemm backends)
from tinylearn import backends

FAST = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CONV_BACKENDS = [b for b in ("numpy", "numba", "cpp") if b != "cpp" or backends.C_available("conv")]


@FAST
@given(
    n=st.integers(0, 2),
    c=st.integers(1, 3),
    h=st.integers(1, 7),
    w=st.integers(1, 7),
    k=st.integers(1, 3),
    s=st.integers(1, 3),
    p=st.integers(0, 2),
    d=st.integers(1, 2),
    seed=st.integers(0, 2**16),
)
@pytest.mark.parametrize("backend", CONV_BACKENDS)
def test_im2col_matches_torch_unfold(backend, n, c, h, w, k, s, p, d, seed):
    x = np.random.default_rng(seed).standard_normal((n, c, h, w)).astype(np.float32)
    if d * (k - 1) + 1 > min(h, w) + 2 * p:
        with pytest.raises(ValueError):
            tl.conv.im2col(x, k, stride=s, padding=p, dilation=d, backend=backend)
        return
    got = tl.conv.im2col(x, k, stride=s, padding=p, dilation=d, backend=backend)
    ref = torch.nn.functional.unfold(torch.from_numpy(x), k, dilation=d, padding=p, stride=s).numpy()
    np.testing.assert_array_equal(got, ref)


@FAST
@given(rows=st.integers(0, 5), cols=st.integers(1, 40), transpose=st.booleans(), seed=st.integers(0, 2**16))
@pytest.mark.parametrize("backend", [b for b in tl.kernels.available_backends() if b != "triton"])
def test_softmax_matches_torch(backend, rows, cols, transpose, seed):
    x = np.random.default_rng(seed).standard_normal((cols, rows) if transpose else (rows, cols)).astype(np.float32)
    x = x.T if transpose else x  # non-contiguous input
    got = tl.kernels.softmax(x, dim=-1, backend=backend)
    ref = torch.softmax(torch.from_numpy(np.ascontiguousarray(x)), dim=-1).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


@FAST
@given(garbage=st.one_of(st.floats(), st.text(max_size=3), st.none(), st.booleans()))
def test_softmax_dim_garbage_is_typeerror(garbage):
    with pytest.raises(TypeError, match="dim"):
        tl.kernels.softmax(np.ones((2, 3), np.float32), dim=garbage)


@FAST
@given(m=st.integers(0, 6), k=st.integers(0, 6), n=st.integers(1, 4), density=st.floats(0, 1), seed=st.integers(0, 99))
@pytest.mark.parametrize("fmt", ["CSR", "ELL"])
@pytest.mark.parametrize("backend", ["numpy", "numba", "cpp"])
def test_sparse_matmul_matches_dense(fmt, backend, m, k, n, density, seed):
    r = np.random.default_rng(seed)
    a = (r.standard_normal((m, k)) * (r.random((m, k)) < density)).astype(np.float32)
    b = r.standard_normal((k, n)).astype(np.float32)
    s = getattr(tl.sparse, fmt).from_dense(a)
    assert not s.indices.flags.writeable  # validated index arrays are frozen
    np.testing.assert_allclose(s.matmul(b, backend=backend), a @ b, rtol=1e-5, atol=1e-5)


@FAST
@given(bad=st.one_of(st.floats(), st.none(), st.booleans(), st.text(max_size=3)))
@pytest.mark.parametrize("backend", ["python", "cpp"])
def test_allocator_garbage_sizes_are_typeerror_and_leave_state(backend, bad):
    a = tl.memory.FirstFitAllocator(1 << 16, backend=backend)
    with pytest.raises(TypeError, match="nbytes"):
        a.malloc(bad)
    assert a.stats()["n_alloc"] == 0


# ------------------------------------------------------------------------------------------------------ col2im
def _geometry_ok(h: int, w: int, k: int, p: int, d: int) -> bool:
    return d * (k - 1) + 1 <= min(h, w) + 2 * p


@FAST
@given(
    n=st.integers(0, 2),
    c=st.integers(1, 3),
    h=st.integers(1, 7),
    w=st.integers(1, 7),
    k=st.integers(1, 3),
    s=st.integers(1, 3),
    p=st.integers(0, 2),
    d=st.integers(1, 2),
    seed=st.integers(0, 2**16),
)
@pytest.mark.parametrize("backend", CONV_BACKENDS)
def test_col2im_is_the_adjoint_of_im2col(backend, n, c, h, w, k, s, p, d, seed):
    """<im2col(x), y> == <x, col2im(y)> for every x, y: col2im is im2col's transpose (sums overlapping patches)."""
    if backend == "cpp" and n == 0:
        n = 1  # cpp col2im rejects an empty batch: see test_col2im_cpp_empty_batch (known bug, reported)
    if not _geometry_ok(h, w, k, p, d):
        with pytest.raises(ValueError):
            tl.conv.col2im(np.ones((n, c * k * k, 1)), (h, w), k, stride=s, padding=p, dilation=d, backend=backend)
        return
    r = np.random.default_rng(seed)
    x = r.standard_normal((n, c, h, w))
    cols = tl.conv.im2col(x, k, stride=s, padding=p, dilation=d, backend=backend)
    y = r.standard_normal(cols.shape)
    back = tl.conv.col2im(y, (h, w), k, stride=s, padding=p, dilation=d, backend=backend)
    assert back.shape == x.shape and back.dtype == np.float64
    lhs, rhs = float(np.vdot(cols, y)), float(np.vdot(x, back))
    assert abs(lhs - rhs) <= 1e-10 * max(1.0, abs(lhs)), (lhs, rhs)
    ref = torch.nn.functional.fold(torch.from_numpy(y), (h, w), k, dilation=d, padding=p, stride=s).numpy()
    np.testing.assert_allclose(back, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(not backends.C_available("conv"), reason="tinylearn._C not built")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_col2im_cpp_empty_batch(dtype):
    # an empty batch gives an empty result, like numpy/numba, torch's fold and cpp im2col (it used to raise a
    # mislabelled 'batch: must be positive for layout KNL' on NKL input)
    cols = np.ones((0, 8, 1), dtype)
    ref = torch.nn.functional.fold(torch.from_numpy(cols), (2, 2), 2).numpy()
    for backend in ("cpp", "numpy"):
        got = tl.conv.col2im(cols, (2, 2), 2, backend=backend)
        assert got.shape == ref.shape == (0, 2, 2, 2) and got.dtype == dtype, (backend, got.shape, got.dtype)


@FAST
@given(h=st.integers(3, 6), w=st.integers(3, 6), transpose=st.booleans(), seed=st.integers(0, 2**16))
@pytest.mark.parametrize("backend", CONV_BACKENDS)
def test_col2im_non_contiguous_cols(backend, h, w, transpose, seed):
    k = 2
    L = (h - k + 1) * (w - k + 1)
    base = np.random.default_rng(seed).standard_normal((1, L, 3 * k * k) if transpose else (1, 3 * k * k, 2 * L))
    cols = base.transpose(0, 2, 1) if transpose else base[:, :, ::2]  # strided views
    assert not cols.flags.c_contiguous
    got = tl.conv.col2im(cols, (h, w), k, backend=backend)
    ref = torch.nn.functional.fold(torch.from_numpy(np.ascontiguousarray(cols)), (h, w), k).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


# -------------------------------------------------------------------------------------------------- layer_norm
LN_BACKENDS = [b for b in tl.kernels.available_backends() if b not in ("triton", "cuda")]


@FAST
@given(
    rows=st.integers(0, 5),
    cols=st.integers(1, 33),
    transpose=st.booleans(),
    affine=st.booleans(),
    eps=st.sampled_from([1e-5, 1e-3, 0.5]),
    seed=st.integers(0, 2**16),
)
@pytest.mark.parametrize("backend", LN_BACKENDS)
def test_layer_norm_matches_torch(backend, rows, cols, transpose, affine, eps, seed):
    r = np.random.default_rng(seed)
    x = (r.standard_normal((cols, rows) if transpose else (rows, cols)) * 3 + 1).astype(np.float32)
    x = x.T if transpose else x  # non-contiguous input
    w = r.standard_normal(cols).astype(np.float32) if affine else None  # None: weight 1
    b = r.standard_normal(cols).astype(np.float32) if affine else np.zeros(cols, np.float32)
    got = tl.kernels.layer_norm(x, w, b, eps=eps, backend=backend)
    tw, tb = (torch.from_numpy(w) if affine else None), torch.from_numpy(b)
    ref = torch.nn.functional.layer_norm(torch.from_numpy(np.ascontiguousarray(x)), (cols,), tw, tb, eps).numpy()
    assert got.shape == x.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


@FAST
@given(
    rows=st.integers(1, 4),
    cols=st.integers(1, 40),
    shift=st.floats(-100, 100),
    scale=st.floats(0.01, 100),
    constant_row=st.booleans(),
    seed=st.integers(0, 2**16),
)
@pytest.mark.parametrize("backend", LN_BACKENDS)
def test_layer_norm_shift_and_scale_invariance(backend, rows, cols, shift, scale, constant_row, seed):
    """var(a*x + b) = a^2 var(x), so LN(a*x + b, eps*a^2) == LN(x, eps) exactly in real arithmetic (a > 0)."""
    r = np.random.default_rng(seed)
    x = r.standard_normal((rows, cols))
    if constant_row:
        x[0] = 0.7  # zero variance: output is 0 (times weight) + bias, not NaN
    w, b = r.standard_normal(cols), r.standard_normal(cols)
    eps = 1e-3
    y = tl.kernels.layer_norm(x, w, b, eps=eps, backend=backend)
    y2 = tl.kernels.layer_norm(scale * x + shift, w, b, eps=eps * scale**2, backend=backend)
    assert np.all(np.isfinite(y))
    np.testing.assert_allclose(y2, y, rtol=1e-7, atol=1e-7)
    if constant_row:
        np.testing.assert_allclose(y[0], b, rtol=0, atol=1e-12)
    # normalised (weight 1, bias 0) rows have mean 0 and (biased) variance var / (var + eps)
    z = tl.kernels.layer_norm(x, None, np.zeros(cols), eps=eps, backend=backend)
    var = x.var(axis=1)
    np.testing.assert_allclose(z.mean(axis=1), 0, atol=1e-12)
    np.testing.assert_allclose(z.var(axis=1), var / (var + eps), rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------------------------------------- quantize/dequantize
QUANT_BACKENDS = ["numpy"] + (["cpp"] if backends.C_available("quant_affine") else [])


@FAST
@given(
    n=st.integers(0, 300),
    scale=st.floats(1e-4, 10),
    dtype=st.sampled_from(["int8", "uint8"]),
    zfrac=st.floats(0, 1),
    seed=st.integers(0, 2**16),
)
@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")
@pytest.mark.parametrize("backend", QUANT_BACKENDS)
def test_quantize_round_trip_and_monotone(backend, n, scale, dtype, zfrac, seed):
    qmin, qmax = tl.quant.affine.qrange(dtype)
    z = int(round(qmin + zfrac * (qmax - qmin)))
    s = float(np.float32(scale))
    lo, hi = (qmin - z) * s, (qmax - z) * s  # the representable range
    r = np.random.default_rng(seed)
    x = np.sort(r.uniform(lo - 3 * s, hi + 3 * s, n).astype(np.float32))
    q = tl.quant.quantize(x, s, z, dtype=dtype, backend=backend)
    assert q.dtype == (np.int8 if dtype == "int8" else np.uint8) and q.shape == x.shape
    assert np.all(np.diff(q.astype(np.int64)) >= 0)  # monotone: sorted in, sorted out
    xh = tl.quant.dequantize(q, s, z, backend=backend)
    assert xh.dtype == np.float32
    inside = (x >= lo) & (x <= hi)
    err = np.abs(xh[inside].astype(np.float64) - x[inside])
    assert np.all(err <= s / 2 * (1 + 1e-5) + 1e-6 * np.abs(x[inside])), err.max(initial=0) / s
    # outside the range the codes saturate at qmin / qmax
    assert np.all(q[x < lo - s] == qmin) and np.all(q[x > hi + s] == qmax)
    ref = torch.quantize_per_tensor(torch.from_numpy(x), s, z, torch.qint8 if dtype == "int8" else torch.quint8)
    np.testing.assert_array_equal(q, ref.int_repr().numpy())


@FAST
@given(bad=st.sampled_from([0.0, -1.0, float("nan"), float("inf"), "a", "1.0", None, [1.0, "x"], {"s": 1}]))
def test_quantize_garbage_scale_raises(bad):
    with pytest.raises((TypeError, ValueError), match="scale"):
        tl.quant.quantize(np.ones(4, np.float32), bad, 0)


# -------------------------------------------------------------------------------------------------------- gemm
GEMM_CASES = [("numpy", None)] + [("numba", None)]
if backends.C_available("gemm"):
    GEMM_CASES += [("cpp", v) for v in tl.gemm.versions("cpp")]


def _layout(r: np.random.Generator, rows: int, cols: int, kind: str, dtype: type) -> np.ndarray:
    if kind == "c":
        return r.standard_normal((rows, cols)).astype(dtype)
    if kind == "t":  # transposed (Fortran order)
        return r.standard_normal((cols, rows)).astype(dtype).T
    if kind == "step":  # every other row and column of a bigger array
        return r.standard_normal((2 * rows, 2 * cols)).astype(dtype)[::2, ::2]
    return r.standard_normal((rows, cols + 3)).astype(dtype)[:, 1 : cols + 1]  # "slice": padded leading dimension


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(0, 37),
    k=st.integers(0, 37),
    n=st.integers(0, 37),
    la=st.sampled_from(["c", "t", "step", "slice"]),
    lb=st.sampled_from(["c", "t", "step", "slice"]),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**16),
)
@pytest.mark.parametrize(("backend", "version"), GEMM_CASES)
def test_gemm_matches_numpy(backend, version, m, k, n, la, lb, dtype, seed):
    r = np.random.default_rng(seed)
    a, b = _layout(r, m, k, la, dtype), _layout(r, k, n, lb, dtype)
    got = tl.gemm.matmul(a, b, backend=backend, version=version)
    assert got.shape == (m, n) and got.dtype == dtype
    ref = a.astype(np.float64) @ b.astype(np.float64)
    tol = (1e-4 if dtype == np.float32 else 1e-10) * max(1, k)
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)


@FAST
@given(
    bad=st.sampled_from(
        [
            ("a", np.ones((2, 2), np.int32)),
            ("a", np.ones(3, np.float32)),
            ("a", [[1.0]]),
            ("b", np.ones((3, 2), np.float32)),
            ("b", np.ones((2, 2), np.float64)),
            ("b", np.ones((2, 2, 2), np.float32)),
        ]
    )
)
def test_gemm_garbage_raises_naming_the_argument(bad):
    name, value = bad
    a, b = np.ones((2, 2), np.float32), np.ones((2, 2), np.float32)
    a, b = (value, b) if name == "a" else (a, value)
    with pytest.raises((TypeError, ValueError), match=f"^{name}:"):
        tl.gemm.matmul(a, b)
