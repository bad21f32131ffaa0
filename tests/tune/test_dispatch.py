"""tinylearn.tune.dispatch: TINYLEARN_TUNE modes, tuned() changes what backend=None resolves to, "off" restores."""

import numpy as np
import pytest

import tinylearn as tl
from tinylearn import backends
from tinylearn.tolerance import assert_close
from tinylearn.tune import dispatch
from tinylearn.tune.measure import Measurement
from tinylearn.tune.records import RecordDB

pytestmark = pytest.mark.skipif(not backends.C_available("gemm"), reason="the C++ gemm extension is not built")

OP = "gemm.matmul"
TUNED = {"version": "simd", "isa": "scalar", "mc": 48, "kc": 64, "nc": 256, "threads": 1}


def _args(m, k, n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)


def _db_with(shape, cfg, seconds=1e-9):
    db = RecordDB(":memory:")
    db.add(OP, shape, cfg, Measurement(cfg, seconds, 0.0, [seconds], True, None))
    return db


@pytest.fixture(autouse=True)
def _env_off(monkeypatch):
    monkeypatch.delenv("TINYLEARN_TUNE", raising=False)
    yield
    monkeypatch.delenv("TINYLEARN_TUNE", raising=False)
    dispatch.set_mode(None)


def test_mode_from_env(monkeypatch):
    assert dispatch.mode() == "off"
    monkeypatch.setenv("TINYLEARN_TUNE", "Cached")
    assert dispatch.mode() == "cached"
    monkeypatch.setenv("TINYLEARN_TUNE", "sometimes")
    with pytest.raises(ValueError, match="TINYLEARN_TUNE"):
        dispatch.mode()
    with pytest.raises(ValueError, match="mode"):
        dispatch.set_mode("always")
    with pytest.raises(ValueError, match="mode"):
        with dispatch.tuned("fast"):
            pass


def test_tuned_changes_resolve_and_off_restores():
    a, b = _args(64, 96, 80)  # class K128_M64_N128
    db = _db_with({"M": 64, "K": 96, "N": 80}, TUNED)
    before = backends.resolve(OP, args=(a, b))
    assert before[:2] == ("cpp", "parallel")
    with dispatch.tuned("cached", db=db):
        bk, ver, fn = backends.resolve(OP, args=(a, b))
        assert bk == "cpp" and ver.startswith("tuned:") and "isa=scalar" in ver
        assert "simd_scalar" in fn.__name__
        assert_close(tl.gemm.matmul(a, b), a @ b)
        other = _args(200, 300, 100)  # another shape class: nothing stored -> the usual ranking
        assert backends.resolve(OP, args=other)[:2] == ("cpp", "parallel")
        assert backends.resolve(OP, "numpy", args=(a, b))[:2] == ("numpy", "default")  # a named backend wins
        assert dispatch.cached() == {(OP, "K128_M64_N128"): TUNED}
        dispatch.set_mode("off")
        assert backends.resolve(OP, args=(a, b))[:2] == ("cpp", "parallel")
        dispatch.set_mode("cached")
        assert backends.resolve(OP, args=(a, b))[1].startswith("tuned:")
    assert backends.resolve(OP, args=(a, b))[:2] == ("cpp", "parallel")


def test_config_that_cannot_run_here_is_ignored_with_warning():
    a, b = _args(30, 20, 10)  # mc=384 is larger than any block this shape can use: not a valid configuration
    bad = dict(TUNED, mc=384)
    with dispatch.tuned("cached", db=_db_with({"M": 30, "K": 20, "N": 10}, bad)):
        with pytest.warns(RuntimeWarning, match="cannot run here"):
            choice = backends.resolve(OP, args=(a, b))
        assert choice[:2] == ("cpp", "parallel")
        assert_close(tl.gemm.matmul(a, b), a @ b)


def test_isa_missing_here_is_ignored_with_warning(monkeypatch):
    monkeypatch.setenv("TINYLEARN_CPU_FEATURES", "scalar")  # this process may now only run the scalar kernels
    vec = dict(TUNED, isa="avx2")
    db = _db_with({"M": 64, "K": 96, "N": 80}, vec)  # recorded under the same fingerprint (forced=scalar)
    a, b = _args(64, 96, 80)
    with dispatch.tuned("cached", db=db):
        assert dispatch.cached() == {(OP, "K128_M64_N128"): vec}
        with pytest.warns(RuntimeWarning, match="cannot run here"):
            assert not backends.resolve(OP, args=(a, b))[1].startswith("tuned:")
        assert_close(tl.gemm.matmul(a, b), a @ b)


def test_search_mode_tunes_on_a_miss(monkeypatch):
    monkeypatch.setattr(dispatch, "SEARCH_BUDGET", 2)
    db = RecordDB(":memory:")
    a, b = _args(24, 40, 36)
    with dispatch.tuned("search", db=db):
        assert_close(tl.gemm.matmul(a, b), a @ b)
        assert len(db.records(OP)) == 2  # one search of two configurations, stored
        assert (OP, "K64_M32_N64") in dispatch.cached()
        tl.gemm.matmul(a, b)
        assert len(db.records(OP)) == 2  # cached: no second search
        assert backends.resolve(OP, args=(a, b))[1].startswith("tuned:")


def test_install_follows_env(monkeypatch, tmp_path):
    path = tmp_path / "tune.sqlite"
    RecordDB(path).add(OP, {"M": 64, "K": 96, "N": 80}, TUNED, Measurement(TUNED, 1e-9, 0.0, [1e-9], True, None))
    monkeypatch.setenv("TINYLEARN_TUNE_DB", str(path))
    monkeypatch.setenv("TINYLEARN_TUNE", "cached")
    monkeypatch.setattr(dispatch, "_db", None)
    monkeypatch.setattr(dispatch, "_cache", None)
    a, b = _args(64, 96, 80)
    dispatch.install()
    assert backends.resolve(OP, args=(a, b))[1].startswith("tuned:")
    monkeypatch.setenv("TINYLEARN_TUNE", "off")
    dispatch.set_mode(None)
    assert backends.resolve(OP, args=(a, b))[:2] == ("cpp", "parallel")
