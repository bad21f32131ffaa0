"""tinylearn.quant affine maps, observers and fake quantization vs torch (integer codes exact, floats bit-exact)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import tinylearn as tl
from tinylearn import backends
from tinylearn.testing import assert_close, make_layouts

warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*deprecated.*")
Q = tl.quant
TORCH_DT = {"int8": torch.qint8, "uint8": torch.quint8}
RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int4": (-8, 7), "uint4": (0, 15)}


def _ties(rng: np.random.Generator, s, shape) -> np.ndarray:
    """Values that land exactly on k + 1/2 steps (the round-half-to-even cases) plus random ones."""
    k = rng.integers(-300, 300, shape).astype(np.float32)
    half = rng.integers(0, 2, shape).astype(np.float32) * np.float32(0.5)
    return ((k + half) * np.asarray(s, np.float32)).astype(np.float32)


# ------------------------------------------------------------------------------------------ calculate_qparams
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int4", "uint4"])
@pytest.mark.parametrize("symmetric", [False, True])
def test_calculate_qparams_matches_torch_observer(dtype, symmetric):
    rng = np.random.default_rng(0)
    tdt = torch.qint8 if dtype.startswith("int") else torch.quint8
    qs = torch.per_tensor_symmetric if symmetric else torch.per_tensor_affine
    lo, hi = RANGES[dtype]
    kw = {} if dtype in ("int8", "uint8") else {"quant_min": lo, "quant_max": hi}
    for _ in range(40):
        x = (rng.standard_normal(64) * rng.uniform(1e-3, 5) + rng.uniform(-3, 3)).astype(np.float32)
        obs = torch.ao.quantization.MinMaxObserver(dtype=tdt, qscheme=qs, **kw)
        obs(torch.from_numpy(x))
        ts, tz = obs.calculate_qparams()
        s, z = Q.calculate_qparams(x.min(), x.max(), dtype=dtype, symmetric=symmetric)
        assert isinstance(s, float) and isinstance(z, int)
        assert np.float32(s) == ts.item() and z == tz.item()
        assert lo <= z <= hi


def test_calculate_qparams_zero_exact_and_degenerate():
    s, z = Q.calculate_qparams(0.5, 3.0, "uint8")  # range extended to include 0
    assert Q.dequantize(Q.quantize(np.float32(0), s, z, "uint8"), s, z) == 0.0
    s, z = Q.calculate_qparams(0.0, 0.0, "int8")  # all zeros: eps scale and zero_point qmin, like torch
    t = torch.ao.quantization.MinMaxObserver(dtype=torch.qint8)
    t(torch.zeros(3))
    ts, tz = t.calculate_qparams()
    assert s == ts.item() == np.float32(np.finfo(np.float32).eps) and z == tz.item() == -128
    s, z = Q.calculate_qparams(np.array([-1.0, 0.0]), np.array([1.0, 2.0]), "int8")
    assert s.shape == (2,) and z.dtype == np.int64


@pytest.mark.parametrize("bad", [dict(dtype="int3"), dict(min_val=2.0, max_val=1.0), dict(min_val=float("nan"))])
def test_calculate_qparams_bad_input(bad):
    kw = dict(min_val=-1.0, max_val=1.0, dtype="int8") | bad
    with pytest.raises(ValueError, match="dtype|min_val"):
        Q.calculate_qparams(**kw)


# ------------------------------------------------------------------------------------------ quantize / dequantize
@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_quantize_per_tensor_exact_vs_torch(dtype):
    rng = np.random.default_rng(1)
    lo, hi = RANGES[dtype]
    for _ in range(60):
        s = np.float32(rng.uniform(1e-3, 1))
        z = int(rng.integers(lo, hi + 1)) if dtype == "uint8" else int(rng.integers(-20, 20))
        x = _ties(rng, s, 1031)
        x[:4] = [np.inf, -np.inf, 1e30, -1e30]
        ref = torch.quantize_per_tensor(torch.from_numpy(x), float(s), z, TORCH_DT[dtype]).int_repr().numpy()
        q = Q.quantize(x, s, z, dtype)
        assert q.dtype == ref.dtype
        np.testing.assert_array_equal(q, ref)
        deq = Q.dequantize(q, s, z)
        tq = torch.quantize_per_tensor(torch.from_numpy(x), float(s), z, TORCH_DT[dtype])
        np.testing.assert_array_equal(deq, tq.dequantize().numpy())


def test_quantize_nan_like_torch():
    x = np.array([np.nan, 1.0], np.float32)
    ref = torch.quantize_per_tensor(torch.from_numpy(x), 0.1, 3, torch.qint8).int_repr().numpy()
    np.testing.assert_array_equal(Q.quantize(x, 0.1, 3), ref)


@pytest.mark.parametrize("layout_shape", [(6, 40), (3, 6, 5)])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_quantize_per_channel_exact_vs_torch(layout_shape, axis, dtype):
    rng = np.random.default_rng(2)
    c = layout_shape[axis]
    s = rng.uniform(1e-3, 0.5, c).astype(np.float32)
    lo, hi = RANGES[dtype]
    z = rng.integers(max(lo, -20), min(hi, 20) + 1, c)
    view = [1] * len(layout_shape)
    view[axis] = c
    for name, x in make_layouts(layout_shape, seed=3, low=-40, high=40):
        x = np.array(x)  # may be a broadcast view
        x.reshape(-1)[::3] = (
            _ties(rng, 1.0, x.size)[: x.size][::3] * np.broadcast_to(s.reshape(view), x.shape).reshape(-1)[::3]
        )
        ref = torch.quantize_per_channel(
            torch.from_numpy(np.ascontiguousarray(x)),
            torch.from_numpy(s.astype(np.float64)),
            torch.from_numpy(z),
            axis % x.ndim,
            TORCH_DT[dtype],
        )
        q = Q.quantize(x, s, z, dtype, axis=axis)
        np.testing.assert_array_equal(q, ref.int_repr().numpy(), err_msg=name)
        np.testing.assert_array_equal(Q.dequantize(q, s, z, axis=axis), ref.dequantize().numpy(), err_msg=name)


@pytest.mark.parametrize("dtype", ["int4", "uint4"])
def test_quantize_int4_range_and_round_trip(dtype):
    rng = np.random.default_rng(4)
    x = rng.standard_normal(500).astype(np.float32)
    s, z = Q.calculate_qparams(x.min(), x.max(), dtype)
    q = Q.quantize(x, s, z, dtype)
    lo, hi = RANGES[dtype]
    assert q.min() >= lo and q.max() <= hi and q.dtype == (np.int8 if dtype == "int4" else np.uint8)
    err = np.abs(Q.dequantize(q, s, z) - x)
    assert err.max() <= s / 2 + 1e-6  # inside the range the error is at most half a step
    # int4 codes equal torch's qint8 codes computed with the clamp narrowed to the int4 range
    tq = (
        torch.quantize_per_tensor(
            torch.from_numpy(x), s, z if dtype == "int4" else z, torch.qint8 if dtype == "int4" else torch.quint8
        )
        .int_repr()
        .numpy()
    )
    np.testing.assert_array_equal(q, np.clip(tq, lo, hi))


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(scale=0.0), ValueError, "scale"),
        (dict(scale=-1.0), ValueError, "scale"),
        (dict(scale=float("nan")), ValueError, "scale"),
        (dict(zero_point=200), ValueError, "zero_point"),
        (dict(dtype="int16"), ValueError, "dtype"),
        (dict(axis=5), ValueError, "axis"),
        (dict(scale=np.ones(3), zero_point=np.zeros(3, int), axis=0), ValueError, "scale"),
    ],
)
def test_quantize_bad_input(kwargs, exc, match):
    args = dict(x=np.ones((4, 4), np.float32), scale=0.1, zero_point=0, dtype="int8") | kwargs
    with pytest.raises(exc, match=match):
        Q.quantize(**args)


def test_dequantize_bad_input():
    with pytest.raises(TypeError, match="q"):
        Q.dequantize(np.ones(3, np.float32), 0.1, 0)


# ------------------------------------------------------------------------------------------ observers
@pytest.mark.parametrize("dtype", ["int8", "uint8"])
@pytest.mark.parametrize("symmetric", [False, True])
def test_minmax_observers_match_torch(dtype, symmetric):
    rng = np.random.default_rng(5)
    qs = torch.per_tensor_symmetric if symmetric else torch.per_tensor_affine
    ours = [Q.MinMaxObserver(dtype, symmetric), Q.MovingAverageMinMaxObserver(0.01, dtype, symmetric)]
    theirs = [
        torch.ao.quantization.MinMaxObserver(dtype=TORCH_DT[dtype], qscheme=qs),
        torch.ao.quantization.MovingAverageMinMaxObserver(dtype=TORCH_DT[dtype], qscheme=qs),
    ]
    for _ in range(5):
        x = (rng.standard_normal(200) * rng.uniform(0.1, 3) + rng.uniform(-1, 1)).astype(np.float32)
        for o, t in zip(ours, theirs):
            assert o(x) is x
            t(torch.from_numpy(x))
    for o, t in zip(ours, theirs):
        s, z = o.calculate_qparams()
        ts, tz = t.calculate_qparams()
        assert np.float32(s) == ts.item() and z == tz.item(), type(o).__name__


@pytest.mark.parametrize("ch_axis", [0, 1, -1])
@pytest.mark.parametrize("symmetric", [False, True])
def test_per_channel_observer_matches_torch(ch_axis, symmetric):
    rng = np.random.default_rng(6)
    qs = torch.per_channel_symmetric if symmetric else torch.per_channel_affine
    o = Q.PerChannelMinMaxObserver(ch_axis, "int8", symmetric)
    t = torch.ao.quantization.PerChannelMinMaxObserver(ch_axis=ch_axis, dtype=torch.qint8, qscheme=qs)
    for _ in range(3):
        x = rng.standard_normal((5, 7, 3)).astype(np.float32)
        o(x)
        t(torch.from_numpy(x))
    s, z = o.calculate_qparams()
    ts, tz = t.calculate_qparams()
    np.testing.assert_array_equal(s, ts.numpy())
    np.testing.assert_array_equal(z, tz.numpy())


def test_histogram_observers_clip_outliers():
    rng = np.random.default_rng(7)
    x = rng.standard_t(3, 20000).astype(np.float32)  # heavy-tailed: max |x| is far out in the tail
    mm = Q.MinMaxObserver(symmetric=True)
    mm(x)
    s_mm, _ = mm.calculate_qparams()
    for obs in (Q.PercentileObserver(99.9), Q.MSEObserver(), Q.HistogramObserver(method="kl")):
        for chunk in np.array_split(x, 4):  # growing amax exercises re-binning
            obs(chunk)
        s, z = obs.calculate_qparams()
        assert z == 0 and s <= (s_mm if isinstance(obs, Q.MSEObserver) else s_mm / 2), type(obs).__name__
        if isinstance(obs, Q.MSEObserver):  # it minimises exactly this (on the histogram)
            err = np.mean((Q.quantize_dequantize(x, s, z) - x) ** 2)
            assert err < np.mean((Q.quantize_dequantize(x, s_mm, 0) - x) ** 2)
    p = Q.PercentileObserver(99.9)
    p(x)
    assert abs(p.threshold() - np.percentile(np.abs(x), 99.9)) <= p.amax / p.bins


def test_kl_threshold_alignment():
    # all mass uniform in the first 300 bins: KL is exactly zero once nothing is clipped, and the threshold is
    # the *upper edge* of the last kept bin (edges[i]), not its centre
    hist = np.zeros(2048)
    hist[:300] = 1.0
    edges = np.linspace(0, 2048.0, 2049)
    t, i, kls = Q.kl_threshold(hist, edges, num_levels=128)
    assert i >= 300 and t == edges[i]
    assert np.isfinite(kls).all() and kls[i - 128] == pytest.approx(kls.min())


def test_observer_nonnegative_input_uses_full_unsigned_range():
    obs = Q.HistogramObserver(dtype="uint8", symmetric=False)
    obs(np.abs(np.random.default_rng(8).standard_normal(5000)).astype(np.float32))
    s, z = obs.calculate_qparams()
    assert z == 0


# ------------------------------------------------------------------------------------------ fake quantize (STE)
@pytest.mark.parametrize("qrange", [(-128, 127), (0, 255), (-8, 7)])
def test_fake_quantize_per_tensor_matches_torch(qrange):
    rng = np.random.default_rng(9)
    qmin, qmax = qrange
    for _ in range(10):
        s = np.float32(rng.uniform(1e-3, 0.2))
        z = int(rng.integers(qmin, qmax + 1))
        x = _ties(rng, s, (7, 33))
        g = rng.standard_normal(x.shape).astype(np.float32)
        tx = torch.from_numpy(x).requires_grad_()
        ty = torch.fake_quantize_per_tensor_affine(tx, float(s), z, qmin, qmax)
        ty.backward(torch.from_numpy(g))
        X = tl.Tensor(x, requires_grad=True)
        Y = Q.fake_quantize(X, s, z, qmin, qmax)
        Y.backward(tl.Tensor(g))
        np.testing.assert_array_equal(Y.data, ty.detach().numpy())
        np.testing.assert_array_equal(X.grad.data, tx.grad.numpy())


@pytest.mark.parametrize("axis", [0, 1])
def test_fake_quantize_per_channel_matches_torch(axis):
    rng = np.random.default_rng(10)
    shape = (6, 9, 4)
    c = shape[axis]
    s = rng.uniform(1e-3, 0.1, c).astype(np.float32)
    z = rng.integers(-10, 10, c).astype(np.int32)
    for name, x in make_layouts(shape, seed=11, low=-10, high=10):
        g = rng.standard_normal(shape).astype(np.float32)
        tx = torch.from_numpy(np.ascontiguousarray(x)).requires_grad_()
        ty = torch.fake_quantize_per_channel_affine(tx, torch.from_numpy(s), torch.from_numpy(z), axis, -128, 127)
        ty.backward(torch.from_numpy(g))
        X = tl.Tensor(np.ascontiguousarray(x), requires_grad=True)
        Y = Q.fake_quantize(X, s, z, -128, 127, axis=axis)
        Y.backward(tl.Tensor(g))
        np.testing.assert_array_equal(Y.data, ty.detach().numpy(), err_msg=name)
        np.testing.assert_array_equal(X.grad.data, tx.grad.numpy(), err_msg=name)


def test_fake_quantize_ste_gradient_is_mask():
    x = tl.Tensor(np.array([-2.0, -0.3, 0.0, 0.44, 5.0], np.float32), requires_grad=True)
    y = Q.fake_quantize(x, 0.1, 0, -8, 7)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.data, [0, 1, 1, 1, 0])


def test_fake_quantize_bad_input():
    x = tl.Tensor(np.ones(3, np.float32))
    with pytest.raises(ValueError, match="scale"):
        Q.fake_quantize(x, 0.0, 0, -128, 127)
    with pytest.raises(ValueError, match="zero_point"):
        Q.fake_quantize(x, 0.1, 300, -128, 127)
    with pytest.raises(ValueError, match="quant_min"):
        Q.fake_quantize(x, 0.1, 0, 5, 5)


@pytest.mark.parametrize("axis", [None, 0])
def test_lsq_matches_torch_learnable(axis):
    rng = np.random.default_rng(12)
    x = rng.standard_normal((4, 50)).astype(np.float32)
    g = rng.standard_normal((4, 50)).astype(np.float32)
    n = 1 if axis is None else 4
    s = rng.uniform(0.03, 0.1, n).astype(np.float32)
    # zero points >= 0: torch's per-tensor learnable *backward* rounds the zero point as int(z + 0.5), which is
    # off by one for negative z (its gradient mask then disagrees with its own forward); ours uses round(z) in both
    z = rng.integers(0, 3, n).astype(np.float32)
    tx, ts, tz = (torch.from_numpy(a.copy()).requires_grad_() for a in (x, s, z))
    if axis is None:
        ty = torch._fake_quantize_learnable_per_tensor_affine(tx, ts, tz, -8, 7, 0.5)
    else:
        ty = torch._fake_quantize_learnable_per_channel_affine(tx, ts, tz, axis, -8, 7, 0.5)
    ty.backward(torch.from_numpy(g))
    X, S, Z = (tl.Tensor(a.copy(), requires_grad=True) for a in (x, s, z))
    Y = Q.fake_quantize_learnable(X, S, Z, -8, 7, axis=axis, grad_factor=0.5)
    Y.backward(tl.Tensor(g))
    np.testing.assert_array_equal(Y.data, ty.detach().numpy())
    np.testing.assert_array_equal(X.grad.data, tx.grad.numpy())
    assert_close(S.grad.data, ts.grad.numpy(), "float32", reduction_size=200)
    assert_close(Z.grad.data, tz.grad.numpy(), "float32", reduction_size=200)


def test_lsq_scale_gradient_formula():
    # LSQ's step-size gradient uses the STE through round: d/ds [round(x/s) s] ~ round(x/s) - x/s inside the range,
    # and qmin/qmax (minus z) where clipped; check against that formula in float64
    rng = np.random.default_rng(13)
    x = rng.uniform(-1.2, 1.2, 50)
    s0 = 0.1
    X = tl.Tensor(x.astype(np.float32), requires_grad=True)
    S = tl.Tensor(np.array([s0], np.float32), requires_grad=True)
    Z = tl.Tensor(np.array([0.0], np.float32), requires_grad=True)
    Q.fake_quantize_learnable(X, S, Z, -8, 7).sum().backward()
    r = np.rint(x.astype(np.float32) / np.float32(s0))
    expected = np.where(r < -8, -8.0, np.where(r > 7, 7.0, r - x / s0)).sum()
    assert abs(S.grad.data[0] - expected) < 1e-4 * 50
    assert Z.grad.data[0] == pytest.approx(-s0 * ((r < -8) | (r > 7)).sum(), rel=1e-6)


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int4", "uint4"])
def test_quantize_large_cpp_path_exact(dtype):
    # non-empty inputs take the C++ kernel (fma + nearbyint); it must equal torch and the numpy path bit for bit
    rng = np.random.default_rng(14)
    lo, hi = RANGES[dtype]
    for _ in range(5):
        s = np.float32(rng.uniform(1e-3, 0.5))
        z = int(rng.integers(lo, hi + 1))
        x = _ties(rng, s, 20_001)
        x[:5] = [np.inf, -np.inf, np.nan, 1e30, -0.0]
        q = Q.quantize(x, s, z, dtype)
        assert q.dtype == (np.int8 if dtype in ("int8", "int4") else np.uint8)
        np.testing.assert_array_equal(q[5:1000], Q.quantize(x[5:1000], s, z, dtype, backend="numpy"))
        np.testing.assert_array_equal(q, Q.quantize(x, s, z, dtype, backend="numpy"))  # the whole array on numpy
        assert backends.resolve("quant.quantize_per_tensor", None, None, (x,))[0] == "cpp"  # the when= threshold
        assert backends.resolve("quant.quantize_per_tensor", None, None, (x[:100],))[0] == "cpp"  # CPP_MIN_SIZE = 0
        assert backends.resolve("quant.quantize_per_tensor", None, None, (x[:0],))[0] == "numpy"
        np.testing.assert_array_equal(Q.dequantize(q, s, z, backend="numpy"), Q.dequantize(q, s, z, backend="cpp"))
        if dtype in TORCH_DT:
            ref = torch.quantize_per_tensor(torch.from_numpy(x), float(s), z, TORCH_DT[dtype]).int_repr().numpy()
            np.testing.assert_array_equal(q, ref)
            tq = torch.quantize_per_tensor(torch.from_numpy(x), float(s), z, TORCH_DT[dtype])
            np.testing.assert_array_equal(Q.dequantize(q, s, z), tq.dequantize().numpy())
        else:
            np.testing.assert_array_equal(q[5:], np.clip(Q.quantize(x[5:], s, z, dtype[:-1] + "8"), lo, hi))


# ------------------------------------------------------------------------------ C++ versions ladder (issue 17)
# cpp_src/quant_affine.cpp: v0_scalar / v1_simd / v2_threads on every SIMD level the CPU has
# (TINYLEARN_CPU_FEATURES=scalar|avx2|avx512); every rung bit-exact with torch.quantize_per_tensor / dequantize.
from tinylearn.quant import affine as affine_mod  # noqa: E402

needs_affine_cpp = pytest.mark.skipif(not backends.C_available("quant_affine"), reason="_C.quant_affine not built")
AFF_VERSIONS = list(affine_mod.CPP_VERSIONS)


def _aff_levels() -> list[str]:
    if not backends.C_available("quant_affine"):
        return ["scalar"]
    best = affine_mod.simd_level()
    return ["scalar"] + (["avx2"] if best in ("avx2", "avx512") else []) + (["avx512"] if best == "avx512" else [])


AFF_LEVELS = _aff_levels()


def _tie_dense(s: np.float32, z: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Exact ties k + 1/2 of the grid (odd and even k, across and beyond the clamp range), their float32 neighbours,
    random values, every special value, and a stride through all float32 bit patterns."""
    k = np.arange(-(1 << 9), 1 << 9).astype(np.float32)
    ties = ((k + np.float32(0.5)) * s).astype(np.float32)
    pats = np.arange(0, 2**32, 65537 * 7, dtype=np.uint64).astype(np.uint32).view(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e38, -1e38, 1e-45, -1e-45], np.float32)
    return np.concatenate(
        [
            ties,
            np.nextafter(ties, np.float32(np.inf)),
            np.nextafter(ties, np.float32(-np.inf)),
            (k * s).astype(np.float32),
            (rng.standard_normal(n) * 200 * s).astype(np.float32),
            pats,
            special,
        ]
    )


