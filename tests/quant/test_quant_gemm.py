"""int8 GEMM (C++, every SIMD path) exact vs numpy int64 matmul incl. -128 extremes; the CUDA dp4a kernel compiles;
int4 packing and group-wise quantization."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tinylearn as tl
from tinylearn.testing import make_layouts, nvcc_available, nvcc_compile_ptx

Q = tl.quant
ROOT = Path(__file__).resolve().parents[2]
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
    np.testing.assert_array_equal(Q.int8_gemm(a, b, version=path), _ref(a, b))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("va, vb", [(-128, -128), (-128, 127), (127, 127), (127, -128)])
def test_int8_gemm_extremes(path, va, vb):
    # -128 * -128 pairs overflow int16 (maddubs-style) accumulators; the result must still be exact
    a = np.full((9, 1030), va, np.int8)
    b = np.full((1030, 37), vb, np.int8)
    np.testing.assert_array_equal(Q.int8_gemm(a, b, version=path), _ref(a, b))


@pytest.mark.parametrize("path", PATHS)
def test_int8_gemm_layouts(path):
    for (na, a), (nb, b) in zip(
        make_layouts((23, 41), "int8", seed=1, low=-128, high=127),
        make_layouts((41, 19), "int8", seed=9, low=-128, high=127),
    ):
        np.testing.assert_array_equal(Q.int8_gemm(a, b, version=path), _ref(a, b), err_msg=f"{na} @ {nb}")


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
        Q.int8_gemm(np.ones((2, 2), np.int8), np.ones((2, 2), np.int8), version="sse9")


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


def test_dp4a_is_the_cuda_backend_of_int8_gemm():
    """cuda_src/quant_int8_gemm_dp4a.cu is registered; without a GPU, naming it is the registry's RuntimeError."""
    from tinylearn import backends

    assert backends.versions("quant.int8_gemm", "cuda") == ["dp4a_naive", "dp4a_tiled"]
    assert backends.resolve("quant.int8_gemm")[0] != "cuda"  # priority 1: only when named
    if not backends.cuda_available():
        a = np.ones((2, 3), np.int8)
        with pytest.raises(RuntimeError, match="not available on this machine.*no CUDA device"):
            Q.int8_gemm(a, a.T.copy(), backend="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("version", ["dp4a_naive", "dp4a_tiled"])
@pytest.mark.parametrize("mkn", [(67, 132, 45), (1, 1, 1), (33, 5, 64)])
def test_dp4a_kernel_runs_exact(version, mkn):  # pragma: no cover - needs a GPU
    m, k, n = mkn
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    np.testing.assert_array_equal(Q.int8_gemm(a, b, backend="cuda", version=version), _ref(a, b))


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


# ------------------------------------------------------------------------------------------ packed ladder, levels
C_TL = pytest.importorskip("tinylearn.backends").load_C("quant")


def _levels() -> list[str]:
    """TINYLEARN_CPU_FEATURES levels this CPU can take: scalar always, avx2 / avx512 where present."""
    out = ["scalar"]
    if C_TL.int8_gemm_paths()[0] in ("avx2", "avx512vnni"):
        out.append("avx2")
    if "avx512vnni" in C_TL.int8_gemm_paths():
        out.append("avx512")
    return out


LEVELS = _levels()


def _versions_at(level: str, monkeypatch) -> list[str]:
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", level)
    return Q.gemm.packed_versions()


@pytest.mark.parametrize("level", LEVELS)
def test_levels_select_the_kernels(level, monkeypatch):
    vs = _versions_at(level, monkeypatch)
    wino_first = C_TL.int8_avx2_choice()["kernel"] == "avx2_wino"  # best first on a multiplier-bound core
    direct = ["avx2_madd16", "avx2_u7"]
    avx2 = (["avx2_wino", *direct] if wino_first else [*direct, "avx2_wino"]) + ["scalar"]
    want = {"scalar": ["scalar"], "avx2": avx2}.get(level)
    if want is not None:
        assert vs == want
    else:
        assert vs[0] == "avx512vnni" and vs[-1] == "scalar"
    # an explicit version above the level is refused (ValueError naming it), never silently downgraded
    pk = Q.PackedInt8Weight(np.ones((8, 3), np.int8))
    for v in {"avx512vnni", "avx2_madd16", "avx2_u7", "avx2_wino"} - set(vs):
        with pytest.raises(ValueError, match=v):
            pk.matmul(np.ones((2, 8), np.uint8), 0, version=v)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("mkn", [(1, 1, 1), (3, 5, 7), (4, 4, 64), (5, 130, 65), (13, 257, 130), (1, 1030, 3)])
def test_packed_versions_exact(level, mkn, monkeypatch):
    m, k, n = mkn
    rng = np.random.default_rng(7 * m + k + n)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    pk = Q.PackedInt8Weight(b)
    a8 = rng.integers(-128, 128, (m, k), dtype=np.int8)
    au = rng.integers(0, 256, (m, k), dtype=np.uint8)
    a7 = rng.integers(0, 128, (m, k), dtype=np.uint8)
    for v in _versions_at(level, monkeypatch):
        if v != "avx2_u7":
            np.testing.assert_array_equal(pk.matmul(a8, version=v), _ref(a8, b), err_msg=v)
            np.testing.assert_array_equal(pk.matmul(au, 17, version=v), _ref(au.astype(np.int64) - 17, b), err_msg=v)
        np.testing.assert_array_equal(pk.matmul(a7, 3, version=v), _ref(a7.astype(np.int64) - 3, b), err_msg=v)
    np.testing.assert_array_equal(pk.matmul(a8), _ref(a8, b))  # auto


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("va, vb", [(255, 127), (255, -128), (0, -128), (128, -128)])
def test_packed_adversarial_u8_exact(level, va, vb, monkeypatch):
    """All-255 (or 128) activations against all-127 / all -128 weights: every vpmaddubsw pair would saturate
    (2*255*127 = 64770 > 32767); the non-saturating kernels must give the exact int32 result."""
    k, n = 1027, 70
    a = np.full((6, k), va, np.uint8)
    b = np.full((k, n), vb, np.int8)
    pk = Q.PackedInt8Weight(b)
    want = (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32)
    assert abs(int(want[0, 0])) == k * va * abs(vb)
    for v in _versions_at(level, monkeypatch):
        if v == "avx2_u7" and va > 127:
            with pytest.raises(ValueError, match="0..127"):
                pk.matmul(a, 0, version=v)
            continue
        np.testing.assert_array_equal(pk.matmul(a, 0, version=v), want, err_msg=v)


@pytest.mark.parametrize("level", LEVELS)
def test_int8_gemm_versions_exact_at_every_level(level, monkeypatch):
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", level)
    rng = np.random.default_rng(5)
    a = rng.integers(-128, 128, (37, 300), dtype=np.int8)
    b = rng.integers(-128, 128, (300, 90), dtype=np.int8)
    a[:3], b[:, :2] = -128, -128
    versions = Q.gemm.int8_gemm_versions()
    assert versions[-1] == "scalar" and ("avx2_madd16" in versions) == (level != "scalar")
    for v in versions:
        np.testing.assert_array_equal(Q.int8_gemm(a, b, version=v), _ref(a, b), err_msg=v)


@pytest.mark.skipif("avx2" not in C_TL.int8_gemm_paths(), reason="needs AVX2 (vpmaddubsw)")
def test_maddubs_saturates_exactly_as_defined():
    """The real vpmaddubsw kernel equals the numpy definition (int16-saturated pair sums) bit for bit: wrong vs the
    int64 product on 8-bit codes, exact on 7-bit codes."""
    rng = np.random.default_rng(11)
    b = rng.integers(-128, 128, (301, 45), dtype=np.int8)
    b[:, 0] = -128
    a = rng.integers(0, 256, (9, 301), dtype=np.uint8)
    a[0] = 255
    got = Q.gemm.int8_gemm_maddubs_saturating(a, b)
    np.testing.assert_array_equal(got, Q.gemm.maddubs_reference(a, b))
    assert got[0, 0] == 150 * -32768 + 255 * -128  # 150 saturated pairs + the odd last product
    assert (got != _ref(a, b)).any()
    a7 = (a >> 1).astype(np.uint8)
    np.testing.assert_array_equal(Q.gemm.int8_gemm_maddubs_saturating(a7, b), _ref(a7, b))


def test_packed_weight_bad_input():
    pk = Q.PackedInt8Weight(np.ones((8, 3), np.int8))
    with pytest.raises(ValueError, match="version"):
        pk.matmul(np.ones((2, 8), np.int8), version="sse9")
    with pytest.raises(ValueError, match="zero_point"):
        pk.matmul(np.ones((2, 8), np.int8), zero_point=3)
    with pytest.raises(TypeError, match="a_int8"):
        pk.matmul(np.ones((2, 8), np.int16))
    with pytest.raises(ValueError, match="a_int8"):
        pk.matmul(np.ones((2, 7), np.uint8))


# ------------------------------------------------------------------------------------------ dynamic int8 Linear
def _torch_dynamic(w, b):
    import warnings

    import torch

    lin = torch.nn.Linear(w.shape[1], w.shape[0])
    with torch.no_grad():
        lin.weight.copy_(torch.from_numpy(w))
        lin.bias.copy_(torch.from_numpy(b))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(lin), {torch.nn.Linear}, torch.qint8)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("m, k, n", [(1, 64, 32), (32, 256, 100), (7, 1024, 1024)])
