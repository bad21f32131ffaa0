"""Command line: ``tinylearn bench|check|info`` (also ``python -m tinylearn ...``).

tinylearn bench [TOPIC ...] [--json PATH] [--plot DIR] [--full] [--size N]   side-by-side benchmark tables
tinylearn bench [TOPIC ...] --record                      ... and save them as benchmarks/<cpu>/<date>_<topics>.json
tinylearn bench [TOPIC ...] --compare SAVED.json [--current NOW.json]   ratios to a saved record (regressions)
tinylearn check TOPIC [--impl=reference] [--folder DIR]   run your exercises for one topic
tinylearn exercises copy DIR                              the exercise folders, for a pip-installed tinylearn
tinylearn info                                            versions, CPU numeric paths, devices, compilers

TOPIC is any of a topic's names (tinylearn.topics.get): quant, 03_quantization, 03, autodiff, autograd, matmul ...
TINYLEARN_CPU_FEATURES=scalar|avx2|avx512 forces the C++ kernels' SIMD level (``tinylearn info`` shows it).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any


def _resolve_topics(names: list[str], cmd: str) -> list[str] | None:
    """Short topic names for any of their names (``quant``, ``03_quantization``, ``autodiff``, ``matmul``)."""
    from tinylearn import topics

    out, unknown = [], []
    for n in names:
        try:
            t = topics.get(n)
        except ValueError:
            unknown.append(n)
            continue
        if cmd == "bench" and t.bench is None:
            unknown.append(n)
        elif cmd == "check" and t.exercises is None:
            unknown.append(n)
        else:
            out.append(t.name)
    if unknown:
        if cmd == "bench":
            rows = [t for t in topics.all_topics() if t.bench]
        else:
            rows = [t for t in topics.all_topics() if t.exercises]
        known = ", ".join(f"{'/'.join((t.name, *t.aliases))} ({t.notebook})" for t in rows)
        print(f"tinylearn {cmd}: unknown topic(s) {', '.join(unknown)}; known topics: {known}", file=sys.stderr)
        return None
    return out


def _positive_int(text: str) -> int:
    """argparse type of --size: a positive integer (``--size 0`` used to run every benchmark with an empty size)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {n}")
    return n


def _check_output_paths(args: argparse.Namespace) -> str | None:
    """Fail before minutes of benchmarking when --json/--plot cannot be written."""
    for flag in ("--json", "--plot", "--compare", "--current"):
        if getattr(args, flag[2:]) == "":
            return f"{flag}: empty path"
    for flag, path in (("--compare", args.compare), ("--current", args.current)):
        if path is not None:
            from tinylearn.bench.record import load_record

            try:
                load_record(path)
            except ValueError as e:
                return str(e).replace("--compare", flag, 1)
    if args.current is not None and args.compare is None:
        return "--current: only makes sense with --compare SAVED.json"
    if args.json:
        if Path(args.json).is_dir():
            return f"--json: {args.json} is a folder; give a file path such as {Path(args.json) / 'bench.json'}"
        parent = Path(args.json).resolve().parent
        if not parent.is_dir():
            return f"--json: folder {parent} does not exist (for {args.json})"
        if not os.access(parent, os.W_OK):
            return f"--json: folder {parent} is not writable (for {args.json})"
    if args.plot:
        out = Path(args.plot)
        if out.exists() and not out.is_dir():
            return f"--plot: {out} is a file; give a folder"
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            return f"--plot: cannot create {out}: {e.strerror} (in {out.parent})"
        if not os.access(out, os.W_OK):
            return f"--plot: folder {out} is not writable"
    return None


def _run_bench_topic(topic: str, full: bool, size: int | None, progress: Any) -> list[Any]:
    import inspect

    from tinylearn import topics
    from tinylearn.bench import Table

    mod = importlib.import_module(topics.get(topic).bench)
    kw: dict[str, Any] = {"full": full, "progress": progress}
    if size is not None:
        if "sizes" not in inspect.signature(mod.run).parameters:
            raise ValueError(f"--size: the {topic} benchmark has no size parameter")
        kw["sizes"] = [size]
    tables = mod.run(**kw)
    return [tables] if isinstance(tables, Table) else list(tables)


