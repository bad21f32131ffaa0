"""Benchmark records: what ``tinylearn bench --json`` writes, where ``--record`` files it, and ``--compare``.

A record is one JSON object::

    {"schema": 1, "machine": {...cpu model, SIMD level, cores, threads, versions, date...},
     "tables": [{"topic": "kernels", "title": ..., "baseline": "torch", "rows": [...], "notes": [...]}, ...]}

Records of a machine live in ``benchmarks/<cpu-model>/`` (``cpu_slug()``), so a regression shows as a ratio to
the saved record of the same CPU: ``tinylearn bench kernels --compare benchmarks/<cpu>/<file>.json``.
Wall times move with load and clock, so a comparison prints both ratios: now/saved of the time itself, and
the change of the ratio to torch measured in the same process (more robust across runs on a busy machine).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
from pathlib import Path
from typing import Any

from ..backends import load_C
from ..cpu import blas_thread_timeout, malloc_settings
from .table import Row, Table

SCHEMA = 1


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it (``/proc/cpuinfo``), or ``platform.processor()``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown-cpu"


def simd_level(detected: bool = False) -> str:
    """The widest SIMD level tinylearn's kernels use here: avx512, avx2 or scalar (after TINYLEARN_CPU_FEATURES;
    ``detected=True``: what the CPU itself has)."""
    try:
        from tinylearn import cpu

        feats = set(cpu.detected_features() if detected else cpu.cpu_features())
    except (ImportError, ValueError):
        return "unknown"
    if "avx512f" in feats:
        return "avx512"
    if "avx2" in feats:
        return "avx2"
    return "scalar"


def cpu_slug(
    model: str | None = None, level: str | None = None, forced: str | None = None, build: str | None = None
) -> str:
    """A folder name for a CPU: lower-case model words joined by '-', plus the CPU's SIMD level
    (AMD EPYC -> amd-epyc-avx2), plus ``-forced-<level>`` when TINYLEARN_CPU_FEATURES forced a lower path, plus
    ``-portable-build`` when that forced run is of a portable build (``build``: ``_C.build_isa``, default this one's).

    The SIMD level is part of the name because the same model string ("AMD EPYC") covers AVX2-only and AVX-512
    parts, whose numbers must not be compared with each other; a forced run is not an AVX2-only machine either
    (torch/numpy/BLAS keep their own paths unless forced too).
    """
    model = cpu_model() if model is None else model
    level = simd_level(detected=True) if level is None else level
    forced = os.environ.get("TINYLEARN_CPU_FEATURES", "") if forced is None else forced
    words = re.sub(r"\((r|tm)\)", "", model.lower())
    words = re.sub(r"\b(processor|cpu|\d+-core)\b", " ", words)
    slug = "-".join(w for w in re.split(r"[^a-z0-9.]+", words) if w and w != "@")
    tail = f"-forced-{forced}" if forced and forced != level else ""
    # a forced run of a portable build (build_isa "baseline") compiles the forced path as an AVX2-only CPU would
    build = _build_isa() if build is None else build
    if tail and build == "baseline":
        tail += "-portable-build"
    return f"{slug or 'unknown-cpu'}-{level}{tail}"


def _build_isa() -> str | None:
    """The ISA tinylearn._C was compiled for: "avx512"/"avx2" (a -march=native build there), "baseline" (portable),
    None without the extension. A forced-AVX2 record is only an AVX2 machine's numbers from a portable build."""
    try:
        return str(load_C().build_isa)
    except (RuntimeError, AttributeError):
        return None


def machine_info() -> dict[str, Any]:
    """What a reader needs to judge a record: CPU, SIMD level, cores, threads, versions, date (UTC)."""
    import importlib.metadata as md

    info: dict[str, Any] = {
        "cpu_model": cpu_model(),
        "simd": simd_level(),
        "simd_detected": simd_level(detected=True),
        "cores": os.cpu_count(),
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "python": platform.python_version(),
        "forced_features": os.environ.get("TINYLEARN_CPU_FEATURES", ""),
        # the other libraries' path switches (a forced-AVX2 proxy sets them so torch/oneDNN/fbgemm/BLAS drop too)
        "forced_env": {
            k: os.environ[k]
            for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "FBGEMM_ENABLE_INSTRUCTIONS", "OPENBLAS_CORETYPE")
            if k in os.environ
        },
        "blas_thread_timeout": blas_thread_timeout(),
        "malloc": malloc_settings(),
        "build_isa": _build_isa(),
    }
    for pkg in ("tinylearn", "numpy", "torch", "tinygrad"):
        try:
            info[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            info[pkg] = None
    try:
        import torch

        info["torch_threads"] = torch.get_num_threads()
    except ImportError:
        info["torch_threads"] = None
    try:
        info["load_avg_1min"] = round(os.getloadavg()[0], 2)
    except OSError:
        info["load_avg_1min"] = None
    return info


def make_record(tables: list[tuple[str, Table]], machine: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON object for ``(topic, table)`` pairs."""
    return {
        "schema": SCHEMA,
        "machine": machine_info() if machine is None else machine,
        "tables": [{"topic": topic, **t.to_dict()} for topic, t in tables],
    }


def default_record_path(topics: list[str], root: str | Path = "benchmarks", when: _dt.date | None = None) -> Path:
    """``benchmarks/<cpu-slug>/<YYYY-MM-DD>_<topics>.json`` (``all`` when every topic ran). When that file exists
    already (a second run the same day), ``<YYYY-MM-DD>T<HHMM>Z_<topics>.json``: a saved record is never
    overwritten."""
    now = _dt.datetime.now(_dt.timezone.utc)
    when = when or now
    day = when if not isinstance(when, _dt.datetime) else when.date()
    stamp = (when if isinstance(when, _dt.datetime) else now).strftime("T%H%MZ")
    name = "_".join(topics) if topics else "all"
    folder = Path(root) / cpu_slug()
    path, n = folder / f"{day.isoformat()}_{name}.json", 1
    while path.exists():
        path = folder / f"{day.isoformat()}{stamp}{'' if n == 1 else f'-{n}'}_{name}.json"
        n += 1
    return path


def load_record(path: str | Path) -> dict[str, Any]:
    """Read a record; also accepts the older bare list of tables. Raises ValueError naming the file on bad JSON."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--compare: no such record file {str(p)!r}")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"--compare: {str(p)!r} is not JSON ({e.msg} at line {e.lineno})") from None
    if isinstance(data, list):
        data = {"schema": 0, "machine": {}, "tables": data}
    if not isinstance(data, dict) or not isinstance(data.get("tables"), list):
        raise ValueError(f"--compare: {str(p)!r} is not a tinylearn bench record (no 'tables' list)")
    for t in data["tables"]:
        if not isinstance(t, dict) or not {"title", "rows"} <= set(t):
            raise ValueError(f"--compare: {str(p)!r} has a table without 'title'/'rows'")
    return data