def test_dynamic_linear_matches_torch(level, m, k, n, monkeypatch):
    import torch

    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", level)
    from tinylearn.quant.modules import DynamicQuantizedLinear

    rng = np.random.default_rng(m + k)
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    x = (rng.standard_normal((m, k)) + 0.3).astype(np.float32)
    tq = _torch_dynamic(w, b)
    y_t = tq(torch.from_numpy(x)).numpy()
    mod = DynamicQuantizedLinear(w, b)  # torch defaults: per-tensor weights, reduce_range
    y = mod(tl.Tensor(x)).data
    ch = C_TL.int8_avx2_choice()  # 7-bit codes below wino_min_rows rows keep u7 (no per-call widening of B)
    avx2_auto = "avx2_wino" if ch["kernel"] == "avx2_wino" and m >= ch["wino_min_rows_7bit"] else "avx2_u7"
    assert mod.last_kernel == {"scalar": "scalar", "avx2": avx2_auto}.get(level, "avx512vnni")
    # same quantization parameters as torch: weight scale, activation scale / zero point (reduce_range: 0..127)
    assert np.isclose(mod.w_scale[0], tq[0].weight().q_scale(), rtol=1e-6)
    s_t, z_t = torch._choose_qparams_per_tensor(torch.from_numpy(x), True)
    sx, zx = mod.last_act_qparams
    assert np.isclose(sx[0], s_t, rtol=1e-6) and int(zx[0]) == z_t
    # quantization tolerance: one activation code step against the largest weight row, plus float rounding
    step = float(sx[0]) * float(mod.w_scale[0]) * np.abs(mod.w_q.astype(np.int64)).sum(1).max()
    np.testing.assert_allclose(y, y_t, atol=step / 64 + 1e-5, rtol=1e-5)
    # and close to the float layer (error of 8-bit weights / 7-bit activations)
    assert np.abs(y - (x @ w.T + b)).max() < 0.05 * np.abs(x @ w.T).max()


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize(
    "per_channel, reduce_range, per_row",
    [(False, True, False), (True, False, False), (True, True, True), (False, False, True)],
)
def test_dynamic_linear_accumulators_exact(level, per_channel, reduce_range, per_row, monkeypatch):
    """The int32 accumulators inside the dynamic Linear equal numpy's int64 product bit for bit, on every level,
    and the fused C++ forward equals the same arithmetic done in numpy (codes, accumulators, fp32 epilogue)."""
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", level)
    from tinylearn.quant.modules import DynamicQuantizedLinear

    rng = np.random.default_rng(3)
    w = rng.standard_normal((70, 300)).astype(np.float32)
    w[0] = np.abs(w[0])  # a same-sign row: large pair sums
    b = rng.standard_normal(70).astype(np.float32)
    x = np.abs(rng.standard_normal((2, 9, 300))).astype(np.float32) * 3  # non-negative: codes reach qmax
    mod = DynamicQuantizedLinear(w, b, per_channel, reduce_range, per_row)
    y = mod(x).data
    assert y.shape == (2, 9, 70)
    x2 = x.reshape(-1, 300)
    q, s, z = mod.quantize_input(x2)
    assert q.max() == (127 if reduce_range else 255)
    np.testing.assert_array_equal(s, mod.last_act_qparams[0])
    np.testing.assert_array_equal(z, mod.last_act_qparams[1])
    acc = mod.int32_accumulators(q, z if per_row else int(z[0]))
    want = (q.astype(np.int64) - z.astype(np.int64)[:, None]) @ mod.w_q.astype(np.int64).T
    np.testing.assert_array_equal(acc, want)
    sx = s[:, None] if per_row else s[0]
    y_ref = acc.astype(np.float32) * (sx * mod.w_scale) + b
    np.testing.assert_allclose(y.reshape(-1, 70), y_ref, rtol=1e-6, atol=1e-6)


