"""Shared test setup: the ``gpu`` marker skips with a reason when no CUDA device can run kernels."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from tinylearn.testing import cuda_available

    if not cuda_available():
        skip = pytest.mark.skip(reason="no CUDA device (tinylearn.testing.cuda_available() is False)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
