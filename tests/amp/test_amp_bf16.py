"""bfloat16 kernels behind tl.autocast: the C++ bf16 GEMM (gemm.cpp ``bf16_matmul``, ``tl.amp.bf16_ops``), the casts
and the ReLU on bf16 bits (cpp_src/amp_bf16.cpp), on every CPU path this machine has, against numpy/fp64 references
and torch; and autocast routing Linear / MatMul / ReLU to them."""

from __future__ import annotations

import numpy as np
import pytest

from tinylearn import backends
from tinylearn.amp import bf16_bits, bfloat16
from tinylearn.amp.bf16_ops import BF16_MATMUL, TO_BF16, bf16_matmul, to_bf16

pytestmark = pytest.mark.skipif(not backends.C_available("amp"), reason="tinylearn._C (amp) is not built")

PATHS = [p for p in ("scalar", "avx2", "avx512") if p == "scalar" or p in backends.load_C("gemm").isa_paths()]


@pytest.fixture(params=PATHS)
def cpu_path(request, monkeypatch):
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", request.param)
    return request.param


def _bf(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(bfloat16)


def _exact_bound(a, b):
    """fp32 accumulation error bound of sum_k a_ik b_kj (values exact in fp32): K * eps32 * sum |a||b|."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return a.shape[1] * 2.0**-24 * (np.abs(a64) @ np.abs(b64)) + 1e-30


# ---------------------------------------------------------------------------------------------------- GEMM
@pytest.mark.parametrize(("m", "k", "n"), [(1, 1, 1), (1, 512, 300), (17, 33, 9), (70, 260, 40), (256, 64, 513)])
def test_bf16_gemm_is_fp32_accumulation_of_bf16_values(cpu_path, m, k, n):
    rng = np.random.default_rng(m * 7 + k + n)
    a, b = _bf(rng, (m, k)), _bf(rng, (k, n))
    g = backends.load_C("gemm")
    c32 = g.bf16_matmul(a.view(np.uint16), b.view(np.uint16), out="float32")
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert c32.dtype == np.float32 and c32.shape == (m, n)
    assert (np.abs(c32 - ref) <= _exact_bound(a, b)).all()
    # out="bfloat16" is that fp32 result rounded once, to nearest even (same summation order: same bits)
    c16 = g.bf16_matmul(a.view(np.uint16), b.view(np.uint16), out="bfloat16")
    assert c16.dtype == np.uint16 and np.array_equal(c16, bf16_bits(c32))


@pytest.mark.parametrize("version", ["simd", "parallel"])
def test_bf16_matmul_strided_operands_match_reference(cpu_path, version):
    rng = np.random.default_rng(1)
    base_a, base_b = _bf(rng, (40, 90)), _bf(rng, (70, 60))
    views = [
        (base_a[:, :70], base_b),  # row stride larger than the width
        (base_a[::2, ::-1][:, :70], base_b[::-1]),  # step and negative strides
        (base_b[:, :40].T, base_a[:, :70].T),  # transposed views
    ]
    for a, b in views:
        got = bf16_matmul(a, b, backend="cpp", version=version).astype(np.float64)
        ref = a.astype(np.float64) @ b.astype(np.float64)
        # one bf16 rounding (half an ulp: 2^-9 relative) on top of the fp32 accumulation error
        assert (np.abs(got - ref) <= 2.0**-8 * np.abs(ref) + _exact_bound(a, b)).all()


def test_bf16_matmul_integer_inputs_are_bitwise_equal_across_backends(cpu_path):
    rng = np.random.default_rng(2)
    a = rng.integers(-8, 9, (33, 130)).astype(bfloat16)
    b = rng.integers(-8, 9, (130, 21)).astype(bfloat16)
    bias = rng.integers(-50, 51, 21).astype(bfloat16)
    want = bf16_matmul(a, b, bias, backend="numpy")
    for v in ("simd", "parallel"):
        got = bf16_matmul(a, b, bias, backend="cpp", version=v)
        assert got.dtype == bfloat16 and np.array_equal(got.view(np.uint16), want.view(np.uint16))


def test_bf16_matmul_bias_is_added_before_the_one_rounding():
    # the bf16 ulp at 1 is 2^-7. a @ b = 1 + 3*2^-10 (0.375 ulp above 1, fp32-exact), bias = 3*2^-10: one rounding of
    # the fp32 sum 1 + 0.75 ulp gives 1 + 2^-7; rounding the product first (to 1) and then 1 + 0.375 ulp gives 1
    a = np.array([[1.0, 3 * 2.0**-10]], np.float32).astype(bfloat16)
    b = np.array([[1.0], [1.0]], np.float32).astype(bfloat16)
    bias = np.array([3 * 2.0**-10], np.float32).astype(bfloat16)
    assert float(a[0, 1]) == 3 * 2.0**-10 and float(bias[0]) == 3 * 2.0**-10
    for backend in ("cpp", "numpy"):
        assert float(bf16_matmul(a, b, bias, backend=backend)[0, 0]) == 1 + 2.0**-7
    twice = (bf16_matmul(a, b, backend="cpp").astype(np.float32) + bias.astype(np.float32)).astype(bfloat16)
    assert float(twice[0, 0]) == 1.0


DPBF16 = backends.load_C("gemm").bf16_dot_path() == "dpbf16"
needs_dpbf16 = pytest.mark.skipif(not DPBF16, reason="this CPU has no AVX512_BF16 (vdpbf16ps)")


@needs_dpbf16
@pytest.mark.parametrize(("m", "k", "n"), [(1, 1, 1), (6, 2, 32), (17, 33, 9), (70, 261, 40), (130, 1030, 70)])
@pytest.mark.parametrize("threads", [1, 0])
def test_dpbf16_kernel_is_fp32_accumulation_of_exact_products(m, k, n, threads):
    """The AVX512_BF16 kernel (odd K: the last pair's high half is zero; edges no 6x32 tile divides) stays within the
    fp32 accumulation bound of the exact sum, and on integer inputs equals the widening kernel bit for bit."""
    g = backends.load_C("gemm")
    rng = np.random.default_rng(m + k + n)
    a, b = _bf(rng, (m, k)), _bf(rng, (k, n))
    got = g.bf16_matmul(a.view(np.uint16), b.view(np.uint16), out="float32", threads=threads, dot="dpbf16")
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert (np.abs(got - ref) <= _exact_bound(a, b)).all()
    ai = rng.integers(-8, 9, (m, k)).astype(bfloat16)
    bi = rng.integers(-8, 9, (k, n)).astype(bfloat16)
    dp = g.bf16_matmul(ai.view(np.uint16), bi.view(np.uint16), out="bfloat16", threads=threads, dot="dpbf16")
    wd = g.bf16_matmul(ai.view(np.uint16), bi.view(np.uint16), out="bfloat16", threads=threads, dot="widen")
    assert np.array_equal(dp, wd)


@needs_dpbf16
def test_dpbf16_strided_views_and_auto_choice(monkeypatch):
    g = backends.load_C("gemm")
    rng = np.random.default_rng(4)
    base_a, base_b = _bf(rng, (40, 91)), _bf(rng, (71, 60))
    for a, b in [(base_a[::2, ::-1][:, :71], base_b[::-1]), (base_b[:, :40].T, base_a[:, :71].T)]:
        got = g.bf16_matmul(a.view(np.uint16), b.view(np.uint16), out="float32", dot="dpbf16")
        assert (np.abs(got - a.astype(np.float64) @ b.astype(np.float64)) <= _exact_bound(a, b)).all()
    assert g.bf16_dot_path() == "dpbf16" and g.bf16_dot_path("avx2") == "widen"
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", "avx2")  # the x86-64-v3 level has no AVX512_BF16
    assert g.bf16_dot_path() == "widen"
    with pytest.raises(ValueError, match="dot='dpbf16' needs AVX512_BF16 on the avx512 path"):
        g.bf16_matmul(base_a.view(np.uint16), base_a.T.view(np.uint16), dot="dpbf16")


@needs_dpbf16
def test_dpbf16_treats_subnormal_inputs_as_zero_the_widening_kernel_does_not():
    """The one numeric difference (Intel SDM, VDPBF16PS: DAZ): a bf16 subnormal (2^-130 here) times 2^100."""
    g = backends.load_C("gemm")
    a = np.array([[2.0**-130, 1.0]], np.float32).astype(bfloat16)
    b = np.array([[2.0**100], [0.0]], np.float32).astype(bfloat16)
    assert float(a[0, 0]) == 2.0**-130  # representable: a bf16 subnormal
    wd = g.bf16_matmul(a.view(np.uint16), b.view(np.uint16), out="float32", dot="widen")
    dp = g.bf16_matmul(a.view(np.uint16), b.view(np.uint16), out="float32", dot="dpbf16")
    assert wd[0, 0] == 2.0**-30 and dp[0, 0] == 0.0


def test_bf16_matmul_dot_argument_is_checked():
    g = backends.load_C("gemm")
    a16 = np.zeros((3, 4), np.uint16)
    with pytest.raises(ValueError, match="dot must be 'auto', 'widen' or 'dpbf16', got 'fast'"):
        g.bf16_matmul(a16, a16.T, dot="fast")
    assert g.bf16_dot_path("scalar") == "widen"
    if not DPBF16:
        with pytest.raises(ValueError, match="dot='dpbf16' needs AVX512_BF16"):
            g.bf16_matmul(a16, a16.T, dot="dpbf16")


def test_bf16_matmul_empty_and_zero_k():
    g = backends.load_C("gemm")
    z = np.zeros((0, 5), np.uint16)
    assert g.bf16_matmul(z, np.zeros((5, 3), np.uint16)).shape == (0, 3)
    c = g.bf16_matmul(np.zeros((4, 0), np.uint16), np.zeros((0, 3), np.uint16), out="bfloat16")
    assert c.shape == (4, 3) and (c == 0).all()


def test_bf16_matmul_bad_input_names_the_argument():
    g = backends.load_C("gemm")
    a16 = np.zeros((3, 4), np.uint16)
    with pytest.raises(TypeError, match="a must be the uint16 bit patterns"):
        g.bf16_matmul(np.zeros((3, 4), np.float32), a16.T)
    with pytest.raises(ValueError, match="b must be 2-D"):
        g.bf16_matmul(a16, np.zeros(4, np.uint16))
    with pytest.raises(ValueError, match="inner dimensions differ"):
        g.bf16_matmul(a16, a16)
    with pytest.raises(ValueError, match="out must be 'float32' or 'bfloat16', got 'int8'"):
        g.bf16_matmul(a16, a16.T, out="int8")
    with pytest.raises(ValueError, match=r"bias must have shape \(3,\)"):
        g.bf16_matmul(a16, a16.T, bias=np.zeros(4, np.uint16))
    with pytest.raises(TypeError, match="bias must be the uint16"):
        g.bf16_matmul(a16, a16.T, bias=np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="threads must be >= 0"):
        g.bf16_matmul(a16, a16.T, threads=-1)
    b = np.zeros((3, 4), bfloat16)
    with pytest.raises(TypeError, match="a: dtype must be bfloat16, got float32"):
        bf16_matmul(np.zeros((3, 4), np.float32), b.T)
    with pytest.raises(ValueError, match=r"bias: expected shape \(3,\)"):
        bf16_matmul(b, b.T, np.zeros(4, bfloat16))
    with pytest.raises(TypeError, match="bias: expected a bfloat16"):
        bf16_matmul(b, b.T, np.zeros(3, np.float32))


def test_registry_picks_the_cpp_bf16_gemm_on_every_path(monkeypatch):
    rng = np.random.default_rng(3)
    a, b = _bf(rng, (5, 6)), _bf(rng, (6, 7))
    assert backends.resolve(BF16_MATMUL, args=(a, b))[:2] == ("cpp", "parallel")
    assert backends.versions(BF16_MATMUL, "cpp") == ["simd", "parallel"]
    # the scalar level runs the portable packed kernel (the same numbers up to summation order)
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", "scalar")
    a, b = _bf(rng, (40, 300)), _bf(rng, (300, 50))
    got = backends.load_C("gemm").bf16_matmul(a.view(np.uint16), b.view(np.uint16))
    assert (np.abs(got - a.astype(np.float64) @ b.astype(np.float64)) <= _exact_bound(a, b)).all()


# ---------------------------------------------------------------------------------------------------- casts
SPECIAL = np.array(
    [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 3.4e38, -3.4e38, 1e-40, -1e-40, 1.00390625, 1.01171875, 1.0078125,
     -2.0, 3.3961e38, 65504.0, 1e-45, -1e-45, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8],
    np.float32,
)  # fmt: skip


def test_to_bf16_rounds_to_nearest_even_on_every_path(cpu_path):
    rng = np.random.default_rng(4)
    x = np.concatenate([SPECIAL, (rng.standard_normal(1000) * 1e3).astype(np.float32)])
    for backend in ("cpp", "numpy"):
        got = to_bf16(x, backend=backend).view(np.uint16)
        fin = ~np.isnan(x)
        assert np.array_equal(got[fin], bf16_bits(x)[fin])
        assert np.isnan(got.view(bfloat16).astype(np.float32)[~fin]).all()
    assert np.array_equal(to_bf16(x, backend="cpp").view(np.uint16), bf16_bits(x))  # NaN -> the quiet 0x7FC0
    back = np.empty(x.shape, np.float32)
    backends.load_C("amp").from_bf16(bf16_bits(x), back)
    assert np.array_equal(back.view(np.uint32), bf16_bits(x).astype(np.uint32) << 16)


def test_to_bf16_layouts_and_bad_input():
    x = np.arange(24, dtype=np.float32).reshape(4, 6) / 7
    assert np.array_equal(to_bf16(x.T).view(np.uint16), bf16_bits(x.T))  # non-contiguous: numpy's astype
    assert backends.resolve(TO_BF16, args=(x.T,))[0] == "numpy" and backends.resolve(TO_BF16, args=(x,))[0] == "cpp"
    with pytest.raises(TypeError, match="x: expected a float32 numpy.ndarray, got float64"):
        to_bf16(x.astype(np.float64))
    amp = backends.load_C("amp")
    with pytest.raises(ValueError, match="out has shape"):
        amp.to_bf16(x, np.empty(5, np.uint16))
    with pytest.raises(ValueError, match="must be C-contiguous"):
        amp.to_bf16(x.T, np.empty((6, 4), np.uint16))
    with pytest.raises(TypeError, match="out must have dtype uint16"):
        amp.to_bf16(x, np.empty((4, 6), np.int16))


def test_from_bf16_registered_cast_is_exact_and_routes_layouts():
    """amp.from_bf16 (autocast's cast up): C++ for contiguous bf16, numpy's astype otherwise; exact either way; an
    autocast conv's input rounding and the casts of its gradients run it."""
    from tinylearn.amp.bf16_ops import FROM_BF16, from_bf16

    rng = np.random.default_rng(6)
    x = to_bf16(np.concatenate([SPECIAL, (rng.standard_normal(980) * 1e3).astype(np.float32)]).reshape(40, 25))
    want = x.view(np.uint16).astype(np.uint32) << 16
    for backend in ("cpp", "numpy"):
        got = from_bf16(x, backend=backend)
        assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want)
    assert np.array_equal(from_bf16(x.T).view(np.uint32), want.T)  # non-contiguous: numpy's astype
    assert backends.resolve(FROM_BF16, args=(x.T,))[0] == "numpy" and backends.resolve(FROM_BF16, args=(x,))[0] == "cpp"
    with pytest.raises(TypeError, match="x: expected a bfloat16 numpy.ndarray, got float32"):
        from_bf16(np.ones(3, np.float32))


@pytest.mark.parametrize("ta,tb,odd", [(a, b, o) for a in (0, 1) for b in (0, 1) for o in (0, 1)])
def test_bf16_matmul_every_operand_layout_is_exact(cpu_path, ta, tb, odd):
    """Row- and column-major A and B (the packs' transposing and pair-interleaving paths, their odd-stride and k-tail
    fallbacks, the balanced row split over two threads): integer inputs, so every fp32 sum is exact and each dot
    path must give exactly the float64 product."""
    g = backends.load_C("gemm")
    rng = np.random.default_rng(8)
    dots = ["widen"] + (["dpbf16"] if cpu_path == "avx512" and "dpbf16" in g.bf16_dot_path() else [])
    for m, k, n in [(256, 512, 10), (37, 29, 53), (64, 8, 64), (7, 300, 33), (300, 17, 100), (50, 1030, 70)]:
        a = rng.integers(-4, 5, (k, m) if ta else (m, k)).astype(bfloat16).view(np.uint16)
        b = rng.integers(-4, 5, (n, k) if tb else (k, n)).astype(bfloat16).view(np.uint16)
        a, b = (a.T if ta else a), (b.T if tb else b)
        if odd:  # a row stride that is odd (a column slice of a wider array)
            wide = np.zeros((a.shape[0], a.shape[1] + 1), np.uint16)
            wide[:, :-1] = a
            a = wide[:, :-1]
        want = a.view(bfloat16).astype(np.float64) @ b.view(bfloat16).astype(np.float64)
        for dot in dots:
            for threads in (1, 2):
                got = g.bf16_matmul(a, b, out="float32", dot=dot, threads=threads)
                assert np.array_equal(got, want), (m, k, n, dot, threads)


def test_bf16_sum_rows_equals_numpys_fp32_reduce_on_every_path(cpu_path):
    """amp.bf16_sum_rows (a bf16 Linear's bias gradient): the bits of np.add.reduce(dtype=float32) then one rounding,
    for column counts around the 32-wide SIMD block, empty shapes and a large array split over threads."""
    from tinylearn.amp.bf16_ops import SUM_ROWS, bf16_sum_rows

    rng = np.random.default_rng(9)
    for shape in [(256, 512), (256, 10), (3, 70), (1, 33), (1200, 1100), (0, 5), (5, 0)]:
        x = (rng.standard_normal(shape) * 100).astype(bfloat16)
        want = np.add.reduce(x, axis=0, dtype=np.float32).astype(bfloat16)
        for backend in ("cpp", "numpy"):
            got = bf16_sum_rows(x, backend=backend)
            assert got.dtype == bfloat16 and np.array_equal(got.view(np.uint16), want.view(np.uint16)), shape
    x = rng.standard_normal((6, 4)).astype(bfloat16)
    assert backends.resolve(SUM_ROWS, args=(x.T,))[0] == "numpy" and backends.resolve(SUM_ROWS, args=(x,))[0] == "cpp"
    with pytest.raises(TypeError, match="x: expected a bfloat16 numpy.ndarray, got float32"):
        bf16_sum_rows(np.ones((2, 2), np.float32))
    with pytest.raises(ValueError, match="x: must be 2-D"):
        bf16_sum_rows(np.ones(3, bfloat16))
    with pytest.raises(ValueError, match="out must have shape"):
        backends.load_C("amp").sum_rows(x.view(np.uint16), np.empty(5, np.uint16))


def test_round_bf16_equals_the_two_casts_on_every_path(cpu_path):
    """amp.round_bf16 (AutocastRound's one pass) gives the bits of to_bf16 then from_bf16: ties to even, NaN quiet,
    overflow to Inf, subnormals, -0.0; C++ for contiguous float32, numpy's casts otherwise."""
    from tinylearn.amp.bf16_ops import ROUND_BF16, round_bf16

    rng = np.random.default_rng(7)
    x = np.concatenate([SPECIAL, (rng.standard_normal(1036) * 1e3).astype(np.float32)]).reshape(-1, 33)
    want = to_bf16(x).astype(np.float32)
    nan = np.isnan(x)

    def same(got, want, nan):  # bit for bit; a NaN stays a NaN (the C++ path makes it the quiet 0x7FC0, as torch)
        return np.array_equal(np.isnan(got), nan) and np.array_equal(
            got.view(np.uint32)[~nan], want.view(np.uint32)[~nan]
        )

    for backend in ("cpp", "numpy"):
        got = round_bf16(x, backend=backend)
        assert got.dtype == np.float32 and same(got, want, nan)
    assert same(round_bf16(x.T), want.T, nan.T)
    assert (
        backends.resolve(ROUND_BF16, args=(x.T,))[0] == "numpy" and backends.resolve(ROUND_BF16, args=(x,))[0] == "cpp"
    )
    with pytest.raises(TypeError, match="x: expected a float32 numpy.ndarray, got float64"):
        round_bf16(np.ones(3))
    with pytest.raises(ValueError, match="must be C-contiguous"):
        backends.load_C("amp").round_bf16(x.T, np.empty(x.T.shape, np.float32))


# ---------------------------------------------------------------------------------------------------- ReLU
def _bits(vals):
    return np.array(vals, np.uint16)


RELU_BITS = _bits([0x0000, 0x8000, 0x7FC0, 0xFFC0, 0x7F80, 0xFF80, 0x0001, 0x8001, 0xFF81, 0x7F81, 0x3F80, 0xBF80])


def test_relu_bf16_bits_match_torch(cpu_path):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    bits = np.concatenate([RELU_BITS, _bf(rng, 1000).view(np.uint16)])
    x = bits.view(bfloat16)
    amp = backends.load_C("amp")
    out = np.empty_like(bits)
    amp.relu(bits, out)
    want = torch.relu(torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16))
    nan = np.isnan(x.astype(np.float32))  # NaN in, NaN out (torch's vectorised path changes the payload: 0xFFFF)
    assert np.array_equal(out.view(np.int16)[~nan], want.view(torch.int16).numpy()[~nan])
    assert np.array_equal(out[nan], bits[nan]) and torch.isnan(want[torch.from_numpy(nan)]).all()
    g = _bf(rng, bits.shape).view(np.uint16)
    back = np.empty_like(bits)
    amp.relu_backward(g, bits, back)
    tg = torch.from_numpy(g.view(np.int16).copy()).view(torch.bfloat16)
    ty = torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16)
    want_b = torch.ops.aten.threshold_backward(tg, ty, 0)
    assert np.array_equal(back.view(np.int16), want_b.view(torch.int16).numpy())
    assert x.dtype == bfloat16


