"""Power controllers on the MODEL plant [Q126, Q154, Q186, Q243, Q254]: PID converges and anti-windup limits the
overshoot after saturation, the cap allocator never exceeds the cap and beats uniform capping on a heterogeneous mix,
the dual-threshold controller keeps the running average under its cap and clips peaks, the batch-size controller
finds the oracle batch within the budget, the DVFS waveform and the multi-objective controller trade time for
energy/temperature as stated, bad input is rejected. Everything is a MODEL; no timing is asserted."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from tinylearn.sched.device_model import A100
from tinylearn.sched.plant import FirstOrderPlant, Plant, Workload, predict
from tinylearn.sched.power import (
    PID,
    BatchSizeController,
    DualThresholdController,
    PowerCapAllocator,
    best_batch,
    fit_power_model,
    response_metrics,
    step_response,
)
from tinylearn.sched.power_dvfs import MultiObjectiveDVFS, arrhenius_af, frequency_waveform, run_schedule, temp_slope

MIX = [Workload("gemm", 300.0), Workload("conv", 80.0), Workload("attn", 20.0), Workload("embed", 3.0)]


def test_pid_converges_on_a_first_order_plant() -> None:
    r = step_response(PID(1.0, 2.0, 0.0, 3.0, 0.0, 10.0), FirstOrderPlant(1.5, 2.0), 1000, 0.02)
    assert r["steady_state_error"] < 0.01
    assert abs(r["y"][-1] - 3.0) < 0.01 * 3.0
    assert math.isfinite(r["settling_time_s"])


def test_anti_windup_limits_overshoot_after_saturation() -> None:
    res = {}
    for aw in (True, False):
        pid = PID(2.0, 3.0, 0.0, 1.0, 0.0, 1.3, anti_windup=aw)  # the output saturates at 1.3 during the rise
        res[aw] = step_response(pid, FirstOrderPlant(1.0, 1.0), 500, 0.02)
    assert res[True]["overshoot"] < 0.05 < 0.10 < res[False]["overshoot"]
    assert res[True]["settling_time_s"] < res[False]["settling_time_s"]
    assert max(res[True]["steady_state_error"], res[False]["steady_state_error"]) < 0.01


def test_derivative_on_measurement_does_not_kick_on_a_setpoint_step() -> None:
    sp = np.r_[np.full(1000, 1.0), np.full(100, 2.0)]  # settled before the step
    r = step_response(PID(0.5, 1.0, 0.05, 1.0, -10, 10), FirstOrderPlant(1.0, 0.5), 1100, 0.01, setpoints=sp)
    jump = abs(r["u"][1000] - r["u"][999])
    assert 0.5 - 0.05 < jump < 0.5 + 0.05  # only kp x step moves at once, not kd x step / dt = 5
    assert r["start"] == 1000


def test_pid_reset_and_limits() -> None:
    pid = PID(1.0, 1.0, 0.0, 5.0, 0.0, 2.0, initial=1.0)
    assert pid.update(0.0, 1.0) == 2.0
    pid.reset()
    assert pid.output == 1.0 and pid.integral == 1.0 and pid.prev is None


def test_response_metrics_on_a_known_series() -> None:
    t = np.arange(10, dtype=float)
    y = np.array([0.0, 0.5, 1.2, 1.1, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    m = response_metrics(t, y, 1.0, start=1, y_start=0.0)
    assert math.isclose(m["overshoot"], 0.2)
    assert m["settling_time_s"] == 3.0 and m["steady_state_error"] == 0.0


def test_power_pid_on_the_device_plant_tracks_the_cap() -> None:
    plant = Plant(A100, MIX[:2], batch=256, noise_w=2.0, seed=0)
    g = 2 * 3 * (A100.tdp_w - A100.idle_w) / A100.f_max_mhz
    pid = PID(0.2 / g, 4.0 / g, 0.0, 500.0, A100.f_min_mhz, A100.f_max_mhz, initial=A100.f_max_mhz)
    r = step_response(pid, plant, 400, 0.05)
    assert r["steady_state_error"] < 0.02  # the running average of a dithering quantised clock
    assert r["y"][:3].max() > 550 and abs(r["y"][-100:].mean() - 500) < 10


def test_fitted_power_models_upper_bound_the_plant() -> None:
    plant = Plant(A100, MIX, batch=64)
    for i in range(plant.n):
        for form in ("linear", "activity"):
            m = fit_power_model(plant, i, form=form)
            for f in A100.freqs():
                p = plant.predict(i, f, sm_share=0.5)
                assert m["power"](f, p["util"]) >= p["power"] - 1e-9
    assert fit_power_model(plant, 0, form="activity")["max_residual_w"] < 1e-6
    assert fit_power_model(plant, 0, form="linear")["max_residual_w"] > 10.0


def test_allocator_never_exceeds_the_cap_and_beats_uniform() -> None:
    rng = np.random.default_rng(0)
    wins = 0
    for _ in range(12):
        ws = [Workload(f"j{k}", float(10 ** rng.uniform(0.3, 2.7))) for k in range(int(rng.integers(2, 6)))]
        plant = Plant(A100, ws, batch=int(rng.choice([32, 128, 512])))
        lo = sum(plant.predict(i, A100.f_min_mhz)["power"] for i in range(plant.n))
        hi = sum(plant.predict(i, A100.f_max_mhz)["power"] for i in range(plant.n))
        cap = float(rng.uniform(lo * 1.05, hi))
        alloc = PowerCapAllocator(cap)
        g, u = alloc.allocate(plant), alloc.uniform(plant)
        assert alloc.allocate(plant, model="linear", strict=False)["true_power_w"] <= cap + 1e-9
        assert g["true_power_w"] <= cap + 1e-9 and u["true_power_w"] <= cap + 1e-9
        assert g["throughput"] >= u["throughput"] - 1e-9
        wins += g["throughput"] > u["throughput"] + 1e-3
    plant = Plant(A100, MIX, batch=64)
    alloc = PowerCapAllocator(400.0)
    g, u = alloc.allocate(plant), alloc.uniform(plant)
    assert g["throughput"] > u["throughput"] * 1.03 and wins >= 6


def test_allocator_closed_loop_stays_under_the_cap() -> None:
    plant = Plant(A100, MIX, batch=64, noise_w=5.0, sensor_tau_s=0.05)
    r = PowerCapAllocator(450.0).run(plant, 200, 0.05)
    assert r["true"].max() <= 450.0 and 0.9 * 450 <= r["measured"][-100:].mean() <= 450.0


def _bursty(n: int, dt: float) -> np.ndarray:
    t = np.arange(n) * dt
    return np.where((t % 4.0) < 1.5, 1.0, 0.25)


def test_dual_threshold_keeps_average_and_clips_peaks() -> None:
    dt, load = 0.05, _bursty(1200, 0.05)
    mk = lambda: Plant(A100, MIX[:2], batch=256, noise_w=3.0, sensor_tau_s=0.02, seed=1)
    ctl = DualThresholdController(350.0, 560.0, 5.0)
    free, capped = ctl.run(mk(), load, dt, control=False), ctl.run(mk(), load, dt)
    assert free["power"].max() > 600 and free["average"][200:].max() > 400  # both limits bind without control
    assert capped["average"][200:].max() <= 350.0 * 1.02
    bursts = int(np.sum(np.diff(load) > 0)) + 1
    assert int(np.sum(capped["power"] > 560.0)) <= bursts  # at most the onset step of each burst
    assert capped["duty"].min() < 1.0 and capped["clock"].min() < A100.f_max_mhz  # both loops acted


def test_batch_size_controller_is_near_the_oracle_under_budget() -> None:
    for budget in (150.0, 190.0, 205.0, 240.0):
        plant = Plant(A100, [Workload("gpt", 60.0)], batch=32, noise_w=2.0, seed=2)
        ctl = BatchSizeController(budget)
        r = ctl.run(plant, 60, 0.1)
        _, tight = best_batch(plant, 0, budget * (1 - 2 * ctl.margin), ctl.candidates)
        _, full = best_batch(plant, 0, budget, ctl.candidates)
        assert tight * 0.999 <= r["throughput"][-20:].mean() <= full * 1.001
        assert r["power"][3:].max() <= budget  # after the three probes
        assert int(np.sum(np.diff(r["batch"][-40:]) != 0)) <= 1  # no flip-flop


def test_batch_size_controller_follows_a_budget_cut() -> None:
    plant = Plant(A100, [Workload("gpt", 60.0)], batch=32, noise_w=2.0, seed=2)
    r = BatchSizeController(240.0).run(plant, 80, 0.1, budget_change=(40, 180.0))
    assert r["batch"][30:40].min() > r["batch"][45:].max()
    assert r["power"][41:].max() <= 180.0


def test_waveform_memory_bound_lowers_the_clock_at_no_time_cost() -> None:
    w = Workload("k", 8.0, max_batch=4096)
    wf = frequency_waveform(8.0, [60.0, 60.5, 61.0], A100, workload=w)
    assert wf["memory_bound"] and wf["plateau_mhz"] < 0.6 * A100.f_max_mhz
    work = predict(A100, w, A100.f_max_mhz, 256)["throughput"] * 60
    a = run_schedule(A100, w, wf["clocks"], work, 0.5, temp0_c=61.0)
    b = run_schedule(A100, w, [A100.f_max_mhz], work, 0.5, temp0_c=61.0)
    assert a["time_s"] <= b["time_s"] * 1.03 and a["energy_j"] < 0.7 * b["energy_j"]


def test_waveform_hot_compute_bound_ramps_down_before_throttling() -> None:
    hot, w = replace(A100, ambient_c=50.0), Workload("k", 300.0, max_batch=4096)
    wf = frequency_waveform(300.0, [70.0, 71.0, 72.0, 73.0], hot, workload=w, f_start=1000.0)
    assert not wf["memory_bound"] and wf["plateau_mhz"] == hot.f_max_mhz
    assert {"up", "down"} <= set(wf["phase"]) and wf["clocks"][-1] < hot.f_max_mhz
    assert wf["predicted_temp"].max() <= hot.throttle_c - 4.0 + 0.5  # one ladder step per time step: a small overrun
    work = predict(hot, w, hot.f_max_mhz, 256)["throughput"] * 60
    a = run_schedule(hot, w, wf["clocks"], work, 0.5, temp0_c=73.0)
    b = run_schedule(hot, w, [hot.f_max_mhz], work, 0.5, temp0_c=73.0)
    assert b["throttled_steps"] > 0 == a["throttled_steps"]
    assert a["peak_temp_c"] < b["peak_temp_c"] - 3.0 and a["energy_j"] < b["energy_j"]


def test_temp_slope() -> None:
    assert math.isclose(temp_slope([1.0, 2.0, 3.0], 0.5), 2.0)
    assert temp_slope(-0.3, 1.0) == -0.3


def test_multi_objective_dvfs_trades_energy_and_mtbf_for_little_work() -> None:
    t = np.arange(400)
    load = np.clip(0.55 + 0.35 * np.sin(t / 60), 0, 1)
    warm = replace(A100, ambient_c=40.0)
    mk = lambda: Plant(warm, [Workload("train", 400.0)], batch=256, noise_w=3.0, temp0_c=50.0)
    fixed = MultiObjectiveDVFS({"perf": 1.0}).run(mk(), load, 1.0, fixed_mhz=warm.f_max_mhz)
    perf = MultiObjectiveDVFS({"perf": 1.0}).run(mk(), load, 1.0)
    bal = MultiObjectiveDVFS({"energy": 1.0, "perf": 2.0, "reliability": 1.0}).run(mk(), load, 1.0)
    assert perf["served_share"] > 0.999 and bal["served_share"] > 0.98
    assert bal["energy_j"] < 0.95 * fixed["energy_j"] and bal["mean_af"] < fixed["mean_af"]
    assert bal["peak_temp_c"] < fixed["peak_temp_c"]


def test_arrhenius_factor() -> None:
    assert arrhenius_af(60.0) == 1.0
    assert arrhenius_af(70.0) > 1.0 > arrhenius_af(50.0)
    assert math.isclose(arrhenius_af(70.0, ea_ev=1.4), arrhenius_af(70.0) ** 2)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: PID(-1.0, 0.0, 0.0, 1.0, 0.0, 1.0), "kp"),
        (lambda: PID(0.0, 0.0, 0.0, 1.0, 0.0, 1.0), "kp/ki/kd"),
        (lambda: PID(1.0, 0.0, 0.0, 1.0, 2.0, 1.0), "out_min"),
        (lambda: PID(1.0, 0.0, float("nan"), 1.0, 0.0, 1.0), "kd"),
        (lambda: PID(1.0, 0.0, 0.0, 1.0, 0.0, 1.0).update(0.0, 0.0), "dt"),
        (lambda: step_response(PID(1, 1, 0, 1, 0, 2), FirstOrderPlant(1, 1), 1, 0.1), "steps"),
        (lambda: step_response(PID(1, 1, 0, 1, 0, 2), object(), 5, 0.1), "plant"),
        (lambda: step_response(PID(1, 1, 0, 1, 0, 2), FirstOrderPlant(1, 1), 5, 0.1, setpoints=[1.0]), "setpoints"),
        (lambda: PowerCapAllocator(-5.0), "cap_w"),
        (lambda: PowerCapAllocator(10.0).allocate(Plant(A100, MIX)), "budget_w"),
        (lambda: PowerCapAllocator(500.0).allocate(Plant(A100, MIX), model="cubic"), "model"),
        (lambda: DualThresholdController(600.0, 500.0, 5.0), "avg_cap_w"),
        (lambda: DualThresholdController(400.0, 500.0, 0.0), "window_s"),
        (lambda: DualThresholdController(400.0, 500.0, 5.0).run(Plant(A100, MIX), [2.0, 1.0], 0.1), "load"),
        (lambda: BatchSizeController(0.0), "power_budget_w"),
        (lambda: BatchSizeController(100.0).fit(), "samples"),
        (lambda: frequency_waveform(0.0, 0.0, A100), "ai"),
        (lambda: frequency_waveform(10.0, [1.0], A100), "temp_trend"),
        (lambda: MultiObjectiveDVFS({"speed": 1.0}), "weights"),
        (lambda: MultiObjectiveDVFS({"perf": -1.0}), "weights"),
        (lambda: PID("a", 1.0, 0.0, 1.0, 0.0, 1.0), "kp"),
        (lambda: PID(1.0, 1.0, 0.0, 1.0, 0.0, 2.0).update("x", 0.1), "measured"),
        (lambda: step_response(PID(1, 1, 0, 1, 0, 2), FirstOrderPlant(1, 1), 10**12, 0.1), "steps"),
        (lambda: step_response("pid", FirstOrderPlant(1, 1), 10, 0.1), "controller"),
        (lambda: fit_power_model("plant", 0), "plant"),
        (lambda: fit_power_model(Plant(A100, MIX), 7), "i"),
        (lambda: PowerCapAllocator(500.0).allocate("plant"), "plant"),
        (lambda: PowerCapAllocator(500.0, margin="x"), "margin"),
        (lambda: DualThresholdController(300.0, 400.0, 1.0).run(Plant(A100, MIX), "abc", 0.1), "load"),
        (lambda: BatchSizeController(100.0).run(Plant(A100, MIX), 10, 0.1, device=9), "device"),
        (lambda: frequency_waveform(10.0, 0.1, "A100"), "spec"),
        (lambda: frequency_waveform(10.0, 0.1, A100, slowdown_ok="x"), "slowdown_ok"),
        (lambda: run_schedule(A100, MIX[0], [1000.0], 1e30, 0.1, max_steps=100), "max_steps"),
        (lambda: MultiObjectiveDVFS({"perf": 1.0}).choose(A100, MIX[0], 32, 50.0, 100.0, "x"), "load"),
        (lambda: arrhenius_af(-300.0), "temp_c"),
    ],
)
def test_bad_input_is_rejected(call, match: str) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        call()
