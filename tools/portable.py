#!/usr/bin/env python3
"""make test-portable: run the unit tests, the exercises and nbval again with other numeric paths forced.

One machine stands in for others by forcing, in one process environment per run, every library's CPU dispatch:

    run       tinylearn (TINYLEARN_CPU_FEATURES)  torch (ATEN_CPU_CAPABILITY)  OpenBLAS (OPENBLAS_CORETYPE)  numpy
    baseline  scalar                              default                      Sandybridge                   every SIMD
                                                                                                             dispatch
                                                                                                             target off
    avx2      avx2                                avx2                         Haswell                       AVX-512 off

(numpy: NPY_DISABLE_CPU_FEATURES, given only the dispatch targets this CPU has; numpy ignores the others.)
The avx2 run also sets FBGEMM_ENABLE_INSTRUCTIONS=AVX2: ATEN_CPU_CAPABILITY does not reach fbgemm (torch's int8
GEMMs), which would keep its AVX-512 VNNI kernels; its AVX2 kernels sum u8 x s8 pairs into int16 with saturation
(vpmaddubsw), so a test that used torch's quantized ops as an exact oracle would fail there as on an AVX2-only CPU.
The report probes that saturation (255 x 127 x 2 > 32767) to check the override took effect.
Before a run, a child process with that environment reports the paths it really uses (torch's
get_cpu_capability, threadpoolctl's OpenBLAS core type, numpy's __cpu_features__, tinylearn._C.cpu_supports and
the int8 GEMM path) and the run fails if an override did not take effect. A run whose effective paths are all
the ones ``make test`` already used on this CPU (e.g. ``avx2`` on an AVX2-only CPU) is reported and skipped
(``--no-skip`` runs it anyway).

No suite runs twice on the same numeric path: the unit tests marked ``path_independent`` (their result cannot
depend on a SIMD/BLAS path: file layout, CLI, packaging, docs, process launchers) are deselected here, and so are
the ``timing`` ones (fits of measured times, which ``make test`` runs alone on the cores). The
notebooks of the first run execute in a real JupyterLab in headless Chromium (tools/lab_test.py --compare: Run
All, no error cell, plots and widgets rendered, and every compared cell equal to the committed output by nbval's
rules); the server and its kernels inherit the run's environment, so that one execution is both the browser test
and this path's nbval run. Later runs (e.g. avx2 on an AVX-512 CPU) use nbval (tools/nbval_run.py, as make
test-notebooks: two notebooks at a time, the exclusive ones alone). ``--notebooks-via lab`` fails when
no browser is installed (CI); ``auto`` (default) falls back to nbval; ``nbval`` never starts a browser.

    python tools/portable.py                  # every run, then the suites
    python tools/portable.py --report-only    # print and verify the paths, run no tests
    python tools/portable.py --runs baseline  # one run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKERS = os.environ.get("JOBS", "auto")  # pytest-xdist workers, as in the Makefile
SUITES = {
    "tests": [
        "-m",
        "pytest",
        "tests/",
        "-q",
        "-p",
        "no:cacheprovider",
        "-m",
        "not path_independent and not timing",
        "-n",
        WORKERS,
    ],
    "exercises": ["-m", "pytest", "exercises/", "--impl=reference", "-q", "-p", "no:cacheprovider"],
    "notebooks": ["tools/nbval_run.py"],  # two at a time where they may share the cores (make test-notebooks)
}
LAB = ["tools/lab_test.py", "--compare", "--require", "--out", str(ROOT / "build" / "lab-test-portable")]


def lab_available() -> bool:
    import importlib.util

    sys.path.insert(0, str(ROOT / "tools"))
    import lab_test

    return lab_test._chromium() is not None and importlib.util.find_spec("playwright") is not None


FORCED_VARS = (
    "TINYLEARN_CPU_FEATURES",
    "ATEN_CPU_CAPABILITY",
    "OPENBLAS_CORETYPE",
    "NPY_DISABLE_CPU_FEATURES",
    "FBGEMM_ENABLE_INSTRUCTIONS",
)


def fbgemm_saturates() -> bool | None:
    """Whether torch's fbgemm int8 linear saturates u8 x s8 pair sums in int16 (its AVX2 / AVX-512 kernels without
    VNNI do; VNNI's vpdpbusd does not). None when torch has no fbgemm engine."""
    import warnings

    import torch

    if "fbgemm" not in torch.backends.quantized.supported_engines:
        return None
    torch.backends.quantized.engine = "fbgemm"
    k = 64
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qx = torch.quantize_per_tensor(torch.full((1, k), 255.0), 1.0, 0, torch.quint8)
        qw = torch.quantize_per_tensor(torch.full((4, k), 127.0), 1.0, 0, torch.qint8)
        y = torch.ops.quantized.linear(qx, torch.ops.quantized.linear_prepack(qw, None), 1e4, 0)
    exact, saturated = 255 * 127 * k, 32767 * (k // 2)  # 2072640 vs 1048544: 207 vs 105 output steps of 1e4
    got = float(y.dequantize()[0, 0])
    return abs(got - saturated) < abs(got - exact)


def report() -> dict:
    """The numeric paths of this process (run in a child with the run's environment)."""
    import scipy.linalg  # noqa: F401  (loads scipy's OpenBLAS too, so threadpoolctl sees both)

    from tinylearn import cpu

    out = cpu.numeric_paths()
    out["detected"] = cpu.detected_features()
    out["fbgemm_saturates"] = fbgemm_saturates()
    for b in out["blas"]:
        b.pop("filepath", None)
    return out


def child_report(env: dict[str, str]) -> dict:
    code = "import json, sys; sys.path.insert(0, 'tools'); import portable; print(json.dumps(portable.report()))"
    p = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"portable: the report process failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in FORCED_VARS}


def runs_for(default: dict) -> dict[str, dict[str, str]]:
    """The overrides of each run, given what this CPU does by default."""
    simd = default["numpy_simd"]["dispatch"]  # the dispatch targets this CPU enables (X86_V3, X86_V4, AVX512_*)
    avx512 = [t for t in simd if "512" in t or t == "X86_V4"]
    runs = {
        "baseline": {
            "TINYLEARN_CPU_FEATURES": "scalar",
            "ATEN_CPU_CAPABILITY": "default",
            "OPENBLAS_CORETYPE": "Sandybridge",
            "NPY_DISABLE_CPU_FEATURES": " ".join(simd),
        },
    }
    if "avx2" in default["detected"]:
        runs["avx2"] = {
            "TINYLEARN_CPU_FEATURES": "avx2",
            "ATEN_CPU_CAPABILITY": "avx2",
            "OPENBLAS_CORETYPE": "Haswell",
            "NPY_DISABLE_CPU_FEATURES": " ".join(avx512),
            "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
        }
    return runs


def verify(name: str, forced: dict[str, str], got: dict) -> list[str]:
    """Every override took effect; returns the failures (empty = all good)."""
    bad = []
    want_cap = {"default": "DEFAULT", "avx2": "AVX2", "avx512": "AVX512"}[forced["ATEN_CPU_CAPABILITY"]]
    if got["torch_capability"] != want_cap:
        bad.append(f"torch: ATEN_CPU_CAPABILITY={forced['ATEN_CPU_CAPABILITY']} but {got['torch_capability']}")
    openblas = [b for b in got["blas"] if b["internal_api"] == "openblas"]
    if not openblas:
        bad.append("OpenBLAS: no OpenBLAS loaded (threadpoolctl), so OPENBLAS_CORETYPE cannot be checked")
    for b in openblas:
        if str(b["architecture"]).lower() != forced["OPENBLAS_CORETYPE"].lower():
            want = forced["OPENBLAS_CORETYPE"]
            bad.append(f"OpenBLAS {b['version']}: OPENBLAS_CORETYPE={want} but core {b['architecture']}")
    still = set(forced["NPY_DISABLE_CPU_FEATURES"].split()) & set(got["numpy_simd"]["enabled"])
    if still:
        bad.append(f"numpy: NPY_DISABLE_CPU_FEATURES did not disable {sorted(still)}")
    if forced.get("FBGEMM_ENABLE_INSTRUCTIONS") == "AVX2" and got["fbgemm_saturates"] is False:
        bad.append("fbgemm: FBGEMM_ENABLE_INSTRUCTIONS=AVX2 but its int8 linear does not saturate (VNNI kernels still)")
    level = forced["TINYLEARN_CPU_FEATURES"]
    feats = set(got["tinylearn_features"])
    if got["tinylearn_forced"] != level:
        bad.append(f"tinylearn: forced level reported as {got['tinylearn_forced']!r}, expected {level!r}")
    if level == "scalar" and (feats or set(got["tinylearn_kernels"].values()) != {"scalar"}):
        bad.append(f"tinylearn: scalar forced but features {sorted(feats)}, kernels {got['tinylearn_kernels']}")
    if level == "avx2" and (
        any(f.startswith("avx512") or f == "avxvnni" for f in feats)
        or any("512" in p for p in got["tinylearn_kernels"].values())
    ):
        bad.append(f"tinylearn: avx2 forced but features {sorted(feats)}, kernels {got['tinylearn_kernels']}")
    return [f"[{name}] {b}" for b in bad]


def effective(r: dict) -> tuple:
    return (
        r["torch_capability"],
        tuple(sorted(str(b["architecture"]) for b in r["blas"])),
        tuple(r["numpy_simd"]["enabled"]),
        tuple(r["tinylearn_features"]),
        tuple(sorted(r["tinylearn_kernels"].items())),
        r["fbgemm_saturates"],
    )


def show(name: str, r: dict) -> None:
    blas = ", ".join(f"{b['internal_api']} {b['version']} core={b['architecture']}" for b in r["blas"]) or "none"
    print(f"  [{name}] torch capability : {r['torch_capability']}")
    print(f"  [{name}] BLAS             : {blas}")
    print(f"  [{name}] numpy dispatch   : {', '.join(r['numpy_simd']['dispatch']) or 'baseline only'}")
    forced = r["tinylearn_forced"] or "not forced"
    print(f"  [{name}] tinylearn        : {forced}; features {' '.join(r['tinylearn_features']) or '(none)'}")
    print(f"  [{name}] tinylearn kernels: {r['tinylearn_kernels']}")
    print(f"  [{name}] fbgemm int8 sat. : {r['fbgemm_saturates']} (True: AVX2-style int16 pair sums)", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", nargs="*", help="runs to do (default: all)")
    ap.add_argument("--suites", nargs="*", default=list(SUITES), choices=list(SUITES))
    ap.add_argument("--report-only", action="store_true", help="print and verify the paths, run no tests")
    ap.add_argument("--no-skip", action="store_true", help="run suites even when the paths equal the default ones")
    ap.add_argument(
        "--notebooks-via",
        choices=("auto", "lab", "nbval"),
        default="auto",
        help="the first run's notebooks: JupyterLab + nbval comparison (lab), nbval, or lab when a browser exists",
    )
    args = ap.parse_args(argv)

    base = clean_env()
    default = child_report(base)
    print("portable: default numeric paths of this CPU")
    show("default", default)
    runs = runs_for(default)
    unknown = set(args.runs or ()) - set(runs)
    if unknown:
        print(f"portable: unknown or inapplicable run(s) {sorted(unknown)}; known here: {list(runs)}", file=sys.stderr)
        return 2
    failed: list[str] = []
    via_lab = args.notebooks_via == "lab" or (args.notebooks_via == "auto" and lab_available())
    for name in args.runs or list(runs):
        forced = runs[name]
        env = {**base, **forced}
        print(f"\nportable: run {name}: " + " ".join(f"{k}={v!r}" for k, v in forced.items()))
        got = child_report(env)
        show(name, got)
        bad = verify(name, forced, got)
        if bad:
            print("\n".join(f"portable: FAILED override {b}" for b in bad), file=sys.stderr)
            failed += bad
            continue
        print(f"  [{name}] every override took effect")
        if effective(got) == effective(default) and not args.no_skip:
            print(f"  [{name}] same effective paths as the default run (`make test`) on this CPU: suites skipped")
            continue
        if args.report_only:
            continue
        for suite in args.suites:
            t0 = time.perf_counter()
            cmd = SUITES[suite]
            if suite == "notebooks" and via_lab:
                print(f"portable: [{name}] notebooks run in JupyterLab (headless Chromium), compared by nbval's rules")
                cmd, via_lab = LAB, False  # later runs use nbval
            run_env = env
            if suite == "tests" and WORKERS != "0":  # one thread per xdist worker, as make test-tests does
                run_env = {**env, "OMP_NUM_THREADS": "1"}
            p = subprocess.run([sys.executable, *cmd], env=run_env, cwd=ROOT)
            status = "passed" if p.returncode == 0 else f"FAILED (exit {p.returncode})"
            print(f"portable: [{name}] {suite} {status} in {time.perf_counter() - t0:.0f} s", flush=True)
            if p.returncode:
                failed.append(f"[{name}] {suite}")
    if failed:
        print("\nportable: failures: " + "; ".join(failed), file=sys.stderr)
        return 1
    print("\nportable: all runs green")
    return 0


if __name__ == "__main__":
    sys.exit(main())
