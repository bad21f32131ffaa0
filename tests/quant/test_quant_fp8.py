"""FP8 E4M3 / E5M2 encode/decode: bit-exact with torch's float8 casts over all 2^16 high-half float32 patterns,
random bit patterns, every rounding tie, NaN / inf / out-of-range / subnormal edges; delayed scaling."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import tinylearn as tl

Q = tl.quant
TDT = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def _torch_codes(x: np.ndarray, fmt: str) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(TDT[fmt]).view(torch.uint8).numpy()


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_all_high_half_patterns(fmt):
    x = (np.arange(2**16, dtype=np.uint32) << 16).view(np.float32)  # every sign/exponent and 7 mantissa bits
    np.testing.assert_array_equal(Q.fp8_encode(x, fmt), _torch_codes(x, fmt))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_random_bit_patterns(fmt):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 2**32, 300_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    np.testing.assert_array_equal(Q.fp8_encode(x, fmt), _torch_codes(x, fmt))
    y = rng.standard_normal(100_000).astype(np.float32) * np.float32(2.0) ** rng.integers(-20, 20, 100_000)
    np.testing.assert_array_equal(Q.fp8_encode(y, fmt), _torch_codes(y.astype(np.float32), fmt))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_ties_and_neighbours(fmt):
    vals = np.unique(Q.fp8_table(fmt)[np.isfinite(Q.fp8_table(fmt))].astype(np.float64))
    mids = ((vals[1:] + vals[:-1]) / 2).astype(np.float32)  # exact in float32: needs M + 1 mantissa bits
    x = np.concatenate(
        [mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf)), vals.astype(np.float32)]
    )
    np.testing.assert_array_equal(Q.fp8_encode(x, fmt), _torch_codes(x, fmt))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_edges(fmt):
    fmax = Q.FORMATS[fmt][3]
    x = np.array(
        [
            0.0,
            -0.0,
            np.inf,
            -np.inf,
            np.nan,
            -np.nan,
            fmax,
            -fmax,
            fmax * 1.03,
            fmax * 1.1,
            1e38,
            -1e38,
            np.float32(2.0**-9),
            2.0**-10,
            2.0**-17,
            2.0**-16,
            1e-45,
            3.4e38,
        ],
        np.float32,
    )
    np.testing.assert_array_equal(Q.fp8_encode(x, fmt), _torch_codes(x, fmt))


def test_format_facts():
    t4, t5 = Q.fp8_table("e4m3"), Q.fp8_table("e5m2")
    assert np.nanmax(t4) == 448.0 and np.isnan(t4[0x7F]) and np.isnan(t4[0xFF]) and np.isnan(t4).sum() == 2
    assert t4[0x7E] == 448.0 and t4[0x01] == 2.0**-9 and t4[0x08] == 2.0**-6
    assert np.isposinf(t5[0x7C]) and np.isneginf(t5[0xFC]) and np.isnan(t5).sum() == 6
    assert np.nanmax(t5[np.isfinite(t5)]) == 57344.0 and t5[0x01] == 2.0**-16
    # rounding carries into the exponent: 1.9375 = 1.1111b rounds (RNE, 3 mantissa bits) to 2.0 = code 0x40
    assert Q.fp8_encode(np.float32(1.9375), "e4m3") == 0x40
    # torch's e4m3fn cast saturates out-of-range and inf to +-448 rather than producing NaN
    assert Q.fp8_encode(np.float32(1e4), "e4m3") == 0x7E and Q.fp8_encode(np.float32(-np.inf), "e4m3") == 0xFE


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_decode_matches_torch_and_round_trips(fmt):
    codes = np.arange(256, dtype=np.uint8)
    ref = torch.from_numpy(codes).view(TDT[fmt]).float().numpy()
    np.testing.assert_array_equal(Q.fp8_decode(codes, fmt), ref)
    finite = np.isfinite(ref)
    back = Q.fp8_encode(Q.fp8_decode(codes, fmt), fmt)
    ok = finite & ~((codes & 0x7F) == 0)  # +-0 keep their sign too; check separately
    np.testing.assert_array_equal(back[ok], codes[ok])
    assert Q.fp8_encode(np.float32(-0.0), fmt) == 0x80


def test_saturate():
    x = np.array([1e6, -1e6, np.inf, -np.inf, np.nan], np.float32)
    np.testing.assert_array_equal(
        Q.fp8_decode(Q.fp8_encode(x, "e5m2", saturate=True), "e5m2")[:4], [57344, -57344, 57344, -57344]
    )
    assert np.isnan(Q.fp8_decode(Q.fp8_encode(x, "e5m2", saturate=True), "e5m2")[4])
    assert Q.fp8_encode(np.float32(1e6), "e5m2") == 0x7C  # non-saturating: inf, like torch


def test_fp8_bad_input():
    with pytest.raises(ValueError, match="fmt"):
        Q.fp8_encode(np.ones(3, np.float32), "e3m4")
    with pytest.raises(ValueError, match="fmt"):
        Q.fp8_decode(np.zeros(3, np.uint8), "fp8")
    with pytest.raises(TypeError, match="codes"):
        Q.fp8_decode(np.array([300]), "e4m3")


def test_delayed_scaling_uses_history():
    ds = Q.DelayedScaling("e4m3", history_len=4)
    rng = np.random.default_rng(1)
    assert ds.scale == 1.0
    x = rng.standard_normal(1000).astype(np.float32)
    ds.fake_quantize(x)
    amax = float(np.abs(x).max())
    assert ds.scale == pytest.approx(448.0 / amax)
    y = ds.fake_quantize(x)
    rel = np.abs(y - x) / np.maximum(np.abs(x), 1e-3)
    assert np.median(rel) < 2**-4  # 3 mantissa bits: relative error <= 2^-4 for normals
    for _ in range(4):
        ds.update(np.ones(3) * 0.5)  # old amax drops out of the window
    assert ds.scale == pytest.approx(448.0 / 0.5)


def test_fp8_matmul_close_to_fp32():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((32, 64)).astype(np.float32)
    b = rng.standard_normal((64, 16)).astype(np.float32)
    ref = a @ b
    out = Q.fp8_matmul(a, b, sa=448 / np.abs(a).max(), sb=448 / np.abs(b).max())
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 0.05


# ------------------------------------------------------------------------------------ C++ kernels (issue 17)
# cpp_src/quant_fp8.cpp: versions v0_scalar / v1_simd / v2_threads, each SIMD level the CPU has
# (TINYLEARN_CPU_FEATURES=scalar|avx2|avx512), all bit-exact with torch. Oracles: x.to(float8) for the default mode;
# for saturate=True, torch.clamp(x, -max, max).to(float8) (clamping first is what saturation means; NaN stays NaN).
from tinylearn import backends  # noqa: E402
from tinylearn.quant import fp8 as fp8_mod  # noqa: E402

needs_cpp = pytest.mark.skipif(not backends.C_available("quant_fp8"), reason="tinylearn._C.quant_fp8 not built")
VERSIONS = list(fp8_mod.CPP_VERSIONS)
FMAX = {"e4m3": 448.0, "e5m2": 57344.0}


def _levels() -> list[str]:
    if not backends.C_available("quant_fp8"):
        return ["scalar"]
    best = backends.load_C("quant_fp8").fp8_isa()  # what the CPU has (the switch is unset while collecting)
    return ["scalar"] + (["avx2"] if best in ("avx2", "avx512") else []) + (["avx512"] if best == "avx512" else [])


LEVELS = _levels()


def _torch_ref(x: np.ndarray, fmt: str, saturate: bool) -> np.ndarray:
    t = torch.from_numpy(np.ascontiguousarray(x, np.float32))
    if saturate:
        t = t.clamp(-FMAX[fmt], FMAX[fmt])
    return t.to(TDT[fmt]).view(torch.uint8).numpy()


def _boundaries(fmt: str) -> np.ndarray:
    """Every FP8 value, every midpoint between neighbours (the RNE ties), each +-1 and +-2 float32 ulps, the
    overflow thresholds, float32 subnormals, +-0, +-inf and NaNs with payloads; both signs."""
    t = Q.fp8_table(fmt)
    vals = np.unique(np.abs(t[np.isfinite(t)]).astype(np.float64))
    top = vals[-1] + (vals[-1] - vals[-2])  # the next grid point past max (what the overflow tie rounds to)
    grid = np.concatenate([vals, [top, 2 * top]])
    mids = (grid[1:] + grid[:-1]) / 2
    base = np.concatenate([vals, mids, [top, 2 * top]]).astype(np.float32)
    near = [base]
    for k in (1, 2):
        up, dn = base.copy(), base.copy()
        for _ in range(k):
            up, dn = np.nextafter(up, np.float32(np.inf)), np.nextafter(dn, np.float32(0))
        near += [up, dn]
    special = np.array(
        [0, 1, 2, 0x7FFFFF, 0x800000, 0x7F7FFFFF, 0x7F800000, 0x7F800001, 0x7FC00000, 0x7FFFFFFF], np.uint32
    ).view(np.float32)
    mag = np.concatenate(near + [special])
    return np.concatenate([mag, -mag])


def _dense_sample() -> np.ndarray:
    bits = np.arange(0, 2**32, 257, dtype=np.uint64).astype(np.uint32)  # ~16.7M patterns: every exponent and sign
    return np.concatenate([bits.view(np.float32), _boundaries("e4m3"), _boundaries("e5m2")])


@pytest.fixture(scope="module")
def dense() -> np.ndarray:
    return _dense_sample()


@needs_cpp
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("saturate", [False, True])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_cpp_encode_dense_bit_exact(dense, fmt, saturate, level, monkeypatch):
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", level)
    assert fp8_mod.simd_level() == level
    ref = _torch_ref(dense, fmt, saturate)
    for v in VERSIONS:
        got = Q.fp8_encode(dense, fmt, saturate, backend="cpp", version=v)
        bad = np.flatnonzero(got != ref)
        assert bad.size == 0, (
            f"{fmt} saturate={saturate} {level} {v}: {bad.size} mismatches, e.g. bits "
            f"{[hex(int(b)) for b in dense[bad[:4]].view(np.uint32)]} -> {got[bad[:4]]}, torch {ref[bad[:4]]}"
        )


@pytest.mark.parametrize("saturate", [False, True])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_numpy_reference_boundaries_bit_exact(fmt, saturate):
    x = np.concatenate([_boundaries("e4m3"), _boundaries("e5m2")])
    np.testing.assert_array_equal(Q.fp8_encode(x, fmt, saturate, backend="numpy"), _torch_ref(x, fmt, saturate))


def test_boundary_sample_hits_every_rounding_case():
    """The sample is not vacuous: it contains exact ties that round down (to even) and up (to even), overflow to
    the top code, and float32 subnormals."""
    x = _boundaries("e4m3")
    c = _torch_ref(x, "e4m3", False)
    back = Q.fp8_decode(c, "e4m3")
    fin = np.isfinite(x) & np.isfinite(back)
    err = np.abs(x[fin].astype(np.float64)) - np.abs(back[fin].astype(np.float64))
    assert (err > 0).any() and (err < 0).any()  # rounded down and up
    assert (x == np.float32(464.0)).any() and Q.fp8_encode(np.float32(464.0), "e4m3") == 0x7E  # tie to even (max)
    assert Q.fp8_encode(np.float32(61440.0), "e5m2") == 0x7C  # E5M2 overflow tie goes to the even code: inf
    assert Q.fp8_encode(np.float32(61440.0), "e5m2", saturate=True) == 0x7B


@needs_cpp
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_cpp_decode_bits_match_torch(fmt, level, monkeypatch):
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", level)
    codes = np.tile(np.arange(256, dtype=np.uint8), 41)[:10_000]  # tails of the vector loops too
    ref = torch.from_numpy(codes).view(TDT[fmt]).float().numpy().view(np.uint32)
    for v in VERSIONS:
        got = Q.fp8_decode(codes, fmt, backend="cpp", version=v)
        np.testing.assert_array_equal(got.view(np.uint32), ref, err_msg=f"{fmt} {level} {v}")  # NaN bits too
    np.testing.assert_array_equal(Q.fp8_decode(codes, fmt, backend="numpy"), ref.view(np.float32))  # values


@needs_cpp
@pytest.mark.parametrize("level", LEVELS)
def test_cpp_every_tail_length(level, monkeypatch):
    """Lengths 0..100 and around the thread grain: vector loops, masked / scalar tails, thread chunk edges."""
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", level)
    rng = np.random.default_rng(3)
    big = (rng.standard_normal(2 * 65536 + 77) * 300).astype(np.float32)
    for n in [*range(101), 65535, 65536, 2 * 65536 - 1, 2 * 65536, 2 * 65536 + 77]:
        x = big[:n]
        for fmt in ("e4m3", "e5m2"):
            ref = _torch_ref(x, fmt, False)
            for v in VERSIONS:
                c = Q.fp8_encode(x, fmt, backend="cpp", version=v)
                np.testing.assert_array_equal(c, ref, err_msg=f"n={n} {fmt} {v}")
                np.testing.assert_array_equal(
                    Q.fp8_decode(c, fmt, backend="cpp", version=v).view(np.uint32),
                    torch.from_numpy(ref).view(TDT[fmt]).float().numpy().view(np.uint32),
                    err_msg=f"decode n={n} {fmt} {v}",
                )


@needs_cpp
def test_cpp_noncontiguous_shapes_and_routing():
    rng = np.random.default_rng(4)
    base = (rng.standard_normal((96, 130)) * 100).astype(np.float32)
    for x in (base.T, base[::3, 1::2], base[:, ::-1], base.astype(np.float64)[::2], np.float32(3.3), base[:0]):
        for fmt in ("e4m3", "e5m2"):
            got = Q.fp8_encode(x, fmt, backend="cpp")
            assert got.shape == np.shape(x) and got.dtype == np.uint8
            np.testing.assert_array_equal(got, _torch_ref(np.asarray(x, np.float32), fmt, False))
            np.testing.assert_array_equal(got, Q.fp8_encode(x, fmt, backend="numpy"))
            np.testing.assert_array_equal(Q.fp8_decode(got.T, fmt, backend="cpp"), Q.fp8_decode(got, fmt).T)
    # torch tensors are accepted (input policy); routing: empty -> numpy, anything else -> the C++ default rung
    np.testing.assert_array_equal(Q.fp8_encode(torch.from_numpy(base)), Q.fp8_encode(base))
    small, large = base[0, :10], base.reshape(-1)
    assert backends.resolve("quant.fp8_encode", None, None, (small, "e4m3", False))[:2] == ("cpp", "v2_threads")
    assert backends.resolve("quant.fp8_encode", None, None, (small[:0], "e4m3", False))[0] == "numpy"
    assert backends.resolve("quant.fp8_encode", None, None, (large, "e4m3", False))[:2] == ("cpp", "v2_threads")
    assert backends.versions("quant.fp8_encode", "cpp") == ["v2_threads", "v0_scalar", "v1_simd"]


@needs_cpp
def test_cpp_bad_input(monkeypatch):
    x = np.ones(1000, np.float32)
    with pytest.raises(ValueError, match="version"):
        Q.fp8_encode(x, "e4m3", version="v9")
    with pytest.raises(ValueError, match="version"):
        backends.load_C("quant_fp8").fp8_encode(x, "e4m3", False, "fast")
    with pytest.raises(ValueError, match="fmt"):
        backends.load_C("quant_fp8").fp8_decode(np.zeros(3, np.uint8), "e4m4", "auto")
    with pytest.raises(ValueError, match="fmt"):
        Q.fp8_encode(x, "E3M4")
    with pytest.raises(TypeError, match="saturate"):
        Q.fp8_encode(x, "e5m2", saturate="yes")
    with pytest.raises(TypeError, match="x"):
        Q.fp8_encode(np.ones(3, np.complex64))
    with pytest.raises(TypeError, match="codes"):
        Q.fp8_decode(np.ones(3, np.float32))
    with pytest.raises(ValueError, match="backend"):
        Q.fp8_decode(np.zeros(3, np.uint8), backend="fortran")
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", "sse9")
    with pytest.raises(ValueError, match="TINYLEARN_CPU_FEATURES"):
        Q.fp8_encode(x, version="v1_simd")
    monkeypatch.delenv("TINYLEARN_CPU_FEATURES")
    assert Q.fp8_encode(x, "E4M3").tolist() == Q.fp8_encode(x, "e4m3").tolist()  # case-insensitive like before


@needs_cpp
@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("TINYLEARN_EXHAUSTIVE") != "1",
    reason="all 2^32 float32 patterns x 2 formats x 2 modes (~9 min, loaded 2 cores): TINYLEARN_EXHAUSTIVE=1",
)
@pytest.mark.parametrize("saturate", [False, True])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_cpp_encode_all_2_32_patterns(fmt, saturate):
    step = 1 << 26
    for start in range(0, 2**32, step):
        x = np.arange(start, start + step, dtype=np.uint64).astype(np.uint32).view(np.float32)
        got = Q.fp8_encode(x, fmt, saturate, backend="cpp", version="v2_threads")
        ref = _torch_ref(x, fmt, saturate)
        bad = np.flatnonzero(got != ref)
        assert bad.size == 0, f"{fmt} saturate={saturate}: bits {hex(start + int(bad[0]))} -> {got[bad[0]]}"
