"""The autocast switch both ``tinylearn.amp`` (which defines ``tl.autocast``) and the autograd core read.

It lives under autograd so that ``autograd.checkpoint`` can save and restore the autocast state for its
recomputation without importing ``tinylearn.amp`` (which imports autograd: that was an import circle).
``tinylearn.amp.autocast_mode`` registers its ``Function.apply`` hook here once, on import; ``set_dtype`` installs
it while a dtype is active and removes it otherwise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from . import function


class _State:
    dtype: np.dtype | None = None  # the active autocast dtype (None: autocast off)
    inside: bool = False  # an autocast op is being applied (its casts must not recurse)
    n_cast: int = 0  # casts inserted since the last reset (for lessons/tests)
    hook: Callable[..., Any] | None = None  # tinylearn.amp's (cls, args, kwargs) -> outputs | NotImplemented


def register_hook(hook: Callable[..., Any]) -> None:
    """Called once by ``tinylearn.amp.autocast_mode``: the hook ``set_dtype`` installs while autocast is on."""
    _State.hook = hook


def get_autocast_dtype() -> np.dtype | None:
    """The dtype of the innermost active autocast context, or None."""
    return _State.dtype


def is_autocast_enabled() -> bool:
    return _State.dtype is not None


def set_dtype(dtype: np.dtype | None) -> np.dtype | None:
    """Make ``dtype`` the active autocast dtype (None: off) and return the previous one."""
    if dtype is not None and _State.hook is None:
        raise RuntimeError("autocast: no hook registered (import tinylearn.amp to turn autocast on)")
    prev, _State.dtype = _State.dtype, dtype
    function._autocast_hook = _State.hook if dtype is not None else None
    return prev


@contextlib.contextmanager
def autocast_dtype(dtype: np.dtype | None) -> Iterator[None]:
    """Run the body under autocast ``dtype`` (None: autocast off), restoring the previous state on exit."""
    prev = set_dtype(dtype)
    try:
        yield
    finally:
        set_dtype(prev)