def _torch_q(x: np.ndarray, s: np.float32, z: int, dtype: str) -> np.ndarray:
    return torch.quantize_per_tensor(torch.from_numpy(x), float(s), z, TORCH_DT[dtype]).int_repr().numpy()


def test_torch_quantize_is_fused_multiply_add():
    """Which arithmetic torch uses, settled on tie-dense data: round(fma(x, 1/s, z)) matches bit for bit; the
    alternatives round(x / s) + z, round(x * (1/s)) + z and round(fl(x * (1/s)) + z) each differ somewhere."""
    rng = np.random.default_rng(21)
    s, z = np.float32(0.1), 3
    x = _tie_dense(s, z, 50_000, rng)
    x = x[np.isfinite(x) & (np.abs(x) < 1e6)]
    ref = _torch_q(x, s, z, "int8")
    inv = np.float32(1) / s
    with np.errstate(all="ignore"):
        fma = np.rint((x.astype(np.float64) * np.float64(inv) + z).astype(np.float32))
        alts = {
            "div": np.rint((x / s).astype(np.float32)) + z,
            "mul": np.rint((x * inv).astype(np.float32)) + z,
            "mul_then_add": np.rint((x * inv).astype(np.float32) + np.float32(z)),
        }
    np.testing.assert_array_equal(np.clip(fma, -128, 127), ref)
    for name, a in alts.items():
        assert (np.clip(a, -128, 127) != ref).any(), f"{name} is indistinguishable from torch on this sample"