def test_dynamic_linear_noncontiguous_and_module_swap():
    from tinylearn.quant.modules import DynamicQuantizedLinear, quantize_dynamic

    rng = np.random.default_rng(4)
    model = tl.nn.Sequential(tl.nn.Linear(40, 30), tl.nn.ReLU(), tl.nn.Linear(30, 5))
    qm = quantize_dynamic(model)
    assert isinstance(qm[0], DynamicQuantizedLinear) and isinstance(qm[2], DynamicQuantizedLinear)
    assert isinstance(model[0], tl.nn.Linear)  # original untouched
    xt = rng.standard_normal((40, 12)).astype(np.float32).T  # non-contiguous [12, 40]
    y = qm(tl.Tensor(xt)).data
    np.testing.assert_allclose(y, qm(tl.Tensor(np.ascontiguousarray(xt))).data, rtol=0, atol=0)
    y_f = model(tl.Tensor(xt)).data
    assert np.abs(y - y_f).max() < 0.05 * np.abs(y_f).max() + 1e-3


def test_dynamic_linear_bad_input():
    from tinylearn.quant.modules import DynamicQuantizedLinear

    mod = DynamicQuantizedLinear(np.ones((4, 8), np.float32))
    with pytest.raises(ValueError, match="in_features"):
        mod(np.ones((2, 7), np.float32))
    x = np.ones((2, 8), np.float32)
    x[1, 3] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        mod(x)
    with pytest.raises(ValueError, match="weight"):
        DynamicQuantizedLinear(np.ones(4, np.float32))
    with pytest.raises(ValueError, match="bias"):
        DynamicQuantizedLinear(np.ones((4, 8), np.float32), np.ones(3, np.float32))
    with pytest.raises(ValueError, match="version"):
        DynamicQuantizedLinear(np.ones((4, 8), np.float32), version="sse9")


@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (3, 7, 5), (4, 64, 9), (2, 301, 3)])
def test_winograd_reference_is_the_product_with_half_the_multiplies(m, k, n):
    """The identity behind avx2_wino, in numpy: exact for int8 extremes and odd K (zero padding), M N K/2 + (M + N) K/2
    multiplications instead of M N K."""
    rng = np.random.default_rng(m * k + n)
    a = rng.integers(-128, 128, (m, k))
    b = rng.integers(-128, 128, (k, n))
    a[0, :] = -128
    b[:, 0] = -128
    c, mults = Q.winograd_reference(a, b)
    np.testing.assert_array_equal(c, a @ b)
    half = (k + 1) // 2
    assert mults == (m * n + m + n) * half
    with pytest.raises(ValueError, match="winograd_reference"):
        Q.winograd_reference(a, np.zeros((k + 1, n), np.int64))


