"""NF4 (tinylearn.compress.nf4): the derived codebook vs bitsandbytes' published table, block-wise quantization
with double quantization (round-trip error bounds, storage bits), the packed layout, errors, and the C++
dequantize-on-the-fly matmul (every version) against the numpy reference on odd and non-contiguous inputs."""

from __future__ import annotations

import numpy as np
import pytest

from tinylearn import backends
from tinylearn.compress import nf4

# bitsandbytes' NF4 table (bitsandbytes/functional.py, get_4bit_type("nf4")), as published numbers
PUBLISHED_NF4 = [
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
]  # fmt: skip

HAS_C = backends.C_available("compress")
needs_c = pytest.mark.skipif(not HAS_C, reason="tinylearn._C.compress not built")


def test_codebook_matches_published() -> None:
    cb = nf4.nf4_codebook(np.float64)
    np.testing.assert_allclose(cb, PUBLISHED_NF4, atol=1e-4, rtol=0)
    assert cb[7] == 0.0 and cb[0] == -1.0 and cb[-1] == 1.0
    assert np.all(np.diff(cb) > 0)
    assert abs(nf4.NF4_OFFSET - 0.9677083) < 1e-6


@pytest.mark.parametrize("n", [0, 1, 2, 7, 64])
def test_pack_unpack_identity(n: int) -> None:
    rng = np.random.default_rng(n)
    codes = rng.integers(0, 16, n).astype(np.uint8)
    packed = nf4.pack_nibbles(codes)
    assert packed.size == (n + 1) // 2
    np.testing.assert_array_equal(nf4.unpack_nibbles(packed, n), codes)


def test_packed_layout_exact() -> None:
    # even flat index in the high nibble
    np.testing.assert_array_equal(nf4.pack_nibbles([1, 2, 15, 0, 7]), np.array([0x12, 0xF0, 0x70], np.uint8))
    w = np.array([[-1.0, 1.0, 0.0, 0.5]], np.float32)  # one block: absmax 1
    q = nf4.nf4_quantize(w, block_size=4, double_quant=False)
    np.testing.assert_array_equal(
        nf4.unpack_nibbles(q.codes, 4), [0, 15, 7, 12]
    )  # 0.5 -> 0.4407 (level 12, the nearer)
    assert q.codes.tolist() == [0x0F, 0x7C]
    np.testing.assert_array_equal(q.absmax, [1.0])


def test_levels_round_trip_exactly() -> None:
    cb = nf4.nf4_codebook()
    w = (np.concatenate([cb, cb[::-1]]) * 3.0).astype(np.float32).reshape(2, 16)
    q = nf4.nf4_quantize(w, block_size=16, double_quant=False)
    np.testing.assert_allclose(nf4.nf4_dequantize(q), w, rtol=1e-6, atol=0)


@pytest.mark.parametrize("double_quant", [False, True])
def test_round_trip_error_bounds(double_quant: bool) -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 512)).astype(np.float32) * 0.02
    q = nf4.nf4_quantize(w, block_size=64, double_quant=double_quant)
    d = nf4.nf4_dequantize(q)
    assert d.shape == w.shape and d.dtype == np.float32
    blocks, dblocks = w.reshape(-1, 64), d.reshape(-1, 64)
    absmax = np.abs(blocks).max(1, keepdims=True)
    gap = np.diff(nf4.nf4_codebook()).max() / 2  # nearest level: error <= half the widest gap times the scale
    err = np.abs(dblocks - blocks)
    if not double_quant:
        assert np.all(err <= gap * absmax * (1 + 1e-5))
    else:  # + the scale's own error, <= step / 2 per block
        s_err = np.abs(q.scales() - absmax[:, 0]).max()
        assert s_err <= q.dq_step.max() / 2 * 1.001
        assert np.all(err <= gap * absmax + s_err + 1e-7)
    rel_mse = ((d - w) ** 2).mean() / (w**2).mean()
    assert rel_mse < 0.012


def test_nf4_beats_uniform_int4_on_normal_weights() -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((512, 512)).astype(np.float32)
    mse_nf4 = ((nf4.nf4_dequantize(nf4.nf4_quantize(w, 64, double_quant=False)) - w) ** 2).mean()
    mse_int4 = ((nf4.int4_absmax_quantize(w, 64) - w) ** 2).mean()
    assert mse_nf4 < 0.8 * mse_int4


def test_storage_bits_per_parameter() -> None:
    w = np.random.default_rng(2).standard_normal((1024, 1024)).astype(np.float32)
    plain = nf4.nf4_quantize(w, 64, double_quant=False)
    dq = nf4.nf4_quantize(w, 64, double_quant=True)
    assert plain.bits_per_param == pytest.approx(4 + 32 / 64)
    assert dq.bits_per_param == pytest.approx(4 + 8 / 64 + 32 / (64 * 256), abs=1e-3)
    assert dq.nbytes == w.size // 2 + w.size // 64 + 4 * (w.size // 64 // 256) + 4
    assert dq.nbytes <= 0.3 * w.nbytes


