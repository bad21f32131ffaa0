"""The foundation: op-test harness, benchmark harness, CLI, compiled extension, packaging files."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tomllib

import tinylearn
import tinylearn.topics
from tinylearn import backends
from tinylearn.bench import Comparison, Table, measure
from tinylearn.bench.table import Row
from tinylearn.testing import assert_close, broadcast_shape_pairs, make_array, make_layouts, tolerance

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- tolerance table / assert_close
def test_tolerance_table_matches_design():
    assert tolerance("float64") == (1e-10, 1e-7)
    assert tolerance("float32") == (1e-5, 1e-4)
    assert tolerance(np.float16) == (1e-3, 1e-3)
    assert tolerance("bfloat16") == (1e-2, 1e-2)
    assert tolerance("float32", reduction_size=4096) == (1e-4, 1e-3)
    assert tolerance("int8") == (0.0, 0.0)


def test_assert_close_passes_within_and_fails_outside_tolerance():
    e = np.linspace(-3, 3, 101).astype(np.float32)
    assert_close(e + 5e-6, e)  # inside atol + rtol*|e|
    with pytest.raises(AssertionError, match=r"max abs err .* worst at \(\d+,\)"):
        assert_close(e + 1e-3, e)


def test_assert_close_torch_dtypes_and_exact_integers():
    torch = pytest.importorskip("torch")
    x = torch.randn(4, 5, dtype=torch.bfloat16)
    assert_close(x.float() + 1e-3, x)  # bf16 tolerance picked from expected's dtype
    assert_close(np.arange(5, dtype=np.int8), torch.arange(5, dtype=torch.int8))
    with pytest.raises(AssertionError, match="integer mismatches"):
        assert_close(np.array([1, 2, 4], np.int32), np.array([1, 2, 3], np.int32))


def test_assert_close_nan_inf_and_shape():
    a = np.array([1.0, np.nan, np.inf], np.float32)
    assert_close(a.copy(), a)
    with pytest.raises(AssertionError, match="NaN mismatch"):
        assert_close(np.array([1.0, 0.0, np.inf], np.float32), a)
    with pytest.raises(AssertionError, match="inf mismatch"):
        assert_close(np.array([1.0, np.nan, -np.inf], np.float32), a)
    with pytest.raises(AssertionError, match="shape mismatch"):
        assert_close(np.zeros((2, 3)), np.zeros((3, 2)))


def test_harness_rejects_bad_arguments():
    with pytest.raises(ValueError, match="dtype"):
        assert_close(np.zeros(2), np.zeros(2), dtype="float128x")
    with pytest.raises(ValueError, match="layout"):
        make_array((2, 2), layout="diagonal")
    with pytest.raises(ValueError, match="shape"):
        make_array((2, -1))


def test_layouts_are_really_non_contiguous():
    seen = dict(make_layouts((3, 4)))
    assert set(seen) == {"contiguous", "fortran", "strided", "reversed", "broadcast"}
    assert all(a.shape == (3, 4) for a in seen.values())
    assert seen["contiguous"].flags.c_contiguous
    assert not seen["fortran"].flags.c_contiguous
    assert not seen["strided"].flags.c_contiguous and not seen["strided"].flags.f_contiguous
    assert seen["reversed"].strides[0] < 0
    assert 0 in seen["broadcast"].strides


def test_broadcast_pairs_broadcast():
    for a, b in broadcast_shape_pairs(n=50):
        np.broadcast_shapes(a, b)


# ---------------------------------------------------------------- bench harness
def test_measure_reports_median_of_repeats():
    calls = []
    t = measure(lambda: calls.append(1), warmup=2, repeat=5)
    assert t.min <= t.median <= t.max and len(t.times) == 5
    assert len(calls) >= 2 + 1 + 5
    with pytest.raises(ValueError, match="repeat"):
        measure(lambda: None, repeat=0)
    with pytest.raises(TypeError, match="fn"):
        measure(42)


def test_measure_warms_up_for_warmup_s_seconds():
    """Warm-up calls go on until warmup_s has passed (a fast kernel reaches its steady state before it is timed);
    warmup=0 turns the warm-up off whatever warmup_s says."""
    stamps: list[float] = []
    t = measure(lambda: stamps.append(time.perf_counter()), warmup=2, repeat=3, min_call_s=0.0, warmup_s=0.05)
    n_timed = 1 + 3 * t.inner  # the sizing call + the timed samples
    warm = stamps[: len(stamps) - n_timed]
    # warm[0] is stamped inside the first call, a little after measure() started its clock
    assert len(warm) > 2 and stamps[len(warm)] - warm[0] >= 0.045
    calls: list[int] = []
    measure(lambda: calls.append(1), warmup=0, repeat=3, min_call_s=0.0, warmup_s=10.0)
    assert len(calls) == 1 + 3


def test_comparison_ratios_and_unavailable_rows():
    cmp = Comparison("t", baseline="torch", repeat=3)
    with cmp.case("small", flops=1e6) as c:
        c.add("torch", lambda: sum(range(2000)))
        c.add("slow", lambda: sum(range(20000)))
        c.add("broken", lambda: 1 / 0)
        c.unavailable("gpu", "no CUDA device")
    tab = cmp.table
    assert tab.get("small", "torch").ratio == pytest.approx(1.0)
    assert tab.get("small", "slow").ratio > 1.0
    assert tab.get("small", "broken").median_ms is None and "ZeroDivisionError" in tab.get("small", "broken").note
    assert tab.get("small", "gpu").note == "n/a: no CUDA device"
    text = tab.to_text()
    assert "x torch" in text and "GFLOP/s" in text and "n/a" in text
    assert json.loads(tab.to_json())["rows"][0]["impl"] == "torch"
    assert tab.to_markdown().count("|") > 10


def test_tinygrad_column_says_why_without_clang(monkeypatch):
    import tinylearn.bench.comparators as comp

    monkeypatch.setattr(comp, "clang_available", lambda: False)
    cmp = Comparison("t", repeat=3)
    with cmp.case("c") as c:
        row = c.add_tinygrad("tinygrad", lambda tg: lambda: None)
    assert row.median_ms is None and row.note == "n/a: clang not found"


def test_plot_table_draws_bars(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    tab = Table("demo", rows=[Row("a", "torch", 1.0), Row("a", "x", 2.0), Row("b", "torch", 3.0), Row("b", "x", None)])
    tab.compute_ratios()
    ax = tinylearn.bench.plot_table(tab, path=str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").stat().st_size > 1000
    assert len(ax.patches) == 4


def test_cli_unknown_topic_lists_known_ones():
    p = subprocess.run([sys.executable, "-m", "tinylearn", "bench", "no_such_topic"], capture_output=True, text=True)
    assert p.returncode != 0
    assert "no_such_topic" in p.stderr and "quant" in p.stderr and "conv" in p.stderr


def test_cli_info_runs():
    p = subprocess.run([sys.executable, "-m", "tinylearn", "info"], capture_output=True, text=True)
    assert p.returncode == 0 and "torch" in p.stdout and "_C" in p.stdout


def test_matmul_benchmark_has_all_columns():
    from tinylearn.bench import matmul

    (tab,) = matmul.run(sizes=[64])
    impls = tab.impls()
    assert {"numpy", "torch", "tinygrad", "C++ ikj loop", "C++ naive ijk"} <= set(impls)
    assert (
        all(r.median_ms is not None for r in tab.rows if r.impl != "tinygrad") and tab.get("n=64", "torch").ratio == 1
    )


# ---------------------------------------------------------------- packaging
def _norm(name: str) -> str:
    return re.split(r"[<>=!~\[ ;]", name.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_lists_the_pyproject_packages():
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_norm(d) for d in proj["dependencies"]}
    for extra, deps in proj["optional-dependencies"].items():
        if extra != "gpu":  # conda users add cupy on a GPU machine (said in environment.yml)
            wanted |= {_norm(d) for d in deps}
    env_lines = (ROOT / "environment.yml").read_text().splitlines()
    listed = {_norm(ln.split("#")[0].strip()[2:]) for ln in env_lines if ln.strip().startswith("- ")}
    listed = {n.split("=")[0] for n in listed}
    missing = wanted - listed
    assert not missing, f"environment.yml lacks {sorted(missing)}"
    assert {"python", "clang", "openmpi"} <= listed


def test_constraints_pin_exact_versions_of_every_dependency():
    pins = {}
    for ln in (ROOT / "constraints.txt").read_text().splitlines():
        if ln and not ln.startswith("#"):
            name, _, ver = ln.partition("==")
            pins[_norm(name)] = ver
    assert pins["torch"] == "2.13.0" and pins["tinygrad"] == "0.14.0"
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = list(proj["dependencies"]) + [d for k, v in proj["optional-dependencies"].items() if k != "gpu" for d in v]
    assert not [d for d in deps if _norm(d) not in pins]


# ---------------------------------------------------------------- notebooks and exercises are in order
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_executed_with_a_plot_and_no_errors(nb):
    cells = json.loads(nb.read_text())["cells"]
    code = [c for c in cells if c["cell_type"] == "code" and "".join(c["source"]).strip()]
    assert code, f"{nb.name} has no code"
    assert all(c.get("execution_count") is not None for c in code), f"{nb.name}: unexecuted cells"
    assert not [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert any("image/png" in o.get("data", {}) for c in code for o in c.get("outputs", [])), f"{nb.name}: no plot"
    assert cells[0]["cell_type"] == "markdown" and "question" in "".join(cells[0]["source"]).lower()
    src = nb.parent / "src" / (nb.stem + ".py")
    assert src.is_file(), f"{nb.name} has no source {src}"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_cells_equal_their_source(nb):
    """The committed .ipynb (what nbval runs) holds exactly the cells of notebooks/src (what is reviewed)."""
    spec = importlib.util.spec_from_file_location("tl_nb_tool_sync", ROOT / "tools" / "nb.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.out_of_sync(nb.parent / "src" / (nb.stem + ".py")) == []


EXERCISES = sorted(p for p in (ROOT / "exercises").iterdir() if p.is_dir() and p.name[:2].isdigit())


def test_exercise_stubs_are_unsolved():
    """Every exercise test must fail on the untouched stubs (and CI runs --impl=reference, where they pass). One
    pytest child for all folders (an interpreter start with torch per folder cost more than the tests), its -rA
    summary counted per folder: each folder has failures and no passes."""
    for folder in EXERCISES:
        assert (folder / "stubs.py").is_file() and (folder / "reference.py").is_file(), folder.name
        assert "NotImplementedError" in (folder / "stubs.py").read_text(), folder.name
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "exercises/", "-q", "-p", "no:cacheprovider", "--impl=stub", "--tb=no", "-rA"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert p.returncode == 1, f"expected failures on the stubs, got exit {p.returncode}: {p.stdout[-2000:]}{p.stderr}"
    counts: dict[str, dict[str, int]] = {f.name: {"PASSED": 0, "FAILED": 0, "ERROR": 0} for f in EXERCISES}
    for line in p.stdout.splitlines():
        m = re.match(r"(PASSED|FAILED|ERROR|XPASS) exercises/([^/]+)/", line)
        if m and m.group(2) in counts:
            kind = "PASSED" if m.group(1) == "XPASS" else m.group(1)
            counts[m.group(2)][kind] += 1
    passing = {k: c["PASSED"] for k, c in counts.items() if c["PASSED"]}
    assert not passing, f"tests pass on the untouched stubs: {passing}"
    unfailed = [k for k, c in counts.items() if c["FAILED"] + c["ERROR"] == 0]
    assert not unfailed, f"no test fails on these folders' stubs: {unfailed}\n{p.stdout[-2000:]}"


def test_library_has_no_stubs():
    # a stub raises it; naming the exception (e.g. tinylearn check counting unsolved stubs) is fine
    hits = [str(p) for p in (ROOT / "tinylearn").rglob("*.py") if "raise NotImplementedError" in p.read_text()]
    assert not hits, f"NotImplementedError in the library: {hits}"


# ---------------------------------------------------------------- module size and test coverage
MAX_LINES = 500
REASON = "Why one file"


def test_no_module_over_500_lines_without_a_reason():
    """Small files named for what they hold: a Python module or C++ source over 500 lines says why it is one file
    (a line starting 'Why one file' in its docstring / leading comment)."""
    long = []
    for p in sorted((ROOT / "tinylearn").rglob("*.py")):
        text = p.read_text()
        if text.count("\n") > MAX_LINES and REASON not in (ast.get_docstring(ast.parse(text)) or ""):
            long.append(str(p.relative_to(ROOT)))
    for p in sorted((ROOT / "cpp_src").rglob("*")):
        if p.suffix in (".cpp", ".h", ".inc") and p.read_text().count("\n") > MAX_LINES:
            head = "\n".join(p.read_text().splitlines()[:60])
            if REASON not in head:
                long.append(str(p.relative_to(ROOT)))
    assert not long, f"over {MAX_LINES} lines without a '{REASON}' reason: {long}"


def _public_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {path.stem}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name) and t.id.isupper()}
    return names


def test_every_library_module_is_tested_or_exempt_with_a_reason():
    """Each tinylearn module has a test or exercise that names it or one of its public names; the rest are listed
    in topics.INDIRECTLY_TESTED with the tests that exercise them."""
    text = "\n".join(p.read_text() for d in ("tests", "exercises") for p in (ROOT / d).rglob("*.py"))
    words = set(re.findall(r"\b\w+\b", text))
    untested = []
    for p in sorted((ROOT / "tinylearn").rglob("*.py")):
        if p.name == "__init__.py" or "__pycache__" in p.parts:
            continue
        dotted = ".".join(p.relative_to(ROOT).with_suffix("").parts)
        if dotted not in tinylearn.topics.INDIRECTLY_TESTED and not (_public_names(p) & words):
            untested.append(dotted)
    assert not untested, f"modules no test names (test them, or add to topics.INDIRECTLY_TESTED): {untested}"
    stale = [m for m in tinylearn.topics.INDIRECTLY_TESTED if not (ROOT / (m.replace(".", "/") + ".py")).is_file()]
    assert not stale, f"topics.INDIRECTLY_TESTED lists modules that do not exist: {stale}"


# ---------------------------------------------------------------- the topic table (tinylearn.topics)
TOPIC_ROWS = tinylearn.topics.all_topics()


@pytest.mark.parametrize("t", TOPIC_ROWS, ids=[t.name for t in TOPIC_ROWS])
def test_topic_row_lists_files_that_exist(t):
    """Every file a row names exists: notebook (+ source), exercise folder, test modules, bench module, packages,
    C++/CUDA sources (globs must match)."""
    assert (ROOT / "notebooks" / "src" / f"{t.notebook}.py").is_file(), f"{t.name}: no notebook source"
    assert (ROOT / "notebooks" / f"{t.notebook}.ipynb").is_file(), f"{t.name}: no notebook"
    if t.exercises is not None:
        folder = ROOT / "exercises" / t.exercises
        for f in ("stubs.py", "reference.py", f"test_{t.exercises}.py"):
            assert (folder / f).is_file(), f"{t.name}: exercises/{t.exercises}/{f} missing"
    assert t.tests, f"{t.name}: no test modules"
    for path in t.test_paths():
        assert (ROOT / path).is_file(), f"{t.name}: {path} missing"
    assert t.bench is not None, f"{t.name}: no benchmark module"
    assert callable(importlib.import_module(t.bench).run)
    for pkg in t.packages:
        assert (ROOT / "tinylearn" / pkg / "__init__.py").is_file(), f"{t.name}: package tinylearn/{pkg} missing"
    for folder, globs in (("cpp_src", t.cpp), ("cuda_src", t.cuda)):
        for g in globs:
            assert list((ROOT / folder).glob(g)), f"{t.name}: {folder}/{g} matches no file"


def test_every_test_file_belongs_to_a_topic_row_or_is_a_named_common_suite():
    """tests/<topic>/test_*.py for every module of a row; tests/common/ holds exactly the COMMON_TESTS (each with
    its reason); nothing else under tests/."""
    listed = {path for t in TOPIC_ROWS for path in t.test_paths()}
    listed |= {f"tests/common/{m}.py" for m in tinylearn.topics.COMMON_TESTS}
    found = {str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")}
    assert found == listed, (
        f"not in the topic table: {sorted(found - listed)}; listed but absent: {sorted(listed - found)}"
    )
    assert all(why.strip() for why in tinylearn.topics.COMMON_TESTS.values())


def test_topic_names_resolve_uniquely_and_every_topic_folder_has_a_row():
    names = [n for t in TOPIC_ROWS for n in t.names()]
    assert len(names) == len(set(names)), "a name is used by two topics"
    for t in TOPIC_ROWS:
        assert all(tinylearn.topics.get(n) is t for n in t.names())
    assert tinylearn.topics.get("03_quantization.ipynb").name == "quant"
    with pytest.raises(ValueError, match="known topics"):
        tinylearn.topics.get("no_such_topic")
    notebooks = {p.stem for p in (ROOT / "notebooks" / "src").glob("[0-9][0-9]_*.py")}
    exercises = {p.name for p in (ROOT / "exercises").iterdir() if p.is_dir() and p.name[:2].isdigit()}
    assert notebooks <= {t.notebook for t in TOPIC_ROWS}, "a notebook without a topic row"
    assert exercises <= {t.exercises for t in TOPIC_ROWS}, "an exercise folder without a topic row"


def test_bench_registry_comes_from_the_topic_table():
    from tinylearn.bench import TOPICS, available_topics

    assert list(TOPICS) == [t.name for t in TOPIC_ROWS if t.bench]
    for t in TOPIC_ROWS:
        for n in t.names():
            assert n in TOPICS and TOPICS[n] == t.bench
    assert "no_such_topic" not in TOPICS
    assert set(available_topics()) <= set(TOPICS)
    with pytest.raises(ValueError, match="known"):
        tinylearn.bench.run_topic("no_such_topic")


def test_readme_curriculum_map_is_generated_from_the_topic_table():
    tool = ROOT / "tools" / "readme_map.py"
    p = subprocess.run([sys.executable, str(tool), "--check"], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_named_backend_resolution_is_cached_and_register_invalidates_it():
    """resolve() with a named backend remembers its answer after one full check; registering again clears it."""
    op = "test.cached_resolve_op"
    backends.register(op, "numpy", lambda: "v1", version="a")
    assert backends.dispatch(op, backend="numpy") == "v1"
    assert backends.dispatch(op, backend="numpy") == "v1"  # second call: the cached entry
    backends.register(op, "numpy", lambda: "v2", version="a")  # a replaced implementation is seen at once
    assert backends.dispatch(op, backend="numpy") == "v2"
    backends.register(op, "numpy", lambda: "b", version="b", default=True)  # a new default version too
    assert backends.dispatch(op, backend="numpy") == "b"
    assert backends.dispatch(op, backend="numpy", version="a") == "v2"
    with pytest.raises(ValueError, match="version"):  # errors are never cached
        backends.dispatch(op, backend="numpy", version="zz")
    with pytest.raises(ValueError, match="backend"):
        backends.dispatch(op, backend="nope")
    backends._REGISTRY.pop(op)
    backends._RESOLVED.clear()


def test_unnamed_backend_ranking_is_cached_but_when_and_register_are_honoured():
    """resolve(backend=None) remembers only the priority order: `when=` still sees every input, register() re-ranks."""
    op = "test.ranked_resolve_op"
    backends.register(op, "numpy", lambda x: "numpy")
    backends.register(op, "python", lambda x: "python", priority=-5)
    backends.register(op, "cpp", lambda x: "cpp", when=lambda x: x > 10, available=lambda: True)
    try:
        expect_cpp = backends.backend_available("cpp")
        assert backends.dispatch(op, 100) == ("cpp" if expect_cpp else "numpy")
        assert backends.dispatch(op, 1) == "numpy"  # the cached ranking still asks when= per call
        backends.register(op, "python", lambda x: "python", priority=10**6)  # re-ranked at once
        assert backends.dispatch(op, 100) == "python"
        with pytest.raises(ValueError, match="version"):
            backends.dispatch(op, 1, version="zz")
    finally:
        backends._REGISTRY.pop(op)
        backends._RESOLVED.clear()
        backends._RANKED.clear()


def _registering_modules_in_source() -> set[str]:
    """Modules whose code calls ``backends.register`` (the one way ops register) or ``tunable.declare`` (the one way
    search spaces are declared), found by reading the source."""
    found = set()
    calls = {("backends", "register"), ("tunable", "declare")}
    for path in (ROOT / "tinylearn").rglob("*.py"):
        if "exercises" in path.parts or path.name in ("backends.py", "tunable.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            f = node.func if isinstance(node, ast.Call) else None
            if isinstance(f, ast.Attribute) and (getattr(f.value, "id", ""), f.attr) in calls:
                found.add(".".join(path.relative_to(ROOT).with_suffix("").parts))
                break
    return found


def test_every_registering_module_is_listed_in_the_topic_table():
    """Ops register through the topic table: each module that calls backends.register (or tunable.declare, a search
    space) is a row's ``registers`` entry, and importing exactly the listed modules (a fresh interpreter) registers
    every op, each module only ops of its own package, so backends (and tunable) find every op by name."""
    listed = set(tinylearn.topics.registering_modules())
    source = _registering_modules_in_source()
    assert source == listed, f"not in the table: {sorted(source - listed)}; listed, never registering: " + str(
        sorted(listed - source)
    )
    code = (  # record which module's code calls register (package __init__s import each other's modules)
        "import importlib, inspect, json, sys, tinylearn.backends as b, tinylearn.topics as t, tinylearn.tunable as u\n"
        "seen, real, real_declare = {}, b.register, u.declare\n"
        "def spy(op, *a, **k):\n"
        "    seen.setdefault(inspect.stack()[1].frame.f_globals['__name__'], set()).add(op)\n"
        "    return real(op, *a, **k)\n"
        "def spy_declare(space):\n"
        "    seen.setdefault(inspect.stack()[1].frame.f_globals['__name__'], set()).add(space.op)\n"
        "    return real_declare(space)\n"
        "b.register, u.declare = spy, spy_declare\n"
        "for m in t.registering_modules():\n"
        "    importlib.reload(sys.modules[m]) if m in sys.modules else importlib.import_module(m)\n"
        "print(json.dumps({m: sorted(v) for m, v in seen.items()}))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    new_ops = json.loads(run.stdout.strip().splitlines()[-1])
    assert set(new_ops) == listed, sorted(set(new_ops) ^ listed)
    for mod, ops in new_ops.items():
        assert all(op.split(".", 1)[0] == mod.split(".")[1] for op in ops), (mod, ops)
    assert len(set().union(*new_ops.values())) >= 30  # the ~35 ops of the table


def test_an_op_is_found_from_the_table_without_importing_its_package():
    """A fresh interpreter that never imports tinylearn.conv still resolves "conv.conv2d" (backends imports the
    modules the table lists for that package), and an op of no package is a clear ValueError."""
    code = (
        "import sys, tinylearn.backends as b\n"
        "assert 'tinylearn.conv' not in sys.modules\n"
        "print(sorted(b.versions('conv.conv2d')))\n"
        "assert 'tinylearn.conv.conv2d' in sys.modules\n"
        "try:\n    b.resolve('nosuch.op')\nexcept ValueError as e:\n    print('ValueError', 'nosuch.op' in str(e))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert "numpy" in lines[0] and lines[1] == "ValueError True"
