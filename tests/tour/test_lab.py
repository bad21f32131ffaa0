"""The learner's JupyterLab: the browser test's verdict logic and ``tl.check`` (browser run: `make test-lab`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import tinylearn as tl

ROOT = Path(__file__).resolve().parents[2]


def _lab_test():
    spec = importlib.util.spec_from_file_location("lab_test", ROOT / "tools" / "lab_test.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cell(src="x = 1", count=1, outputs=()):
    return {"type": "code", "count": count, "source": src, "outputs": list(outputs)}


PNG = {"output_type": "display_data", "data": {"image/png": "iVBOR"}}
WIDGET = {"output_type": "display_data", "data": {"application/vnd.jupyter.widget-view+json": {"model_id": "m"}}}


def test_check_cells_accepts_a_good_notebook():
    assert _lab_test().check_cells([_cell(outputs=[PNG]), _cell("from tqdm.auto import tqdm", 2, [WIDGET])]) == []


@pytest.mark.parametrize(
    "cells,fragment",
    [
        ([_cell(outputs=[PNG]), _cell(count=None)], "last code cell did not run"),
        ([_cell(outputs=[PNG, {"output_type": "error", "ename": "ValueError", "evalue": "x"}])], "raised ValueError"),
        ([_cell()], "no plot"),
        ([_cell(outputs=[PNG]), _cell("from tqdm.auto import tqdm", 2, [{"output_type": "stream"}])], "widget"),
    ],
)
def test_check_cells_reports_each_problem(cells, fragment):
    problems = _lab_test().check_cells(cells)
    assert any(fragment in p for p in problems), problems


def test_tl_check_runs_the_exercises_both_ways():
    ref = tl.check("01_autodiff", impl="reference")
    assert ref.ok and ref.passed > 0 and ref.failed == 0
    stub = tl.check("gemm")  # any of the topic's names
    assert not stub.ok and stub.failed > 0
    assert "not written yet" in stub.summary()
    assert "<table>" in stub._repr_html_()


def test_tl_check_errors_name_the_argument():
    with pytest.raises(ValueError, match="topic"):
        tl.check("no_such_topic")
    with pytest.raises(ValueError, match="impl"):
        tl.check("01_autodiff", impl="mine")
    with pytest.raises(ValueError, match="has no exercises"):
        tl.check("tour")


def _nbval_run():
    spec = importlib.util.spec_from_file_location("nbval_run", ROOT / "tools" / "nbval_run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_nbval_run_reads_failed_cells_and_checks_its_arguments():
    run = _nbval_run()
    m = run.FAILED.match("FAILED notebooks/13_llm_serving.ipynb::Cell 5 - \x1b[91mNotebook cell failed\x1b[0m")
    assert m and m.group(1) == "notebooks/13_llm_serving.ipynb" and m.group(2).startswith("Cell 5")
    assert run.FAILED.match("PASSED notebooks/00_tour.ipynb::Cell 0") is None
    for argv in (["--jobs", "0"], ["no_such_notebook"]):
        with pytest.raises(SystemExit):
            run.main(argv)


def test_exclusive_notebooks_exist_and_say_why():
    from tinylearn.topics import exclusive_notebooks

    alone = exclusive_notebooks()
    assert alone and all((ROOT / "notebooks" / n).is_file() and len(why) > 20 for n, why in alone.items())


def test_notebook_plan_runs_exclusive_ones_alone_and_the_rest_shared():
    from tinylearn.topics import exclusive_notebooks, notebook_plan

    names = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    alone, shared = notebook_plan(names, 2)
    assert set(alone) == set(exclusive_notebooks()) and sorted(alone + shared) == names
    assert alone == [n for n in names if n in alone]  # the given order is kept
    assert notebook_plan(names, 1) == (names, [])
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="jobs"):
            notebook_plan(names, bad)
