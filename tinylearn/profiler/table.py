"""Aggregating profile events per op and printing them the way ``torch.profiler``'s ``key_averages().table()`` does.

``key_averages(events)`` groups events by name (and by input shapes with ``group_by_input_shape=True``) into
``Row``s: calls, self time (the op's own time, children excluded), total time (children included), FLOPs and bytes
(the cost model's figures, self: a parent's count excludes what its children already count, so totals do not double
count a GEMM dispatched inside ``Linear``). ``KeyAverages.table(sort_by, row_limit)`` prints the columns torch
prints (Name, Self CPU %, Self CPU, CPU total %, CPU total, CPU time avg, # of Calls) plus FLOPs, GFLOP/s (FLOPs
over self time), bytes and arithmetic intensity. Percentages are of the summed self time of all events, as in torch.

``roofline_rows`` places every row with a FLOP count under the roofline (``tinylearn.bench.roofline``): intensity
I = FLOPs / bytes, roof = min(peak, I * bandwidth), bound "memory" when I * bandwidth < peak, fraction = achieved /
roof (how far below the roof the op runs: the re-tune signal ``hotspots`` reads).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from ..bench import roofline as _roofline
from .events import Event

SORT_KEYS = {
    "self_cpu_time_total": lambda r: r.self_ns,
    "self_cpu_time": lambda r: r.self_ns,
    "cpu_time_total": lambda r: r.total_ns,
    "cpu_time": lambda r: r.total_ns,
    "cpu_time_avg": lambda r: r.avg_ns,
    "count": lambda r: r.count,
    "flops": lambda r: r.flops or 0,
    "gflops": lambda r: r.gflops or 0.0,
    "bytes": lambda r: r.bytes or 0,
    "intensity": lambda r: r.intensity or 0.0,
}


@dataclass
class Row:
    key: str
    kind: str
    count: int = 0
    self_ns: int = 0
    total_ns: int = 0
    flops: int | None = None
    bytes: int | None = None
    input_shapes: tuple = ()
    backend: str | None = None
    version: str | None = None

    @property
    def avg_ns(self) -> float:
        return self.total_ns / self.count if self.count else 0.0

    @property
    def gflops(self) -> float | None:
        return self.flops / self.self_ns if self.flops is not None and self.self_ns > 0 else None

    @property
    def intensity(self) -> float | None:
        return self.flops / self.bytes if self.flops is not None and self.bytes else None


class KeyAverages(list):
    """A list of ``Row`` (first-seen order) with torch's ``table()``."""

    def table(self, sort_by: str = "self_cpu_time_total", row_limit: int = 20) -> str:
        return format_table(self, sort_by=sort_by, row_limit=row_limit)

    def row(self, key: str) -> Row:
        for r in self:
            if r.key == key:
                return r
        raise KeyError(f"key: no op named {key!r} in this profile; ops: {sorted({r.key for r in self})}")


def key_averages(events: Iterable[Event], group_by_input_shape: bool = False) -> KeyAverages:
    rows: dict[tuple, Row] = {}
    for e in events:
        k = (e.name, e.shapes) if group_by_input_shape else (e.name,)
        r = rows.get(k)
        if r is None:
            r = rows[k] = Row(
                e.name,
                e.kind,
                input_shapes=e.shapes if group_by_input_shape else (),
                backend=e.backend,
                version=e.version,
            )
        r.count += 1
        r.self_ns += e.self_ns
        r.total_ns += e.duration_ns
        if e.flops is not None:
            r.flops = (r.flops or 0) + e.flops
        if e.bytes is not None:
            r.bytes = (r.bytes or 0) + e.bytes
        if r.backend != e.backend or r.version != e.version:  # several backends under one name: say so
            r.backend = "mixed" if r.backend != e.backend else r.backend
            r.version = "mixed" if r.version != e.version else r.version
    return KeyAverages(rows.values())


def _t(ns: float) -> str:
    if ns >= 1e9:
        return f"{ns / 1e9:.3f}s"
    if ns >= 1e6:
        return f"{ns / 1e6:.3f}ms"
    return f"{ns / 1e3:.3f}us"


