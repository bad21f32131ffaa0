"""Which numeric paths this process uses on the CPU: tinylearn's own dispatch, BLAS, torch, numpy.

``TINYLEARN_CPU_FEATURES=scalar|avx2|avx512`` forces tinylearn's C++ kernels down to a level (one switch, read by
``cpp_src/cpu_features.h`` on every dispatch): ``scalar`` no SIMD feature at all, ``avx2`` the x86-64-v3 subset
(sse4.2, avx, avx2, fma, f16c) where the CPU has it, ``avx512`` (or unset) whatever the CPU reports.

    tinylearn.cpu.cpu_features()      # effective features, e.g. ['sse4.2', 'avx', 'avx2', 'fma', 'f16c']
    tinylearn.cpu.forced()            # 'scalar' | 'avx2' | 'avx512' | None
    tinylearn.cpu.kernel_paths()      # {'quant.int8_gemm': 'avx2'}: the path each dispatching kernel takes
    tinylearn.cpu.numeric_paths()     # the above plus torch's capability, OpenBLAS core type, numpy's SIMD

``tinylearn info`` and ``tools/portable.py`` (``make test-portable``) print these.
"""

from __future__ import annotations

import os
from typing import Any

from .backends import env_flag, load_C

LEVELS: tuple[str, ...] = ("scalar", "avx2", "avx512")
ENV = "TINYLEARN_CPU_FEATURES"


def forced() -> str | None:
    """The level forced by TINYLEARN_CPU_FEATURES, None when unset; ValueError for any other value."""
    v = env_flag(ENV)
    if not v:
        return None
    if v not in LEVELS:
        raise ValueError(f"{ENV}: unknown value {os.environ[ENV]!r} (choose {', '.join(LEVELS)}, or leave it unset)")
    return v


def detected_features() -> list[str]:
    """What the CPU reports (ignores the switch), among the names the C++ side knows."""
    C = load_C()
    return [f for f in C.cpu_feature_names if C.cpu_detected(f)]


def cpu_features() -> list[str]:
    """The effective features the C++ kernels may use after TINYLEARN_CPU_FEATURES."""
    C = load_C()
    return [f for f in C.cpu_feature_names if C.cpu_supports(f)]


def kernel_paths() -> dict[str, str]:
    """Every C++ kernel that dispatches on CPU features -> the path it takes now (best available)."""
    C = load_C()
    out = {"quant.int8_gemm": C.quant.int8_gemm_paths()[0]}
    if "gemm" in C.submodules:
        out["gemm.simd"] = C.gemm.isa()  # the fp32/fp64 GEMM micro-kernel (isa="auto")
    if hasattr(C.kernels, "vec_isa"):
        # cpp_src/vec_math.h (exp/erf/tanh/log) and the float32 simd* versions of the fused kernels built on it
        isa = C.kernels.vec_isa()
        for name in ("kernels.vec_math", "kernels.softmax.simd", "kernels.bias_gelu.simd", "kernels.layer_norm.simd"):
            out[name] = isa
    if hasattr(C.kernels, "flash_attention_path"):
        out["kernels.flash_attention"] = C.kernels.flash_attention_path(64)  # head dim 64; narrower dims differ
    if hasattr(C.kernels, "flash_attention_backward_path"):
        out["kernels.flash_attention_backward"] = C.kernels.flash_attention_backward_path(64, 64)
    for sub, fn in (("quant_affine", "quant_affine_isa"), ("quant_fp8", "fp8_isa")):
        mod = getattr(C, sub, None)
        if mod is not None and hasattr(mod, fn):
            out[sub.replace("_", ".", 1)] = getattr(mod, fn)()
    return out


def blas_info() -> list[dict[str, Any]]:
    """threadpoolctl's view of the BLAS libraries loaded in this process (numpy's and scipy's OpenBLAS ...)."""
    import numpy  # noqa: F401  (loads numpy's BLAS so that threadpoolctl sees it)
    from threadpoolctl import threadpool_info

    return [
        {k: d.get(k) for k in ("internal_api", "version", "architecture", "num_threads", "filepath")}
        for d in threadpool_info()
        if d.get("user_api") == "blas"
    ]


