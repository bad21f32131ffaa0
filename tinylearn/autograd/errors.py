"""tinylearn's exception classes."""

from __future__ import annotations


class ShapeError(RuntimeError, ValueError):
    """A shape mismatch: both RuntimeError (what torch code catches) and ValueError (tinylearn's convention)."""
