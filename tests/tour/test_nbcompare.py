"""tools/nbcompare.py: nbval's comparison rules applied to outputs executed elsewhere (the JupyterLab run)."""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]


def _nbcompare():
    sys.path.insert(0, str(ROOT / "tools"))
    spec = importlib.util.spec_from_file_location("nbcompare", ROOT / "tools" / "nbcompare.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _nb(*cells: tuple[str, list[dict]]) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    for i, (src, outs) in enumerate(cells):
        c = nbformat.v4.new_code_cell(src, execution_count=i + 1)
        c.outputs = [nbformat.from_dict(o) for o in outs]
        nb.cells.append(c)
    nb.cells.insert(0, nbformat.v4.new_markdown_cell("# title"))
    return nbformat.from_dict(nb)


def _stream(text: str) -> dict:
    return {"output_type": "stream", "name": "stdout", "text": text}


def _result(text: str) -> dict:
    return {"output_type": "execute_result", "execution_count": 1, "metadata": {}, "data": {"text/plain": text}}


REF = _nb(
    ("print('a')", [_stream("a\n")]),
    ("# NBVAL_IGNORE_OUTPUT\nprint(t)", [_stream("took 1.5 ms\n")]),
    ("x", [_result("42")]),
    ("# NBVAL_SKIP\nboom()", []),
    ("plot()", [{"output_type": "display_data", "metadata": {}, "data": {"image/png": "AAAA", "text/plain": "<F>"}}]),
)


def _executed(ref: nbformat.NotebookNode) -> list[dict]:
    return [copy.deepcopy(dict(c)) for c in ref.cells]


def test_identical_outputs_and_the_ignored_kinds_of_difference_pass():
    C = _nbcompare()
    got = _executed(REF)
    got[2]["outputs"] = [_stream("took 9.9 ms\n")]  # NBVAL_IGNORE_OUTPUT cell
    got[3]["outputs"][0]["execution_count"] = 7  # execution counts are not compared
    got[5]["outputs"][0]["data"]["image/png"] = "BBBB"  # PNG bytes are not compared (nbval without nbdime)
    got[1]["outputs"] = [_stream("a"), _stream("\n")]  # streams are coalesced, as nbval does
    assert C.compare_cells(REF, got, C.sanitize_patterns()) == []


def test_a_changed_compared_output_is_reported_with_its_cell():
    C = _nbcompare()
    got = _executed(REF)
    got[3]["outputs"] = [_result("43")]
    problems = C.compare_cells(REF, got, C.sanitize_patterns())
    assert len(problems) == 1 and problems[0].startswith("cell 2:") and "43" in problems[0]
    got = _executed(REF)
    got[1]["outputs"] = []
    assert C.compare_cells(REF, got, C.sanitize_patterns())[0].startswith("cell 0:")


def test_sanitize_patterns_apply_and_a_source_or_cell_count_mismatch_fails():
    C = _nbcompare()
    ref = _nb(("f()", [_stream("at 0x7f00aa11bb22 in 3.2 ms\n")]))
    got = _executed(ref)
    got[1]["outputs"] = [_stream("at 0x55aa00ff1122 in 17 ms\n")]
    assert C.compare_cells(ref, got, C.sanitize_patterns()) == []
    got[1]["source"] = "g()"
    assert "source differs" in C.compare_cells(ref, got, C.sanitize_patterns())[0]
    assert "code cells" in C.compare_cells(ref, got[:1], C.sanitize_patterns())[0]


def test_a_committed_notebook_equals_itself():
    C = _nbcompare()
    ref = nbformat.read(ROOT / "notebooks" / "04_pruning.ipynb", as_version=4)
    assert C.compare_cells(ref, _executed(ref), C.sanitize_patterns()) == []
