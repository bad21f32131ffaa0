"""Kernel versions (llm.c style): every version in cpp_src/kernels_*.cpp and every algorithmic variant in the numpy
reference is validated against torch; plus the accuracy of the vectorisable exp/erf the float32 kernels use."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.special import erf as special_erf

import tinylearn as tl
import tinylearn.cpu
from tinylearn.kernels import cpu as cpu_k
from tinylearn.kernels import reference
from tinylearn.testing import assert_close, make_array

if not tl.backends.C_available("kernels"):
    pytest.skip("tinylearn._C.kernels not built", allow_module_level=True)
C = tl.backends.load_C("kernels")


@pytest.mark.parametrize("version", ["three_pass", "online"])
@pytest.mark.parametrize("shape", [(1, 1), (3, 15), (4, 16), (5, 17), (2, 4099)])
def test_softmax_versions(version: str, shape: tuple[int, int]) -> None:
    x = make_array(shape, seed=1, low=-30, high=30)
    x[0, 0] = -np.inf
    assert_close(
        tl.kernels.softmax(x, backend="cpu", version=version), torch.softmax(torch.from_numpy(x), -1), "float32"
    )


@pytest.mark.parametrize("version", ["three_pass", "online"])
def test_softmax_versions_masked_and_nan(version: str) -> None:
    x = np.full((3, 40), -np.inf, np.float32)
    x[1, 5] = 2.0
    x[2, :] = 1.0
    x[2, 3] = np.nan
    y = C.softmax_forward(x, version)
    assert np.isnan(y[0]).all() and np.isnan(y[2]).all()
    assert y[1, 5] == 1.0 and (np.delete(y[1], 5) == 0).all()


@pytest.mark.parametrize("version", ["two_pass", "welford"])
@pytest.mark.parametrize("shape", [(1, 1), (3, 15), (4, 16), (5, 17), (2, 4099)])
def test_layer_norm_versions(version: str, shape: tuple[int, int]) -> None:
    x = make_array(shape, seed=2, low=-2, high=6)
    w, b = make_array(shape[-1:], seed=3), make_array(shape[-1:], seed=4)
    y = tl.kernels.layer_norm(x, w, b, backend="cpu", version=version)
    expected = F.layer_norm(torch.from_numpy(x), w.shape, torch.from_numpy(w), torch.from_numpy(b))
    assert_close(y, expected, "float32", reduction_size=shape[-1])


def test_unknown_version_is_an_error() -> None:
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="version"):
        C.softmax_forward(x, "four_pass")
    with pytest.raises(ValueError, match="version"):
        C.layer_norm_forward(x, np.ones(3, np.float32), np.zeros(3, np.float32), 1e-5, "sloppy")
    with pytest.raises(ValueError, match="weight/bias"):
        C.layer_norm_forward(x, np.ones(4, np.float32), np.zeros(4, np.float32), 1e-5, "two_pass")
    with pytest.raises(ValueError, match="incompatible shapes"):
        C.flash_attention_forward(
            np.zeros((1, 2, 3), np.float32), np.zeros((1, 2, 4), np.float32), np.zeros((1, 2, 4), np.float32), False, 16
        )


def test_exp_erf_approximations() -> None:
    x = np.linspace(-87, 88, 200_001, dtype=np.float32)
    e = np.exp(x.astype(np.float64))
    rel = np.abs(C.exp_approx(x).astype(np.float64) - e) / e
    assert rel.max() < 4e-7  # ~3 ulp
    special = np.array([-np.inf, -1e4, -100.0, 0.0, 100.0, np.inf, np.nan], np.float32)
    got = C.exp_approx(special)
    assert got[0] == 0 and got[1] == 0 and got[2] == 0 and got[3] == 1 and np.isinf(got[4]) and np.isinf(got[5])
    assert np.isnan(got[6])
    u = np.linspace(-6, 6, 10_001, dtype=np.float32)
    assert (
        np.abs(C.erf_approx(u) - np.array([math.erf(float(t)) for t in u])).max() < 5e-7
    )  # A&S 7.1.26: 1.5e-7 + fp32 rounding


def test_reference_online_softmax_and_welford() -> None:
    x = make_array((4, 37), seed=5, low=-10, high=10).astype(np.float64)
    for chunk in (1, 4, 37, 100):
        assert_close(reference.softmax_online(x, chunk), reference.softmax(x), "float64")
    mean, var = reference.welford_stats(x + 1e6, chunk=5)
    assert_close(mean, (x + 1e6).mean(axis=1), "float64")
    assert_close(var, x.var(axis=1), "float64", atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block", [1, 7, 16, 64])
def test_reference_tiled_flash_matches_naive(causal: bool, block: int) -> None:
    q, k, v = (make_array((3, 23, 8), "float64", seed=6 + i) for i in range(3))
    o_ref, lse_ref = reference.attention(q, k, v, causal)
    o, lse = reference.flash_attention_tiled(q, k, v, causal, block)
    assert_close(o, o_ref, "float64")
    assert_close(lse, lse_ref, "float64")


@pytest.mark.parametrize("version", cpu_k.ATTENTION_VERSIONS)
@pytest.mark.parametrize("block", [1, 5, 16, 128])
def test_cpu_flash_block_sizes(block: int, version: str) -> None:
    """Every flash rung (tests/kernels/test_flash_cpu.py runs them on every CPU path, with more shapes)."""
    q, k, v = (make_array((2, 3, 41, 16), seed=10 + i) for i in range(3))
    for causal in (False, True):
        o = tl.kernels.flash_attention(q, k, v, causal, block_size=block, backend="cpu", version=version)
        expected = F.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)), is_causal=causal)
        assert_close(o, expected, "float32")


# ---- issue 17: the simd rungs on cpp_src/vec_math.h ------------------------------------------------------------
SIMD_SHAPES = [(1, 1), (3, 15), (4, 16), (5, 17), (3, 33), (2, 100), (2, 4099), (64, 768)]
LEVELS = ("scalar", "avx2", "avx512")


def _torch_ln(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> torch.Tensor:
    return F.layer_norm(torch.from_numpy(x), w.shape, torch.from_numpy(w), torch.from_numpy(b))


@pytest.mark.parametrize("version", cpu_k.SOFTMAX_VERSIONS)
@pytest.mark.parametrize("shape", SIMD_SHAPES)
def test_softmax_all_rungs(version: str, shape: tuple[int, int]) -> None:
    x = make_array(shape, seed=11, low=-30, high=30)
    x[0, 0] = -np.inf
    expected = torch.softmax(torch.from_numpy(x), -1)
    assert_close(cpu_k.softmax(x, version), expected, "float32")
    xt = np.asfortranarray(x)  # non-contiguous input: the binding copies it to C order
    assert_close(cpu_k.softmax(xt, version), expected, "float32")
    x64 = x.astype(np.float64)  # float64 runs the portable rung under every name
    assert_close(cpu_k.softmax(x64, version), torch.softmax(torch.from_numpy(x64), -1), "float64")


@pytest.mark.parametrize("version", ["simd", "simd_omp", "online_simd"])
def test_softmax_simd_masked_nan_inf_rows(version: str) -> None:
    x = np.full((5, 45), -np.inf, np.float32)
    x[1, 40] = 2.0
    x[2, :] = 1.0
    x[2, 3] = np.nan
    x[3, :] = 0.0
    x[3, 44] = np.nan  # NaN in the tail
    x[4, :] = 1.0
    x[4, 7] = np.inf
    y = cpu_k.softmax(x, version)
    want = torch.softmax(torch.from_numpy(x), -1).numpy()
    assert np.isnan(y[0]).all() and np.isnan(y[2]).all() and np.isnan(y[3]).all() and np.isnan(y[4]).all()
    assert np.isnan(want[[2, 3, 4]]).all()
    assert y[1, 40] == 1.0 and (np.delete(y[1], 40) == 0).all()


@pytest.mark.parametrize("version", cpu_k.LAYER_NORM_VERSIONS)
@pytest.mark.parametrize("shape", SIMD_SHAPES)
def test_layer_norm_all_rungs(version: str, shape: tuple[int, int]) -> None:
    x = make_array(shape, seed=12, low=-2, high=6)
    w, b = make_array(shape[-1:], seed=13), make_array(shape[-1:], seed=14)
    y, mean, rstd = cpu_k.layer_norm(x, w, b, 1e-5, version)
    assert_close(y, _torch_ln(x, w, b), "float32", reduction_size=shape[-1])
    x64 = x.astype(np.float64)
    assert_close(mean, x64.mean(-1), "float32", reduction_size=shape[-1])
    assert_close(rstd, 1 / np.sqrt(x64.var(-1) + 1e-5), "float32", reduction_size=shape[-1])


@pytest.mark.parametrize("version", ["simd", "simd_omp"])
def test_layer_norm_simd_large_offset_and_constant_rows(version: str) -> None:
    # shifted sums (K = x[0]) in float64 lanes: no cancellation for a large common offset; a constant row has var 0
    x = make_array((6, 777), seed=15, low=-1, high=1) + np.float32(3e4)
    x[5] = 7.0
    w, b = np.ones(777, np.float32), np.zeros(777, np.float32)
    y, mean, rstd = cpu_k.layer_norm(x, w, b, 1e-5, version)
    x64 = x.astype(np.float64)
    ref = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y, ref, rtol=0, atol=5e-3)  # float32 input rounding at 3e4 is 2e-3 of std
    assert (y[5] == 0).all() and rstd[5] == np.float32(1 / np.sqrt(1e-5))


@pytest.mark.parametrize("version", cpu_k.BIAS_GELU_VERSIONS)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", SIMD_SHAPES)
def test_bias_gelu_all_rungs(version: str, approximate: str, shape: tuple[int, int]) -> None:
    x = make_array(shape, seed=16, low=-6, high=6)
    b = make_array(shape[-1:], seed=17)
    y = cpu_k.bias_gelu(x, b, approximate, version)
    expected = F.gelu(torch.from_numpy(x) + torch.from_numpy(b), approximate=approximate)
    assert_close(y, expected, "float32")
    x64, b64 = x.astype(np.float64), b.astype(np.float64)
    e64 = F.gelu(torch.from_numpy(x64) + torch.from_numpy(b64), approximate=approximate)
    assert_close(cpu_k.bias_gelu(x64, b64, approximate, version), e64, "float64")


def test_bias_gelu_simd_is_accurate_near_zero() -> None:
    # the simd rungs' GELU has a few-ulp relative error everywhere; A&S 7.1.26 (autovec) has 1.5e-7 absolute
    # error, which is a large relative error of gelu(u) ~ u/2 for tiny u
    u = np.geomspace(1e-6, 1e-2, 4096, dtype=np.float32).reshape(1, -1)
    b = np.zeros(u.shape[1], np.float32)
    ref = 0.5 * u.astype(np.float64) * (1 + special_erf(u.astype(np.float64) / np.sqrt(2)))
    rel = np.abs(cpu_k.bias_gelu(u, b, "none", "simd_omp") / ref - 1)
    assert rel.max() < 2.5e-7  # ~2 ulp of these outputs (measured 2.0e-7: the fit S's rounding near y = 0)
    assert np.abs(cpu_k.bias_gelu(u, b, "none", "autovec") / ref - 1).max() > 3e-7  # what the rung buys (4.4e-7)


def _ulp_error(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|got - ref| in units of the float32 spacing at ref (float64 reference)."""
    return np.abs(got.astype(np.float64) - ref) / np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)


