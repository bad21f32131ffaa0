"""Build notebooks from their percent-format sources and execute them, committing clean outputs.

    python tools/nb.py build notebooks/src/01_autodiff.py [...]   # -> notebooks/01_autodiff.ipynb, executed
    python tools/nb.py build --all                                 # every notebooks/src/*.py (make notebooks)
    python tools/nb.py check                                       # every notebook executed, no error outputs
    python tools/nb.py sync notebooks/src/03_quantization.py       # markdown-only edit: copy the text, keep outputs

Source format (jupytext "percent"): a line ``# %%`` starts a code cell, ``# %% [markdown]`` a markdown cell whose
lines are written as ``# text``. The .py source is the reviewable truth; the .ipynb carries the outputs nbval
compares. Execution: kernel ``python3`` (the standard kernelspec), cwd notebooks/, 600 s per cell; the build
fails if a cell raises, and warns about stderr output outside ``# NBVAL_IGNORE_OUTPUT`` cells.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
NB_DIR = ROOT / "notebooks"


def parse_percent(text: str) -> list[nbformat.NotebookNode]:
    cells: list[nbformat.NotebookNode] = []
    kind, buf = None, []

    def flush() -> None:
        if kind is None:
            return
        while buf and not buf[-1].strip():
            buf.pop()
        while buf and not buf[0].strip():
            buf.pop(0)
        if kind == "markdown":
            lines = [ln[2:] if ln.startswith("# ") else ln[1:] if ln.startswith("#") else ln for ln in buf]
            cells.append(nbformat.v4.new_markdown_cell("\n".join(lines)))
        elif buf:
            cells.append(nbformat.v4.new_code_cell("\n".join(buf)))

    for line in text.splitlines():
        if line.startswith("# %%"):
            flush()
            kind = "markdown" if "[markdown]" in line else "code"
            buf = []
        elif kind is not None:
            buf.append(line)
    flush()
    return cells


# nbval's comment markers: it acts on a line that is exactly "# MARKER" (any text after the marker on the same line
# and nbval silently ignores it: a machine-dependent cell then fails on another CPU)
NBVAL_MARKERS = ("NBVAL_IGNORE_OUTPUT", "NBVAL_CHECK_OUTPUT", "NBVAL_RAISES_EXCEPTION", "NBVAL_SKIP")


def marker_errors(source: str) -> list[str]:
    """Lines of a code cell that look like an nbval marker but are not one nbval recognises."""
    bad = []
    for line in source.splitlines():
        comment = line.strip().lstrip("#").strip() if line.strip().startswith("#") else ""
        if comment.startswith("NBVAL") and comment not in NBVAL_MARKERS:
            bad.append(f"{line.strip()!r}: nbval only reads a marker alone on its line (# {comment.split()[0]})")
    return bad


def ignores_output(source: str) -> bool:
    """Whether nbval skips comparing this code cell's outputs (a line exactly '# NBVAL_IGNORE_OUTPUT')."""
    return any(
        ln.strip().lstrip("#").strip() == "NBVAL_IGNORE_OUTPUT" for ln in source.splitlines() if ln.strip()[:1] == "#"
    )


def build(src: Path, timeout: int = 600) -> Path:
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = parse_percent(src.read_text())
    bad = [
        f"{src.name} cell {i}: {e}"
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code"
        for e in marker_errors(c.source)
    ]
    if bad:
        raise SystemExit("\n".join(bad))
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    out = NB_DIR / (src.stem + ".ipynb")
    t0 = time.time()
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(NB_DIR)}})
    client.execute()
    dt = time.time() - t0
    for i, cell in enumerate(nb.cells):
        cell.metadata = {}
        if cell.cell_type == "code":
            cell.id = f"c{i:03d}"
            ignored = ignores_output(cell.source)
            for o in cell.outputs:
                o.pop("metadata", None) if o.get("output_type") == "stream" else None
                if o.get("output_type") == "stream" and o.get("name") == "stderr" and not ignored:
                    print(f"  warning: {out.name} cell {i} writes to stderr: {o['text'][:100]!r}", file=sys.stderr)
        else:
            cell.id = f"m{i:03d}"
    nbformat.write(nb, out)
    print(f"built {out.relative_to(ROOT)} in {dt:.1f} s")
    return out


def out_of_sync(src: Path) -> list[str]:
    """Where the committed notebook's cells differ from its source (empty when they agree)."""
    want = [(c.cell_type, c.source) for c in parse_percent(src.read_text())]
    nb_path = NB_DIR / (src.stem + ".ipynb")
    have = [(c["cell_type"], "".join(c["source"])) for c in json.loads(nb_path.read_text())["cells"]]
    diffs = [
        f"{nb_path.name} cell {i} ({w[0]}) differs from {src.name}"
        for i, (w, h) in enumerate(zip(want, have))
        if w != h
    ]
    if len(want) != len(have):
        diffs.append(f"{nb_path.name} has {len(have)} cells, {src.name} {len(want)}")
    return diffs


def sync(src: Path) -> Path:
    """Copy edited markdown cells from the source into the committed notebook without re-executing it.

    Only for markdown-only edits: if any code cell differs (or the cell list changed), it refuses; rebuild instead.
    """
    want = parse_percent(src.read_text())
    out = NB_DIR / (src.stem + ".ipynb")
    nb = nbformat.read(out, as_version=4)
    if [c.cell_type for c in want] != [c.cell_type for c in nb.cells] or any(
        w.source != h.source for w, h in zip(want, nb.cells) if w.cell_type == "code"
    ):
        raise SystemExit(f"{src.name}: code cells changed, so outputs may change: run `tools/nb.py build {src}`")
    for w, h in zip(want, nb.cells):
        if w.cell_type == "markdown":
            h.source = w.source
    nbformat.write(nb, out)
    print(f"synced the markdown of {out.relative_to(ROOT)}")
    return out


def check() -> int:
    bad = []
    for p in sorted(NB_DIR.glob("*.ipynb")):
        cells = json.loads(p.read_text())["cells"]
        code = [c for c in cells if c["cell_type"] == "code" and "".join(c["source"]).strip()]
        if any(c.get("execution_count") is None for c in code):
            bad.append(f"{p.name}: unexecuted code cells")
        if any(o.get("output_type") == "error" for c in code for o in c.get("outputs", [])):
            bad.append(f"{p.name}: error output committed")
        if not any("image/png" in o.get("data", {}) for c in code for o in c.get("outputs", [])):
            bad.append(f"{p.name}: no plot")
        bad += [f"{p.name}: {e}" for c in code for e in marker_errors("".join(c["source"]))]
        src = NB_DIR / "src" / (p.stem + ".py")
        bad += out_of_sync(src) if src.is_file() else [f"{p.name}: no source {src.name}"]
    print("\n".join(bad) or "all notebooks executed, plots present, no errors, nbval markers well formed")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("sources", nargs="*", type=Path)
    b.add_argument("--all", action="store_true")
    sub.add_parser("check")
    sy = sub.add_parser("sync")
    sy.add_argument("sources", nargs="+", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "check":
        return check()
    if args.cmd == "sync":
        for s in args.sources:
            sync(Path(s).resolve())
        return 0
    srcs = sorted((NB_DIR / "src").glob("*.py")) if args.all else args.sources
    if not srcs:
        ap.error("build: give source files or --all")
    for s in srcs:
        build(Path(s).resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
