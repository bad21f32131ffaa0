"""Benchmark records: the --json/--record format, benchmarks/<cpu>/ naming, and --compare (ratios to a saved run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tinylearn.__main__ import main
from tinylearn.bench import Row, Table
from tinylearn.bench.record import compare, cpu_slug, default_record_path, load_record, make_record

REPO = Path(__file__).resolve().parents[2]


def _table(title: str, times: dict[tuple[str, str], float]) -> Table:
    t = Table(title=title)
    for (case, impl), ms in times.items():
        t.add(Row(case=case, impl=impl, median_ms=ms))
    t.compute_ratios()
    return t


def _record(times: dict[tuple[str, str], float], cpu: str = "AMD EPYC", simd: str = "avx2") -> dict:
    return make_record([("kernels", _table("softmax", times))], machine={"cpu_model": cpu, "simd": simd})


@pytest.mark.parametrize(
    ("model", "level", "slug"),
    [
        ("AMD EPYC", "avx2", "amd-epyc-avx2"),
        ("AMD EPYC 9654 96-Core Processor", "avx512", "amd-epyc-9654-avx512"),
        ("Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz", "avx512", "intel-xeon-platinum-8480-2.00ghz-avx512"),
        ("", "scalar", "unknown-cpu-scalar"),
    ],
)
def test_cpu_slug(model: str, level: str, slug: str) -> None:
    assert cpu_slug(model, level, forced="") == slug
    assert cpu_slug(model, level, forced=level) == slug  # forcing the CPU's own level changes nothing
    assert cpu_slug(model, level, forced="scalar" if level != "scalar" else "avx2").startswith(slug + "-forced-")
    low = "scalar" if level != "scalar" else "avx2"
    assert cpu_slug(model, level, forced=low, build="baseline") == f"{slug}-forced-{low}-portable-build"
    assert cpu_slug(model, level, forced=low, build="avx512") == f"{slug}-forced-{low}"
    assert cpu_slug(model, level, forced="", build="baseline") == slug


def test_default_record_path_names_cpu_date_and_topics(tmp_path: Path) -> None:
    import datetime as dt

    p = default_record_path(["kernels", "conv"], root=tmp_path, when=dt.date(2026, 11, 24))
    assert p.parent == tmp_path / cpu_slug()
    assert p.name == "2026-11-24_kernels_conv.json"
    assert default_record_path([], root=tmp_path, when=dt.date(2026, 1, 2)).name == "2026-01-02_all.json"


def test_default_record_path_never_overwrites_a_saved_record(tmp_path: Path) -> None:
    import datetime as dt

    when = dt.datetime(2026, 11, 24, 12, 30, tzinfo=dt.timezone.utc)
    names = []
    for _ in range(3):
        p = default_record_path(["quant"], root=tmp_path, when=when)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("{}")
        names.append(p.name)
    assert names == ["2026-11-24_quant.json", "2026-11-24T1230Z_quant.json", "2026-11-24T1230Z-2_quant.json"]


def test_compare_ratios_and_unmatched_rows() -> None:
    saved = _record({("n=1", "torch"): 2.0, ("n=1", "tinylearn"): 4.0, ("n=2", "torch"): 1.0})
    now = _record({("n=1", "torch"): 1.0, ("n=1", "tinylearn"): 3.0, ("n=3", "torch"): 1.0}, simd="avx512")
    t = compare(saved, now)
    rows = {(r.case.split(" | ")[1], r.impl): r for r in t.rows}
    assert set(rows) == {("n=1", "torch"), ("n=1", "tinylearn")}
    r = rows[("n=1", "tinylearn")]
    assert r.ratio == pytest.approx(0.75)  # 3 ms now / 4 ms saved
    assert r.extra["x base saved"] == pytest.approx(2.0)
    assert r.extra["x base now"] == pytest.approx(3.0)  # faster in ms, but slower relative to torch
    assert any("1 only in the saved record; 1 only now" in n for n in t.notes)
    assert any("different machines" in n for n in t.notes)


def test_compare_handles_rows_that_did_not_run() -> None:
    saved = _record({("n=1", "torch"): 2.0, ("n=1", "tinygrad"): 5.0})
    now = _record({("n=1", "torch"): 2.0, ("n=1", "tinygrad"): None})  # type: ignore[dict-item]
    r = next(r for r in compare(saved, now).rows if r.impl == "tinygrad")
    assert r.ratio is None and r.extra["x base now"] is None


def test_load_record_accepts_old_list_and_rejects_garbage(tmp_path: Path) -> None:
    old = tmp_path / "old.json"
    old.write_text(json.dumps([{"topic": "kernels", **_table("t", {("a", "torch"): 1.0}).to_dict()}]))
    assert load_record(old)["tables"][0]["title"] == "t"
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json.*not JSON"):
        load_record(bad)
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="not a tinylearn bench record"):
        load_record(wrong)
    with pytest.raises(ValueError, match="no such record file"):
        load_record(tmp_path / "missing.json")


def test_cli_compare_two_saved_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_record({("n=1", "torch"): 2.0, ("n=1", "tinylearn"): 4.0})))
    b.write_text(json.dumps(_record({("n=1", "torch"): 2.0, ("n=1", "tinylearn"): 8.0})))
    assert main(["bench", "--compare", str(a), "--current", str(b)]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "tinylearn" in ln and "n=1" in ln)
    assert "2x" in line  # 8 ms now / 4 ms saved
    assert main(["bench", "--current", str(b)]) == 2  # --current without --compare
    assert main(["bench", "--compare", str(tmp_path / "nope.json")]) == 2


def test_cli_runs_a_topic_writes_a_record_and_compares_to_it(tmp_path: Path) -> None:
    rec = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "tinylearn", "bench", "matmul", "--size", "16"]
    p = subprocess.run([*cmd, "--json", str(rec)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    data = load_record(rec)
    assert data["schema"] == 1 and data["machine"]["cpu_model"] and data["machine"]["simd"]
    # the ISA _C was compiled for (a native build's AVX2 kernels are not an AVX2-only CPU's)
    assert data["machine"]["build_isa"] in ("avx512", "avx2", "baseline", None)
    assert {t["topic"] for t in data["tables"]} == {"tour"}
    p = subprocess.run([*cmd, "--compare", str(rec)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "now vs saved record" in p.stdout and "only in the saved record" in p.stdout


def test_saved_records_in_the_repo_are_valid() -> None:
    files = sorted((REPO / "benchmarks").glob("*/*.json"))
    for f in files:
        data = load_record(f)
        assert data["schema"] >= 1, f
        name = f.parent.name.split("-forced-")[0]
        assert name.endswith(("-avx2", "-avx512", "-scalar")), f"{f}: folder is not a cpu slug"
        assert data["tables"], f
