"""Temperature prediction and heat-aware migration [Q182] (MODEL node): the linear predictor is exact on a ramp,
migration never overloads a device and removes the throttling of the stated uneven-cooling scenario."""

from __future__ import annotations

import numpy as np
import pytest

from tinylearn.sched import thermal as th
from tinylearn.sched.device_model import A100


def _scenario(seed: int = 0) -> tuple[list, list[th.ThermalJob], dict[str, int]]:
    rng = np.random.default_rng(seed)
    utils = np.clip(rng.normal(0.45, 0.05, 8), 0.3, 0.5)
    jobs = [th.ThermalJob(f"j{i}", float(u)) for i, u in enumerate(utils)]
    return th.uneven_node(), jobs, {f"j{i}": i // 2 for i in range(8)}  # the badly cooled devices are packed


def test_predictor_exact_on_linear_ramp() -> None:
    p = th.TempPredictor(window=5)
    for t in range(20):
        p.update(float(t), 40.0 + 0.7 * t)
    assert p.slope == pytest.approx(0.7, abs=1e-12)
    assert p.predict(10.0) == pytest.approx(40.0 + 0.7 * 29, abs=1e-9)
    assert p.predict(0.0) == pytest.approx(40.0 + 0.7 * 19, abs=1e-9)


def test_predictor_follows_rc_model_direction() -> None:
    spec, p, temp = A100, th.TempPredictor(10), 40.0
    for t in range(10):
        p.update(float(t), temp)
        temp = spec.temp_after(temp, spec.tdp_w, 1.0)
    assert p.predict(5.0) > temp - 1.0 > 40.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_migration_reduces_throttling_and_never_overloads(seed: int) -> None:
    specs, jobs, placement = _scenario(seed)
    none = th.simulate_node(specs, jobs, placement, "none", duration_s=300)
    mig = th.simulate_node(specs, jobs, placement, "migrate", duration_s=300)
    assert none.throttled_s > 100  # the scenario does throttle without migration
    assert mig.throttled_s < 0.25 * none.throttled_s
    assert mig.loads.max() <= 2 and mig.loads.sum(1).min() == len(jobs) == mig.loads.sum(1).max()
    assert len(mig.migrations) >= 1 and all(m.src < 2 for m in mig.migrations)  # from the hot devices
    assert mig.temps.max() < none.temps[:, :2].max()


def test_decision_respects_slots_and_frozen() -> None:
    specs = th.uneven_node((0.2, 0.05, 0.05))
    jobs = {"a": th.ThermalJob("a", 0.6), "b": th.ThermalJob("b", 0.4), "c": th.ThermalJob("c", 0.3)}
    devs = [th.DeviceState(s, capacity=2) for s in specs]
    devs[0].jobs, devs[1].jobs, devs[2].jobs = ["a", "b"], ["c"], []
    for t in range(5):
        devs[0].predictor.update(float(t), 80.0 + 2.0 * t)
    moves = th.heat_aware_migration(devs, jobs, horizon_s=10.0)
    assert [(m.job, m.src) for m in moves] == [("a", 0)] and moves[0].dst in (1, 2)
    assert th.heat_aware_migration(devs, jobs, horizon_s=10.0, frozen=["a", "b"]) == []
    devs[1].jobs, devs[2].jobs = ["c", "x"], ["y", "z"]
    jobs.update({k: th.ThermalJob(k, 0.1) for k in "xyz"})
    assert th.heat_aware_migration(devs, jobs, horizon_s=10.0) == []  # no device has room


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="^window"):
        th.TempPredictor(1)
    with pytest.raises(ValueError, match="^t"):
        p = th.TempPredictor(3)
        p.update(1.0, 40.0)
        p.update(1.0, 41.0)
    with pytest.raises(ValueError, match="^util"):
        th.ThermalJob("j", 1.5)
    specs, jobs, placement = _scenario()
    with pytest.raises(ValueError, match="^policy"):
        th.simulate_node(specs, jobs, placement, "cool")
    with pytest.raises(ValueError, match="^placement"):
        th.simulate_node(specs, jobs, {**placement, "j1": 0, "j2": 0})
    with pytest.raises(ValueError, match="^placement"):
        th.simulate_node(specs, jobs, {"j0": 0})
    with pytest.raises(ValueError, match="^horizon_s"):
        th.heat_aware_migration([], {}, -1.0)
