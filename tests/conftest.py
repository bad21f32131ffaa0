"""Shared test setup: the ``gpu`` marker skips with a reason when no CUDA device can run kernels; the topic table's
``path_independent`` modules get that marker (make test-portable deselects them: same result on every CPU path), and
so does every ``standalone_sanitizer`` test (it builds its own binary from cpp_src with fixed flags)."""

from __future__ import annotations

import pytest


@pytest.hookimpl(tryfirst=True)  # before -m selection reads the markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from tinylearn.testing.pytest_hooks import skip_gpu_without_device

    skip_gpu_without_device(items)
    from tinylearn.topics import path_independent_tests

    same_everywhere = path_independent_tests()
    for item in items:
        if str(item.path.relative_to(config.rootpath)) in same_everywhere or item.get_closest_marker(
            "standalone_sanitizer"
        ):
            item.add_marker(pytest.mark.path_independent)
