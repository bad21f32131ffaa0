"""Two single-threaded BLAS calls at once instead of one multi-threaded call after the other (issue 18).

numpy's OpenBLAS threads each GEMM on its own. For the backward GEMMs of a Linear layer with a small batch
(K = batch = 128 in ``dW = G^T X``) its 2-thread split barely helps (measured on 2 cores: 512x512 dW 655 us on one
thread, ~610 us on two), while two independent single-threaded GEMMs on the two cores run side by side:

* ``run_pair(f1, f2)``: f1 on a helper thread, f2 on the caller, OpenBLAS at one thread for both (numpy releases
  the GIL inside matmul). Used for dX = G W and dW = G^T X of one layer (1090 us in sequence -> 740 us).
* ``matmul_rows_split(a, b)``: a @ b as two row halves computed at once into one C-contiguous result
  (dW 512x784: 720 us -> 550 us).

Both fall back to plain sequential numpy when numpy's BLAS is not OpenBLAS, when OpenBLAS runs one thread (the
``threadpool_limits(1)`` / OMP_NUM_THREADS=1 case), when the machine has one core, when the helper thread is busy
(another Python thread is inside a pair), or when the products are too small to pay the hand-off (~10-20 us).
The results are bitwise those of the same GEMMs run one after the other on one OpenBLAS thread each; they can differ
in the last bits from a 2-thread call (OpenBLAS may split K differently with more threads: its Haswell kernels do).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from .._threads import cores

MIN_FLOPS = 1 << 23  # per product: below ~8 MFLOP (~80 us on one core) the hand-off does not pay
# cores this process may run on, read once (os.cpu_count() costs ~20 us on Linux and ignores taskset / cgroups)
_CORES = cores()

_lib: list[Any] = []  # [(get_num_threads, set_num_threads) ctypes functions of numpy's OpenBLAS] or [None]


def _symbols(dynlib: Any) -> Any:
    for pre in ("", "scipy_"):
        for suf in ("", "64_", "_64"):
            get = getattr(dynlib, f"{pre}openblas_get_num_threads{suf}", None)
            put = getattr(dynlib, f"{pre}openblas_set_num_threads{suf}", None)
            par = getattr(dynlib, f"{pre}openblas_get_parallel{suf}", None)
            if get is not None and put is not None:
                return get, put, par
    return None


def _find_openblas() -> Any:
    # numpy's wheel bundles its OpenBLAS in numpy.libs: open it directly (already loaded, so dlopen returns it;
    # ~0.1 ms and a few KB), and ask it whether it threads with its own pthread pool (openblas_get_parallel() == 1)
    import ctypes
    import glob

    libdir = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    paths = glob.glob(os.path.join(libdir, "*openblas*.so*"))
    if len(paths) == 1:
        fns = _symbols(ctypes.CDLL(paths[0]))
        if fns is not None and fns[2] is not None:
            return fns[:2] if fns[2]() == 1 else None
    # other installs (conda, system BLAS): threadpoolctl finds the library (slower, ~15 ms once)
    from threadpoolctl import ThreadpoolController

    libs = [c for c in ThreadpoolController().lib_controllers if c.internal_api == "openblas"]
    pick = [c for c in libs if "numpy" in c.filepath] or libs
    # one OpenBLAS with its own pthread pool (process-wide thread count); an OpenMP build keeps per-thread limits
    if len(pick) != 1 or getattr(pick[0], "threading_layer", None) != "pthreads":
        return None
    fns = _symbols(pick[0].dynlib)
    return None if fns is None else fns[:2]


def _openblas() -> Any:
    if not _lib:
        try:
            _lib.append(_find_openblas())
        except Exception:  # no threadpoolctl or an unreadable library: stay sequential
            _lib.append(None)
    return _lib[0]


class _Helper:
    """One daemon thread running submitted callables; recreated after fork."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()  # held by the caller of a pair for its whole duration
        self.tasks: queue.SimpleQueue = queue.SimpleQueue()
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        threading.Thread(target=self._loop, name="tinylearn-blas-pair", daemon=True).start()

    def _loop(self) -> None:
        while True:
            fn = self.tasks.get()
            try:
                self.result, self.error = fn(), None
            except BaseException as e:  # handed back to the caller
                self.result, self.error = None, e
            fn = None  # drop the closure now: it holds the GEMM operands (a gradient would outlive its use)
            self.done.set()


_helper: list[_Helper] = []


def _get_helper() -> _Helper:
    if not _helper or _helper[0].pid != os.getpid():
        _helper[:] = [_Helper()]
    return _helper[0]


def parallel_ok(*flops: float) -> bool:
    """True when two BLAS products of these FLOP counts should run side by side (see the module docstring)."""
    if min(flops) < MIN_FLOPS or _CORES < 2:
        return False
    fns = _openblas()
    return fns is not None and fns[0]() >= 2


def run_pair(f1: Callable[[], Any], f2: Callable[[], Any]) -> tuple[Any, Any]:
    """(f1(), f2()) with f1 on the helper thread and f2 on the caller, numpy's OpenBLAS at one thread meanwhile.

    Call only when ``parallel_ok`` said so; if the helper is busy the two run in sequence on the caller.
    """
    fns = _openblas()
    h = _get_helper()
    if fns is None or not h.lock.acquire(blocking=False):
        return f1(), f2()
    get_n, set_n = fns
    try:
        n = get_n()
        set_n(1)
        try:
            h.done.clear()
            h.tasks.put(f1)
            try:
                r2 = f2()
            finally:
                h.done.wait()
        finally:
            set_n(n)
        if h.error is not None:
            err, h.error = h.error, None
            raise err
        r1, h.result = h.result, None
        return r1, r2
    finally:
        h.lock.release()


def matmul_rows_split(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b for 2-D a [M, K], b [K, N], as rows [:M/2] and [M/2:] computed at once into a C-contiguous result."""
    out = np.empty((a.shape[0], b.shape[1]), np.result_type(a, b))
    m = a.shape[0] // 2
    run_pair(lambda: np.matmul(a[:m], b, out=out[:m]), lambda: np.matmul(a[m:], b, out=out[m:]))
    return out
