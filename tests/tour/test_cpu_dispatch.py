"""TINYLEARN_CPU_FEATURES=scalar|avx2|avx512: the one switch every feature-dispatching C++ kernel honours.

cpp_src/cpu_features.h reads the variable on every dispatch, so setting it in os.environ takes effect at once.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from tinylearn import cpu
from tinylearn import quant as Q
from tinylearn.backends import load_C

C = load_C()
DETECTED = set(cpu.detected_features())
V3 = {"sse4.2", "avx", "avx2", "fma", "f16c"}


@pytest.fixture
def level(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> str:
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", request.param)
    return request.param


def test_unset_means_detected(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("TINYLEARN_CPU_FEATURES", raising=False)
    assert cpu.forced() is None and C.cpu_features_forced() == ""
    assert set(cpu.cpu_features()) == DETECTED
    assert all(C.cpu_supports(f) == C.cpu_detected(f) for f in C.cpu_feature_names)


@pytest.mark.parametrize("level", ["scalar", "avx2", "avx512", " AVX2 "], indirect=True)
def test_forced_level_is_reported_and_applied(level: str):
    want = level.strip().lower()
    assert cpu.forced() == want and C.cpu_features_forced() == want
    feats = set(cpu.cpu_features())
    if want == "scalar":
        assert feats == set() and Q.int8_gemm_paths() == ["scalar"]
        assert cpu.kernel_paths()["quant.int8_gemm"] == "scalar"
    elif want == "avx2":
        assert feats == DETECTED & V3
        assert not any(f.startswith("avx512") or f == "avxvnni" for f in feats)
        assert "avx512vnni" not in Q.int8_gemm_paths()
        assert Q.int8_gemm_paths()[0] == ("avx2" if "avx2" in DETECTED else "scalar")
    else:
        assert feats == DETECTED
    assert feats <= DETECTED  # forcing never claims a feature the CPU lacks


@pytest.mark.parametrize("bad", ["sse", "avx-512", "native", "1"])
def test_invalid_value_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, bad: str):
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", bad)
    for fn in (cpu.forced, C.cpu_features_forced, lambda: C.cpu_supports("avx2"), Q.int8_gemm_paths):
        with pytest.raises(ValueError, match=r"TINYLEARN_CPU_FEATURES.*scalar, avx2, avx512"):
            fn()
    a = np.ones((2, 3), np.int8)
    with pytest.raises(ValueError, match="TINYLEARN_CPU_FEATURES"):
        Q.int8_gemm(a, a.T.copy(), backend="cpp")


def _exact(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a.astype(np.int64) @ b.astype(np.int64)


# shapes that exercise the SIMD tails (N not a multiple of the panel width, odd K) and extreme values
SHAPES = [(1, 1, 1), (5, 7, 3), (17, 33, 19), (64, 130, 48)]


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{m}x{k}x{n}" for m, k, n in SHAPES])
def test_int8_gemm_forced_paths_are_exact_and_identical(monkeypatch: pytest.MonkeyPatch, shape):
    m, k, n = shape
    rng = np.random.default_rng(sum(shape))
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    a[0, :] = -128  # worst case for a saturating u8 x s8 pair sum
    b[:, 0] = -128
    want = _exact(a, b)
    results = {}
    for level in ("scalar", "avx2", "avx512"):
        monkeypatch.setenv("TINYLEARN_CPU_FEATURES", level)
        path = Q.int8_gemm_paths()[0]
        results[level] = (path, Q.int8_gemm(a, b, backend="cpp"))
        np.testing.assert_array_equal(results[level][1], want)
    assert results["scalar"][0] == "scalar"
    np.testing.assert_array_equal(results["scalar"][1], results["avx2"][1])
    # non-contiguous operands take the same forced path
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", "scalar")
    at = np.asfortranarray(a)
    np.testing.assert_array_equal(Q.int8_gemm(at, b, backend="cpp"), want)


def test_forced_scalar_refuses_an_explicit_simd_path(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", "scalar")
    a = np.ones((4, 8), np.int8)
    with pytest.raises(ValueError, match="avx2"):
        load_C("quant").int8_gemm(a, a.T.copy(), "avx2")
    with pytest.raises(ValueError, match="avx512vnni"):
        load_C("quant").int8_pack_b(a)


def test_unknown_feature_name_is_a_value_error():
    with pytest.raises(ValueError, match="unknown feature 'sse9'"):
        C.cpu_supports("sse9")
    with pytest.raises(ValueError, match="unknown feature"):
        C.cpu_detected("avx1024")


@pytest.mark.skipif("gemm" not in C.submodules, reason="tinylearn._C built without the gemm topic")
def test_gemm_micro_kernel_follows_the_level(monkeypatch: pytest.MonkeyPatch):
    G = load_C("gemm")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((37, 29))
    b = rng.standard_normal((29, 23))
    want = {"scalar": "scalar", "avx2": "avx2" if {"avx2", "fma"} <= DETECTED else "scalar"}
    want["avx512"] = "avx512" if "avx512f" in DETECTED else want["avx2"]
    for level, isa in want.items():
        monkeypatch.setenv("TINYLEARN_CPU_FEATURES", level)
        assert G.isa() == isa and cpu.kernel_paths()["gemm.simd"] == isa
        np.testing.assert_allclose(G.matmul(a, b, "simd"), a @ b, rtol=1e-12, atol=1e-12)
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", "scalar")
    assert G.isa_paths() == ["scalar"]
    with pytest.raises(ValueError, match=r"does not support avx2 \(TINYLEARN_CPU_FEATURES=scalar\)"):
        G.matmul(a, b, "simd", "avx2")


def _env_after_imports(code: str, timeout_env: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    if timeout_env is not None:
        env["OPENBLAS_THREAD_TIMEOUT"] = timeout_env
    probe = code + "; import os, tinylearn.cpu as c; print(os.environ.get('OPENBLAS_THREAD_TIMEOUT')); "
    probe += "print(c.blas_thread_timeout())"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize(
    "code, preset, want_env, want_text",
    [
        ("import tinylearn, numpy", None, "16", "2^16 cycles (OPENBLAS_THREAD_TIMEOUT=16)"),
        ("import tinylearn, numpy", "20", "20", "2^20 cycles (OPENBLAS_THREAD_TIMEOUT=20)"),  # a user's value wins
        # numpy first: its OpenBLAS re-reads the variable and restarts its workers (tinylearn._blas_timeout)
        ("import numpy, tinylearn", None, "16", "2^16 cycles (OPENBLAS_THREAD_TIMEOUT=16, numpy was imported before"),
        ("import numpy, tinylearn", "40", "40", "2^30 cycles (OPENBLAS_THREAD_TIMEOUT=40, numpy was imported"),
    ],
)
def test_openblas_spin_timeout_is_set_in_either_import_order(code, preset, want_env, want_text):
    env_line, text = _env_after_imports(code, preset).splitlines()
    assert env_line == want_env
    assert text.startswith(want_text)
    applied = "applied at import to the OpenBLAS numpy loaded: workers restarted with 2^16 cycles" in text
    assert applied == (code.startswith("import numpy") and preset is None), text


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 cores for a second OpenBLAS worker")
def test_numpy_imported_first_no_longer_leaves_openblas_workers_spinning():
    # the CPU a process burns while its only Python thread sleeps right after a numpy matmul: OpenBLAS's default
    # timeout (2^28 cycles, ~0.1 s) spins a worker through the 50 ms sleep; after `import tinylearn` (numpy imported
    # first) the workers were restarted with 2^16 cycles (~25 us) and sleep
    before, after = cpu.openblas_spin(import_tinylearn=False), cpu.openblas_spin(import_tinylearn=True)
    assert before > 0.08, before  # the default: a worker spins through the sleep (quiet: ~1 core; loaded: ~0.3)
    assert after < 0.05, after  # tinylearn's fix: nothing spins
    with pytest.raises(ValueError, match="threads: must be a positive int, got 0"):
        cpu.openblas_spin(True, threads=0)


def _omp_status_after(code: str, preset: str | None) -> tuple[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    if preset is not None:
        env["GOMP_SPINCOUNT"] = preset
    probe = code + "; import os, tinylearn.cpu as c; print(os.environ.get('GOMP_SPINCOUNT')); print(c.omp_spin_count())"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    env_line, text = out.stdout.splitlines()
    return env_line, text


@pytest.mark.parametrize(
    "code, preset, want_env, want_text",
    [
        ("import tinylearn", None, "1000", "GOMP_SPINCOUNT=1000 (set by tinylearn before libgomp loaded)"),
        ("import tinylearn", "77", "77", "GOMP_SPINCOUNT=77 (set by the user)"),  # a user's value wins
        # libgomp loaded first (what `import torch` does): too late, said and not pretended
        ("import ctypes; ctypes.CDLL('libgomp.so.1'); import tinylearn", None, "None", "libgomp default (~300000"),
    ],
)
def test_openmp_spin_count_is_set_before_libgomp_loads(code, preset, want_env, want_text):
    env_line, text = _omp_status_after(code, preset)
    assert env_line == want_env
    assert text.startswith(want_text), text
    if want_env == "None":
        assert "libgomp" in text and "was loaded before tinylearn" in text


@pytest.mark.timing
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 cores for an OpenMP worker")
def test_openmp_workers_stop_spinning_soon_after_a_kernel():
    # the CPU a process burns while its only Python thread sleeps 50 ms right after a 2-thread tinylearn GEMM: with
    # libgomp's default spin (loaded before tinylearn) a worker spins ~7 ms (0.14 of the sleep, quiet box); after
    # tinylearn set GOMP_SPINCOUNT=1000 first, ~0.2 ms
    before, after = cpu.openmp_spin(import_tinylearn_first=False), cpu.openmp_spin(import_tinylearn_first=True)
    assert before > 0.03, before
    assert after < before / 3, (before, after)
    with pytest.raises(ValueError, match="repeats: must be a positive int, got 0"):
        cpu.openmp_spin(True, repeats=0)


_MALLOC_USER_VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")


@pytest.mark.skipif("asan" in os.environ.get("LD_PRELOAD", ""), reason="ASan's allocator replaces glibc's malloc")
@pytest.mark.skipif(any(v in os.environ for v in _MALLOC_USER_VARS), reason="malloc tuned by the environment")
def test_malloc_settings_keep_a_steps_arrays_in_the_heap():
    # a step's four 1 MiB temporaries, freed together: glibc's defaults trim them and every step faults 1024 pages
    # in again; after import tinylearn (mmap threshold 32 MiB, trim threshold 64 MiB) they are reused from the heap
    assert cpu.malloc_settings() == "mmap threshold 32 MiB, trim threshold 64 MiB (mallopt)"
    before, after = cpu.alloc_page_faults(import_tinylearn=False), cpu.alloc_page_faults(import_tinylearn=True)
    assert before > 500, before  # measured 992 of the 1024 pages per step
    assert after < 20, after  # measured 0
    with pytest.raises(ValueError, match="nbytes: must be an int >= 4096, got 10"):
        cpu.alloc_page_faults(True, nbytes=10)


def test_malloc_settings_are_opt_out():
    env = {**os.environ, "TINYLEARN_MALLOC": "default"}
    code = "import tinylearn.cpu as c; print(c.malloc_settings())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "glibc defaults (TINYLEARN_MALLOC=default)"
