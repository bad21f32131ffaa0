"""pytest hooks shared by tests/conftest.py and exercises/conftest.py (one implementation, two callers)."""

from __future__ import annotations

from typing import Any

from ..backends import cuda_available


def skip_gpu_without_device(items: list[Any]) -> None:
    """Mark every test carrying ``@pytest.mark.gpu`` as skipped, with the reason, when no CUDA device can run."""
    if cuda_available():
        return
    import pytest

    skip = pytest.mark.skip(reason="no CUDA device (tinylearn.backends.cuda_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