@pytest.mark.parametrize("level", LEVELS)
def test_bias_gelu_simd_ulp_error_and_negative_tail(monkeypatch: pytest.MonkeyPatch, level: str) -> None:
    """vm::gelu_erf (vec_math.h) evaluates Phi(-|u|) = e^{-u^2/2} S(|u|/(|u|+4)) directly instead of 1 + erf, so
    the negative tail keeps its relative accuracy: <= 8 ulp for u >= -5 (measured 6.6 on every 3rd float32 in
    [-5, 14]), abs. error <= 6e-9 below -5 (|u| clamped to 6). u/2 (1 + erf) cancels there: autovec's A&S erf
    (abs. error 1.5e-7) is off by > 1e-4 relative at u = -4 and worse further out."""
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", level)
    if cpu_k.vector_math_path() != level:
        pytest.skip(f"no {level} on this CPU")
    from scipy.special import erfc

    u = np.concatenate([np.linspace(-5, 6, 1 << 20, dtype=np.float32), np.float32([0, -0.0, 1e-30, -1e-30])])
    ref = 0.5 * u.astype(np.float64) * erfc(-u.astype(np.float64) / np.sqrt(2))
    zero = np.float32([-0.0])  # u + (-0) = u, also for u = -0
    got = cpu_k.bias_gelu(u.reshape(-1, 1), zero, "none", "simd_omp").ravel()
    assert _ulp_error(got, ref).max() <= 8
    assert np.signbit(got[-3]) and got[-3] == 0  # gelu(-0) = -0
    tail = np.linspace(-12, -5, 4097, dtype=np.float32)
    ref_tail = 0.5 * tail.astype(np.float64) * erfc(-tail.astype(np.float64) / np.sqrt(2))
    assert np.abs(cpu_k.bias_gelu(tail.reshape(-1, 1), zero, "none", "simd").ravel() - ref_tail).max() <= 6e-9
    special = np.float32([np.nan, np.inf, 30.0]).reshape(-1, 1)
    out = cpu_k.bias_gelu(special, zero, "none", "simd").ravel()
    assert np.isnan(out[0]) and out[1] == np.inf and out[2] == 30.0
    mid = u[(u > -5) & (u < -2)]
    ref_mid = ref[: len(u) - 4][(u[:-4] > -5) & (u[:-4] < -2)]
    autovec = cpu_k.bias_gelu(mid.reshape(-1, 1), zero, "none", "autovec").ravel()
    assert np.abs(autovec / ref_mid - 1).max() > 1e-4


