"""Installable as a package: one resource lookup (tinylearn._resources), `tinylearn exercises copy`, `tinylearn
check` in a copied folder, topic names in the CLI. The wheel itself is built and used from a fresh venv by
tools/wheel_smoke.sh (CI step; too slow for a unit test)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tinylearn import _resources
from tinylearn.__main__ import main

ROOT = Path(__file__).resolve().parents[2]


def test_checkout_wins_in_an_editable_install():
    assert _resources.checkout_root() == ROOT
    assert _resources.cuda_dir() == ROOT / "cuda_src"
    assert _resources.exercises_dir() == ROOT / "exercises"
    assert _resources.cuda_source("kernels_softmax") == ROOT / "cuda_src" / "kernels_softmax.cu"
    assert _resources.cuda_source("vector_reduce.cu") == ROOT / "cuda_src" / "vector_reduce.cu"
    from tinylearn.kernels import cuda as kc

    assert kc.source_path("kernels_layernorm") == ROOT / "cuda_src" / "kernels_layernorm.cu"


def test_bad_names_are_clear_errors():
    with pytest.raises(ValueError, match=r"no CUDA source nope\.cu .*known: \[.*kernels_softmax"):
        _resources.cuda_source("nope")
    with pytest.raises(TypeError, match="name: must be a str"):
        _resources.cuda_source(3)


def test_packaged_copy_is_used_without_a_checkout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    pkg = tmp_path / "site-packages" / "tinylearn"
    (pkg / "cuda_src").mkdir(parents=True)
    (pkg / "cuda_src" / "k.cu").write_text('extern "C" __global__ void k() {}\n')
    (pkg / "exercises" / "01_x").mkdir(parents=True)
    (pkg / "exercises" / "01_x" / "test_01_x.py").write_text("")
    monkeypatch.setattr(_resources, "checkout_root", lambda: None)
    monkeypatch.setattr(_resources, "_PKG", pkg)
    monkeypatch.setattr(_resources.importlib.util, "find_spec", lambda name: None)
    assert _resources.cuda_source("k") == pkg / "cuda_src" / "k.cu"
    assert _resources.exercises_dir() == pkg / "exercises"
    shutil.rmtree(pkg / "cuda_src")
    with pytest.raises(FileNotFoundError, match="no cuda_src/ found"):
        _resources.cuda_dir()


def test_cmake_installs_the_package_data():
    text = (ROOT / "CMakeLists.txt").read_text()
    assert re.search(r"install\(DIRECTORY \S*cuda_src/ DESTINATION tinylearn/cuda_src", text)
    assert re.search(r"install\(DIRECTORY \S*exercises/ DESTINATION tinylearn/exercises", text)


@pytest.mark.parametrize(
    "names",
    [("quant", "03_quantization", "03", "quantization"), ("autograd", "autodiff", "01_autodiff"), ("tour", "matmul")],
)
def test_cli_resolves_every_name_of_a_topic(names):
    from tinylearn.__main__ import _resolve_topics

    for n in names:
        assert _resolve_topics([n], "bench") == [names[0]]


def test_cli_unknown_topics_list_the_known_ones(capsys: pytest.CaptureFixture[str]):
    assert main(["check", "no_such_topic"]) == 2
    err = capsys.readouterr().err
    assert "no_such_topic" in err and "quant/quantization (03_quantization)" in err
    assert "tour" not in err  # the tour has no exercises
    assert main(["bench", "nope"]) == 2
    assert "tour/matmul (00_tour)" in capsys.readouterr().err
    assert main(["bench", "quant", "--size", "64"]) == 2  # quant's run() takes no sizes
    assert "--size" in capsys.readouterr().err


def test_exercises_copy_and_check_in_the_copy(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    dest = tmp_path / "my_exercises"
    assert main(["exercises", "copy", str(dest)]) == 0
    src = _resources.exercises_dir()
    folders = sorted(p.name for p in src.iterdir() if p.is_dir() and p.name[:2].isdigit())
    assert sorted(p.name for p in dest.iterdir() if p.is_dir()) == folders
    assert (dest / "conftest.py").read_text() == (src / "conftest.py").read_text()
    assert not list(dest.rglob("__pycache__"))
    capsys.readouterr()
    assert main(["exercises", "copy", str(dest)]) == 2  # never overwrites the learner's work silently
    assert "--force" in capsys.readouterr().err
    # the learner "solves" the memory exercises in the copy: check must run the copy, not the repository's stubs
    ex = dest / "07_memory_pools"
    shutil.copy(ex / "reference.py", ex / "stubs.py")
    p = subprocess.run(
        [sys.executable, "-m", "tinylearn", "check", "memory"], cwd=dest, capture_output=True, text=True, timeout=600
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"exercises 07_memory_pools \(stub\): [1-9]\d* passed, 0 failed", p.stdout), p.stdout
