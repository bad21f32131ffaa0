"""FP8 E4M3 / E5M2 encode/decode: bit-exact with torch's float8 casts over all 2^16 high-half float32 patterns,
random bit patterns, every rounding tie, NaN / inf / out-of-range / subnormal edges; delayed scaling."""

from __future__ import annotations

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