def _index(tables: list[dict[str, Any]]) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    out = {}
    for t in tables:
        for r in t["rows"]:
            out[(t.get("topic", ""), t["title"], r["case"], r["impl"])] = {**r, "_baseline": t.get("baseline", "torch")}
    return out


def _base_ratio(idx: dict, key: tuple[str, str, str, str]) -> float | None:
    r = idx[key]
    base = idx.get((key[0], key[1], key[2], r["_baseline"]))
    if base is None or not base.get("median_ms") or r.get("median_ms") is None:
        return None
    return r["median_ms"] / base["median_ms"]


def compare(saved: dict[str, Any], now: dict[str, Any]) -> Table:
    """One row per (table, case, impl) present in both: now/saved of the median time, and both ratios to torch.

    Rows only in one of the two records are counted in the notes (renamed cases do not match silently).
    """
    a, b = _index(saved["tables"]), _index(now["tables"])
    out = Table(title="now vs saved record", baseline="saved")
    common = [k for k in b if k in a]
    for key in common:
        s, n = a[key], b[key]
        ratio = n["median_ms"] / s["median_ms"] if s.get("median_ms") and n.get("median_ms") is not None else None
        out.add(
            Row(
                case=f"{key[0]}: {key[1]} | {key[2]}",
                impl=key[3],
                median_ms=n.get("median_ms"),
                ratio=ratio,
                extra={
                    "saved ms": s.get("median_ms"),
                    "x base saved": _base_ratio(a, key),
                    "x base now": _base_ratio(b, key),
                },
            )
        )
    only_saved = sum(k not in b for k in a)
    only_now = sum(k not in a for k in b)
    sm, nm = saved.get("machine", {}), now.get("machine", {})
    out.notes.append(f"{len(common)} rows in both; {only_saved} only in the saved record; {only_now} only now")
    s_cpu, n_cpu = (sm.get("cpu_model"), sm.get("simd")), (nm.get("cpu_model"), nm.get("simd"))
    if s_cpu[0] and n_cpu[0] and s_cpu != n_cpu:
        out.notes.append(f"different machines: saved on {s_cpu[0]} ({s_cpu[1]}), now {n_cpu[0]} ({n_cpu[1]})")
    out.notes.append("x saved = now/saved median time (>1: slower now); 'x base' = ratio to the table's baseline")
    return out