@pytest.mark.skipif("avx2" not in C_TL.int8_gemm_paths(), reason="needs AVX2")
def test_avx2_choice_follows_the_measured_multiplier_rate():
    """'auto' on AVX2 without VNNI runs Winograd exactly where a vpmaddwd + vpaddd stream measured below 1.5x the MAC
    rate of an fp32 FMA stream (the multiplier is the bottleneck), and the direct kernels elsewhere."""
    c = Q.avx2_choice()
    assert c == dict(C_TL.int8_avx2_choice())  # measured once per process
    assert 0.2 < c["madd16_over_fma"] < 8.0
    assert (c["kernel"] == "avx2_wino") == (c["madd16_over_fma"] < 1.5)
    if c["kernel"] != "avx2_wino" or "avx512vnni" in C_TL.int8_gemm_paths():
        return
    # which kernel "auto" ran is visible through the dynamic Linear: 7-bit codes keep u7 below the row threshold
    from tinylearn.quant.modules import DynamicQuantizedLinear

    w = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)
    for reduce_range, m, want in [
        (True, 1, "avx2_u7"),
        (True, c["wino_min_rows_7bit"], "avx2_wino"),
        (False, 1, "avx2_wino"),
    ]:
        mod = DynamicQuantizedLinear(w, None, reduce_range=reduce_range)
        mod(np.ones((m, 64), np.float32))
        assert mod.last_kernel == want, (reduce_range, m)


@pytest.mark.skipif("avx2" not in C_TL.int8_gemm_paths(), reason="needs AVX2")
def test_winograd_sums_wrap_and_stay_exact():
    """avx2_wino's sums (a + b)(a' + b') reach 2 * 256^2 per lane, its row and column terms K/2 * 128^2: at K = 65536
    of -128s they wrap modulo 2^32 (W = 2^31), the result C = K * 2^14 = 2^30 must still be exact; uint8 255 x -128
    at K = 65536 gives C = -2139095040, near the int32 limit."""
    k = 65536
    b = np.full((k, 70), -128, np.int8)
    pk = Q.PackedInt8Weight(b)
    a = np.full((4, k), -128, np.int8)
    got = pk.matmul(a, version="avx2_wino")
    assert (got == 1 << 30).all()
    au = np.full((4, k), 255, np.uint8)
    assert (pk.matmul(au, 0, version="avx2_wino") == -255 * 128 * k).all()
    assert (pk.matmul(au, 255, version="avx2_wino") == 0).all()


def test_packed_k_limit_and_wrapping_offset():
    """uint8 codes minus a zero point reach |C| = K * 255 * 128: K > 65536 is refused (int32 could overflow);
    int8 A near the int8 limit stays exact although the +128-offset sums wrap modulo 2^32 inside the kernel."""
    pk = Q.PackedInt8Weight(np.full((65537, 1), -128, np.int8))
    with pytest.raises(ValueError, match="65536"):
        pk.matmul(np.zeros((1, 65537), np.uint8))
    k = 131071
    b = np.full((k, 2), -128, np.int8)
    a = np.full((1, k), 127, np.int8)  # offset codes 255: S = -255 * 128 * k wraps; C = -2130690176 fits
    pk2 = Q.PackedInt8Weight(b)
    for v in Q.gemm.packed_versions():
        if v != "avx2_u7":
            np.testing.assert_array_equal(pk2.matmul(a, version=v), _ref(a, b), err_msg=v)


# ------------------------------------------------------------------------------------------ micro-kernel tails
# The vnni and avx2_madd16 kernels work on 6-row x 64-column blocks (avx2_u7 and scalar on 4 rows, avx2_wino on
# 3 rows x 32 columns), K in 4-deep quads blocked by 64 quads (256 k; 128 quads for avx2_madd16): M around and below
# the block rows, K not a multiple of 2 / 4 / 32 / 256 / 512, N not a multiple of 8 / 16 / 64 exercise every tail
# (padded rows, zero K padding, partial column panels).
TAIL_M = [1, 2, 3, 4, 5, 6, 7, 11, 12, 13, 25]
TAIL_KN = [(1, 1), (3, 17), (33, 65), (257, 63), (515, 130)]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("k, n", TAIL_KN)
def test_packed_versions_row_and_k_tails(level, k, n, monkeypatch):
    rng = np.random.default_rng(k * 31 + n)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    b[0] = -128  # an extreme row: -128 * 255 pairs
    pk = Q.PackedInt8Weight(b)
    versions = _versions_at(level, monkeypatch)
    for m in TAIL_M:
        a8 = rng.integers(-128, 128, (m, k), dtype=np.int8)
        au = rng.integers(0, 256, (m, k), dtype=np.uint8)
        au[:, 0] = 255
        a7 = rng.integers(0, 128, (m, k), dtype=np.uint8)
        for v in versions:
            msg = f"{v} m={m} k={k} n={n}"
            if v != "avx2_u7":
                np.testing.assert_array_equal(pk.matmul(a8, version=v), _ref(a8, b), err_msg=msg)
                np.testing.assert_array_equal(
                    pk.matmul(au, 200, version=v), _ref(au.astype(np.int64) - 200, b), err_msg=msg
                )
            np.testing.assert_array_equal(pk.matmul(a7, 64, version=v), _ref(a7.astype(np.int64) - 64, b), err_msg=msg)


