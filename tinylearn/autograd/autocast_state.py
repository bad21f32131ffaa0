"""The autocast switch both ``tinylearn.amp`` (which defines ``tl.autocast``) and the autograd core read.

It lives under autograd so that ``autograd.checkpoint`` can save and restore the autocast state for its
recomputation without importing ``tinylearn.amp`` (which imports autograd: that was an import circle).
``tinylearn.amp.autocast_mode`` registers its ``Function.apply`` hook here once, on import.

The state is **thread-local**, like torch's autocast: ``with tl.autocast(...)`` in one thread leaves the ops of
every other thread in their input dtypes. ``Function.apply`` reads one module-level hook slot; ``set_dtype``
installs the hook while at least one thread has autocast on and removes it when the last one leaves (the hook
itself reads the calling thread's dtype and returns NotImplemented where it is off), so a process that never
autocasts pays nothing per op.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from . import function


class _ThreadState(threading.local):
    """Per-thread autocast state (the class attributes are every new thread's defaults)."""

    dtype: np.dtype | None = None  # the active autocast dtype of this thread (None: autocast off)
    inside: bool = False  # an autocast op is being applied in this thread (its casts must not recurse)
    n_cast: int = 0  # casts inserted by this thread since the last reset (for lessons/tests)


_State = _ThreadState()  # the calling thread's state (``_State.dtype`` reads this thread's value)
_hook: Callable[..., Any] | None = None  # tinylearn.amp's (cls, args, kwargs) -> outputs | NotImplemented
_n_active = 0  # threads whose autocast is on: the hook is installed in Function.apply while this is > 0
_lock = threading.Lock()


def register_hook(hook: Callable[..., Any]) -> None:
    """Called once by ``tinylearn.amp.autocast_mode``: the hook ``set_dtype`` installs while autocast is on."""
    global _hook
    _hook = hook
    with _lock:
        if _n_active:
            function._autocast_hook = hook


def get_autocast_dtype() -> np.dtype | None:
    """The dtype of the calling thread's innermost active autocast context, or None."""
    return _State.dtype


def is_autocast_enabled() -> bool:
    """Whether autocast is on in the calling thread."""
    return _State.dtype is not None


def set_dtype(dtype: np.dtype | None) -> np.dtype | None:
    """Make ``dtype`` the calling thread's autocast dtype (None: off) and return its previous one."""
    global _n_active
    if dtype is not None and not isinstance(dtype, np.dtype):
        raise TypeError(f"dtype: expected a numpy dtype or None, got {type(dtype).__name__}")
    if dtype is not None and _hook is None:
        raise RuntimeError("autocast: no hook registered (import tinylearn.amp to turn autocast on)")
    prev = _State.dtype
    if (prev is None) != (dtype is None):  # this thread turns autocast on or off
        with _lock:
            _n_active += 1 if dtype is not None else -1
            function._autocast_hook = _hook if _n_active > 0 else None
    _State.dtype = dtype
    return prev


@contextlib.contextmanager
def autocast_dtype(dtype: np.dtype | None) -> Iterator[None]:
    """Run the body under autocast ``dtype`` (None: autocast off), restoring the previous state on exit."""
    prev = set_dtype(dtype)
    try:
        yield
    finally:
        set_dtype(prev)
