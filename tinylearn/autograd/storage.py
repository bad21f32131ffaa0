"""Storage hook (for the memory-pool topic): where every freshly computed tensor array may be re-homed.

``set_storage_hook(fn)`` makes every Tensor built from a freshly computed array (op outputs, factories,
``Tensor(data)``) call ``fn(array) -> array`` first; ``fn`` may return an arena-backed copy with the same
shape/dtype/values. ``set_storage_hook(None)`` (the default) removes it; unset, it costs one ``is None`` test per
tensor. ``get_storage_hook()`` returns the current hook. ``tinylearn.memory.pooled`` installs one.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

hook: Callable[[np.ndarray], np.ndarray] | None = None  # read by Tensor construction; set via set_storage_hook


def set_storage_hook(fn: Callable[[np.ndarray], np.ndarray] | None) -> Callable[[np.ndarray], np.ndarray] | None:
    """Install ``fn(array) -> array`` (or None to remove); returns the previous hook so callers can restore it."""
    global hook
    if fn is not None and not callable(fn):
        raise TypeError(f"fn: storage hook must be callable or None, got {type(fn).__name__}")
    prev, hook = hook, fn
    return prev


def get_storage_hook() -> Callable[[np.ndarray], np.ndarray] | None:
    return hook