def test_madd16_shared_widened_b_under_threads():
    """avx2_madd16 widens each (panel, K block) of B once per call into a buffer shared by the threads (claimed by
    a CAS; a thread that finds a piece being widened widens its own copy): many row items x panels x K blocks
    (incl. a partial last block), repeated so that threads race for the same pieces, stay exact."""
    if "avx2_madd16" not in Q.gemm.packed_versions():
        pytest.skip("needs AVX2")
    rng = np.random.default_rng(5)
    for m, k, n in [(300, 1030, 200), (97, 515, 130), (40, 2049, 64)]:
        b = rng.integers(-128, 128, (k, n), dtype=np.int8)
        pk = Q.PackedInt8Weight(b)
        a8 = rng.integers(-128, 128, (m, k), dtype=np.int8)
        au = rng.integers(0, 256, (m, k), dtype=np.uint8)
        want8, wantu = _ref(a8, b), _ref(au.astype(np.int64) - 131, b)
        for _ in range(5):
            np.testing.assert_array_equal(pk.matmul(a8, version="avx2_madd16"), want8, err_msg=f"{m}x{k}x{n}")
            np.testing.assert_array_equal(pk.matmul(au, 131, version="avx2_madd16"), wantu, err_msg=f"{m}x{k}x{n} u8")


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("mkn", [(7, 31, 9), (13, 257, 65), (6, 515, 1), (25, 66, 130)])
def test_int8_gemm_every_version_odd_shapes(level, mkn, monkeypatch):
    """The per-call int8_gemm versions (incl. avx2_madd16 on the packed layout) on odd M / K / N at every level."""
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", level)
    m, k, n = mkn
    rng = np.random.default_rng(m + k + n)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    a[0], b[:, 0] = -128, -128
    for v in Q.gemm.int8_gemm_versions():
        np.testing.assert_array_equal(Q.int8_gemm(a, b, version=v), _ref(a, b), err_msg=f"{v} {mkn}")


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("reduce_range, per_row", [(True, False), (False, False), (True, True)])
@pytest.mark.parametrize("m, k", [(1, 37), (5, 64), (97, 1024), (300, 301)])
def test_dynamic_linear_codes_match_numpy(level, reduce_range, per_row, m, k, monkeypatch):
    """The fused C++ activation pass (min/max, 32-wide quantize with a scalar tail, rows quantized by the work item
    that multiplies them) picks the same qparams and codes as the numpy reference, on row counts below and above
    the row-split threshold and K with tails; ties x / s = n + 0.5 round to even in both. Checked through the exact
    accumulators: the C++ forward equals the numpy epilogue on the numpy codes."""
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", level)
    from tinylearn.quant.modules import DynamicQuantizedLinear

    rng = np.random.default_rng(m * k)
    n = 70
    w = rng.standard_normal((n, k)).astype(np.float32)
    mod = DynamicQuantizedLinear(w, rng.standard_normal(n).astype(np.float32), False, reduce_range, per_row)
    x = rng.standard_normal((m, k)).astype(np.float32) * 2
    x.flat[-1] = 9.0  # the range's extreme in the last chunk
    x.flat[0] = -3.0
    y = mod(x).data
    q, s, z = mod.quantize_input(x)
    np.testing.assert_array_equal(s, mod.last_act_qparams[0])
    np.testing.assert_array_equal(z, mod.last_act_qparams[1])
    y_ref = mod._forward_numpy(x)[0]
    np.testing.assert_allclose(y, y_ref, rtol=1e-6, atol=1e-6)
    # a NaN in the last element (the last row's work item) is refused
    x.flat[-1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        mod(x)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("m", [11, 12, 13, 23, 24, 25, 49, 131])
def test_dynamic_linear_work_split_every_version(level, m, monkeypatch):
    """The fused forward splits its work by column panels (few rows, quantized up front) or by chunks of rows (each
    item quantizes its rows, then multiplies them): row counts around the switch (2 row blocks per thread) and
    with M % 6 / M % 4 tails give the numpy arithmetic exactly, for every packed kernel, per tensor and per row,
    7- and 8-bit codes; a NaN in a middle row is refused in both splits."""
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", level)
    from tinylearn.quant.gemm import packed_versions
    from tinylearn.quant.modules import DynamicQuantizedLinear

    rng = np.random.default_rng(m)
    k, n = 200, 150  # K % 4 == 0 with a K-block tail, N = 2 full panels + a partial one
    w = rng.standard_normal((n, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    x = (rng.standard_normal((m, k)) * 2 + 0.5).astype(np.float32)
    for v in packed_versions():
        for reduce_range, per_row in [(True, False), (False, False), (True, True), (False, True)]:
            if v == "avx2_u7" and not reduce_range:
                continue
            mod = DynamicQuantizedLinear(
                w, b, per_channel=per_row, reduce_range=reduce_range, per_row=per_row, version=v
            )
            y = mod(x).data
            assert mod.last_kernel == v
            q, s, z = mod.quantize_input(x)
            np.testing.assert_array_equal(s, mod.last_act_qparams[0])
            np.testing.assert_array_equal(z, mod.last_act_qparams[1])
            np.testing.assert_allclose(y, mod._forward_numpy(x)[0], rtol=1e-6, atol=1e-6, err_msg=f"{v} m={m}")
            xn = x.copy()
            xn[m // 2, k // 3] = np.inf
            with pytest.raises(ValueError, match="NaN or Inf"):
                mod(xn)


def test_bench_sets_fbgemm_avx2_under_the_avx2_proxy(monkeypatch):
    """tinylearn bench quant under TINYLEARN_CPU_FEATURES=avx2 asks torch's fbgemm for its AVX2 kernels
    (FBGEMM_ENABLE_INSTRUCTIONS, read by fbgemm at its first GEMM) and keeps a value the caller set."""
    from tinylearn.quant import bench

    monkeypatch.delenv(bench.FBGEMM_ENV, raising=False)
    monkeypatch.delenv("TINYLEARN_CPU_FEATURES", raising=False)
    assert bench.fbgemm_isa() == ""
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", "avx2")
    assert bench.fbgemm_isa() == "AVX2"
    monkeypatch.setenv(bench.FBGEMM_ENV, "AVX512")
    assert bench.fbgemm_isa() == "AVX512"


# ------------------------------------------------------------------------------------------ Strassen (avx2_strassen)
_STRASSEN_SHAPES = [(2, 8, 128), (6, 16, 256), (8, 72, 384), (98, 264, 128), (100, 520, 640), (290, 1032, 256)]


@pytest.mark.parametrize("m, k, n", [(2, 8, 4), (4, 64, 6), (16, 32, 64), (8, 8, 8)])
def test_strassen_reference_is_the_product_with_seven_of_eight_multiplies(m, k, n):
    """One level: 7 block products of (M/2)(K/2)(N/2); l levels: 7^l of them, exact in int64; the sign tables the C++
    kernel uses are the ones the reference uses."""
    rng = np.random.default_rng(m + k + n)
    a = rng.integers(-128, 128, (m, k)).astype(np.int64)
    b = rng.integers(-128, 128, (k, n)).astype(np.int64)
    levels = 0
    while all(d % (2 << levels) == 0 for d in (m, k, n)) and levels < 3:
        levels += 1
    for lv in range(levels + 1):
        c, mults = Q.strassen_reference(a, b, lv)
        np.testing.assert_array_equal(c, a @ b, err_msg=f"levels={lv}")
        assert mults == m * k * n * 7**lv // 8**lv
    with pytest.raises(ValueError, match="not divisible"):
        Q.strassen_reference(a[:, :-1], b[:-1], 1) if k % 2 == 0 else Q.strassen_reference(a, b, levels + 1)
    with pytest.raises(ValueError, match="levels"):
        Q.strassen_reference(a, b, -1)
    if Q.gemm.backends.C_available("quant"):  # the C++ kernel's tables are the reference's
        assert [t.tolist() for t in Q.gemm.strassen_signs()] == [list(map(list, t)) for t in C_TL.int8_strassen_signs()]


def test_strassen_in_float_rounds_the_operand_sums():
    """The same algebra in float32 is not exact: the operand sums round, and the error grows with the levels
    (why Strassen suits integer GEMM, where every step is exact)."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((256, 256)).astype(np.float32)
    b = rng.standard_normal((256, 256)).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    err = [float(np.abs(Q.strassen_reference(a, b, lv)[0] - exact).max()) for lv in (0, 3)]
    assert err[1] > 1.3 * err[0], err


def _needs_strassen():
    if "avx2_wino" not in Q.gemm.packed_versions():
        pytest.skip("avx2_strassen needs AVX2 and the C++ extension")


@pytest.mark.parametrize("m, k, n", _STRASSEN_SHAPES)
def test_strassen_exact(m, k, n):
    """avx2_strassen equals numpy's int64 product for int8 A and for uint8 codes minus zero points 0 / 200 / 255,
    over row counts that split into items with a 1- and 2-row last block (M/2 % 3) and several K blocks."""
    _needs_strassen()
    rng = np.random.default_rng(m * k + n)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    b[0] = -128
    pk = Q.PackedInt8Weight(b)
    a8 = rng.integers(-128, 128, (m, k), dtype=np.int8)
    a8[:, 1] = -128
    np.testing.assert_array_equal(pk.matmul(a8, version="avx2_strassen"), _ref(a8, b))
    assert pk.last_version == "avx2_strassen"
    au = rng.integers(0, 256, (m, k), dtype=np.uint8)
    au[:, 0] = 255
    for zp in (0, 200, 255):
        np.testing.assert_array_equal(pk.matmul(au, zp, version="avx2_strassen"), _ref(au.astype(np.int64) - zp, b))


def test_strassen_quadrant_extremes():
    """Every quadrant at an extreme: the operand sums reach 510 (uint8 255 - 0 twice) and 256 (B), the kernel's
    pre-add a + b 766; all 16 A patterns x 4 B patterns stay exact."""
    _needs_strassen()
    m, k, n = 4, 64, 128
    for bits in range(16):
        au = np.zeros((m, k), np.uint8)
        a8 = np.zeros((m, k), np.int8)
        for q in range(4):
            rows = slice(0, m // 2) if q < 2 else slice(m // 2, m)
            cols = slice(0, k // 2) if q % 2 == 0 else slice(k // 2, k)
            au[rows, cols] = 255 if bits >> q & 1 else 0
            a8[rows, cols] = 127 if bits >> q & 1 else -128
        for bpat in range(4):
            b = np.full((k, n), -128, np.int8)
            if bpat & 1:
                b[: k // 2, n // 2 :] = 127
            if bpat & 2:
                b[k // 2 :, : n // 2] = 127
            pk = Q.PackedInt8Weight(b)
            msg = f"A pattern {bits}, B pattern {bpat}"
            np.testing.assert_array_equal(pk.matmul(a8, version="avx2_strassen"), _ref(a8, b), err_msg=msg)
            np.testing.assert_array_equal(pk.matmul(au, 0, version="avx2_strassen"), _ref(au, b), err_msg=msg)


def test_strassen_sums_wrap_and_stay_exact():
    """At K = 65536 the block products and the Winograd terms wrap modulo 2^32; C = -255 * 128 * K, near the int32
    limit, must come out exact (and int8 -128 x -128 gives 2^30)."""
    _needs_strassen()
    k = 65536
    pk = Q.PackedInt8Weight(np.full((k, 128), -128, np.int8))
    au = np.full((2, k), 255, np.uint8)
    assert (pk.matmul(au, 0, version="avx2_strassen") == -255 * 128 * k).all()
    assert (pk.matmul(au, 255, version="avx2_strassen") == 0).all()
    assert (pk.matmul(np.full((2, k), -128, np.int8), 0, version="avx2_strassen") == 1 << 30).all()


def test_strassen_prepared_b_copies_and_threads():
    """The prepared B is 64-byte aligned; a misaligned copy of it (what pickling or np.copy may give) is realigned,
    not misread; repeated calls (threads racing over the row items) stay exact."""
    _needs_strassen()
    rng = np.random.default_rng(11)
    m, k, n = 194, 256, 384
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    wide, terms = C_TL.int8_strassen_pack(b)
    assert wide.ctypes.data % 64 == 0
    buf = np.empty(wide.size + 32, np.int16)
    off = next(o for o in range(32) if (buf.ctypes.data + 2 * o) % 64 == 16)  # 16 bytes past a 64-byte boundary
    moved = buf[off : off + wide.size]
    moved[:] = wide
    assert moved.ctypes.data % 64 == 16
    want = _ref(a, b)
    for w in (wide, moved):
        for _ in range(5):
            np.testing.assert_array_equal(C_TL.int8_gemm_strassen(a, w, terms, k, n), want)


def test_strassen_refuses_bad_input():
    """Shapes it cannot block, a prepared B of another shape, a CPU level without AVX2 and zero points outside
    uint8 are ValueErrors that name the argument and the value."""
    _needs_strassen()
    pk = Q.PackedInt8Weight(np.ones((64, 128), np.int8))
    with pytest.raises(ValueError, match="M=3"):
        pk.matmul(np.ones((3, 64), np.int8), version="avx2_strassen")
    for k, n, what in [(60, 128, "K=60"), (64, 100, "N=100")]:
        with pytest.raises(ValueError, match=what):
            Q.PackedInt8Weight(np.ones((k, n), np.int8)).matmul(np.ones((2, k), np.int8), version="avx2_strassen")
    with pytest.raises(ValueError, match="zero_point: 256"):
        pk.matmul(np.ones((2, 64), np.uint8), 256)
    with pytest.raises(ValueError, match="zero_point: -1"):
        pk.matmul(np.ones((2, 64), np.uint8), -1)
    with pytest.raises(ValueError, match="shape"):
        C_TL.int8_strassen_pack(np.ones((64, 100), np.int8))
    wide, terms = C_TL.int8_strassen_pack(np.ones((64, 128), np.int8))
    with pytest.raises(ValueError, match="prepared B"):
        C_TL.int8_gemm_strassen(np.ones((2, 64), np.int8), wide[:-1], terms, 64, 128)
    with pytest.raises(ValueError, match="K=32"):
        C_TL.int8_gemm_strassen(np.ones((2, 32), np.int8), wide, terms, 64, 128)
    # |C| <= K * 255 * 128 must fit int32: uint8 codes stop at K = 65536 (int8 at 2^17 - 1), as the packed kernels
    with pytest.raises(ValueError, match="65536"):
        C_TL.int8_gemm_strassen(np.zeros((2, 65544), np.uint8), wide, terms, 65544, 128)


def test_strassen_refused_without_avx2(monkeypatch):
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", "scalar")
    pk = Q.PackedInt8Weight(np.ones((64, 128), np.int8))
    with pytest.raises(ValueError, match="avx2_strassen"):
        pk.matmul(np.ones((2, 64), np.int8), version="avx2_strassen")
    assert not Q.strassen_auto(512, 1024, 1024)  # "auto" keeps the level's kernels
    np.testing.assert_array_equal(pk.matmul(np.ones((2, 64), np.int8)), np.full((2, 128), 64))
    assert pk.last_version == "auto"


def test_strassen_auto_rule():
    """ "auto" runs avx2_strassen where avx2_wino is the AVX2 choice and the shape is in the measured range (M >= 64,
    512 <= K, N, K N <= 2^21); the result is the same product either way."""
    _needs_strassen()
    wino_first = Q.gemm.packed_versions()[0] == "avx2_wino"
    for (m, k, n), in_range in [
        ((512, 1024, 1024), True),
        ((64, 512, 512), True),
        ((62, 512, 512), False),
        ((512, 256, 1024), False),
        ((512, 2048, 2048), False),
        ((511, 1024, 1024), False),
    ]:
        assert Q.strassen_auto(m, k, n) == (in_range and wino_first), (m, k, n)
    rng = np.random.default_rng(2)
    b = rng.integers(-128, 128, (512, 512), dtype=np.int8)
    a = rng.integers(-128, 128, (64, 512), dtype=np.int8)
    pk = Q.PackedInt8Weight(b)
    before = pk.nbytes
    np.testing.assert_array_equal(pk.matmul(a), _ref(a, b))
    assert pk.last_version == ("avx2_strassen" if wino_first else "auto")
    assert (pk.nbytes > before) == wino_first  # the seven widened B operands, cached


# ---------------------------------------------------------------- cache-oblivious recursion (notebook 03, Q84)
@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 33, 5), (96, 200, 72), (64, 64, 64), (0, 4, 3)])
def test_cache_oblivious_matmul_exact(shape) -> None:
    m, k, n = shape
    rng = np.random.default_rng(sum(shape))
    a, b = rng.integers(-128, 128, (m, k)), rng.integers(-128, 128, (k, n))
    c, ws = Q.cache_oblivious_matmul(a, b, leaf=8)
    assert c.dtype == np.int64 and np.array_equal(c, a @ b)
    assert ws[0] == m * k + k * n + m * n
    assert all(ws[d + 1] >= ws[d] / 2 for d in range(len(ws) - 1))  # at most 2x smaller per depth
    assert ws[-1] <= 3 * 8 * 8


def test_cache_oblivious_matmul_float_matches_and_bad_input() -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((50, 70)).astype(np.float64)
    b = rng.standard_normal((70, 30)).astype(np.float64)
    np.testing.assert_allclose(Q.cache_oblivious_matmul(a, b, leaf=16)[0], a @ b, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="a \\[M, K\\]"):
        Q.cache_oblivious_matmul(a, a)
    with pytest.raises(ValueError, match="leaf"):
        Q.cache_oblivious_matmul(a, b, leaf=0)


def test_packed_and_dynamic_ladders_are_registry_ops():
    """PackedInt8Weight.matmul and DynamicQuantizedLinear dispatch through quant.int8_packed_gemm /
    quant.int8_dynamic_linear: backends.use pins them, the version lists are the registry's rungs this CPU runs,
    and backend/version are keyword-only."""
    from tinylearn import backends
    from tinylearn.quant.gemm import PACKED_OP, PACKED_VERSIONS
    from tinylearn.quant.modules import DYNAMIC_OP, DynamicQuantizedLinear

    assert backends.versions(PACKED_OP, "cpp") == list(dict.fromkeys(PACKED_VERSIONS))
    assert backends.registered(DYNAMIC_OP) == ["cpp", "numpy"]
    for listing, op in ((Q.packed_versions(), PACKED_OP), (Q.int8_gemm_paths(), "quant.int8_gemm")):
        assert listing and set(listing) <= set(backends.versions(op, "cpp"))
    assert set(Q.gemm.int8_gemm_versions()) <= set(backends.versions("quant.int8_gemm", "cpp"))
    rng = np.random.default_rng(4)
    b = rng.integers(-128, 128, (40, 9), dtype=np.int8)
    a = rng.integers(0, 128, (3, 40), dtype=np.uint8)
    pk = Q.PackedInt8Weight(b)
    with backends.use(PACKED_OP, backend="numpy"):
        np.testing.assert_array_equal(pk.matmul(a, 5), _ref(a.astype(np.int64) - 5, b))
    with backends.use(PACKED_OP, backend="cpp", version="scalar"):
        np.testing.assert_array_equal(pk.matmul(a, 5), _ref(a.astype(np.int64) - 5, b))
        assert pk.last_version == "scalar"
    np.testing.assert_array_equal(pk.matmul(a, 5, backend="numpy", version="scalar"), _ref(a.astype(np.int64) - 5, b))
    mod = DynamicQuantizedLinear(rng.standard_normal((9, 40)).astype(np.float32))
    x = rng.standard_normal((2, 40)).astype(np.float32)
    y = mod(x).data
    with backends.use(DYNAMIC_OP, backend="numpy"):
        np.testing.assert_allclose(mod(x).data, y, rtol=1e-6, atol=1e-6)
        assert mod.last_kernel == "numpy"
    with pytest.raises(TypeError):
        Q.int8_gemm(b.T.copy(), b, "scalar")  # version is keyword-only
    with pytest.raises(TypeError):
        pk.matmul(a, 0, "scalar")
    with pytest.raises(TypeError):
        tl.gemm.matmul(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32), "numpy")
