"""tinylearn — a notebook-driven curriculum library for AI-systems engineering.

Top level: the autograd Tensor and its factory functions (``tl.Tensor``, ``tl.cat``, ``tl.no_grad`` ...).
Topic subpackages load on first access (``tl.conv``, ``tl.quant`` ...) so ``import tinylearn`` stays light.

On a machine with no NVIDIA device node, importing tinylearn sets ``TRITON_INTERPRET=1`` (unless already set):
Triton kernels can only run in its interpreter there, and triton reads the knob when it is first imported — which
torch may do lazily (optimizer steps, torch.compile) before ``tl.kernels`` is used.

Importing tinylearn also sets ``OPENBLAS_THREAD_TIMEOUT=16`` (unless already set), in either import order. By
default OpenBLAS's worker threads busy-wait 2^28 cycles (~0.1 s) after every BLAS call, and on a small machine that
spinning thread takes a core from the next OpenMP region — tinylearn's own kernels and torch's alike (measured on 2
cores: torch conv2d 7 ms alone, 13.9 ms right after a numpy matmul; 7.2 ms with the timeout at 2^16 cycles). 2^16
cycles (~25 us) keeps back-to-back BLAS calls as fast as before. When numpy was imported first, the OpenBLAS it
loaded is asked to re-read the variable and restart its idle workers (``tinylearn._blas_timeout``).
``tinylearn.cpu.numeric_paths()`` and ``python -m tinylearn info`` report the value in effect. Set the variable
yourself (e.g. ``OPENBLAS_THREAD_TIMEOUT=28``) to keep OpenBLAS's default.

Importing tinylearn also sets ``GOMP_SPINCOUNT=1000`` (unless set, and only if libgomp is not loaded yet: import
tinylearn before torch): libgomp's workers then spin ~35 us after a parallel region instead of ~7 ms, so
they stop competing with the BLAS call that often follows (``tinylearn._omp_spin``; ``python -m tinylearn info``
says whether it applied).

Importing tinylearn also raises glibc's mmap and trim thresholds (``tinylearn._malloc_tuning``: freed arrays stay in
the heap for the next step instead of page-faulting in again; up to 64 MiB of freed memory stays resident).
``TINYLEARN_MALLOC=default`` keeps glibc's defaults.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

if "TRITON_INTERPRET" not in os.environ and not any(os.path.exists(p) for p in ("/dev/nvidia0", "/dev/dxg")):
    os.environ["TRITON_INTERPRET"] = "1"

from . import _blas_timeout, _malloc_tuning, _omp_spin  # noqa: E402  (standard library only)

_NUMPY_LOADED_FIRST = "numpy" in sys.modules  # then OpenBLAS already read its environment
_blas_timeout.shorten(_NUMPY_LOADED_FIRST)
_malloc_tuning.tune()
_omp_spin.apply()

__version__ = "0.1.0"

_SUBPACKAGES = (
    "autograd",
    "nn",
    "optim",
    "data",
    "conv",
    "quant",
    "prune",
    "sparse",
    "kernels",
    "dist",
    "memory",
    "gemm",
    "amp",
    "bench",
    "testing",
    "inference",
    "parallel",
    "compiler",
    "serve",
    "compress",
    "resilience",
    "longctx",
    "tune",
    "profiler",
    "sched",
)

try:
    from .autograd import (  # noqa: F401
        Tensor,
        arange,
        cat,
        manual_seed,
        no_grad,
        ones,
        rand,
        randn,
        stack,
        where,
        zeros,
    )
except ImportError as _e:  # pragma: no cover - only while the autograd package is being written
    _AUTOGRAD_ERROR: ImportError | None = _e
else:
    _AUTOGRAD_ERROR = None


if os.environ.get("TINYLEARN_TUNE", "off").strip().lower() not in ("", "off"):
    # tuned choices without code changes: backend=None dispatch consults the records of tinylearn.tune
    from .tune.dispatch import install as _install_tuned

    _install_tuned()


def __getattr__(name: str) -> Any:
    if name == "check":  # tl.check("01_autodiff"): the exercise tests as a pass/fail table
        from .exercise_check import check

        return check
    if name == "compile":  # tl.compile (torch.compile's name) lives in tinylearn.compiler
        from .compiler import compile

        return compile
    if name == "profile":  # tl.profile(): the op recorder of tinylearn.profiler (torch.profiler.profile's role)
        from .profiler import profile

        return profile
    if name == "autocast":  # tl.autocast lives in tinylearn.amp (imports ml_dtypes on first use)
        from .amp import autocast

        return autocast
    if name in _SUBPACKAGES:
        mod = importlib.import_module(f".{name}", __name__)
        globals()[name] = mod
        return mod
    if _AUTOGRAD_ERROR is None and not name.startswith("__"):  # torch's free functions (tl.sin, tl.einsum, ...)
        from .autograd import torch_api

        if hasattr(torch_api, name):
            return getattr(torch_api, name)
    if _AUTOGRAD_ERROR is not None and name in ("Tensor", "cat", "stack", "where", "no_grad"):
        raise AttributeError(f"tinylearn.{name} unavailable: {_AUTOGRAD_ERROR}")
    raise AttributeError(f"module 'tinylearn' has no attribute {name!r}")


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext tinylearn`` adds the ``%tinylearn check TOPIC`` magic."""
    from .exercise_check import load_ipython_extension as load

    load(ipython)


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_SUBPACKAGES))
