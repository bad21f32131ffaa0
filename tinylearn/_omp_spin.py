"""Short OpenMP spin-wait (libgomp), set before libgomp loads (imported by ``tinylearn/__init__.py``; stdlib only).

After every parallel region libgomp's worker threads busy-wait ``GOMP_SPINCOUNT`` iterations (default 300,000:
a few milliseconds) for the next region before they sleep. tinylearn's C++ kernels, the kernels ``tl.compile``
generates and torch's intra-op threads all use the one libgomp of the process (torch's wheel ships
``libgomp.so.1``; whichever copy loads first serves both). numpy's OpenBLAS has its own worker threads, so on a
small machine a GEMM that follows an OpenMP kernel shares a core with a spinning OpenMP worker for milliseconds:
measured on 2 cores, ``tl.compile``'s MLP block (extern GEMM, fused bias+GELU, extern GEMM, fused residual)
ran 5.4 ms per call with the default spin and 2.4-3.0 ms with ``GOMP_SPINCOUNT`` at 1,000-20,000 (eager torch
2.5 ms either way). ``OMP_WAIT_POLICY=passive`` (no spin at all) made torch's small ops pay a futex wake-up each.

``SPINCOUNT`` = 1,000 iterations (~35 us here; the default spins ~7 ms: 0.14 of a core through a 50 ms sleep after
one 2-thread kernel, 0.003-0.005 with 1,000, ``cpu.openmp_spin``) keeps back-to-back kernels' workers awake and lets
them sleep before a BLAS call of any size needs the core. It matters most on a **busy** machine: when another
process holds one of the 2 cores, the team's worker spinning at the end of a region holds the only core its master
needs, so every parallel region costs the whole spin -- measured, a [512, 128] softmax under load: 8.0 ms per call
with the default, 4.3 / 1.0 / 0.51 / 0.18 / 0.086 ms at 100,000 / 20,000 / 10,000 / 3,000 / 1,000 (0.021 ms on
a quiet box in every case); torch's ops pay the same (a GELU chain: 24 ms per call with the default under load).

libgomp reads the variable once, when it loads, and exports no way to change it later:

- tinylearn imported before torch (and before anything else that loads libgomp): ``apply()`` sets the variable and
  libgomp reads it when it loads (tinylearn's extension or torch, whichever is first).
- libgomp already loaded (``import torch`` came first): nothing can be changed; ``status()`` says so and names the
  library, ``python -m tinylearn info`` prints it. Import tinylearn first, or set ``GOMP_SPINCOUNT`` yourself.

A variable the user set (``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY``) is never changed.
"""

from __future__ import annotations

import os

VAR = "GOMP_SPINCOUNT"
SPINCOUNT = "1000"
_status: list[str] = []


def loaded_libgomp() -> list[str]:
    """Paths of the libgomp copies mapped into this process (Linux /proc/self/maps; elsewhere none)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libgomp" in line and ".so" in line}
    except OSError:
        return []
    return sorted(p for p in paths if os.path.isabs(p))


def apply() -> str:
    """Set ``GOMP_SPINCOUNT`` unless the user chose a spin policy or libgomp is already loaded; return the status."""
    if _status:
        return _status[0]
    user = [v for v in (VAR, "OMP_WAIT_POLICY") if v in os.environ]
    loaded = loaded_libgomp()
    if user:
        text = ", ".join(f"{v}={os.environ[v]}" for v in user) + " (set by the user)"
    elif loaded:
        text = (
            f"libgomp default (~300000 spins): {', '.join(loaded)} was loaded before tinylearn (import torch came "
            f"first?); import tinylearn first or set {VAR}={SPINCOUNT} to stop OpenMP workers spinning into BLAS calls"
        )
    else:
        os.environ[VAR] = SPINCOUNT  # os.environ writes through to the C environment: libgomp's getenv sees it
        text = f"{VAR}={SPINCOUNT} (set by tinylearn before libgomp loaded)"
    _status.append(text)
    return text


def status() -> str:
    """What ``apply`` found and did at import."""
    return _status[0] if _status else apply()
