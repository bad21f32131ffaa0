"""The machine a tuning record was measured on: a fingerprint dict and a stable id hashed from it.

A tuned configuration is only valid where it was measured: another CPU model has other caches and ISA, a forced
``TINYLEARN_CPU_FEATURES`` level runs other micro-kernels, and a new numpy/torch/tinylearn can change the kernels
themselves. ``fingerprint()`` collects exactly what decides that (CPU model from /proc/cpuinfo, the effective
feature list from ``tinylearn.cpu``, core count, the forced level, library and Python versions);
``machine_id(fp)`` is a SHA-256 prefix of its canonical JSON, so equal fingerprints give equal ids on every run.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from typing import Any


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _version(mod: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(mod)
    except Exception:  # noqa: BLE001 - not installed: recorded as None
        return None


def fingerprint() -> dict[str, Any]:
    """What decides whether a timing transfers: cpu model, features, cores, forced level, versions."""
    try:
        from .. import cpu

        features: list[str] | None = list(cpu.cpu_features())
    except Exception:  # noqa: BLE001 - the C++ extension is not built: no feature list
        features = None
    return {
        "cpu": _cpu_model(),
        "machine": platform.machine(),
        "features": features,
        "cores": os.cpu_count(),
        "forced": os.environ.get("TINYLEARN_CPU_FEATURES", "").strip().lower() or None,
        "tinylearn": _version("tinylearn"),
        "numpy": _version("numpy"),
        "torch": _version("torch"),
        "python": platform.python_version(),
    }


def machine_id(fp: dict[str, Any] | None = None) -> str:
    """A stable 16-hex-digit id of ``fp`` (default: this machine's fingerprint)."""
    if fp is None:
        fp = fingerprint()
    if not isinstance(fp, dict):
        raise TypeError(f"fp: expected a fingerprint dict, got {type(fp).__name__}")
    blob = json.dumps(fp, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
