"""tinylearn.tune.bandit: the UCB1 policy (deterministic rewards) and run_bandit over configurations of a space."""

import math

import numpy as np
import pytest

from tinylearn.tunable import Param, Space
from tinylearn.tune.bandit import UCB1, BanditResult, run_bandit


def _build(cfg):
    if cfg["k"] == 5:
        return lambda x: x * 2.5  # wrong
    return lambda x: x * 2.0


SPACE = Space(
    op="tc_bandit.scale",
    params=(Param("k", (1, 2, 3, 4, 5)),),
    build=_build,
    shape_of=lambda x: {"N": x.shape[0]},
    make_args=lambda shape, rng: ((rng.standard_normal(shape["N"]).astype(np.float32),), {}),
    default=lambda shape: {"k": 1},
    reference=lambda x: x * 2.0,
)


def test_ucb1_tries_every_arm_then_exploits():
    ucb = UCB1(["a", "b", "c"])
    assert ucb.c == pytest.approx(math.sqrt(2))
    rng = np.random.default_rng(0)
    p = {"a": 0.3, "b": 0.8, "c": 0.5}
    first = []
    for t in range(2000):
        arm = ucb.select()
        if t < 3:
            first.append(arm)
        ucb.update(arm, float(rng.random() < p[arm]))
    assert first == ["a", "b", "c"]
    assert ucb.favourite() == "b" and ucb.total == 2000
    assert ucb.counts[1] > 0.8 * 2000
    assert min(ucb.counts) > 5  # the losers are still retried, ever more rarely
    assert ucb.means()[1] == pytest.approx(0.8, abs=0.05)


def test_ucb1_bad_inputs():
    with pytest.raises(ValueError, match="arms"):
        UCB1([])
    with pytest.raises(ValueError, match="c"):
        UCB1([1, 2], c=-1.0)
    ucb = UCB1([1, 2])
    with pytest.raises(ValueError, match="arm"):
        ucb.update(3, 1.0)
    with pytest.raises(ValueError, match="reward"):
        ucb.update(1, float("nan"))


def test_run_bandit_policy_and_regret():
    cfgs = [{"k": 1}, {"k": 2}, {"k": 3}]
    res = run_bandit(SPACE, {"N": 256}, cfgs, rounds=120, reward=lambda cfg, s: 1.0 if cfg["k"] == 2 else 0.2)
    assert isinstance(res, BanditResult)
    assert sum(res.counts) == 120 and len(res.chosen) == 120 and len(res.regret) == 120
    assert res.settled_arm == 1 and res.counts[1] > 60
    assert res.chosen[:3] == [0, 1, 2]
    assert all(b >= a for a, b in zip(res.regret, res.regret[1:]))  # cumulative regret never decreases
    assert len(res.seconds) == 3 and all(s > 0 for s in res.seconds)
    assert res.reward_source == "callable"


def test_run_bandit_time_and_cycles_rewards_say_their_source():
    res = run_bandit(SPACE, {"N": 64}, [{"k": 1}, {"k": 2}], rounds=20)
    assert res.reward_source == "time"
    assert all(0.0 <= m <= 1.0 for m in res.means) and max(res.means) > 0.5
    cyc = run_bandit(SPACE, {"N": 64}, [{"k": 1}, {"k": 2}], rounds=20, reward="cycles")
    # cycles where a PMU is readable, else time with the reason (a VM without a virtual PMU)
    assert cyc.reward_source == "cycles (hardware counters)" or cyc.reward_source.startswith(
        "time only (hardware counters unavailable"
    )
    assert all(0.0 <= m <= 1.0 for m in cyc.means) and sum(cyc.counts) == 20


def test_run_bandit_bad_inputs():
    with pytest.raises(ValueError, match="configs"):
        run_bandit(SPACE, {"N": 64}, [{"k": 1}, {"k": 5}], rounds=10)  # a wrong arm is refused
    with pytest.raises(ValueError, match="configs"):
        run_bandit(SPACE, {"N": 64}, [], rounds=10)
    with pytest.raises(ValueError, match="rounds"):
        run_bandit(SPACE, {"N": 64}, [{"k": 1}, {"k": 2}], rounds=1)
    with pytest.raises(ValueError, match="reward"):
        run_bandit(SPACE, {"N": 64}, [{"k": 1}], rounds=3, reward="flops")
    with pytest.raises(ValueError, match="shape"):
        run_bandit(SPACE, {"N": 0}, [{"k": 1}], rounds=3)


def test_run_bandit_rescores_when_a_faster_call_arrives(monkeypatch):
    # scripted costs: arm k=1 costs 1.0 but its FIRST call was slowed to 5.0 (a busy neighbour); arm k=2 costs 3.0.
    # A scale fixed by the first round (t_ref = 3.0) would score both arms 1.0 -- no gap to learn from; the running
    # minimum rescored gives 1.0 and 1/3, so the slow arm is pulled rarely
    import tinylearn.tune.bandit as bandit

    calls = {1: 0}

    def fake_timed(fn):  # the arm is the one select() just returned
        if fake_timed.arm == 1:
            calls[1] += 1
            return 5.0 if calls[1] == 1 else 1.0
        return 3.0

    cfgs = [{"k": 1}, {"k": 2}]
    orig_select = bandit.UCB1.select

    def select(self):
        arm = orig_select(self)
        fake_timed.arm = cfgs[arm]["k"]
        return arm

    monkeypatch.setattr(bandit, "_timed", fake_timed)
    monkeypatch.setattr(bandit.UCB1, "select", select)
    res = run_bandit(SPACE, {"N": 16}, cfgs, rounds=200)
    assert res.means[0] > 0.95 and res.means[1] == pytest.approx(1 / 3)
    assert res.counts[1] < 0.25 * 200 and res.settled_arm == 0
