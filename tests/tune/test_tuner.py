"""tinylearn.tune.tuner: budget accounting, wrong configurations discarded and reported, records, bad arguments."""

import numpy as np
import pytest

from tinylearn import tunable
from tinylearn.tolerance import assert_close
from tinylearn.tunable import Param, Space
from tinylearn.tune.records import RecordDB
from tinylearn.tune.searchers import GridSearch, RandomSearch
from tinylearn.tune.tuner import TuneResult, best, tune


def _build(cfg):
    if cfg["unroll"] == 8:
        return lambda x: x * 2.0 + 1e-2  # fast-looking but wrong
    return lambda x: x * 2.0


SPACE = tunable.declare(
    Space(
        op="tc_tuner.scale",
        params=(Param("unroll", (1, 2, 4, 8)), Param("order", ("ij", "ji"))),
        build=_build,
        shape_of=lambda x: {"N": x.shape[0]},
        make_args=lambda shape, rng: ((rng.standard_normal(shape["N"]).astype(np.float32),), {}),
        default=lambda shape: {"unroll": 1, "order": "ij"},
        reference=lambda x: x * 2.0,
    )
)
EMPTY = tunable.declare(
    Space(
        op="tc_tuner.empty",
        params=(Param("k", (1, 2)),),
        build=_build,
        shape_of=SPACE.shape_of,
        make_args=SPACE.make_args,
        default=lambda shape: {"k": 1},
        valid=lambda cfg, shape: False,
    )
)


def test_wrong_config_discarded_and_reported():
    db = RecordDB(":memory:")
    r = tune("tc_tuner.scale", {"N": 300}, searcher="grid", budget=8, db=db, repeat=3)
    assert isinstance(r, TuneResult)
    assert len(r.history) == 8 and r.history[0].config == r.default == {"unroll": 1, "order": "ij"}
    assert {tuple(m.config.values()) for m in r.rejected} == {(8, "ij"), (8, "ji")}
    assert all("wrong result" in m.error for m in r.rejected)
    assert r.best["unroll"] != 8 and r.best_s is not None and r.default_s is not None
    assert r.shape_class == "N512" and r.searcher == "grid"
    assert len(r.best_so_far()) == 8 and r.best_so_far()[-1] == r.best_s
    rows = db.records("tc_tuner.scale")
    assert len(rows) == 8 and sum(not x["ok"] for x in rows) == 2
    assert best("tc_tuner.scale", "N512", db=db) == r.best
    assert best("tc_tuner.scale", "N64", db=db) is None


def test_budget_counts_the_default_and_store_false():
    db = RecordDB(":memory:")
    r = tune("tc_tuner.scale", {"N": 64}, searcher="random", budget=3, db=db, store=False, repeat=3)
    assert len(r.history) == 3 and r.history[0].config == r.default
    assert db.records("tc_tuner.scale") == []
    one = tune("tc_tuner.scale", {"N": 64}, budget=1, db=db, repeat=3)
    assert len(one.history) == 1 and one.best == one.default
    assert len(tune("tc_tuner.scale", {"N": 64}, budget=100, db=db, repeat=2).history) == 8  # space exhausted


def test_searcher_as_class_and_factory():
    db = RecordDB(":memory:")
    a = tune("tc_tuner.scale", {"N": 64}, searcher=GridSearch, budget=3, db=db, repeat=2)
    b = tune(
        "tc_tuner.scale", {"N": 64}, searcher=lambda sp, sh, seed: RandomSearch(sp, sh, seed=seed), budget=3, db=db
    )
    assert a.searcher == "grid" and b.searcher == "random"
    assert [m.config for m in a.history[1:]] == [{"unroll": 1, "order": "ji"}, {"unroll": 2, "order": "ij"}]


@pytest.mark.parametrize("budget", [0, -1, 2.5, "4", True])
def test_bad_budget(budget):
    with pytest.raises(ValueError, match="budget"):
        tune("tc_tuner.scale", {"N": 64}, budget=budget, store=False)


def test_bad_arguments():
    with pytest.raises(ValueError, match="searcher"):
        tune("tc_tuner.scale", {"N": 64}, searcher="hillclimb", store=False)
    with pytest.raises(ValueError, match="shape"):
        tune("tc_tuner.scale", {"N": -3}, store=False)
    with pytest.raises(ValueError, match="shape"):
        tune("tc_tuner.scale", {}, store=False)
    with pytest.raises(ValueError, match="shape"):
        tune("tc_tuner.scale", {"M": 64}, store=False)  # make_args needs N
    with pytest.raises(ValueError, match="empty search space"):
        tune("tc_tuner.empty", {"N": 64}, store=False)
    with pytest.raises(ValueError, match="op"):
        tune("tc_tuner.no_such_op", {"N": 64}, store=False)
    with pytest.raises(TypeError, match="db"):
        tune("tc_tuner.scale", {"N": 64}, db="file.sqlite")


def test_gemm_space_tunes_to_a_correct_config():
    db = RecordDB(":memory:")
    shape = {"M": 48, "N": 40, "K": 72}
    r = tune("gemm.matmul", shape, searcher="random", budget=4, db=db, repeat=2)
    assert r.rejected == [] and len(r.history) == 4
    space = tunable.get("gemm.matmul")
    (a, b), _ = space.make_args(shape, np.random.default_rng(1))
    assert_close(space.build(r.best)(a, b), a @ b)


def test_confirm_top_remeasures_the_leaders_interleaved():
    db = RecordDB(":memory:")
    r = tune("tc_tuner.scale", {"N": 256}, searcher="grid", budget=6, db=db, repeat=3, confirm_top=2)
    assert len(r.history) == 6 and r.history[0].config == r.default
    ranked = sorted((m for m in r.history if m.ok), key=lambda m: m.seconds)
    confirmed = [m for m in r.history if len(m.times) > 3]  # 3 interleaved rounds of 3 samples, minus outliers
    assert r.default in [m.config for m in confirmed] and 2 <= len(confirmed) <= 3
    assert r.best == ranked[0].config and r.best_s == ranked[0].seconds
    stored = {tuple(sorted(x["config"].items())): x["seconds"] for x in db.records("tc_tuner.scale")}
    assert all(stored[tuple(sorted(m.config.items()))] == m.seconds for m in r.history if m.ok)
    with pytest.raises(ValueError, match="confirm_top"):
        tune("tc_tuner.scale", {"N": 64}, confirm_top=-1, store=False)