@pytest.mark.parametrize("shape", [(3, 15), (5, 17), (2, 100), (64, 768), (3, 4099)])
def test_simd_rungs_forced_paths_agree(monkeypatch: pytest.MonkeyPatch, shape: tuple[int, int]) -> None:
    """TINYLEARN_CPU_FEATURES=scalar and avx2 give the same bits (the scalar code emulates the 8 lanes);
    avx512 (where present) folds 16 lanes into 8, so its sums agree to rounding."""
    x = make_array(shape, seed=18, low=-8, high=8)
    w, b = make_array(shape[-1:], seed=19), make_array(shape[-1:], seed=20)
    results: dict[str, list[np.ndarray]] = {}
    for level in LEVELS:
        monkeypatch.setenv("TINYLEARN_CPU_FEATURES", level)
        path = cpu_k.vector_math_path()
        assert tl.cpu.kernel_paths()["kernels.softmax.simd"] == path
        if level == "scalar":
            assert path == "scalar"
        out = [cpu_k.softmax(x, v) for v in ("simd", "simd_omp", "online_simd")]
        out += list(cpu_k.layer_norm(x, w, b, 1e-5, "simd_omp"))
        out += [cpu_k.bias_gelu(x, b, a, "simd_omp") for a in ("none", "tanh")]
        results[path] = out
    for path, out in results.items():
        for got, want in zip(out, results["scalar"]):
            if path == "avx2":
                np.testing.assert_array_equal(got, want)
            else:
                assert_close(got, want, "float32", reduction_size=shape[-1])
        for got, want in zip(out[-2:], results["scalar"][-2:]):  # bias+GELU is elementwise: same bits everywhere
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape", [(3, 15), (4, 16), (5, 17), (3, 33), (3, 4099), (64, 768)])
def test_streaming_stores_give_the_same_bits(monkeypatch: pytest.MonkeyPatch, shape: tuple[int, int]) -> None:
    """Outputs above the threshold are written with non-temporal stores after a scalar head up to the vector
    alignment (odd row lengths start rows at every alignment): the same bits as normal stores, on every path."""
    x = make_array(shape, seed=21, low=-8, high=8)
    w, b = make_array(shape[-1:], seed=22), make_array(shape[-1:], seed=23)
    for level in LEVELS:
        monkeypatch.setenv("TINYLEARN_CPU_FEATURES", level)
        out = {}
        for mode, min_bytes in (("stream", "0"), ("normal", str(2**62))):
            monkeypatch.setenv("TINYLEARN_STREAM_MIN_BYTES", min_bytes)
            assert C.stream_output(x.nbytes) == (mode == "stream")
            res = [a for v in ("simd", "simd_omp") for a in cpu_k.layer_norm(x, w, b, 1e-5, v)]
            res += [cpu_k.bias_gelu(x, b, a, v) for v in ("simd", "simd_omp") for a in ("none", "tanh")]
            out[mode] = res
        for got, want in zip(out["stream"], out["normal"]):
            np.testing.assert_array_equal(got, want, err_msg=f"{level} {shape}")
    monkeypatch.delenv("TINYLEARN_STREAM_MIN_BYTES")
    assert not C.stream_output(4 << 20) and C.stream_output((4 << 20) + 4)  # the default threshold: 4 MiB


