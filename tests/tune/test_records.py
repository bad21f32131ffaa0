"""tinylearn.tune.records: the SQLite RecordDB (this machine's rows, unwritable paths, corrupt files, threads)."""

import threading
import warnings

import pytest

from tinylearn.tune.measure import Measurement
from tinylearn.tune.records import RecordDB, default_path

SHAPE = {"M": 100, "N": 64, "K": 64}


def _m(s, ok=True):
    return Measurement({"k": 1}, s if ok else None, 0.01, [s] if ok else [], ok, None if ok else "wrong")


def test_add_records_best(tmp_path):
    db = RecordDB(tmp_path / "t.sqlite")
    assert db.persistent
    db.add("op.a", SHAPE, {"k": 1}, _m(2e-3))
    db.add("op.a", SHAPE, {"k": 2}, _m(1e-3))
    db.add("op.a", SHAPE, {"k": 3}, _m(0, ok=False))
    db.add("op.a", {"M": 1000, "N": 64, "K": 64}, {"k": 4}, _m(5e-4))
    rows = db.records("op.a", "K64_M128_N64")
    assert [r["config"]["k"] for r in rows] == [1, 2, 3]
    assert rows[2]["ok"] is False and rows[2]["error"] == "wrong" and rows[2]["seconds"] is None
    assert rows[0]["shape"] == SHAPE and rows[0]["shape_class"] == "K64_M128_N64"
    best = db.best("op.a", "K64_M128_N64")
    assert best["config"] == {"k": 2} and best["seconds"] == 1e-3
    assert db.best("op.a", "K8_M8_N8") is None
    assert len(db.records("op.a")) == 4
    assert set(db.best_all()) == {("op.a", "K64_M128_N64"), ("op.a", "K64_M1024_N64")}
    db.close()
    again = RecordDB(tmp_path / "t.sqlite")  # persisted
    assert again.best("op.a", "K64_M128_N64")["config"] == {"k": 2}


def test_other_machine_ignored_with_one_warning():
    db = RecordDB(":memory:")
    assert not db.persistent
    db.add("op.b", SHAPE, {"k": 9}, _m(1e-6), fingerprint={"cpu": "someone else's"})
    db.add("op.b", SHAPE, {"k": 1}, _m(1e-3))
    with pytest.warns(RuntimeWarning, match="another machine"):
        rows = db.records("op.b")
    assert [r["config"] for r in rows] == [{"k": 1}]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once only
        assert db.best("op.b", "K64_M128_N64")["config"] == {"k": 1}
    assert db.best("op.b", "K64_M128_N64", any_machine=True)["config"] == {"k": 9}
    assert len(db.records("op.b", any_machine=True)) == 2


def test_unwritable_path_warns_and_uses_memory(tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("not a directory")
    bad = blocker / "sub" / "tune.sqlite"
    with pytest.warns(RuntimeWarning, match="afile"):
        db = RecordDB(bad)
    assert not db.persistent
    db.add("op.c", SHAPE, {"k": 1}, _m(1e-3))
    assert len(db.records("op.c")) == 1


def test_corrupt_file_names_path(tmp_path):
    p = tmp_path / "corrupt.sqlite"
    p.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(ValueError, match="corrupt.sqlite"):
        RecordDB(p)


def test_default_path_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("TINYLEARN_TUNE_DB", str(tmp_path / "env.sqlite"))
    assert default_path() == str(tmp_path / "env.sqlite")
    db = RecordDB()
    assert db.path == str(tmp_path / "env.sqlite") and db.persistent
    monkeypatch.delenv("TINYLEARN_TUNE_DB")
    assert default_path().endswith("tinylearn/tune.sqlite")


def test_threads_share_one_connection():
    db = RecordDB(":memory:")

    def work(i):
        for j in range(25):
            db.add("op.t", SHAPE, {"k": i * 100 + j}, _m(1e-3 + j * 1e-6))

    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(db.records("op.t")) == 100


def test_bad_inputs(tmp_path):
    db = RecordDB(":memory:")
    with pytest.raises(ValueError, match="shape"):
        db.add("op", {}, {"k": 1}, _m(1e-3))
    with pytest.raises(ValueError, match="op"):
        db.add("", SHAPE, {"k": 1}, _m(1e-3))
    with pytest.raises(TypeError, match="measurement"):
        db.add("op", SHAPE, {"k": 1}, 1e-3)
    with pytest.raises(TypeError, match="path"):
        RecordDB(42)
    with pytest.raises(TypeError, match="shape_class"):
        db.best("op", {"M": 1})
