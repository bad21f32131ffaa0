"""Result tables: one row per (case, implementation), ratio = median / baseline median of the same case.

ratio < 1 means faster than the baseline (torch by default). Text, markdown and JSON output.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Row:
    case: str
    impl: str
    median_ms: float | None  # None: not run (see note)
    min_ms: float | None = None
    ratio: float | None = None  # median / baseline median (same case)
    gflops: float | None = None
    gbps: float | None = None
    peak_mb: float | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Table:
    title: str
    baseline: str = "torch"
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, row: Row) -> None:
        self.rows.append(row)

    def extend(self, other: Table) -> None:
        self.rows.extend(other.rows)
        self.notes.extend(n for n in other.notes if n not in self.notes)

    def cases(self) -> list[str]:
        return list(dict.fromkeys(r.case for r in self.rows))

    def impls(self) -> list[str]:
        return list(dict.fromkeys(r.impl for r in self.rows))

    def get(self, case: str, impl: str) -> Row | None:
        return next((r for r in self.rows if r.case == case and r.impl == impl), None)

    def compute_ratios(self) -> None:
        for case in self.cases():
            base = self.get(case, self.baseline)
            for r in self.rows:
                if r.case != case:
                    continue
                ok = base is not None and base.median_ms and r.median_ms is not None
                r.ratio = r.median_ms / base.median_ms if ok else None

    def _columns(self) -> list[tuple[str, str]]:
        cols = [("case", "case"), ("impl", "impl"), ("median_ms", "median ms"), ("ratio", f"x {self.baseline}")]
        for key, label in (("gflops", "GFLOP/s"), ("gbps", "GB/s"), ("peak_mb", "peak MB")):
            if any(getattr(r, key) is not None for r in self.rows):
                cols.append((key, label))
        extra_keys = list(dict.fromkeys(k for r in self.rows for k in r.extra))
        cols += [(f"extra:{k}", k) for k in extra_keys]
        cols.append(("note", "note"))
        return cols

    def _cell(self, r: Row, key: str) -> str:
        v = r.extra.get(key[6:]) if key.startswith("extra:") else getattr(r, key)
        if v is None:
            return "-" if key != "median_ms" else "n/a"
        if isinstance(v, float):
            if math.isnan(v):
                return "nan"
            if key == "ratio":
                return f"{v:.3g}x"
            return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.3e}"
        return str(v)

    def to_text(self) -> str:
        cols = self._columns()
        body = [[self._cell(r, k) for k, _ in cols] for r in self.rows]
        widths = [max(len(lbl), *(len(b[i]) for b in body)) if body else len(lbl) for i, (_, lbl) in enumerate(cols)]
        line = "  ".join(lbl.ljust(w) for (_, lbl), w in zip(cols, widths))
        out = [f"== {self.title} ==", line, "-" * len(line)]
        out += ["  ".join(c.ljust(w) for c, w in zip(b, widths)).rstrip() for b in body]
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)

    def to_markdown(self) -> str:
        cols = self._columns()
        out = [f"**{self.title}**", "", "| " + " | ".join(lbl for _, lbl in cols) + " |"]
        out.append("|" + "|".join("---" for _ in cols) + "|")
        out += ["| " + " | ".join(self._cell(r, k) for k, _ in cols) + " |" for r in self.rows]
        out += [f"\n_{n}_" for n in self.notes]
        return "\n".join(out)

    def to_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "baseline": self.baseline,
            "rows": [asdict(r) for r in self.rows],
            "notes": list(self.notes),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def _repr_markdown_(self) -> str:
        return self.to_markdown()

    def __str__(self) -> str:
        return self.to_text()
