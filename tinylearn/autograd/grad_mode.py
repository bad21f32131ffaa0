"""Context managers that switch autograd globally: ``no_grad`` / ``enable_grad`` and ``detect_anomaly``.

Inside ``no_grad()`` ops build no graph (outputs have requires_grad=False): inference costs no saved tensors.
Inside ``detect_anomaly()`` every op's forward output and every backward gradient is checked for NaN/Inf and the
first offender raises RuntimeError naming the op (e.g. "op 'Log' produced NaN in its backward").
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from .function import _GradMode


class _Switch:
    _attr = "enabled"
    _value = False

    def __enter__(self) -> _Switch:
        self._prev = getattr(_GradMode, self._attr)
        setattr(_GradMode, self._attr, self._value)
        return self

    def __exit__(self, *exc: Any) -> None:
        setattr(_GradMode, self._attr, self._prev)

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*a: Any, **k: Any) -> Any:
            with type(self)():
                return fn(*a, **k)

        return wrapper


class no_grad(_Switch):  # noqa: N801 - torch's name
    """Disable graph recording (context manager or decorator)."""

    _value = False


class enable_grad(_Switch):  # noqa: N801
    _value = True


class detect_anomaly(_Switch):  # noqa: N801
    """Check every forward output / backward gradient for NaN/Inf; raise naming the op that produced it."""

    _attr = "anomaly"
    _value = True


def is_grad_enabled() -> bool:
    return _GradMode.enabled
