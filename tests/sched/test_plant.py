"""The MODEL plant the power controllers act on: clocks snap down the DVFS ladder, power/throughput follow the
device model, the roofline makes memory-bound jobs insensitive to the clock, throttling engages above throttle_c,
the sensor lags and its noise is seeded, the first-order test plant matches its closed form, bad input is rejected.
No timing is asserted."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from tinylearn.sched.device_model import A100
from tinylearn.sched.plant import FirstOrderPlant, Plant, Workload, predict, snap_down


def test_snap_down_picks_the_ladder_step_at_or_below() -> None:
    ladder = A100.freqs()
    assert snap_down(A100, ladder[5] + 1.0) == ladder[5]
    assert snap_down(A100, ladder[5]) == ladder[5]
    assert snap_down(A100, 10.0) == ladder[0]
    assert snap_down(A100, 1e6) == ladder[-1]


def test_power_and_throughput_follow_the_device_model() -> None:
    w = Workload("gemm", 300.0)
    m = predict(A100, w, A100.f_max_mhz, 64)
    flops = 64 * w.gflops_per_sample * 1e9
    step = w.overhead_s + A100.step_time_s(flops, flops / w.ai)
    assert math.isclose(m["step_s"], step, rel_tol=1e-12)
    assert math.isclose(m["throughput"], 64 / step, rel_tol=1e-12)
    assert math.isclose(m["power"], A100.power_w(A100.f_max_mhz, m["util"]), rel_tol=1e-12)
    lo = predict(A100, w, A100.f_min_mhz, 64)
    assert lo["power"] < m["power"] and lo["throughput"] < m["throughput"]


def test_memory_bound_job_loses_little_throughput_at_a_lower_clock() -> None:
    mem, comp = Workload("embed", 3.0), Workload("gemm", 400.0)
    f = A100.freqs()[len(A100.freqs()) // 2]
    loss_mem = 1 - predict(A100, mem, f, 64)["throughput"] / predict(A100, mem, A100.f_max_mhz, 64)["throughput"]
    loss_comp = 1 - predict(A100, comp, f, 64)["throughput"] / predict(A100, comp, A100.f_max_mhz, 64)["throughput"]
    assert loss_mem < 0.01 < 0.2 < loss_comp


def test_plant_step_uses_the_inputs_and_heats_up() -> None:
    p = Plant(A100, [Workload("a", 300.0), Workload("b", 10.0)], batch=[64, 32])
    p.set(clock=[A100.f_max_mhz, 900.0], duty=[1.0, 0.5])
    r = p.step(1.0)
    assert r["clock"][1] == snap_down(A100, 900.0)
    exp = p.predict(1, snap_down(A100, 900.0), 32, busy=0.5)
    assert math.isclose(r["power"][1], exp["power"], rel_tol=1e-12)
    assert math.isclose(r["throughput"][1], exp["throughput"], rel_tol=1e-12)
    assert np.all(r["temp"] > A100.ambient_c)
    assert math.isclose(r["total_power"], float(r["power"].sum()))


def test_throttling_lowers_the_clock_above_throttle_c() -> None:
    hot = replace(A100, ambient_c=60.0)  # steady state at TDP would be 105 C, above throttle_c = 87 C
    p = Plant(hot, [Workload("gemm", 400.0)], batch=512, temp0_c=86.0)
    rs = [p.step(0.5) for _ in range(200)]
    assert any(r["throttled"][0] for r in rs)
    assert min(r["clock"][0] for r in rs) < hot.f_max_mhz
    assert max(r["temp"][0] for r in rs[50:]) < hot.throttle_c + 2.0
    cool = Plant(A100, [Workload("gemm", 400.0)], batch=512)
    assert not any(cool.step(0.5)["throttled"][0] for _ in range(50))


def test_sensor_lag_and_seeded_noise() -> None:
    w = [Workload("gemm", 300.0)]
    lagged = Plant(A100, w, batch=64, sensor_tau_s=1.0)
    r = lagged.step(0.1)
    assert A100.idle_w < r["measured"][0] < r["power"][0]
    first = [Plant(A100, w, noise_w=5.0, seed=3).step(0.1)["measured"][0] for _ in range(2)]
    other = Plant(A100, w, noise_w=5.0, seed=4).step(0.1)["measured"][0]
    assert first[0] == first[1] != other


def test_first_order_plant_matches_closed_form() -> None:
    p = FirstOrderPlant(2.0, 0.5)
    for _ in range(10):
        y = p.respond(1.0, 0.1)
    assert math.isclose(y, 2.0 * (1 - math.exp(-1.0 / 0.5)), rel_tol=1e-12)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: Workload("x", -1.0), "ai"),
        (lambda: Workload("x", 1.0, max_batch=0), "max_batch"),
        (lambda: Plant(A100, []), "workloads"),
        (lambda: Plant([A100, A100], [Workload("x", 1.0)]), "devices"),
        (lambda: Plant(A100, [Workload("x", 1.0)], batch=0), "batch"),
        (lambda: Plant(A100, [Workload("x", 1.0)]).set(duty=1.5), "duty"),
        (lambda: Plant(A100, [Workload("x", 1.0)]).set(sm_share=0.0), "sm_share"),
        (lambda: Plant(A100, [Workload("x", 1.0)]).set(clock=[1.0, 2.0]), "clock"),
        (lambda: Plant(A100, [Workload("x", 1.0)]).step(-1.0), "dt"),
        (lambda: Plant(A100, [Workload("x", 1.0)], noise_w=-1.0), "noise_w"),
        (lambda: FirstOrderPlant(0.0, 1.0), "gain"),
        (lambda: Plant(A100, [Workload("x", 1.0)]).set(clock="abc"), "clock"),
        (lambda: Plant(A100, [Workload("x", 1.0)]).predict(3, 1000.0), "i"),
        (lambda: Plant(A100, [Workload("x", 1.0)]).respond("fast", 0.1), "u"),
        (lambda: Plant(A100, [Workload("x", 1.0)], temp0_c="hot"), "temp0_c"),
        (lambda: Plant("A100", [Workload("x", 1.0)]), "devices"),
        (lambda: Plant(A100, "abc"), "workloads"),
        (lambda: FirstOrderPlant(1.0, 0.0), "tau_s"),
    ],
)
def test_bad_input_is_rejected(call, match: str) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        call()
