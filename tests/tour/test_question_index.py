"""tools/question_index.py: the README question index is current and every question topics.py cites is answered."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "question_index.py"
BANK = [str(i) for i in range(1, 88)] + ["88a", "88b"] + [str(i) for i in range(90, 102)] + ["102a", "102b"]
BANK += [str(i) for i in range(103, 285) if i != 273]


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
    secs = qi.sections(tmp_path, ids=BANK)
    assert [(s.notebook, s.heading, s.questions) for s in secs] == [
        ("06_x", "1. Ring all-reduce", ("25", "61")),
        ("06_x", "1b. Tree", ("25",)),
    ]
    assert qi.answered(secs) == {"25", "61"}
    table = qi.render(secs, total=len(BANK))
    assert f"**Coverage: 2 / {len(BANK)}**" in table
    assert table.count("| Q25 |") == 1 and "1b. Tree" in table


def test_out_of_range_tag_is_rejected(tmp_path: Path) -> None:
    qi = _tool()
    (tmp_path / "01_y.py").write_text("# %% [markdown]\n# ## Section [Q999]\n")
    with pytest.raises(ValueError, match="Q999"):
        qi.sections(tmp_path, ids=BANK)


@pytest.mark.parametrize(("tag", "why"), [("Q88", "88a and 88b"), ("Q89", "no such id"), ("Q102", "102a and 102b")])
def test_tags_must_be_exact_bank_ids(tmp_path: Path, tag: str, why: str) -> None:
    qi = _tool()
    (tmp_path / "07_z.py").write_text(f"# %% [markdown]\n# ## Compaction [{tag}]\n")
    with pytest.raises(ValueError, match=why):
        qi.sections(tmp_path, ids=BANK)
    (tmp_path / "07_z.py").write_text("# %% [markdown]\n# ## Compaction [Q88b] [Q102a]\n")
    assert qi.sections(tmp_path, ids=BANK)[0].questions == ("88b", "102a")


def test_bank_ids_are_read_from_the_shared_question_bank() -> None:
    qi = _tool()
    if not qi.BANK.is_file():
        pytest.skip(f"no question bank at {qi.BANK}")
    ids = qi.bank_ids()
    assert len(ids) == len(set(ids)) == 284
    assert {"88a", "88b", "102a", "102b", "142a", "142b", "283"} <= set(ids)
    assert not {"88", "89", "102", "142", "273", "284"} & set(ids)
    assert sorted(["90", "88b", "9", "88a"], key=qi.id_key) == ["9", "88a", "88b", "90"]


def test_audit_finds_calls_and_asserts_per_section(tmp_path: Path) -> None:
    qi = _tool()
    (tmp_path / "05_a.py").write_text(
        "# %%\n"
        "import numpy as np\n"
        "import tinylearn as tl\n"
        "from tinylearn.kernels import softmax\n"
        "K = tl.kernels\n"
        "# %% [markdown]\n"
        "# ## 1. Softmax [Q31]\n"
        "# %%\n"
        "y = softmax(np.ones(3))\n"
        "# %% [markdown]\n"
        "# ### 1b. Checked\n"
        "# %%\n"
        "z = K.layer_norm(y)\n"
        "assert abs(y.sum() - 1) < 1e-6\n"
        "# %% [markdown]\n"
        "# ## 2. Prose only [Q54]\n"
        "# %%\n"
        "print(np.exp(1))\n"
        "# %% [markdown]\n"
        "# ## 3. Torch script on tinylearn [Q17]\n"
        "# %%\n"
        "train(tl)\n"
        "np.testing.assert_allclose(1, 1)\n"
    )
    rows = {r.section.questions: r for r in qi.audit(tmp_path, ids=BANK)}
    assert rows[("31",)].calls == ("softmax", "K.layer_norm", "y.sum")  # y came from a tinylearn call
    assert len(rows[("31",)].asserts) == 1
    assert rows[("31",)].ok and not rows[("54",)].ok and rows[("54",)].calls == () == rows[("54",)].asserts
    assert rows[("17",)].calls == ("train(tl)",) and rows[("17",)].asserts == ("np.testing.assert_allclose(...)",)
    assert "**none**" in qi.render_audit(list(rows.values()))


def test_markers_are_required() -> None:
    qi = _tool()
    with pytest.raises(ValueError, match="markers"):
        qi.updated("# README without the markers\n", "body")
    text = f"head\n{qi.BEGIN}\nold\n{qi.END}\ntail\n"
    assert qi.updated(text, "new") == f"head\n{qi.BEGIN}\nnew\n{qi.END}\ntail\n"


def test_every_tagged_section_calls_tinylearn_and_asserts() -> None:
    """The mechanical half of the tag rule over the real notebooks: no tag on a section without a tinylearn call or
    without an assert (``tools/question_index.py --audit`` prints the table and the offenders)."""
    if not _tool().BANK.is_file():
        pytest.skip("no question bank beside the repository")
    r = subprocess.run([sys.executable, str(TOOL), "--audit"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
