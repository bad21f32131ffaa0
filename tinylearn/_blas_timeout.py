"""Short OpenBLAS spin-wait whatever the import order (imported by ``tinylearn/__init__.py``; standard library only).

After every call OpenBLAS's worker threads busy-wait 2^28 cycles (~0.1 s) for the next one. On a small machine the
spinning worker takes a core from the next OpenMP region (tinylearn's kernels and torch's alike: measured on 2
cores, torch conv2d 7 ms alone, 13.9 ms right after a numpy matmul). ``OPENBLAS_THREAD_TIMEOUT=16`` (2^16 cycles,
~25 us) avoids that and keeps back-to-back BLAS calls as fast; OpenBLAS reads the variable when it loads.

- tinylearn imported first: ``shorten()`` only sets the variable; numpy's OpenBLAS reads it when numpy loads.
- numpy imported first (the usual order in a script): OpenBLAS has read its environment and started its workers with
  the long timeout. ``shorten()`` then sets the variable, asks every OpenBLAS already mapped into the process to read
  its environment again (``openblas_read_env``) and stops its idle workers (``blas_thread_shutdown_``, the function
  OpenBLAS itself runs before a fork); the next BLAS call starts them again with the short timeout. Both functions
  are exported by numpy's and scipy's OpenBLAS builds; a library without them is left alone and reported.

A variable the user set is never changed. ``applied()`` says what was done (``tinylearn.cpu.blas_thread_timeout``
and ``python -m tinylearn info`` print it). Caveat: this runs at import; a BLAS call running in another thread at
that moment would race with the worker shutdown, so import tinylearn before starting threads that use numpy.
"""

from __future__ import annotations

import ctypes
import os

VAR = "OPENBLAS_THREAD_TIMEOUT"
EXPONENT = "16"
_applied: dict[str, str] = {}


def _loaded_openblas() -> list[str]:
    """Paths of the OpenBLAS shared libraries mapped into this process (Linux /proc/self/maps; else none)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower() and ".so" in line}
    except OSError:
        return []
    return sorted(p for p in paths if os.path.isabs(p))


def shorten(numpy_loaded_first: bool) -> dict[str, str]:
    """Set ``OPENBLAS_THREAD_TIMEOUT=16`` unless the user set it, and apply it to OpenBLAS already loaded.

    Returns ``{library path: what happened}`` for the libraries that were already loaded (empty when numpy came
    after tinylearn or the user chose a value)."""
    if VAR in os.environ:
        return _applied
    os.environ[VAR] = EXPONENT  # os.environ writes through to the C environment (putenv): getenv sees it
    if not numpy_loaded_first:
        return _applied
    for path in _loaded_openblas():
        try:
            lib = ctypes.CDLL(path)  # already mapped: the same handle, nothing is loaded twice
        except OSError as e:
            _applied[path] = f"not changed ({e})"
            continue
        if not (hasattr(lib, "openblas_read_env") and hasattr(lib, "blas_thread_shutdown_")):
            _applied[path] = "not changed (no openblas_read_env / blas_thread_shutdown_ exported)"
            continue
        lib.openblas_read_env()
        lib.blas_thread_shutdown_()
        _applied[path] = f"workers restarted with 2^{EXPONENT} cycles"
    return _applied


def applied() -> dict[str, str]:
    """What ``shorten`` did to OpenBLAS libraries loaded before tinylearn (empty when there were none)."""
    return dict(_applied)