@needs_affine_cpp
@pytest.mark.parametrize("level", AFF_LEVELS)
@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_cpp_rungs_bit_exact_vs_torch(dtype, level, monkeypatch):
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", level)
    assert affine_mod.simd_level() == level
    rng = np.random.default_rng(22)
    lo, hi = RANGES[dtype]
    for s, z in [(np.float32(0.1), 3 if lo < 0 else 131), (np.float32(0.0371), -7 if lo < 0 else 0), (1 / 3, lo)]:
        s = np.float32(s)
        x = _tie_dense(s, z, 30_000, rng)
        ref = _torch_q(x, s, z, dtype)
        tq = torch.quantize_per_tensor(torch.from_numpy(x), float(s), z, TORCH_DT[dtype])
        dref = tq.dequantize().numpy().view(np.uint32)
        for v in AFF_VERSIONS:
            q = Q.quantize(x, s, z, dtype, backend="cpp", version=v)
            bad = np.flatnonzero(q != ref)
            assert bad.size == 0, f"{dtype} {level} {v}: x={x[bad[:4]]} -> {q[bad[:4]]}, torch {ref[bad[:4]]}"
            d = Q.dequantize(q, s, z, backend="cpp", version=v)
            np.testing.assert_array_equal(d.view(np.uint32), dref, err_msg=f"dequantize {dtype} {level} {v}")


