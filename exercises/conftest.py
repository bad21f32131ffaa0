"""Exercise runner: every exercise test gets the code under test from the ``impl`` fixture.

    pytest exercises/01_autodiff                      # your stubs (stubs.py in each folder): they start failing
    pytest exercises/ --impl=reference                # tinylearn's reference answers (reference.py): all pass

Each folder NN_topic/ holds ``stubs.py`` (what you edit), ``reference.py`` (the same names, bound to tinylearn's
implementations) and ``test_NN_topic.py``. ``impl.some_function`` is looked up in the chosen module.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--impl",
        action="store",
        default="stub",
        choices=("stub", "reference"),
        help="stub: test your exercises/NN_topic/stubs.py (default); reference: test tinylearn's answers",
    )


def _load(folder: Path, which: str) -> ModuleType:
    fname = "stubs.py" if which == "stub" else "reference.py"
    path = folder / fname
    if not path.is_file():
        raise FileNotFoundError(f"impl: {path} does not exist")
    mod_name = f"tl_exercise_{folder.name}_{which}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def impl(request: pytest.FixtureRequest) -> ModuleType:
    """The module under test for this exercise folder: stubs.py (default) or reference.py (--impl=reference)."""
    return _load(Path(request.path).parent, request.config.getoption("--impl"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from tinylearn.testing.pytest_hooks import skip_gpu_without_device

    skip_gpu_without_device(items)