def _cmd_bench(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from tinylearn.bench import available_topics, plot_table

    topics = _resolve_topics(args.topics, "bench")
    if topics is None:
        return 2
    bad = _check_output_paths(args)
    if bad:
        print(f"tinylearn bench: {bad}", file=sys.stderr)
        return 2
    if args.current is not None:
        return _print_compare(args.compare, args.current, topics)
    if args.compare is not None and not topics:
        from tinylearn.bench.record import load_record

        saved_topics = dict.fromkeys(t.get("topic", "") for t in load_record(args.compare)["tables"])
        topics = [t for t in saved_topics if t in available_topics()]
    topics = topics or available_topics()
    all_tables = []
    for topic in topics:
        bar = tqdm(desc=f"bench {topic}", unit=" rows", file=sys.stderr, leave=False, disable=not sys.stderr.isatty())
        try:

            def progress(msg: str, bar: tqdm = bar) -> None:
                bar.set_postfix_str(msg[:40])
                bar.update()

            tables = _run_bench_topic(topic, args.full, args.size, progress)
        except ModuleNotFoundError as e:
            bar.close()
            print(f"[{topic}] not available: {e}", file=sys.stderr)
            continue
        except ValueError as e:
            bar.close()
            print(f"tinylearn bench: {e}", file=sys.stderr)
            return 2
        bar.close()
        for t in tables:
            print(t.to_text(), "\n", flush=True)
            all_tables.append((topic, t))
            if args.plot:
                import matplotlib

                matplotlib.use("Agg")
                out = Path(args.plot)
                safe = "".join(ch if ch.isalnum() else "_" for ch in t.title)[:60]
                ax = plot_table(t, path=str(out / f"{topic}_{safe}.png"))
                import matplotlib.pyplot as plt

                plt.close(ax.figure)
    if args.json or args.record or args.compare:
        from tinylearn.bench.record import default_record_path, make_record

        rec = make_record(all_tables)
        paths = [Path(args.json)] if args.json else []
        if args.record:
            paths.append(default_record_path(topics if args.topics else []))
        for p in paths:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(json.dumps(rec, indent=1) + "\n")
            print(f"wrote {p}", file=sys.stderr)
        if args.compare:
            return _print_compare(args.compare, rec, topics)
    return 0


def _print_compare(saved_path: str, now: str | dict[str, Any], topics: list[str]) -> int:
    """Print now/saved ratios for the rows of the given topics (all topics when none were named)."""
    from tinylearn.bench.record import compare, load_record

    saved = load_record(saved_path)
    cur = load_record(now) if isinstance(now, str) else now
    if topics:
        saved = {**saved, "tables": [t for t in saved["tables"] if t.get("topic") in topics]}
        cur = {**cur, "tables": [t for t in cur["tables"] if t.get("topic") in topics]}
    table = compare(saved, cur)
    print(table.to_text(), flush=True)
    if not table.rows:
        print(f"tinylearn bench --compare: no row of {saved_path} matches the current run", file=sys.stderr)
        return 1
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from tinylearn.exercise_check import check

    names = _resolve_topics([args.topic], "check")
    if names is None:
        return 2
    try:
        res = check(names[0], impl=args.impl, folder=args.folder)
    except (ValueError, TimeoutError) as e:
        print(f"tinylearn check: {e}", file=sys.stderr)
        return 2
    print(res)
    if res.ok:
        print("  all exercises solved." if args.impl == "stub" else "  tinylearn's reference answers pass.")
    else:
        print(f"  details: cd {res.folder.parent} && {Path(sys.executable).name} -m pytest {res.folder.name} -x")
    return 0 if res.ok else 1


def _cmd_exercises(args: argparse.Namespace) -> int:
    """tinylearn exercises copy DIR: the exercise folders (+ their conftest.py) for a pip-installed tinylearn."""
    import shutil

    from tinylearn._resources import exercises_dir

    src = exercises_dir()
    if not args.dir.strip():
        print("tinylearn exercises copy: DIR is empty; name a folder (use . for the current one)", file=sys.stderr)
        return 2
    dest = Path(args.dir)
    if dest.exists() and not dest.is_dir():
        print(f"tinylearn exercises copy: {dest} is a file, not a folder; pick another DIR", file=sys.stderr)
        return 2
    items = [p for p in sorted(src.iterdir()) if p.name != "__pycache__" and not p.name.startswith(".")]
    clash = [dest / p.name for p in items if (dest / p.name).exists()]
    if clash and not args.force:
        print(
            f"tinylearn exercises copy: {clash[0]} exists (your work?); pick another DIR or pass --force to overwrite",
            file=sys.stderr,
        )
        return 2
    dest.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", ".pytest_cache", "*.pyc")
    for p in items:
        if p.is_dir():
            shutil.copytree(p, dest / p.name, ignore=ignore, dirs_exist_ok=True)
        else:
            shutil.copy2(p, dest / p.name)
    folders = [p.name for p in items if p.is_dir()]
    print(f"copied {len(folders)} exercise folders from {src} to {dest}: {', '.join(folders)}")
    print(f"next: cd {dest} && tinylearn check {folders[0] if folders else 'TOPIC'}   (edit NN_topic/stubs.py)")
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    import importlib.metadata as md
    import platform

    from tinylearn.backends import clang_available, cuda_available, load_C, mpi_available, nvcc_available

    print(f"python     {platform.python_version()} ({sys.executable})")
    for pkg in ("tinylearn", "numpy", "torch", "tinygrad", "numba", "triton", "scikit-learn", "cupy-cuda12x", "mpi4py"):
        try:
            print(f"{pkg:<10} {md.version(pkg)}")
        except md.PackageNotFoundError:
            print(f"{pkg:<10} not installed")
    try:
        _C = load_C()
    except RuntimeError as e:
        print(f"_C         not built ({e.__cause__ or e})")
    else:
        from tinylearn import cpu

        print(f"_C         built; OpenMP={_C.openmp} threads={_C.omp_max_threads()} submodules={list(_C.submodules)}")
        try:
            forced = cpu.forced()
            print(f"cpu        {os.cpu_count()} cores; detected: {' '.join(cpu.detected_features()) or '(none)'}")
            how = f"forced by TINYLEARN_CPU_FEATURES={forced}" if forced else "as detected"
            print(f"tinylearn  features used: {' '.join(cpu.cpu_features()) or '(none: scalar)'} ({how})")
            for kernel, path in cpu.kernel_paths().items():
                print(f"  kernel   {kernel}: {path} path")
        except ValueError as e:
            print(f"cpu        {e}")
    try:
        from tinylearn import cpu

        aten = os.environ.get("ATEN_CPU_CAPABILITY", "unset")
        print(f"torch CPU  capability {cpu.torch_capability()} (ATEN_CPU_CAPABILITY={aten})")
        for b in cpu.blas_info():
            print(
                f"BLAS       {b['internal_api']} {b['version']}: core type {b['architecture']}, "
                f"{b['num_threads']} threads ({Path(str(b['filepath'])).name})"
            )
        print(f"BLAS spin  workers busy-wait {cpu.blas_thread_timeout()} after a call")
        print(f"OMP spin   {cpu.omp_spin_count()}")
        print(f"malloc     {cpu.malloc_settings()}")
        simd = cpu.numpy_simd()
        print(f"numpy SIMD dispatch targets: {' '.join(simd['dispatch']) or 'baseline only'}")
    except ImportError as e:
        print(f"numeric paths unavailable ({e})")
    print(f"clang      {'yes' if clang_available() else 'no (tinygrad CPU device unavailable: apt-get install clang)'}")
    print(f"nvcc       {'yes' if nvcc_available() else 'no'}")
    print(f"CUDA GPU   {'yes' if cuda_available() else 'no'}")
    print(f"MPI        {'yes' if mpi_available() else 'no'}")
    try:
        from tinylearn._resources import cuda_dir, exercises_dir

        print(f"resources  cuda sources {cuda_dir()}; exercises {exercises_dir()}")
    except FileNotFoundError as e:
        print(f"resources  {e}")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from tinylearn.serve.server import run_server

    kw = {k: getattr(args, k) for k in ("max_num_seqs", "max_num_batched_tokens", "block_size", "num_blocks")}
    kw.update(policy=args.policy, preemption=args.preemption, enable_prefix_caching=not args.no_prefix_caching)
    kw.update(kv_budget_blocks=args.kv_budget_blocks, kv_dtype=args.kv_dtype)
    try:
        run_server(
            args.model,
            host=args.host,
            port=args.port,
            allow_remote=args.allow_remote,
            seed=args.seed,
            max_waiting=args.max_waiting,
            drain_timeout_s=args.drain_timeout,
            log_level=args.log_level,
            **kw,
        )
    except (ValueError, TypeError) as e:
        print(f"tinylearn serve: {e}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="tinylearn", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench", help="run benchmark tables (tinylearn vs torch vs tinygrad)")
    b.add_argument("topics", nargs="*", help="topics (default: every available one)")
    b.add_argument("--json", metavar="PATH", help="also write the tables as JSON")
    b.add_argument("--plot", metavar="DIR", help="also write one bar plot per table into DIR")
    b.add_argument("--full", action="store_true", help="full problem sizes (slow)")
    b.add_argument(
        "--size", type=_positive_int, metavar="N", help="one small problem size (topics whose run() takes sizes)"
    )
    b.add_argument("--record", action="store_true", help="also save benchmarks/<cpu>/<date>_<topics>.json")
    b.add_argument("--compare", metavar="SAVED", help="print the ratio of each row to a saved record (--json output)")
    b.add_argument("--current", metavar="NOW", help="with --compare: compare this saved record instead of running")
    c = sub.add_parser("check", help="run the exercise tests for one topic")
    c.add_argument("topic", help="any of the topic's names, e.g. 01_autodiff, autodiff, quant, 03_quantization")
    c.add_argument("--impl", default="stub", choices=("stub", "reference"))
    c.add_argument("--folder", help="the NN_topic exercise folder (default: ./NN_topic, ./exercises/NN_topic, ...)")
    e = sub.add_parser("exercises", help="copy the exercise folders (for a pip-installed tinylearn)")
    esub = e.add_subparsers(dest="action", required=True)
    cp = esub.add_parser("copy", help="copy every NN_topic/ exercise folder and its conftest.py into DIR")
    cp.add_argument("dir", metavar="DIR")
    cp.add_argument("--force", action="store_true", help="overwrite existing files in DIR")
    sub.add_parser("info", help="versions, CPU numeric paths, devices and compilers")
    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server on TinyGPT (FastAPI + uvicorn, loopback only)")
    s.add_argument("--model", default="tiny", help="'tiny' (random-init TinyGPT, seeded) or a save_model .safetensors")
    s.add_argument("--seed", type=int, default=0, help="seed of the tiny model's weights")
    s.add_argument("--host", default="127.0.0.1", help="loopback address to bind (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--allow-remote", action="store_true", help="allow a non-loopback --host (no auth, no TLS!)")
    s.add_argument("--max-waiting", type=_positive_int, default=64, help="bounded queue: beyond it answer 429")
    s.add_argument("--max-num-seqs", type=_positive_int, default=32)
    s.add_argument("--max-num-batched-tokens", type=_positive_int, default=256)
    s.add_argument("--block-size", type=_positive_int, default=16)
    s.add_argument("--num-blocks", type=_positive_int, default=None)
    s.add_argument("--policy", default="fcfs")
    s.add_argument("--preemption", default="recompute", choices=("recompute", "swap"))
    s.add_argument("--no-prefix-caching", action="store_true")
    s.add_argument("--kv-budget-blocks", type=_positive_int, default=None,
                   help="admit a request only if its worst-case KV blocks fit this budget (else 429)")  # fmt: skip
    s.add_argument("--kv-dtype", default="float32", choices=("float32", "int8", "fp8_e4m3"), help="KV block storage")
    s.add_argument("--drain-timeout", type=float, default=30.0, help="seconds SIGTERM waits for in-flight requests")
    s.add_argument("--log-level", default="info")
    args = ap.parse_args(argv)
    cmds = {"bench": _cmd_bench, "check": _cmd_check, "exercises": _cmd_exercises, "info": _cmd_info}
    cmds["serve"] = _cmd_serve
    try:
        return cmds[args.cmd](args)
    except OSError as e:  # a path that is a folder where a file is expected (or the reverse), unwritable, ...
        where = f" {e.filename!r}" if e.filename else ""
        print(f"tinylearn {args.cmd}: {e.strerror or e}{where}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