@needs_affine_cpp
@pytest.mark.parametrize("level", AFF_LEVELS)
def test_cpp_rungs_every_tail_length(level, monkeypatch):
    """Lengths 0..100 and around the 65536-element thread grain, int4/uint4 ranges too: every rung equals numpy."""
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", level)
    rng = np.random.default_rng(23)
    big = (rng.standard_normal(2 * 65536 + 77) * 9).astype(np.float32)
    s = np.float32(0.07)
    for n in [*range(101), 65535, 2 * 65536 - 1, 2 * 65536, 2 * 65536 + 77]:
        x = big[:n]
        for dtype in ("int8", "uint8", "int4", "uint4"):
            lo, hi = RANGES[dtype]
            z = (lo + hi + 1) // 2
            ref = Q.quantize(x, s, z, dtype, backend="numpy")
            dref = Q.dequantize(ref, s, z, backend="numpy")
            for v in AFF_VERSIONS:
                q = Q.quantize(x, s, z, dtype, backend="cpp", version=v)
                np.testing.assert_array_equal(q, ref, err_msg=f"n={n} {dtype} {v}")
                np.testing.assert_array_equal(Q.dequantize(q, s, z, backend="cpp", version=v), dref)


@needs_affine_cpp
def test_cpp_noncontiguous_and_routing():
    rng = np.random.default_rng(24)
    base = (rng.standard_normal((128, 96)) * 3).astype(np.float32)
    s, z = np.float32(0.02), -5
    for x in (base.T, base[::2, 1::3], base[:, ::-1], base.astype(np.float64), np.float32(0.3), base[:0]):
        q = Q.quantize(x, s, z, backend="cpp")
        assert q.shape == np.shape(x) and q.dtype == np.int8
        np.testing.assert_array_equal(q, _torch_q(np.ascontiguousarray(x, np.float32), s, z, "int8"))
        qt = q.T if q.ndim == 2 else q
        np.testing.assert_array_equal(Q.dequantize(qt, s, z, backend="cpp"), Q.dequantize(qt, s, z, backend="numpy"))
    assert backends.versions("quant.quantize_per_tensor", "cpp") == ["v2_threads", "v0_scalar", "v1_simd"]
    assert backends.resolve("quant.quantize_per_tensor", None, None, (base,))[:2] == ("cpp", "v2_threads")
    assert backends.resolve("quant.dequantize_per_tensor", None, None, (q.astype(np.int32),))[0] == "numpy"