@pytest.mark.parametrize("shape", [(1, 7), (3, 4099), (256, 300), (64, 1024)])
def test_grain_changes_threads_not_bits(shape: tuple[int, int]) -> None:
    """The row-chunking knob (topic 17 tunes it) only changes how many threads split the rows: every grain, from one
    thread per few rows to one thread for all, gives the same bits (rows are independent)."""
    x = make_array(shape, seed=31, low=-6, high=6)
    w, b = make_array(shape[-1:], seed=32), make_array(shape[-1:], seed=33)
    for version in ("simd_omp", "online_simd"):
        want = cpu_k.softmax(x, version)
        for grain in (1, 64, 1 << 12, 1 << 20):
            np.testing.assert_array_equal(cpu_k.softmax(x, version, grain), want, err_msg=f"{version} {grain}")
    want_ln = cpu_k.layer_norm(x, w, b, 1e-5, "simd_omp")
    for grain in (1, 64, 1 << 12, 1 << 20):
        for got, ref in zip(cpu_k.layer_norm(x, w, b, 1e-5, "simd_omp", grain), want_ln):
            np.testing.assert_array_equal(got, ref, err_msg=f"layer_norm {grain}")
    with pytest.raises(ValueError, match="grain must be >= 0 .*got -1"):
        C.softmax_forward(x, "simd_omp", -1)
    with pytest.raises(ValueError, match="grain must be >= 0 .*got -5"):
        C.layer_norm_forward(x, w, b, 1e-5, "simd_omp", -5)


