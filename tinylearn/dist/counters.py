"""Per-process event counters: the bytes and collectives a module's operators issued since the last reset.

One object per module (``COUNTS = Counters("bytes_sent", "messages")``) replaces the dict + reset + copy trio each
parallel operator module kept: code under measurement adds to it (``COUNTS["bytes_sent"] += n``), a test or a
notebook calls ``COUNTS.reset()`` before a step and ``COUNTS.snapshot()`` after it. Counters are per process (each
rank counts what it sent); nothing is shared or synchronised.
"""

from __future__ import annotations


class Counters(dict):
    """A ``dict`` of named integer counters, all starting at 0, with ``reset()`` and ``snapshot()``."""

    def __init__(self, *names: str) -> None:
        if not names or not all(isinstance(n, str) and n for n in names):
            raise ValueError(f"names: expected one or more non-empty counter names, got {names!r}")
        super().__init__({n: 0 for n in names})

    def reset(self) -> None:
        """Zero every counter (the names stay)."""
        for key in self:
            self[key] = 0

    def snapshot(self) -> dict[str, int]:
        """A plain copy of the counters now (later additions do not change it)."""
        return dict(self)
