"""The command line (tinylearn/__main__.py) on bad paths and numbers: a one-line error and exit code 2, before any
benchmark runs, never a traceback or a silent no-op (issue 38)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tinylearn.__main__ import main


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _one_line_error(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    ("argv", "frag"),
    [
        (["bench", "matmul", "--json", ""], "--json: empty path"),
        (["bench", "matmul", "--plot", ""], "--plot: empty path"),
        (["bench", "matmul", "--compare", ""], "--compare: empty path"),
        (["bench", "matmul", "--json", "adir"], "--json: adir is a folder"),
        (["bench", "matmul", "--plot", "afile"], "--plot: afile is a file"),
        (["bench", "matmul", "--compare", "adir"], "adir"),
        (["exercises", "copy", ""], "DIR is empty"),
        (["exercises", "copy", "  "], "DIR is empty"),
        (["exercises", "copy", "afile"], "afile is a file"),
        (["exercises", "copy", "afile/sub"], "Not a directory"),
    ],
)
def test_bad_paths_are_one_line_errors(cwd, capsys, argv, frag):
    err = _one_line_error(capsys, argv)
    assert frag in err
    assert sorted(p.name for p in cwd.iterdir()) == ["adir", "afile"]  # nothing written, nothing copied
    assert not any((cwd / "adir").iterdir())


@pytest.mark.parametrize("size", ["0", "-3", "abc", "2.5"])
def test_size_must_be_a_positive_integer(capsys, size):
    with pytest.raises(SystemExit) as e:
        main(["bench", "matmul", "--size", size])
    assert e.value.code == 2
    assert "argument --size: " in capsys.readouterr().err


def test_cli_errors_are_not_tracebacks_in_a_real_process(tmp_path):
    (tmp_path / "afile").write_text("x")
    for args in (["bench", "matmul", "--json", str(tmp_path)], ["exercises", "copy", str(tmp_path / "afile")]):
        p = subprocess.run(
            [sys.executable, "-m", "tinylearn", *args], capture_output=True, text=True, timeout=120, cwd=tmp_path
        )
        assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
