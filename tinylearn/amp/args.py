"""Scalar argument checks of the amp API (integers go through ``tinylearn._inputs.as_int``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._inputs import as_int, is_int

__all__ = ["as_int", "is_int", "bool_arg", "positive_real", "real_arg"]


def real_arg(value: Any, name: str) -> float:
    """``value`` as a float: ints, floats, numpy numbers; TypeError naming ``name`` for bools, strings and the rest."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}: expected a real number, got {type(value).__name__} {value!r}")
    return float(value)


def positive_real(value: Any, name: str) -> float:
    """``value`` as a finite float > 0 (ValueError naming ``name`` otherwise, NaN and Inf included)."""
    v = real_arg(value, name)
    if not (np.isfinite(v) and v > 0):
        raise ValueError(f"{name}: must be a finite number > 0, got {value!r}")
    return v


def bool_arg(value: Any, name: str) -> bool:
    """``value`` as a bool: Python or numpy bools only (``enabled=1`` or ``"no"`` is a TypeError)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__} {value!r}")
    return bool(value)