def test_bad_input() -> None:
    with pytest.raises(TypeError, match="w"):
        nf4.nf4_quantize(np.arange(64, dtype=np.int32))
    with pytest.raises(ValueError, match="block_size"):
        nf4.nf4_quantize(np.zeros(100, np.float32), block_size=64)
    with pytest.raises(ValueError, match="block_size"):
        nf4.nf4_quantize(np.zeros(64, np.float32), block_size=1)
    with pytest.raises(TypeError, match="block_size"):
        nf4.nf4_quantize(np.zeros(64, np.float32), block_size=8.0)
    with pytest.raises(ValueError, match="w"):
        nf4.nf4_quantize(np.full(64, np.nan, np.float32))
    q = nf4.nf4_quantize(np.zeros((4, 16), np.float32), 16)
    with pytest.raises(ValueError, match="x"):
        nf4.nf4_matmul(np.zeros((2, 15), np.float32), q)
    with pytest.raises(TypeError, match="q"):
        nf4.nf4_matmul(np.zeros((2, 16), np.float32), np.zeros((4, 16)))
    with pytest.raises(ValueError, match="version"):
        nf4.nf4_matmul(np.zeros((2, 16), np.float32), q, backend="cpp", version="nope")


def test_zero_block_dequantizes_to_zero() -> None:
    w = np.zeros((2, 64), np.float32)
    w[1] = np.linspace(-1, 1, 64)
    d = nf4.nf4_dequantize(nf4.nf4_quantize(w, 64))
    assert np.all(d[0] == 0)


SHAPES = [
    (1, 1, 64, 64),
    (1, 37, 96, 32),
    (16, 1, 33, 33),
    (7, 13, 33, 11),
    (5, 9, 100, 50),
    (3, 64, 1024, 256),
    (9, 12, 1024, 64),
]


def _versions() -> list[str]:
    if not HAS_C:
        return []
    out = ["scalar", "simd"]
    c = backends.load_C("compress")
    for v in ("avx2", "avx512"):
        try:
            c.nf4_matmul_path(v)
            out.append(v)
        except ValueError:
            pass
    return out


@needs_c
@pytest.mark.parametrize("double_quant", [False, True])
@pytest.mark.parametrize("m,n,k,bs", SHAPES)
def test_cpp_matches_numpy_reference(m: int, n: int, k: int, bs: int, double_quant: bool) -> None:
    rng = np.random.default_rng(m * 1000 + n + k)
    w = rng.standard_normal((n, k)).astype(np.float32)
    q = nf4.nf4_quantize(w, block_size=bs, double_quant=double_quant)
    x = rng.standard_normal((m, k)).astype(np.float32)
    ref = nf4.nf4_matmul(x, q, backend="numpy")
    ref64 = x.astype(np.float64) @ nf4.nf4_dequantize(q).astype(np.float64).T
    c = backends.load_C("compress")
    tol = dict(rtol=1e-5, atol=1e-4 if k > 1000 else 2e-5)
    for v in _versions():
        got = c.nf4_matmul(x, q.codes, n, bs, nf4.nf4_codebook(), q.absmax, q.dq_step, q.dq_mean, q.dq_block, v)
        np.testing.assert_allclose(got, ref64, **tol, err_msg=v)
        np.testing.assert_allclose(got, ref, **tol, err_msg=v)
    for v in ("simd", "scalar"):
        np.testing.assert_allclose(nf4.nf4_matmul(x, q, backend="cpp", version=v), ref64, **tol, err_msg=v)


@needs_c
def test_cpp_non_contiguous_and_fp64_x() -> None:
    rng = np.random.default_rng(3)
    q = nf4.nf4_quantize(rng.standard_normal((24, 40)).astype(np.float32), 32)
    xt = rng.standard_normal((40, 6)).astype(np.float32).T  # transposed view
    xs = rng.standard_normal((12, 80)).astype(np.float32)[::2, ::2]  # strided
    for x in (xt, xs, xs.astype(np.float64)):
        assert not x.flags.c_contiguous or x.dtype == np.float64
        ref = np.ascontiguousarray(x, np.float64) @ nf4.nf4_dequantize(q).astype(np.float64).T
        for v in ("simd", "scalar"):
            np.testing.assert_allclose(nf4.nf4_matmul(x, q, backend="cpp", version=v), ref, rtol=1e-5, atol=2e-5)


@needs_c
def test_forced_scalar_features(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", "scalar")
    assert nf4.nf4_matmul_path("simd") == "scalar"
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", "avx2")
    assert nf4.nf4_matmul_path("simd") in ("avx2", "scalar")


def test_registered_versions() -> None:
    assert backends.versions(nf4.OP, "cpp") == ["simd", "scalar"]
    assert "numpy" in backends.registered(nf4.OP)
    args, kw = backends.example(nf4.OP, np.random.default_rng(0))
    ref = nf4.nf4_matmul(*args, backend="numpy", **kw)
    assert ref.shape == (5, 19)


@needs_c
def test_cpp_rejects_inconsistent_scales() -> None:
    rng = np.random.default_rng(5)
    q = nf4.nf4_quantize(rng.standard_normal((8, 32)).astype(np.float32), 32, double_quant=True)
    c = backends.load_C("compress")
    x = np.zeros((2, 32), np.float32)
    with pytest.raises(ValueError, match="scales"):  # int8 scales without their steps
        c.nf4_matmul(x, q.codes, 8, 32, nf4.nf4_codebook(), q.absmax, None, 0.0, 256, "simd")
    with pytest.raises(ValueError, match="codes"):
        c.nf4_matmul(x, q.codes[:-1], 8, 32, nf4.nf4_codebook(), q.absmax, q.dq_step, q.dq_mean, 256, "simd")
