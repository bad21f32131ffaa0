"""Spatial modules beyond Conv2d/MaxPool2d/AvgPool2d (torch.nn names). Re-exported by ``tinylearn.nn``."""

from __future__ import annotations

__all__: list[str] = []
