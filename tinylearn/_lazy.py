"""Lazy names for a topic package's ``__init__``: ``name -> submodule`` resolved on first attribute access (PEP 562).

    __getattr__, __dir__ = lazy_exports(__name__, {"Engine": "engine", ...}, globals())

keeps ``import tinylearn.<topic>`` light (the submodule, and what it imports -- FastAPI, scipy, peft -- loads only
when a name of it is used); a resolved name is cached in the package's globals, so later lookups are plain."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(
    package: str, exports: dict[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """(``__getattr__``, ``__dir__``) for ``package`` whose names ``exports`` maps to submodules."""

    def __getattr__(name: str) -> Any:
        mod = exports.get(name)
        if mod is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{mod}", package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