def test_simd_versions_errors() -> None:
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="'simd_omp' or 'online_simd', got 'simd2'"):
        C.softmax_forward(x, "simd2")
    with pytest.raises(ValueError, match="'simd' or 'simd_omp', got 'fast'"):
        C.layer_norm_forward(x, np.ones(3, np.float32), np.zeros(3, np.float32), 1e-5, "fast")
    with pytest.raises(ValueError, match="'autovec', 'simd' or 'simd_omp', got 'exact'"):
        C.bias_gelu_forward(x, np.zeros(3, np.float32), False, "exact")
    with pytest.raises(ValueError, match=r"bias shape \(4,\)"):
        C.bias_gelu_forward(x, np.zeros(4, np.float32), False, "simd")


def test_simd_rungs_reject_a_bad_feature_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", "sse")
    x = np.zeros((2, 3), np.float32)
    for call in (
        lambda: cpu_k.softmax(x, "simd"),
        lambda: cpu_k.layer_norm(x, np.ones(3, np.float32), np.zeros(3, np.float32), 1e-5, "simd_omp"),
        lambda: cpu_k.bias_gelu(x, np.zeros(3, np.float32), "none", "simd"),
        lambda: C.vec_exp(x),
    ):
        with pytest.raises(ValueError, match="TINYLEARN_CPU_FEATURES"):
            call()
