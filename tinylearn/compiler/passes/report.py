"""``PassReport``: what one pass changed, printable."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PassReport:
    name: str
    changes: list[str] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def changed(self) -> int:
        return len(self.changes)

    def __str__(self) -> str:
        head = f"{self.name}: {self.changed} change(s)" + (f" {self.stats}" if self.stats else "")
        return "\n".join([head, *("  " + c for c in self.changes)])