def torch_capability() -> str:
    """torch's CPU kernel level (ATEN_CPU_CAPABILITY forces it): 'DEFAULT', 'AVX2', 'AVX512' ..."""
    import torch

    return str(torch.backends.cpu.get_cpu_capability())


def numpy_simd() -> dict[str, list[str]]:
    """numpy's dispatch: CPU features it uses, its enabled dispatch targets, and those it was told not to use."""
    try:
        from numpy._core import _multiarray_umath as mu
    except ImportError:  # numpy 1.x
        from numpy.core import _multiarray_umath as mu
    feats = mu.__cpu_features__
    disabled = env_flag("NPY_DISABLE_CPU_FEATURES").upper().replace(",", " ").split()
    return {
        "enabled": sorted(k for k, v in feats.items() if v),
        "dispatch": [t for t in mu.__cpu_dispatch__ if feats.get(t)],  # the SIMD targets numpy's kernels use now
        "disabled_by_env": sorted(disabled),
    }


def blas_thread_timeout() -> str:
    """How long numpy's OpenBLAS workers busy-wait after a call, as OpenBLAS read it (see ``tinylearn.__init__``).

    ``"2^16 cycles (OPENBLAS_THREAD_TIMEOUT=16)"``, or the OpenBLAS default ``"2^28 cycles (default)"`` when the
    variable is unset. When numpy was imported before tinylearn, tinylearn applied its value to that OpenBLAS
    (``tinylearn._blas_timeout``: the tail says so), or, when the user had set the variable, the value shown is what
    OpenBLAS read unless it was changed after numpy loaded.
    """
    import tinylearn
    from tinylearn import _blas_timeout

    v = os.environ.get("OPENBLAS_THREAD_TIMEOUT", "").strip()
    if not v:
        return "2^28 cycles (default)"
    try:
        n = min(max(int(v), 4), 30)  # OpenBLAS clamps the exponent to [4, 30]
    except ValueError:
        return f"2^28 cycles (default; OPENBLAS_THREAD_TIMEOUT={v!r} is not an integer)"
    tail = ", numpy was imported before tinylearn" if tinylearn._NUMPY_LOADED_FIRST else ""
    done = _blas_timeout.applied()
    if done:
        tail += "; applied at import to the OpenBLAS numpy loaded: " + "; ".join(sorted(set(done.values())))
    return f"2^{n} cycles (OPENBLAS_THREAD_TIMEOUT={v}{tail})"


def omp_spin_count() -> str:
    """How long libgomp's workers busy-wait after a parallel region in this process (``tinylearn._omp_spin``)."""
    from tinylearn import _omp_spin

    return _omp_spin.status()


_SPIN_PROBE = """
import sys, time
import numpy as np
if sys.argv[1] == "1":
    import tinylearn
a = np.random.default_rng(0).random((256, 256), dtype=np.float32)
fractions = []
for _ in range(int(sys.argv[2])):
    a @ a  # wakes OpenBLAS's workers
    c0, w0 = time.process_time(), time.perf_counter()
    time.sleep(0.05)  # the only Python thread sleeps: CPU time now is a BLAS worker spinning
    fractions.append((time.process_time() - c0) / (time.perf_counter() - w0))
print(sorted(fractions)[len(fractions) // 2])
"""


def openblas_spin(import_tinylearn: bool, threads: int = 2, repeats: int = 5) -> float:
    """Measured: the share of a core a fresh process burns while its only Python thread sleeps 50 ms right after a
    numpy matmul (median of ``repeats``). The process imports numpy, then tinylearn if ``import_tinylearn``; the
    environment is this one without ``OPENBLAS_THREAD_TIMEOUT`` and with ``OPENBLAS_NUM_THREADS=threads``.
    OpenBLAS's default spin (2^28 cycles) shows as most of a core; after tinylearn's fix (``_blas_timeout``), ~0."""
    for name, v in (("threads", threads), ("repeats", repeats)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name}: must be a positive int, got {v!r}")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    env["OPENBLAS_NUM_THREADS"] = str(threads)
    return _probe("openblas_spin", _SPIN_PROBE, import_tinylearn, repeats, env)


