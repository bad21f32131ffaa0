"""Thread counts in one place: how many threads tinylearn's C++ kernels use, how many CPUs this process may run on,
and one context manager that caps the thread pools (BLAS / OpenMP through threadpoolctl, optionally torch and
numba) inside a block and restores them afterwards.

    max_threads()                          tinylearn._C's OpenMP default (cpp_src/common.h tl::n_threads), 1 without _C
    cores()                                CPUs this process may run on (its affinity mask)
    limited_threads(n, torch=, numba=)     BLAS / OpenMP (and torch, numba) at n threads inside the block; None: as is

Every benchmark and ``nn.training`` use ``limited_threads``; nothing else in the library calls threadpoolctl's
``threadpool_limits``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from ._inputs import is_int
from .backends import C_available, load_C


def max_threads() -> int:
    """OpenMP's default thread count in tinylearn._C (``tl::n_threads()``: follows OMP_NUM_THREADS); 1 when the
    extension is not built."""
    return int(load_C().omp_max_threads()) if C_available() else 1


def cores() -> int:
    """Number of CPUs this process may run on (its affinity mask; ``os.cpu_count()`` where there is none)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _check(n: int | None, name: str) -> int | None:
    if n is None:
        return None
    if not is_int(n) or n < 1:
        raise ValueError(f"{name}: expected an int >= 1 or None, got {n!r}")
    return int(n)


@contextlib.contextmanager
def limited_threads(
    n: int | None, *, torch: bool = False, numba: bool = False, name: str = "threads"
) -> Iterator[None]:
    """Cap BLAS and OpenMP (threadpoolctl: numpy's BLAS, tinylearn._C's OpenMP) at ``n`` threads inside the block,
    and torch's intra-op threads (``torch=True``) and numba's (``numba=True``) too; everything comes back on exit.

    ``n=None`` leaves every pool as it is. ``name`` is the argument named in the ValueError for a bad ``n`` (not an
    int >= 1). Without threadpoolctl installed the BLAS / OpenMP cap is skipped.
    """
    n = _check(n, name)
    if n is None:
        yield
        return
    with contextlib.ExitStack() as stack:
        if torch:
            import torch as _torch

            old_t = _torch.get_num_threads()
            _torch.set_num_threads(n)
            stack.callback(_torch.set_num_threads, old_t)
        if numba:
            import numba as _numba

            old_nb = _numba.get_num_threads()
            _numba.set_num_threads(min(n, _numba.config.NUMBA_NUM_THREADS))
            stack.callback(_numba.set_num_threads, old_nb)
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:  # pragma: no cover - threadpoolctl is a dependency
            threadpool_limits = None
        if threadpool_limits is not None:
            stack.enter_context(threadpool_limits(limits=n))
        yield