@needs_affine_cpp
def test_cpp_bad_input():
    x = np.ones(5000, np.float32)
    C = backends.load_C("quant_affine")
    for bad in (0.0, -0.1, float("nan"), float("inf"), np.float32(np.nan)):
        with pytest.raises(ValueError, match="scale"):
            Q.quantize(x, bad, 0)
        with pytest.raises(ValueError, match="scale"):
            C.quantize_per_tensor(x, float(bad), 0, -128, 127, "v1_simd")
        with pytest.raises(ValueError, match="scale"):
            Q.dequantize(np.zeros(5000, np.int8), bad, 0)
    for zp, dtype in ((128, "int8"), (-129, "int8"), (-1, "uint8"), (256, "uint8"), (8, "int4")):
        with pytest.raises(ValueError, match="zero_point"):
            Q.quantize(x, 0.1, zp, dtype)
    with pytest.raises(ValueError, match="zero_point"):
        C.quantize_per_tensor(x, 0.1, 200, -128, 127, "auto")
    with pytest.raises(ValueError, match="version"):
        Q.quantize(x, 0.1, 0, version="v7")
    with pytest.raises(ValueError, match="version"):
        C.dequantize_per_tensor_int8(np.zeros(3, np.int8), 0.1, 0, "simd")
    with pytest.raises(TypeError, match="x"):  # project policy (tests/tour/test_input_policy.py): dtype -> TypeError
        Q.quantize(np.ones(3, np.complex64), 0.1, 0)
    with pytest.raises(TypeError, match="q"):
        Q.dequantize(np.ones(3, np.float32), 0.1, 0)
    with pytest.raises(ValueError, match="dtype"):
        Q.quantize(x, 0.1, 0, "int7")
    with pytest.raises(TypeError, match="scale"):
        Q.quantize(x, True, 0)  # a bool is not a scale (falls to the array checks)


