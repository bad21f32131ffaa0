"""Compare a notebook's freshly executed outputs with its committed ones by nbval's rules, without re-running it.

The JupyterLab test (tools/lab_test.py) executes every notebook in a real browser; this module lets that run also
be the forced-numeric-path nbval run (make test-portable used to execute every notebook a third time for it).
The rules are nbval's own: its comment markers and cell tags (NBVAL_IGNORE_OUTPUT, NBVAL_SKIP, ...), its
``skip_compare`` keys (metadata, execution counts, PNG bytes, widget model ids), its stream coalescing and its
``compare_outputs`` method, called here on a small stand-in for its pytest item; the sanitize patterns come from
notebooks/sanitize.cfg exactly as ``--nbval-sanitize-with`` reads them.

    python tools/nbcompare.py EXECUTED.ipynb [REFERENCE.ipynb]   # two files on disk (reference: the committed one)
"""

from __future__ import annotations

import difflib
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import nbformat
from nbval import plugin as nbval

ROOT = Path(__file__).resolve().parents[1]
SANITIZE_CFG = ROOT / "notebooks" / "sanitize.cfg"
# nbval's IPyNbFile.skip_compare without --nbdime (PNG/JPEG bytes differ between runs and are not compared)
SKIP_COMPARE = (
    "metadata",
    "traceback",
    "prompt_number",
    "output_type",
    "name",
    "execution_count",
    "application/vnd.jupyter.widget-view+json",
    "image/png",
    "image/jpeg",
)


def sanitize_patterns(cfg: Path = SANITIZE_CFG) -> dict[str, str]:
    return dict(nbval.get_sanitize_patterns(cfg.read_text()))


def cell_options(cell: Any) -> dict[str, Any]:
    """nbval's options for one code cell: metadata tags, then comment markers (which win), check on by default."""
    opts: dict[str, Any] = defaultdict(bool, nbval.find_metadata_tags(cell.get("metadata", {})))
    opts.update(dict(nbval.find_comment_markers(cell["source"])))
    opts.setdefault("check", True)
    return opts


class _Cell:
    """The attributes nbval's ``IPyNbCell.compare_outputs`` reads, without a pytest session."""

    compare_outputs = nbval.IPyNbCell.compare_outputs
    sanitize = nbval.IPyNbCell.sanitize

    def __init__(self, patterns: dict[str, str]) -> None:
        self.parent = type("Parent", (), {"skip_compare": SKIP_COMPARE, "sanitize_patterns": patterns})()
        self.colors = nbval.nocolors
        self.comparison_traceback: list[str] = []

    def format_output_compare(self, key: str, left: Any, right: Any) -> None:
        diff = difflib.unified_diff(
            str(left).splitlines(), str(right).splitlines(), "committed", "executed", lineterm="", n=1
        )
        self.comparison_traceback.append(f"mismatch {key!r}:\n" + "\n".join(list(diff)[:40]))


def _node(output: dict) -> nbformat.NotebookNode:
    o = dict(output)
    if o.get("output_type") == "stream" and isinstance(o.get("text"), list):
        o["text"] = "".join(o["text"])
    return nbformat.from_dict(o)


def compare_cells(reference: nbformat.NotebookNode, executed: list[dict], patterns: dict[str, str]) -> list[str]:
    """Problems (empty: equal by nbval's rules). ``executed``: one dict per cell with ``source`` and ``outputs``
    (the JupyterLab model's JSON, or the cells of an .ipynb), in notebook order."""
    ref_code = [c for c in reference.cells if c.cell_type == "code"]
    got_code = [c for c in executed if c.get("type", c.get("cell_type")) == "code"]
    if len(ref_code) != len(got_code):
        return [f"{len(got_code)} code cells executed, the committed notebook has {len(ref_code)}"]
    problems = []
    for i, (ref, got) in enumerate(zip(ref_code, got_code, strict=True)):
        if "".join(got["source"]) != ref.source:
            problems.append(f"cell {i}: its source differs from the committed notebook's")
            continue
        opts = cell_options(ref)
        if opts["skip"] or not opts["check"] or ref.execution_count is None or got.get("count", 0) is None:
            continue  # (a cell the run never reached is reported by the caller, not as N output mismatches)
        cell = _Cell(patterns)
        test = nbval.coalesce_streams([_node(o) for o in got["outputs"]])
        if not cell.compare_outputs(test, nbval.coalesce_streams([_node(o) for o in ref.outputs])):
            why = "\n".join(cell.comparison_traceback)
            problems.append(f"cell {i}: outputs differ from the committed ones\n{why}")
    return problems


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2):
        print(__doc__)
        return 2
    executed = nbformat.read(args[0], as_version=4)
    reference = nbformat.read(args[1] if len(args) == 2 else ROOT / "notebooks" / Path(args[0]).name, as_version=4)
    problems = compare_cells(reference, [dict(c) for c in executed.cells], sanitize_patterns())
    for p in problems:
        print(p)
    print(f"nbcompare: {len(problems)} cell(s) differ")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
