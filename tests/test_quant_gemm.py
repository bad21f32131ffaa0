"""int8 GEMM (C++, every SIMD path) exact vs numpy int64 matmul incl. -128 extremes; the CUDA dp4a kernel compiles;
int4 packing and group-wise quantization."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tinylearn as tl
from tinylearn.testing import make_layouts, nvcc_available, nvcc_compile_ptx

Q = tl.quant
ROOT = Path(__file__).resolve().parents[1]
PATHS = Q.int8_gemm_paths()


def _ref(a, b):
    return (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mkn", [(1, 1, 1), (3, 5, 7), (4, 4, 16), (17, 33, 65), (64, 130, 31), (5, 1, 40), (2, 7, 1)])
def test_int8_gemm_exact(path, mkn):
    m, k, n = mkn
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    np.testing.assert_array_equal(Q.int8_gemm(a, b, path), _ref(a, b))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("va, vb", [(-128, -128), (-128, 127), (127, 127), (127, -128)])
def test_int8_gemm_extremes(path, va, vb):
    # -128 * -128 pairs overflow int16 (maddubs-style) accumulators; the result must still be exact
    a = np.full((9, 1030), va, np.int8)
    b = np.full((1030, 37), vb, np.int8)
    np.testing.assert_array_equal(Q.int8_gemm(a, b, path), _ref(a, b))


@pytest.mark.parametrize("path", PATHS)
def test_int8_gemm_layouts(path):
    for (na, a), (nb, b) in zip(
        make_layouts((23, 41), "int8", seed=1, low=-128, high=127),
        make_layouts((41, 19), "int8", seed=9, low=-128, high=127),
    ):
        np.testing.assert_array_equal(Q.int8_gemm(a, b, path), _ref(a, b), err_msg=f"{na} @ {nb}")


def test_int8_gemm_paths_have_fallback():
    assert PATHS[-1] == "scalar"
    z = Q.int8_gemm(np.zeros((3, 0), np.int8), np.zeros((0, 4), np.int8))
    assert z.shape == (3, 4) and not z.any()


@pytest.mark.parametrize(
    "a, b, exc, match",
    [
        (np.ones((2, 3), np.float32), np.ones((3, 2), np.int8), TypeError, "a_int8"),
        (np.ones((2, 3), np.int8), np.ones((3, 2), np.int16), TypeError, "b_int8"),
        (np.ones((2, 3), np.int8), np.ones((4, 2), np.int8), ValueError, "inner"),
        (np.ones(3, np.int8), np.ones((3, 2), np.int8), ValueError, "a_int8"),
    ],
)
def test_int8_gemm_bad_input(a, b, exc, match):
    with pytest.raises(exc, match=match):
        Q.int8_gemm(a, b)


def test_int8_gemm_unknown_version():
    with pytest.raises(ValueError, match="version: 'sse9'"):
        Q.int8_gemm(np.ones((2, 2), np.int8), np.ones((2, 2), np.int8), "sse9")


def test_int8_gemm_backends_versions_and_path_alias():
    """quant.int8_gemm in the registry: cpp (one version per SIMD path) and the numpy int32 reference agree;
    path= still works as a deprecated alias of version=."""
    from tinylearn import backends

    assert backends.available("quant.int8_gemm")[0] == "cpp"
    assert backends.versions("quant.int8_gemm", "cpp")[0] == "auto"
    rng = np.random.default_rng(3)
    a, b = rng.integers(-128, 128, (5, 70), dtype=np.int8), rng.integers(-128, 128, (70, 6), dtype=np.int8)
    np.testing.assert_array_equal(Q.int8_gemm(a, b, backend="numpy"), _ref(a, b))
    with pytest.warns(DeprecationWarning, match="version="):
        np.testing.assert_array_equal(Q.int8_gemm(a, b, path="scalar"), _ref(a, b))
    np.testing.assert_array_equal(Q.int8_gemm(a, b, version="scalar", backend="cpu"), _ref(a, b))


@pytest.mark.skipif(not nvcc_available(), reason="nvcc not on PATH")
def test_dp4a_kernel_compiles(tmp_path):
    ptx = nvcc_compile_ptx(ROOT / "cuda_src" / "quant_int8_gemm_dp4a.cu", tmp_path)
    text = ptx.read_text()
    assert "int8_gemm_dp4a_tiled" in text and "int8_gemm_dp4a_naive" in text and "dp4a" in text


@pytest.mark.gpu
def test_dp4a_kernel_runs_exact():  # pragma: no cover - needs a GPU
    import cupy as cp

    mod = cp.RawModule(code=(ROOT / "cuda_src" / "quant_int8_gemm_dp4a.cu").read_text())
    rng = np.random.default_rng(0)
    m, k, n = 67, 132, 45
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    k4 = (k + 3) // 4
    ap = np.zeros((m, 4 * k4), np.int8)
    ap[:, :k] = a
    bt = np.zeros((n, 4 * k4), np.int8)
    bt[:, :k] = b.T
    for name, grid, block in (
        ("int8_gemm_dp4a_naive", ((n + 15) // 16, (m + 15) // 16), (16, 16)),
        ("int8_gemm_dp4a_tiled", ((n + 31) // 32, (m + 31) // 32), (32, 8)),
    ):
        c = cp.zeros((m, n), cp.int32)
        mod.get_function(name)(
            grid,
            block,
            (cp.asarray(ap.view(np.int32)), cp.asarray(bt.view(np.int32)), c, np.int32(m), np.int32(n), np.int32(k4)),
        )
        np.testing.assert_array_equal(cp.asnumpy(c), _ref(a, b))


# ------------------------------------------------------------------------------------------ int4
@pytest.mark.parametrize("n", [0, 1, 2, 7, 64, 1001])
def test_pack_unpack_int4_round_trip(n):
    rng = np.random.default_rng(n)
    q = rng.integers(-8, 8, n).astype(np.int8)
    p = Q.pack_int4(q)
    assert p.dtype == np.uint8 and p.size == (n + 1) // 2
    np.testing.assert_array_equal(Q.unpack_int4(p, n), q)


def test_pack_int4_layout():
    p = Q.pack_int4(np.array([1, -1, -8, 7, 3], np.int8))
    np.testing.assert_array_equal(p, [0xF1, 0x78, 0x03])  # low nibble first, two's complement, odd pad 0
    np.testing.assert_array_equal(Q.unpack_int4(p, 5), [1, -1, -8, 7, 3])
    np.testing.assert_array_equal(
        Q.unpack_int4(Q.pack_int4(np.array([15, 0, 9], np.uint8)), 3, signed=False), [15, 0, 9]
    )


def test_int4_bad_input():
    with pytest.raises(ValueError, match="q"):
        Q.pack_int4(np.array([8, -9]))
    with pytest.raises(TypeError, match="q"):
        Q.pack_int4(np.array([0.5]))
    with pytest.raises(ValueError, match="n"):
        Q.unpack_int4(np.zeros(2, np.uint8), 5)


@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("symmetric", [True, False])
def test_quantize_groupwise(group_size, symmetric):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((16, 256)).astype(np.float32)
    q, s, z = Q.quantize_groupwise(w, group_size, 4, symmetric)
    assert q.shape == w.shape and s.shape == (16, 256 // group_size) == z.shape
    if symmetric:
        assert q.min() >= -8 and q.max() <= 7 and not z.any()
    else:
        assert q.min() >= 0 and q.max() <= 15
    w_hat = Q.dequantize_groupwise(q, s, z, group_size)
    step = np.repeat(s, group_size, axis=1)
    assert np.all(np.abs(w_hat - w) <= step / 2 + 1e-6)  # no clipping: every weight within half a step
    # groups are independent: scaling one group leaves the others' codes unchanged
    w2 = w.copy()
    w2[:, :group_size] *= 10
    q2, _, _ = Q.quantize_groupwise(w2, group_size, 4, symmetric)
    np.testing.assert_array_equal(q2[:, group_size:], q[:, group_size:])


def test_groupwise_error_shrinks_with_group_size():
    rng = np.random.default_rng(4)
    w = (rng.standard_normal((64, 512)) * np.exp(rng.standard_normal((64, 512)))).astype(np.float32)
    errs = []
    for g in (512, 128, 32):
        q, s, z = Q.quantize_groupwise(w, g)
        errs.append(np.mean((Q.dequantize_groupwise(q, s, z, g) - w) ** 2))
    assert errs[0] > errs[1] > errs[2]


def test_quantize_groupwise_bad_input():
    with pytest.raises(ValueError, match="group_size"):
        Q.quantize_groupwise(np.ones((4, 100), np.float32), 128)
    with pytest.raises(ValueError, match="bits"):
        Q.quantize_groupwise(np.ones((4, 128), np.float32), 128, bits=1)


@pytest.mark.parametrize("mkn", [(1, 3, 1), (13, 70, 130), (64, 256, 64)])
def test_prepacked_weight_exact(mkn):
    m, k, n = mkn
    rng = np.random.default_rng(k)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    pk = Q.PackedInt8Weight(b)
    np.testing.assert_array_equal(pk.matmul(a), _ref(a, b))
    np.testing.assert_array_equal(pk.matmul(np.full((3, k), -128, np.int8)), _ref(np.full((3, k), -128, np.int8), b))
    with pytest.raises(ValueError, match="inner"):
        pk.matmul(np.zeros((2, k + 1), np.int8))
    with pytest.raises(TypeError, match="a_int8"):
        pk.matmul(np.zeros((2, k), np.float32))
