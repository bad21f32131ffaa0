"""The one lookup for tinylearn's non-Python resources: the CUDA sources and the exercise folders.

They are edited in the repository (``cuda_src/``, ``exercises/``); a wheel carries copies inside the package
(``tinylearn/cuda_src``, ``tinylearn/exercises``, installed by CMakeLists.txt). The checkout wins when tinylearn is
imported from one (editable install: edits are seen at once); otherwise the packaged copy is used.

    cuda_dir()           # Path of the folder holding the .cu files
    cuda_source("kernels_softmax")   # Path of kernels_softmax.cu (ValueError listing the known names)
    exercises_dir()      # Path of the folder holding NN_topic/ exercise folders and their conftest.py
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

_PKG = Path(__file__).resolve().parent


@functools.cache
def checkout_root() -> Path | None:
    """The repository root when tinylearn is imported from a checkout (its pyproject names tinylearn)."""
    root = _PKG.parent
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and 'name = "tinylearn"' in pyproject.read_text(errors="replace"):
        return root
    return None


def _packaged(name: str) -> list[Path]:
    """Copies installed inside the package; an editable install may map them to another site-packages folder."""
    out = [_PKG / name]
    spec = importlib.util.find_spec("tinylearn")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        out.append(Path(loc) / name)
    return out


def _find(name: str, probe: str) -> Path:
    root = checkout_root()
    candidates = ([root / name] if root else []) + _packaged(name)
    for c in candidates:
        if c.is_dir() and any(c.glob(probe)):
            return c
    raise FileNotFoundError(
        f"tinylearn: no {name}/ found (looked in {', '.join(str(c) for c in dict.fromkeys(candidates))}); "
        "reinstall tinylearn (`pip install .` from a checkout builds a wheel that carries it)"
    )


def cuda_dir() -> Path:
    """The folder of the hand-written CUDA kernels (``cuda_src/*.cu``)."""
    return _find("cuda_src", "*.cu")


def cuda_source(name: str) -> Path:
    """Path of ``<name>.cu`` (``name`` with or without the suffix); ValueError listing the known sources."""
    if not isinstance(name, str):
        raise TypeError(f"name: must be a str, got {type(name).__name__}")
    d = cuda_dir()
    path = d / (name if name.endswith(".cu") else f"{name}.cu")
    if not path.is_file():
        known = sorted(p.stem for p in d.glob("*.cu"))
        raise ValueError(f"name: no CUDA source {path.name} in {d}; known: {known}")
    return path


def exercises_dir() -> Path:
    """The folder holding the exercise folders ``NN_topic/`` and their ``conftest.py``."""
    return _find("exercises", "*/test_*.py")