def _si(x: float | None, unit: str = "") -> str:
    if x is None:
        return "-"
    for div, p in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= div:
            return f"{x / div:.2f}{p}{unit}"
    return f"{x:.0f}{unit}" if float(x).is_integer() else f"{x:.2f}{unit}"


def sort_rows(rows: Iterable[Row], sort_by: str) -> list[Row]:
    if sort_by not in SORT_KEYS:
        raise ValueError(f"sort_by: unknown key {sort_by!r}; expected one of {sorted(SORT_KEYS)}")
    return sorted(rows, key=SORT_KEYS[sort_by], reverse=True)


def format_table(rows: Iterable[Row], sort_by: str = "self_cpu_time_total", row_limit: int = 20) -> str:
    if isinstance(row_limit, bool) or not isinstance(row_limit, int):
        raise TypeError(f"row_limit: expected an int, got {type(row_limit).__name__} {row_limit!r}")
    rows = list(rows)
    ordered = sort_rows(rows, sort_by)
    if row_limit >= 0:
        ordered = ordered[:row_limit]
    total_self = sum(r.self_ns for r in rows) or 1
    shapes = any(r.input_shapes for r in ordered)
    head = [
        "Name",
        "Self CPU %",
        "Self CPU",
        "CPU total %",
        "CPU total",
        "CPU time avg",
        "# of Calls",
        "FLOPs",
        "GFLOP/s",
        "Bytes",
        "FLOP/B",
    ] + (["Input Shapes"] if shapes else [])
    body = []
    for r in ordered:
        line = [
            r.key,
            f"{100 * r.self_ns / total_self:.2f}%",
            _t(r.self_ns),
            f"{100 * r.total_ns / total_self:.2f}%",
            _t(r.total_ns),
            _t(r.avg_ns),
            str(r.count),
            _si(r.flops),
            "-" if r.gflops is None else f"{r.gflops:.2f}",
            _si(r.bytes, "B"),
            "-" if r.intensity is None else f"{r.intensity:.2f}",
        ]
        if shapes:
            line.append(str([list(s) for s in r.input_shapes]))
        body.append(line)
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    sep = "  ".join("-" * w for w in widths)

    def fmt(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    out = [sep, fmt(head), sep, *(fmt(b) for b in body), sep, f"Self CPU time total: {_t(total_self)}"]
    return "\n".join(out)


def roofline_rows(
    rows: Iterable[Row], peak_gflops: float | None = None, bandwidth_gbs: float | None = None
) -> list[dict]:
    """One dict per op with FLOPs, bytes and time: name, intensity, gflops (achieved), attainable, bound, fraction."""
    for name, v in (("peak_gflops", peak_gflops), ("bandwidth_gbs", bandwidth_gbs)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0):
            raise ValueError(f"{name}: expected a finite number > 0 (or None: this machine's measured roof), got {v!r}")
    if peak_gflops is None or bandwidth_gbs is None:
        mp = _roofline.machine_peak()
        peak_gflops = mp["gflops_fp32"] if peak_gflops is None else peak_gflops
        bandwidth_gbs = mp["bandwidth_gbs"] if bandwidth_gbs is None else bandwidth_gbs
    out = []
    for r in rows:
        if not r.flops or not r.bytes or r.self_ns <= 0:
            continue
        rf = _roofline.roofline(r.flops, r.bytes, peak_gflops, bandwidth_gbs)
        achieved = r.flops / r.self_ns
        out.append(
            {
                "name": r.key,
                "kind": r.kind,
                "calls": r.count,
                "intensity": rf["intensity"],
                "gflops": achieved,
                "attainable_gflops": rf["attainable_gflops"],
                "bound": rf["bound"],
                "fraction": achieved / rf["attainable_gflops"],
                "self_ns": r.self_ns,
                "flops": r.flops,
                "bytes": r.bytes,
                "backend": r.backend,
                "version": r.version,
            }
        )
    return out
