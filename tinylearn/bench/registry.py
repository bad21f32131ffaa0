"""Benchmark topics, read from the topic table (``tinylearn.topics``): each row's ``bench`` module defines
``run(full: bool = False, progress=None) -> list[Table]``.

``TOPICS`` maps the short topic name to that module and accepts any of a topic's names as a key (``quant``,
``03_quantization``, ``03``, ``quantization``; ``matmul`` for the tour). A topic is *available* when its module
imports; ``tinylearn bench`` with no topic runs every available one.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping

from .. import topics
from .table import Table


class _BenchTopics(Mapping[str, str]):
    """topic name -> bench module, in curriculum order; lookups and ``in`` accept every alias of a topic."""

    def _table(self) -> dict[str, str]:
        return topics.bench_topics()  # read on each use: a row added to the table shows up at once

    def canonical(self, name: str) -> str:
        """The short name of the topic ``name`` refers to; ValueError listing the known benchmark topics."""
        try:
            t = topics.get(name)
        except (TypeError, ValueError):
            t = None
        if t is None or t.bench is None:
            raise ValueError(f"topic: unknown benchmark topic {name!r}; known: {', '.join(self._table())}")
        return t.name

    def __getitem__(self, name: str) -> str:
        try:
            return self._table()[self.canonical(name)]
        except ValueError as e:
            raise KeyError(name) from e

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        try:
            self.canonical(name)
        except ValueError:
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())

    def __repr__(self) -> str:
        return f"TOPICS({self._table()!r})"


TOPICS = _BenchTopics()


def available_topics() -> list[str]:
    """Topics whose benchmark module exists and imports (short names, curriculum order)."""
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
    """Run one topic's benchmark (any of its names) and return its tables."""
    mod = importlib.import_module(TOPICS[TOPICS.canonical(name)])
    tables = mod.run(full=full, progress=progress)
    return [tables] if isinstance(tables, Table) else list(tables)