def _probe(name: str, code: str, import_tinylearn: bool, arg: int, env: dict[str, str]) -> float:
    """Run a measuring ``code`` in a fresh process (argv: import tinylearn?, one int) and return the float it prints."""
    import subprocess
    import sys

    args = [sys.executable, "-c", code, "1" if import_tinylearn else "0", str(arg)]
    p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    if p.returncode:
        raise RuntimeError(f"{name}: the probe process failed:\n{p.stderr[-2000:]}")
    return float(p.stdout.strip())


_OMP_SPIN_PROBE = """
import ctypes, sys, time
import numpy as np
if sys.argv[1] == "0":
    ctypes.CDLL("libgomp.so.1", mode=ctypes.RTLD_GLOBAL)  # loaded first, as `import torch` does: default spin
import tinylearn
from tinylearn.backends import load_C
gemm = load_C("gemm")
a = np.random.default_rng(0).random((256, 256), dtype=np.float32)
fractions = []
for _ in range(int(sys.argv[2])):
    gemm.matmul(a, a, "parallel", threads=2)  # one OpenMP parallel region
    c0, w0 = time.process_time(), time.perf_counter()
    time.sleep(0.05)  # the only Python thread sleeps: CPU time now is an OpenMP worker spinning
    fractions.append((time.process_time() - c0) / (time.perf_counter() - w0))
print(sorted(fractions)[len(fractions) // 2])
"""


def openmp_spin(import_tinylearn_first: bool, repeats: int = 5) -> float:
    """Measured: the share of a core a fresh process burns while its only Python thread sleeps 50 ms right after
    one of tinylearn's OpenMP kernels (a 2-thread GEMM; median of ``repeats``). ``import_tinylearn_first=False``
    loads libgomp before tinylearn, as ``import torch`` first does, so libgomp keeps its default spin (~300,000
    iterations: milliseconds); ``True``: tinylearn set ``GOMP_SPINCOUNT`` first (``tinylearn._omp_spin``). The
    environment is this one without ``GOMP_SPINCOUNT``/``OMP_WAIT_POLICY``."""
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ValueError(f"repeats: must be a positive int, got {repeats!r}")
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    return _probe("openmp_spin", _OMP_SPIN_PROBE, import_tinylearn_first, repeats, env)


_FAULT_PROBE = """
import resource, sys
import numpy as np
if sys.argv[1] == "1":
    import tinylearn
n, steps = int(sys.argv[2]), 40
def step():  # a step's temporaries: four n-byte arrays written, then all freed together
    arrays = [np.ones(n // 4, np.float32) for _ in range(4)]
    del arrays
step()  # warm the allocator once
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(steps):
    step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / steps)
"""


def alloc_page_faults(import_tinylearn: bool, nbytes: int = 1 << 20) -> float:
    """Measured: minor page faults per "step" (four ``nbytes`` numpy arrays written, then freed together; mean of 40
    steps) in a fresh process that imports tinylearn (its malloc settings, ``tinylearn._malloc_tuning``) or not.
    glibc's defaults trim the freed top of the heap (more than twice its threshold is free), so each step faults
    its pages in again: one fault per 4 KiB page, 1024 for 4 MiB; with the memory kept in the heap, ~0."""
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 4096:
        raise ValueError(f"nbytes: must be an int >= 4096, got {nbytes!r}")
    env = {k: v for k, v in os.environ.items() if k != "TINYLEARN_MALLOC"}
    return _probe("alloc_page_faults", _FAULT_PROBE, import_tinylearn, nbytes, env)


def malloc_settings() -> str:
    """What tinylearn did to glibc's malloc at import (``tinylearn._malloc_tuning``)."""
    from tinylearn import _malloc_tuning

    return _malloc_tuning.applied()


def numeric_paths() -> dict[str, Any]:
    """One dict describing every numeric path the process uses (printed by tools/portable.py)."""
    return {
        "tinylearn_forced": forced(),
        "tinylearn_features": cpu_features(),
        "tinylearn_kernels": kernel_paths(),
        "torch_capability": torch_capability(),
        "blas": blas_info(),
        "blas_thread_timeout": blas_thread_timeout(),
        "omp_spin": omp_spin_count(),
        "malloc": malloc_settings(),
        "numpy_simd": numpy_simd(),
    }