def test_codec_table_rows_and_exactness(monkeypatch):
    """tinylearn.quant.bench_codec.codec_table: one case per codec op, every tinylearn rung checked bit-exact vs torch
    on the benchmark data before timing; tinygrad disabled here (DEV != CPU gives an n/a row, never a crash)."""
    from tinylearn.quant.bench_codec import codec_table

    monkeypatch.setenv("DEV", "NOT_A_DEVICE")
    t = codec_table(3000, repeat=1)
    assert [c.split(" (")[0] for c in t.cases()] == [
        "quantize per-tensor int8",
        "dequantize int8",
        "fp8 e4m3 encode, saturating",
        "fp8 e5m2 encode",
        "fp8 e4m3 decode",
        "fp8 e5m2 decode",
    ]
    n_rungs = 1 + (3 if backends.C_available("quant_affine") else 0)
    for case in t.cases():
        mine = [r for r in t.rows if r.case == case and r.impl.startswith("tinylearn")]
        assert len(mine) == n_rungs
        for r in mine:
            assert r.median_ms is not None and r.median_ms > 0
            assert r.note.startswith(("bit-exact vs torch", "equal to torch")), (case, r.impl, r.note)
        assert t.get(case, "torch").ratio == 1.0
        tg = t.get(case, "tinygrad")
        assert tg.median_ms is None and tg.note.startswith("n/a: DEV=")
    with pytest.raises(ValueError, match="size"):
        codec_table(0)
