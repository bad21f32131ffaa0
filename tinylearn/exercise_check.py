"""Check a topic's exercises from Python or a notebook: ``tl.check("01_autodiff")`` shows a pass/fail table.

The tests run in a child process (``pytest --impl=stub|reference``) so a crashing or hanging exercise cannot take
the notebook's kernel down; results are read from pytest's JUnit XML. In JupyterLab the returned object renders as
an HTML table; in a terminal ``print()`` gives the text form. ``%tinylearn check 01_autodiff`` does the same after
``%load_ext tinylearn``.

Where the exercises are found, first match wins: ``folder=`` if given; ``./exercises/<topic>/`` or ``./<topic>/``
under the current directory (a folder made by ``tinylearn exercises copy DIR``); the repository checkout; the copy
installed inside the package.
"""

from __future__ import annotations

import html
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from . import topics


@dataclass
class CheckResult:
    topic: str
    impl: str
    folder: Path
    rows: list[tuple[str, str, str]] = field(default_factory=list)  # (test, outcome, message)
    returncode: int = 0

    @property
    def passed(self) -> int:
        return sum(1 for _, o, _ in self.rows if o == "passed")

    @property
    def failed(self) -> int:
        return sum(1 for _, o, _ in self.rows if o in ("failed", "error"))

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.failed == 0 and self.passed > 0

    def summary(self) -> str:
        line = f"exercises {self.folder.name} ({self.impl}): {self.passed} passed, {self.failed} failed"
        stubs = sum(1 for _, o, m in self.rows if o != "passed" and "NotImplemented" in m)
        if stubs:
            line += f" ({stubs} from untouched stubs: not written yet)"
        return line

    def __str__(self) -> str:
        width = max((len(t) for t, _, _ in self.rows), default=10)
        lines = [self.summary()]
        for t, o, m in self.rows:
            lines.append(f"  {'PASS' if o == 'passed' else o.upper():7s} {t:<{width}s}  {m[:100]}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        color = {"passed": "#1a7f37", "failed": "#cf222e", "error": "#cf222e", "skipped": "#9a6700"}
        body = "".join(
            f"<tr><td style='text-align:left'><code>{html.escape(t)}</code></td>"
            f"<td style='color:{color.get(o, '#000')};font-weight:bold'>{o}</td>"
            f"<td style='text-align:left'>{html.escape(m[:160])}</td></tr>"
            for t, o, m in self.rows
        )
        return (
            f"<p><b>{html.escape(self.summary())}</b></p><table><tr><th>test</th><th>result</th><th>message</th></tr>"
            f"{body}</table>"
        )


def _packaged_exercises() -> Path | None:
    try:
        from ._resources import exercises_dir  # written by the packaging layer

        return exercises_dir()
    except Exception:
        return None


def find_exercises(topic: str, folder: str | Path | None = None) -> Path:
    """The exercise folder for ``topic`` (any of its names); ValueError naming the places searched."""
    t = topics.get(topic)
    if t.exercises is None:
        raise ValueError(f"topic: {t.name!r} ({t.notebook}) has no exercises")
    if folder is not None:
        p = Path(folder)
        if not (p / f"test_{t.exercises}.py").is_file():
            raise ValueError(f"folder: {p} holds no test_{t.exercises}.py")
        return p
    cwd = Path.cwd()
    candidates = [cwd / "exercises" / t.exercises, cwd / t.exercises, cwd.parent / "exercises" / t.exercises]
    repo = Path(__file__).resolve().parents[1] / "exercises" / t.exercises
    candidates.append(repo)
    packaged = _packaged_exercises()
    if packaged is not None:
        candidates.append(packaged / t.exercises)
    for c in candidates:
        if (c / f"test_{t.exercises}.py").is_file():
            return c
    raise ValueError(
        f"topic: no exercise folder {t.exercises!r} found (looked in {', '.join(str(c) for c in candidates)}); "
        "`tinylearn exercises copy DIR` makes one"
    )


def check(topic: str, impl: str = "stub", folder: str | Path | None = None, timeout_s: float = 600) -> CheckResult:
    """Run the exercise tests of ``topic`` against your stubs (``impl="stub"``) or tinylearn (``"reference"``)."""
    if impl not in ("stub", "reference"):
        raise ValueError(f"impl: must be 'stub' or 'reference', got {impl!r}")
    d = find_exercises(topic, folder)
    with tempfile.TemporaryDirectory(prefix="tl-check-") as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", str(d), "-q", "-p", "no:cacheprovider", f"--impl={impl}"]
        cmd += ["--tb=line", f"--junitxml={xml}", "-o", "junit_family=xunit1"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=d.parent, timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            raise TimeoutError(f"timeout_s: exercises {d.name} did not finish within {timeout_s} s") from e
        res = CheckResult(topics.get(topic).name, impl, d, returncode=proc.returncode)
        if not xml.is_file():
            res.rows.append(("(collection)", "error", (proc.stdout + proc.stderr).strip()[-300:]))
            return res
        for case in ET.parse(xml).getroot().iter("testcase"):
            name = case.get("name", "?")
            outcome, msg = "passed", ""
            for tag in ("failure", "error", "skipped"):
                el = case.find(tag)
                if el is not None:
                    outcome = {"failure": "failed"}.get(tag, tag)
                    msg = (
                        (el.get("message") or el.text or "").strip().splitlines()[0]
                        if (el.get("message") or el.text)
                        else ""
                    )
                    break
            res.rows.append((name, outcome, msg))
    return res


def load_ipython_extension(ipython) -> None:  # pragma: no cover - exercised in JupyterLab
    """``%load_ext tinylearn`` registers ``%tinylearn check TOPIC [--reference]``."""
    from IPython.display import display

    def tinylearn_magic(line: str) -> None:
        words = line.split()
        if len(words) < 2 or words[0] != "check":
            print("usage: %tinylearn check TOPIC [--reference]")
            return
        display(check(words[1], impl="reference" if "--reference" in words else "stub"))

    ipython.register_magic_function(tinylearn_magic, magic_kind="line", magic_name="tinylearn")
