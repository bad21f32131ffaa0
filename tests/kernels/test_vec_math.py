"""Accuracy of the float32 vector math of cpp_src/vec_math.h (_C.kernels.vec_exp / vec_erf / vec_tanh / vec_log).

The reference is float64 numpy/scipy (exp, tanh, log and scipy.special.erf are accurate to < 1 float64 ulp, i.e.
exact at float32 resolution); the error is |got - ref| in units of the float32 spacing at ref rounded to float32.
Contract: <= 4 ulp where the correctly rounded result is a normal float, <= 1 denormal step (2^-149) below that,
special values exact, overflow/underflow where float32 std:: has it, and every path (scalar, avx2, avx512 where the
CPU has them) bit-identical to the scalar one. The default test samples every 1031st bit pattern of the float range
plus a dense grid on [-12, 12]; the slow one walks all 2^32 patterns.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import pytest
from scipy import special

from tinylearn.backends import load_C

K = load_C("kernels")
FUNCS: dict[str, tuple[Callable[..., np.ndarray], Callable[[np.ndarray], np.ndarray]]] = {
    "exp": (K.vec_exp, np.exp),
    "erf": (K.vec_erf, special.erf),
    "tanh": (K.vec_tanh, np.tanh),
    "log": (K.vec_log, np.log),
}
MAX_ULP = 4.0
TINY = np.finfo(np.float32).tiny
DENORMAL_STEP = 2.0**-149


def available_paths() -> list[str]:
    paths = ["scalar"]
    if K.vec_isa() in ("avx2", "avx512"):
        paths.append("avx2")
    if K.vec_isa() == "avx512":
        paths.append("avx512")
    return paths


def check(name: str, x: np.ndarray) -> float:
    """Assert the contract for `name` on the float32 inputs x (every available path bit-identical to the scalar one,
    which is checked against the reference); return the max ulp error in the normal range."""
    f, ref = FUNCS[name]
    with np.errstate(all="ignore"):
        r64 = ref(x.astype(np.float64))
        r32 = r64.astype(np.float32)
    got = f(x, "scalar")
    for path in available_paths()[1:]:
        other = f(x, path)
        np.testing.assert_array_equal(other.view(np.uint32), got.view(np.uint32), err_msg=f"{name}: {path} != scalar")
    nan = np.isnan(r32)
    assert np.isnan(got[nan]).all(), f"{name}: NaN expected for {x[nan & ~np.isnan(got)][:5]}"
    bad_inf = np.isinf(r32) & (got != r32)
    assert not bad_inf.any(), f"{name}: {x[bad_inf][:5]} -> {got[bad_inf][:5]}, want {r32[bad_inf][:5]}"
    normal = np.isfinite(r32) & (np.abs(r32) >= TINY)
    g = got[normal].astype(np.float64)
    assert np.isfinite(g).all(), f"{name}: non-finite result where the reference is finite"
    ulp = np.abs(g - r64[normal]) / np.spacing(np.abs(r32[normal])).astype(np.float64)
    worst = int(np.argmax(ulp)) if ulp.size else 0
    err = float(ulp[worst]) if ulp.size else 0.0
    assert err <= MAX_ULP, f"{name}: {err:.2f} ulp at x={x[normal][worst]!r}"
    sub = np.isfinite(r32) & ~normal
    err_sub = np.abs(got[sub].astype(np.float64) - r64[sub])
    assert err_sub.size == 0 or err_sub.max() <= DENORMAL_STEP, f"{name}: denormal error {err_sub.max()}"
    return err


def dense_sample() -> np.ndarray:
    bits = np.arange(0, 2**32, 1031, dtype=np.uint64).astype(np.uint32)  # ~4.2M patterns, every exponent
    grid = np.linspace(-12, 12, 1_000_001, dtype=np.float32)
    edges = np.concatenate(
        [np.linspace(a, b, 20_001, dtype=np.float32) for a, b in [(-104.5, -86.0), (87.5, 89.5), (-1e-3, 1e-3)]]
    )
    return np.concatenate([bits.view(np.float32), grid, edges])


@pytest.mark.parametrize("name", list(FUNCS))
def test_max_ulp_on_a_dense_sample(name: str) -> None:
    err = check(name, dense_sample())
    print(f"{name}: max ulp (normal range) {err:.3f} on paths {available_paths()}")  # shown with -s


def test_special_values_exact() -> None:
    inf, nan = np.float32(np.inf), np.float32(np.nan)
    x = np.array([0.0, -0.0, inf, -inf, nan, 89.0, 88.8, -104.0, -200.0, 1.0], np.float32)
    for path in available_paths():
        e = K.vec_exp(x, path)
        assert list(e[:4]) == [1.0, 1.0, inf, 0.0] and np.isnan(e[4])
        assert np.isinf(e[5]) and np.isinf(e[6]) and e[7] == 0 and e[8] == 0 and e[9] == np.float32(np.e)
        for fn in (K.vec_erf, K.vec_tanh):
            y = fn(x, path)
            assert y[0] == 0 and not np.signbit(y[0]) and y[1] == 0 and np.signbit(y[1])  # -0 stays -0
            assert y[2] == 1 and y[3] == -1 and np.isnan(y[4])
        lg = K.vec_log(np.array([0.0, -0.0, inf, -inf, nan, -1.0, 1.0, TINY / 4], np.float32), path)
        assert lg[0] == -inf and lg[1] == -inf and lg[2] == inf and np.isnan(lg[3:6]).all() and lg[6] == 0
        assert lg[7] == np.float32(np.log(np.float64(TINY / 4)))
    # exp's gradual underflow: the denormal results of float32 std::exp
    xs = np.linspace(-103.9, -87.4, 5001, dtype=np.float32)
    np.testing.assert_allclose(K.vec_exp(xs), np.exp(xs.astype(np.float64)), rtol=0, atol=DENORMAL_STEP)


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 15, 16, 17, 33])
def test_tails_and_shapes(n: int) -> None:
    x = np.linspace(-3, 3, n, dtype=np.float32)
    for name, (f, ref) in FUNCS.items():
        arg = np.abs(x) + 0.5 if name == "log" else x
        y = f(arg)
        assert y.shape == arg.shape and y.dtype == np.float32
        np.testing.assert_allclose(y, ref(arg.astype(np.float64)), rtol=3e-7, atol=1e-30)
    x2 = np.ones((3, 5), np.float32)
    assert K.vec_exp(x2).shape == (3, 5)


def test_path_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="path must be 'auto', 'scalar', 'avx2' or 'avx512'"):
        K.vec_exp(x, "avx1024")
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", "scalar")
    assert K.vec_isa() == "scalar"
    with pytest.raises(ValueError, match=r"path 'avx2' is not available.*TINYLEARN_CPU_FEATURES=scalar"):
        K.vec_erf(x, "avx2")
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", "avx2")
    assert K.vec_isa() in ("avx2", "scalar")
    with pytest.raises(ValueError, match="path 'avx512' is not available"):  # avx2 forces the x86-64-v3 subset
        K.vec_tanh(x, "avx512")


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("TINYLEARN_EXHAUSTIVE") != "1",
    reason="all 2^32 inputs take ~45 min per function: run with TINYLEARN_EXHAUSTIVE=1",
)
@pytest.mark.timeout(4 * 3600)  # ~256 chunks of 2^24 inputs, a few seconds each per function
@pytest.mark.parametrize("name", list(FUNCS))
def test_max_ulp_all_float32_bit_patterns(name: str) -> None:
    worst, chunk = 0.0, 2**24
    for start in range(0, 2**32, chunk):
        x = np.arange(start, start + chunk, dtype=np.uint64).astype(np.uint32).view(np.float32)
        worst = max(worst, check(name, x))
    print(f"{name}: max ulp over all 2^32 inputs (normal range) {worst:.3f} on paths {available_paths()}")
