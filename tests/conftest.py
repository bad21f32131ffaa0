"""Shared test setup: the ``gpu`` marker skips with a reason when no CUDA device can run kernels."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from tinylearn.testing.pytest_hooks import skip_gpu_without_device

    skip_gpu_without_device(items)
