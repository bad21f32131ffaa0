"""tools/question_index.py: the README question index is current and every question topics.py cites is answered."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "question_index.py"


def _tool():
    spec = importlib.util.spec_from_file_location("_question_index", TOOL)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_readme_index_is_current_and_every_citation_has_a_tagged_section() -> None:
    r = subprocess.run([sys.executable, str(TOOL), "--check"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def test_only_markdown_headings_count(tmp_path: Path) -> None:
    qi = _tool()
    (tmp_path / "06_x.py").write_text(
        "# %% [markdown]\n"
        "# # Title\n"
        "# ## 1. Ring all-reduce [Q25] [Q61]\n"
        "# prose that mentions [Q7] is not a section\n"
        "# %%\n"
        "# ## a code comment [Q8] is not a heading of a markdown cell\n"
        "x = 1\n"
        "# %% [markdown]\n"
        "# ### 1b. Tree [Q25]\n"
    )
    secs = qi.sections(tmp_path)
    assert [(s.notebook, s.heading, s.questions) for s in secs] == [
        ("06_x", "1. Ring all-reduce", (25, 61)),
        ("06_x", "1b. Tree", (25,)),
    ]
    assert qi.answered(secs) == {25, 61}
    table = qi.render(secs)
    assert "**Coverage: 2 / 284**" in table
    assert table.count("| Q25 |") == 1 and "1b. Tree" in table


def test_out_of_range_tag_is_rejected(tmp_path: Path) -> None:
    qi = _tool()
    (tmp_path / "01_y.py").write_text("# %% [markdown]\n# ## Section [Q999]\n")
    with pytest.raises(ValueError, match="Q999"):
        qi.sections(tmp_path)


def test_markers_are_required() -> None:
    qi = _tool()
    with pytest.raises(ValueError, match="markers"):
        qi.updated("# README without the markers\n", "body")
    text = f"head\n{qi.BEGIN}\nold\n{qi.END}\ntail\n"
    assert qi.updated(text, "new") == f"head\n{qi.BEGIN}\nnew\n{qi.END}\ntail\n"
