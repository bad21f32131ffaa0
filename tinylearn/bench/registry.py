"""Benchmark topics: each topic module defines ``run(full: bool = False, progress=None) -> list[Table]``.

A topic is *available* when its module imports; ``tinylearn bench`` with no topic runs every available one.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from .table import Table

# topic -> module defining run(full=False, progress=None) -> list[Table]
TOPICS: dict[str, str] = {
    "matmul": "tinylearn.bench.matmul",
    "autodiff": "tinylearn.autograd.bench",
    "conv": "tinylearn.conv.bench",
    "quant": "tinylearn.quant.bench",
    "prune": "tinylearn.prune.bench",
    "kernels": "tinylearn.kernels.bench",
    "dist": "tinylearn.dist.bench",
    "memory": "tinylearn.memory.bench",
}


def available_topics() -> list[str]:
    """Topics whose benchmark module exists and imports."""
    out = []
    for name, mod in TOPICS.items():
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name and mod.startswith(e.name):  # the topic module itself is missing
                continue
            raise
        out.append(name)
    return out


def run_topic(name: str, full: bool = False, progress: Callable[[str], None] | None = None) -> list[Table]:
    if name not in TOPICS:
        raise ValueError(f"topic: unknown benchmark topic {name!r}; known: {', '.join(TOPICS)}")
    mod = importlib.import_module(TOPICS[name])
    tables = mod.run(full=full, progress=progress)
    return [tables] if isinstance(tables, Table) else list(tables)