def test_relu_bad_input():
    amp = backends.load_C("amp")
    with pytest.raises(ValueError, match="g has shape"):
        amp.relu_backward(np.zeros(3, np.uint16), np.zeros(4, np.uint16), np.zeros(4, np.uint16))
    with pytest.raises(TypeError, match="x must have dtype uint16"):
        amp.relu(np.zeros(3, np.float32), np.zeros(3, np.uint16))


# ---------------------------------------------------------------------------------------------------- routing
def test_autocast_routes_linear_matmul_relu_to_the_bf16_kernels(monkeypatch):
    import tinylearn as tl
    from tinylearn.autograd import relu as relu_mod

    calls = []
    real = backends.dispatch

    def spy(op, *a, **k):
        calls.append((op, backends.resolve(op, k.get("backend"), k.get("version"), a, {})[0]))
        return real(op, *a, **k)

    monkeypatch.setattr(backends, "dispatch", spy)
    monkeypatch.setattr(relu_mod.backends, "dispatch", spy)
    tl.manual_seed(0)
    lin = tl.nn.Linear(16, 8)
    x = tl.randn(4, 16, requires_grad=True)
    w2 = tl.randn(8, 3, requires_grad=True)
    with tl.autocast("bfloat16"):
        h = tl.relu(lin(x))
        y = h @ w2
    assert y.dtype == bfloat16 and h.dtype == bfloat16
    y.float().sum().backward()
    assert lin.weight.grad.dtype == np.float32 and x.grad.dtype == np.float32 and w2.grad.dtype == np.float32
    ops = {op for op, _ in calls}
    assert {BF16_MATMUL, TO_BF16, "autograd.relu", "autograd.relu_backward"} <= ops
    assert all(b == "cpp" for op, b in calls if op in (BF16_MATMUL, "autograd.relu", "autograd.relu_backward"))


def test_autocast_linear_relu_matches_torch_bf16():
    torch = pytest.importorskip("torch")
    import tinylearn as tl

    rng = np.random.default_rng(6)
    X = rng.standard_normal((32, 48)).astype(np.float32)
    W = (rng.standard_normal((40, 48)) * 0.2).astype(np.float32)
    B = rng.standard_normal(40).astype(np.float32)
    x, w, b = (tl.Tensor(v, requires_grad=True) for v in (X, W, B))
    with tl.autocast("bfloat16"):
        y = tl.relu(tl.nn.functional.linear(x, w, b))
    y.float().sum().backward()
    tx, tw, tb = (torch.tensor(v, requires_grad=True) for v in (X, W, B))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ty = torch.relu(torch.nn.functional.linear(tx, tw, tb))
    ty.float().sum().backward()
    got, want = y.float().numpy(), ty.float().detach().numpy()
    assert np.allclose(got, want, rtol=1e-2, atol=1e-2)
    # torch adds the bias in fp32 before one rounding too: most outputs agree to the bit
    assert (got == want).mean() > 0.9
    for t, tt in ((x, tx), (w, tw), (b, tb)):
        assert np.allclose(t.grad, tt.grad.numpy(), rtol=2e-2, atol=2e-2)
