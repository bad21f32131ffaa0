"""tinylearn.tune.measure: correctness before timing, outlier rejection, noisy re-measurement; tune.fingerprint."""

import time

import numpy as np
import pytest

from tinylearn.tunable import Param, Space
from tinylearn.tune.fingerprint import fingerprint, machine_id
from tinylearn.tune.measure import Measurement, check_output, measure_config, reject_outliers, spread_of


def _build(cfg):
    if cfg["k"] == 3:
        return lambda x: x * 3.0  # wrong
    if cfg["k"] == 4:

        def boom(x):
            raise RuntimeError("kernel exploded")

        return boom
    return lambda x: x * 2.0


SPACE = Space(
    op="tc_measure.scale",
    params=(Param("k", (1, 2, 3, 4)),),
    build=_build,
    shape_of=lambda x: {"N": x.shape[0]},
    make_args=lambda shape, rng: ((rng.standard_normal(shape["N"]).astype(np.float32),), {}),
    default=lambda shape: {"k": 1},
    reference=lambda x: x * 2.0,
)
X = np.arange(64, dtype=np.float32)


def test_correct_config_is_timed():
    m = measure_config(SPACE, {"k": 2}, (X,), expected=X * 2.0, warmup=1, repeat=5)
    assert isinstance(m, Measurement)
    assert m.ok and m.error is None
    assert m.seconds is not None and m.seconds > 0
    assert 1 <= len(m.times) <= 5 and m.spread >= 0
    assert m.config == {"k": 2}


def test_wrong_config_rejected_before_timing():
    m = measure_config(SPACE, {"k": 3}, (X,), expected=X * 2.0)
    assert not m.ok and m.seconds is None and m.times == []
    assert "wrong result" in m.error


def test_raising_config_reported():
    m = measure_config(SPACE, {"k": 4}, (X,), expected=X * 2.0)
    assert not m.ok and m.seconds is None
    assert "RuntimeError" in m.error and "kernel exploded" in m.error


def test_without_expected_no_check():
    assert measure_config(SPACE, {"k": 3}, (X,), repeat=3).ok


def test_outlier_rejection_and_spread():
    times = [1.0, 1.1, 0.9, 1.05, 0.95, 10.0]
    kept = reject_outliers(times)
    assert 10.0 not in kept and len(kept) == 5
    assert reject_outliers([1.0, 1.0, 1.0, 5.0]) == [1.0, 1.0, 1.0, 5.0]  # MAD 0: nothing to judge by
    assert spread_of([1.0, 1.0, 1.0]) == 0.0
    assert spread_of([1.0, 2.0, 3.0, 4.0]) == pytest.approx((3.25 - 1.75) / 2.5)


def test_noisy_measurement_retried():
    calls = [0]
    rng = np.random.default_rng(0)

    def build(cfg):
        def jittery(x):
            calls[0] += 1
            time.sleep(float(rng.uniform(2e-4, 2e-3)))
            return x * 2.0

        return jittery

    space = Space("tc_measure.jitter", (Param("k", (1,)),), build, SPACE.shape_of, SPACE.make_args, SPACE.default)
    measure_config(space, {"k": 1}, (X,), warmup=0, repeat=5, max_spread=1e-9, retries=0)
    once = calls[0]
    calls[0] = 0
    measure_config(space, {"k": 1}, (X,), warmup=0, repeat=5, max_spread=1e-9, retries=2)
    assert calls[0] > 2 * once  # three timing runs instead of one


@pytest.mark.parametrize(
    "kw, name",
    [
        ({"repeat": 0}, "repeat"),
        ({"warmup": -1}, "warmup"),
        ({"retries": 1.5}, "retries"),
        ({"max_spread": 0}, "max_spread"),
    ],
)
def test_bad_arguments(kw, name):
    with pytest.raises(ValueError, match=name):
        measure_config(SPACE, {"k": 2}, (X,), **kw)


def test_bad_config_and_types():
    with pytest.raises(ValueError, match="config"):
        measure_config(SPACE, {"k": 7}, (X,))
    with pytest.raises(TypeError, match="space"):
        measure_config("nope", {"k": 2}, (X,))
    with pytest.raises(TypeError, match="args"):
        measure_config(SPACE, {"k": 2}, [X])


def test_fingerprint_stable_and_distinct():
    fp = fingerprint()
    for key in ("cpu", "features", "cores", "forced", "numpy", "torch", "python"):
        assert key in fp
    assert machine_id(fp) == machine_id(dict(fp)) == machine_id()
    assert len(machine_id(fp)) == 16
    assert machine_id(dict(fp, cpu="another cpu")) != machine_id(fp)
    with pytest.raises(TypeError, match="fp"):
        machine_id("x")


def test_check_output_scales_atol_with_the_output():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((256, 256)).astype(np.float32), rng.standard_normal((256, 256)).astype(np.float32)
    space = Space(
        "tc_measure.mm",
        (Param("k", (1,)),),
        lambda cfg: np.matmul,
        lambda a, b: {"M": a.shape[0], "K": a.shape[1], "N": b.shape[1]},
        SPACE.make_args,
        SPACE.default,
    )
    exact = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)  # |C| ~ 16: fp32 rounding ~1e-5 abs
    assert check_output(space, a @ b, exact, (a, b), {}) is None
    wrong = exact.copy()
    wrong[3, 4] += 0.05
    assert "wrong result" in check_output(space, wrong, exact, (a, b), {})
    assert "wrong result" in check_output(space, exact[:, :255], exact, (a, b), {})  # shape mismatch
