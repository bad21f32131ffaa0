"""The contention-aware alpha-beta-gamma model (p ranks sharing c cores), its least-squares fit, the simulator's
agreement with it, and the benchmark's calibration/validation analysis.

Fits are checked on synthetic times generated from known constants (they must come back); one small real
measurement only checks that the pipeline yields finite, non-negative constants (timings are never asserted).
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

import tinylearn as tl
from tinylearn.dist import bench
from tinylearn.dist import cost_model as cm

TRUE = cm.ContendedParams(alpha_s=80e-6, sched_s=1.5e-3, beta_s_per_byte=1 / 1.2e9, gamma_s_per_byte=1 / 14e9)
SIZES = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]


def _synthetic(algs: list[str], ps: list[int], sizes: list[int], cores: int, noise: float = 0.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    rows = [(a, n, p) for a in algs for p in ps for n in sizes]
    t = [cm.predict_contended(a, n, p, TRUE, cores) * math.exp(noise * rng.standard_normal()) for a, n, p in rows]
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], t


def test_core_share_and_oversubscription() -> None:
    assert cm.core_share(1, 2) == 1 and cm.core_share(2, 2) == 1 and cm.core_share(4, 2) == 2
    assert cm.oversubscription(2, 2) == 0 and cm.oversubscription(8, 2) == 3 and cm.oversubscription(3, 2) == 0.5
    with pytest.raises(ValueError, match="cores"):
        cm.core_share(2, 0)


@pytest.mark.parametrize("algorithm", cm.ALGORITHMS)
def test_contended_model_is_predict_with_scaled_constants_when_all_ranks_are_busy(algorithm: str) -> None:
    # ring, halving/recursive doubling at powers of two, hierarchical, and any algorithm at p = 2 keep every rank
    # active in every step: the whole textbook formula runs with alpha + o sched, s beta, s gamma
    n = 3 << 20
    for p, c in ((2, 2), (4, 2), (8, 2), (4, 8), (2, 1)):
        if algorithm == "tree" and p > 2:
            continue
        s, o = max(1, p / c), max(0, p / c - 1)
        want = cm.predict(
            algorithm,
            n,
            p,
            TRUE.alpha_s + o * TRUE.sched_s,
            s * TRUE.beta_s_per_byte,
            s * TRUE.gamma_s_per_byte,
        )
        got = cm.predict_contended(algorithm, n, p, TRUE, c)
        assert got == pytest.approx(want, rel=1e-12)
        x = cm.contended_features(algorithm, n, p, c)
        assert float(x @ TRUE.as_array()) == pytest.approx(got, rel=1e-12)
    # a core per rank: the plain model, whatever sched is
    assert cm.predict_contended(algorithm, n, 4, TRUE, 4) == pytest.approx(
        cm.predict(algorithm, n, 4, TRUE.alpha_s, TRUE.beta_s_per_byte, TRUE.gamma_s_per_byte), rel=1e-12
    )


def test_contended_coefficients_count_only_the_active_ranks() -> None:
    # tree, p=4 on 2 cores: reduce rounds move 2 messages (4 active ranks: s=2, o=1) then 1 (2 ranks: s=1, o=0),
    # the broadcast mirrors them: L = 4, O = 2*1, SB = 2*2 + 2*1, SR = 2 + 1
    assert cm.contended_coefficients("tree", 4, 2) == (4.0, 2.0, 6.0, 3.0)
    # p=8: 4, 2, 1 messages per round -> a = 8, 4, 2 -> s = 4, 2, 1, o = 3, 1, 0
    assert cm.contended_coefficients("tree", 8, 2) == (6.0, 8.0, 14.0, 7.0)
    # recursive doubling, p=6 on 2 cores: fold in/out between 2+2 ranks (s=2, o=1) around 2 core rounds of 4 ranks
    assert cm.contended_coefficients("recursive_doubling", 6, 2) == (4.0, 4.0, 8.0, 6.0)
    # p=5: one folded pair (2 active ranks: s=1, o=0), core of 4 (s=2, o=1)
    L, O, SB, SR = cm.contended_coefficients("halving_doubling", 5, 2)
    assert (L, O) == (6.0, 4.0) and SB == pytest.approx(2 * 1.5 + 2) and SR == pytest.approx(2 * 0.75 + 1)
    # the plain model's counts when a rank has a core each
    for alg in cm.ALGORITHMS:
        lat, b, r = cm.coefficients(alg, 6)
        assert cm.contended_coefficients(alg, 6, 64) == (lat, 0.0, b, r)
    with pytest.raises(ValueError, match="cores"):
        cm.contended_coefficients("ring", 4, 0)
    # one background thread of another job: 2 ranks + 1 on 2 cores -> s = 1.5, o = 0.5 in every step
    assert cm.contended_coefficients("ring", 2, 2, background=1.0) == (2.0, 1.0, 1.5, 0.75)
    # tree p=4: rounds of 4 + 1 and 2 + 1 active threads -> s = 2.5, 1.5
    assert cm.contended_coefficients("tree", 4, 2, background=1.0) == (4.0, 2 * 1.5 + 2 * 0.5, 2 * 2.5 + 2 * 1.5, 4.0)
    with pytest.raises(ValueError, match="background"):
        cm.contended_coefficients("ring", 4, 2, background=-1.0)


@pytest.mark.parametrize("algorithm", cm.ALGORITHMS)
@pytest.mark.parametrize("p", [2, 3, 4, 5, 6, 8])
def test_simulator_equals_contended_model_on_uniform_links(algorithm: str, p: int) -> None:
    if algorithm == "hierarchical" and p % tl.dist.default_node_size(p):
        pytest.skip("unequal nodes: the closed form is the largest-node approximation")
    for cores, bg in ((1, 0.0), (2, 0.0), (16, 0.0), (2, 0.7), (4, 3.0)):
        for n in (1 << 16, 5 << 20):
            sim = tl.dist.simulate(
                algorithm,
                p,
                n,
                TRUE.alpha_s,
                TRUE.beta_s_per_byte,
                gamma_s_per_byte=TRUE.gamma_s_per_byte,
                cores=cores,
                sched_s=TRUE.sched_s,
                background=bg,
            )
            model = cm.predict_contended(algorithm, n, p, TRUE, cores, background=bg)
            assert math.isclose(sim, model, rel_tol=1e-12), (algorithm, p, cores, bg, n, sim, model)


def test_coefficients_match_the_closed_forms() -> None:
    assert cm.coefficients("ring", 4) == (6.0, 1.5, 0.75)
    assert cm.coefficients("tree", 4) == (4.0, 4.0, 2.0)
    assert cm.coefficients("recursive_doubling", 8) == (3.0, 3.0, 3.0)
    assert cm.coefficients("halving_doubling", 6) == (6.0, 2 * 3 / 4 + 2, 3 / 4 + 1)
    assert cm.coefficients("ring", 1) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="algorithm"):
        cm.coefficients("butterfly", 4)


@pytest.mark.parametrize("algorithm", cm.ALGORITHMS)
def test_fit_recovers_alpha_sched_beta_with_measured_gamma(algorithm: str) -> None:
    a, n, p, t = _synthetic([algorithm], [2, 4], SIZES, cores=2)
    fit = cm.fit_contended(a, n, p, t, 2, gamma_s_per_byte=TRUE.gamma_s_per_byte)
    np.testing.assert_allclose(fit.as_array(), TRUE.as_array(), rtol=1e-6)


def test_fit_recovers_all_four_constants_from_a_family() -> None:
    # ring sends twice the bytes it reduces, recursive doubling as many: together they separate beta from gamma
    a, n, p, t = _synthetic(["ring", "recursive_doubling"], [2, 4, 8], SIZES, cores=2)
    fit = cm.fit_contended(a, n, p, t, 2)
    np.testing.assert_allclose(fit.as_array(), TRUE.as_array(), rtol=1e-6)


def test_fit_with_multiplicative_noise_stays_close() -> None:
    a, n, p, t = _synthetic(["ring", "tree", "recursive_doubling"], [2, 4], SIZES * 3, cores=2, noise=0.03, seed=1)
    fit = cm.fit_contended(a, n, p, t, 2, gamma_s_per_byte=TRUE.gamma_s_per_byte)
    np.testing.assert_allclose(fit.as_array(), TRUE.as_array(), rtol=0.15)
    # the fit minimises relative error: its predictions are within a few % of the noisy points on average
    pred = np.array([cm.predict_contended(x, y, z, fit, 2) for x, y, z in zip(a, n, p)])
    assert np.median(np.abs(pred / np.array(t) - 1)) < 0.05


def test_fit_without_oversubscribed_points_sets_sched_to_zero() -> None:
    a, n, p, t = _synthetic(["ring"], [2, 4], SIZES, cores=8)
    fit = cm.fit_contended(a, n, p, t, 8, gamma_s_per_byte=TRUE.gamma_s_per_byte)
    assert fit.sched_s == 0.0
    assert fit.alpha_s == pytest.approx(TRUE.alpha_s, rel=1e-6)
    assert fit.beta_s_per_byte == pytest.approx(TRUE.beta_s_per_byte, rel=1e-6)


def test_fit_with_background_load() -> None:
    rows = [(a, n, p) for a in ("ring", "tree") for p in (2, 4) for n in SIZES]
    t = [cm.predict_contended(a, n, p, TRUE, 2, background=0.8) for a, n, p in rows]
    fit = cm.fit_contended(*zip(*rows), t, 2, gamma_s_per_byte=TRUE.gamma_s_per_byte, background=0.8)
    np.testing.assert_allclose(fit.as_array(), TRUE.as_array(), rtol=1e-6)
    # the wrong background cannot reproduce both world sizes
    wrong = cm.fit_contended(*zip(*rows), t, 2, gamma_s_per_byte=TRUE.gamma_s_per_byte, background=0.0)
    pred = [cm.predict_contended(a, n, p, wrong, 2) for a, n, p in rows]
    assert max(abs(q / x - 1) for q, x in zip(pred, t)) > 0.02


def test_fit_one_oversubscription_level_leaves_sched_zero() -> None:
    # only p = 2 with a background thread: every message has o = 0.5, so alpha and sched are one number
    rows = [("ring", n, 2) for n in SIZES]
    t = [cm.predict_contended(a, n, p, TRUE, 2, background=1.0) for a, n, p in rows]
    fit = cm.fit_contended(*zip(*rows), t, 2, gamma_s_per_byte=TRUE.gamma_s_per_byte, background=1.0)
    assert fit.sched_s == 0.0 and fit.alpha_s == pytest.approx(TRUE.alpha_s + 0.5 * TRUE.sched_s, rel=1e-6)


def test_fit_bad_input() -> None:
    a, n, p, t = _synthetic(["ring"], [2, 4], SIZES, cores=2)
    with pytest.raises(ValueError, match="cannot separate"):  # one algorithm: beta and gamma are collinear
        cm.fit_contended(a, n, p, t, 2)
    with pytest.raises(ValueError, match="seconds"):
        cm.fit_contended("ring", [1, 2], [2, 2], [1.0], 2)
    with pytest.raises(ValueError, match="seconds"):
        cm.fit_contended("ring", [1, 2], [2, 2], [1.0, -1.0], 2)
    with pytest.raises(ValueError, match="gamma_s_per_byte"):
        cm.fit_contended("ring", n, p, t, 2, gamma_s_per_byte=float("nan"))


def test_fit_weighted_by_relative_standard_error() -> None:
    # one calibration point is off by +60% but its mean is known to be noisy (SE 50%); the others are exact with
    # SE 2%: the weighted fit (generalised least squares) follows the trusted points, the unweighted one does not
    a, n, p, t = _synthetic(["ring"], [2, 4], SIZES, cores=2)
    bad = SIZES.index(256 << 10)
    t[bad] *= 1.6
    sig = [0.02] * len(t)
    sig[bad] = 0.5
    kw = {"gamma_s_per_byte": TRUE.gamma_s_per_byte}
    weighted = cm.fit_contended(a, n, p, t, 2, rel_sigma=sig, **kw)
    plain = cm.fit_contended(a, n, p, t, 2, **kw)
    same = cm.fit_contended(a, n, p, t, 2, rel_sigma=[0.3] * len(t), **kw)  # equal weights: the plain fit
    np.testing.assert_allclose(same.as_array(), plain.as_array(), rtol=1e-9)

    def worst(f: cm.ContendedParams) -> float:
        return max(abs(cm.predict_contended(x, y, z, f, 2) / cm.predict_contended(x, y, z, TRUE, 2) - 1)
                   for x, y, z in zip(a, n, p))  # fmt: skip

    assert worst(weighted) < 0.01 < 0.05 < worst(plain)
    for bad_sig in ([0.1] * (len(t) - 1), [0.0] * len(t), [float("nan")] * len(t)):
        with pytest.raises(ValueError, match="rel_sigma"):
            cm.fit_contended(a, n, p, t, 2, rel_sigma=bad_sig, **kw)


def test_sample_weights_spend_samples_on_the_noisy_small_sizes() -> None:
    assert bench.sample_weights(SIZES) == {64 << 10: 8, 256 << 10: 8, 1 << 20: 4, 4 << 20: 2, 16 << 20: 1}
    assert bench.sample_weights(SIZES, cap=3) == {64 << 10: 3, 256 << 10: 3, 1 << 20: 3, 4 << 20: 2, 16 << 20: 1}
    assert bench.sample_weights([100, 100, 400]) == {100: 2, 400: 1}
    with pytest.raises(ValueError, match="cap"):
        bench.sample_weights(SIZES, cap=0)
    with pytest.raises(ValueError, match="sizes"):
        bench.sample_weights([0, 4])


def test_rel_se_is_the_bootstrap_standard_error_of_the_statistic() -> None:
    rng = np.random.default_rng(0)
    x = rng.exponential(1.0, 400) + 1.0  # mean 2, sd 1: SE of the mean = 1 / sqrt(400) / 2 = 2.5%
    assert bench.rel_se(x) == pytest.approx(0.025, rel=0.2)
    assert bench.rel_se(x[:100]) == pytest.approx(0.05, rel=0.25)  # 4x fewer samples: 2x the error
    assert bench.rel_se(x, "median") > 0.0
    assert bench.rel_se([3.0] * 5) == 0.01  # the floor: identical samples
    with pytest.raises(ValueError, match="statistic"):
        bench.rel_se(x, "mode")
    with pytest.raises(ValueError, match="samples"):
        bench.rel_se([1.0, -1.0])


def test_relative_errors_median_and_quartiles() -> None:
    e = cm.relative_errors([2.0], [[1.0, 2.0, 3.0, 4.0, 5.0]])
    np.testing.assert_allclose(e, [[0.5, 0.0, 1.0]])


def _synthetic_measurement(world_sizes: tuple[int, ...], cores: int, noise: float, background: float = 0.0) -> dict:
    rng = np.random.default_rng(3)
    out = {}
    for p in world_sizes:
        samples = {}
        for impl in bench.IMPLS:
            alg = bench.MODEL_ALGORITHM.get(impl, impl)
            params = TRUE if impl != "p2p ring floor" else cm.ContendedParams(*TRUE.as_array()[:3], 0.0)
            for nb in SIZES:
                t = cm.predict_contended(alg, nb, p, params, cores, background=background)
                samples[(nb, impl)] = list(t * np.exp(noise * rng.standard_normal(9)))
        out[p] = {"gamma": TRUE.gamma_s_per_byte * cm.core_share(p, cores), "samples": samples}
    return out


def test_calibrate_fits_on_calibration_sizes_and_validates_on_the_rest() -> None:
    cal, val = bench.split_sizes(SIZES)
    assert cal == [64 << 10, 1 << 20, 16 << 20] and val == [256 << 10, 4 << 20]
    with pytest.raises(ValueError, match="sizes"):
        bench.split_sizes([1, 2])
    res = bench.calibrate(_synthetic_measurement((2, 4), 2, 0.0), bench.IMPLS, SIZES, 2)
    assert res["gamma"] == pytest.approx(TRUE.gamma_s_per_byte)
    for impl, fit in res["fits"].items():
        assert fit.alpha_s == pytest.approx(TRUE.alpha_s, rel=1e-6), impl
        assert fit.sched_s == pytest.approx(TRUE.sched_s, rel=1e-6), impl
    assert len(res["rows"]) == len(bench.IMPLS) * 2 * len(SIZES)
    assert {r["set"] for r in res["rows"] if r["nbytes"] in val} == {"val"}
    assert max(abs(r["err"]) for r in res["rows"]) < 1e-9  # noise-free: the validation points are predicted
    text = bench.error_table(res, "val")
    assert "halving_doubling" in text and " cal " not in text


@pytest.mark.parametrize("statistic", bench.STATISTICS)
def test_calibrate_statistic_mean_or_median(statistic: str) -> None:
    m = _synthetic_measurement((2, 4), 2, 0.0)
    # a bimodal point (the scheduler's slow mode): 4 of 9 samples +3 ms. The median stays in the fast mode, the
    # mean moves by 4/9 of the wait
    nb = 256 << 10
    fast = m[2]["samples"][(nb, "ring")][0]
    m[2]["samples"][(nb, "ring")] = [fast] * 5 + [fast + 3e-3] * 4
    res = bench.calibrate(m, ["ring"], SIZES, 2, statistic=statistic)
    assert res["statistic"] == statistic
    row = next(r for r in res["rows"] if r["p"] == 2 and r["nbytes"] == nb)
    assert row["slow_frac"] == pytest.approx(4 / 9) and row["n"] == 9
    assert row["err_median"] == pytest.approx(0.0, abs=1e-9)
    assert row["err_mean"] == pytest.approx(4 / 9 * 3e-3 / row["pred_s"], rel=1e-9)
    assert row["err"] == (row["err_mean"] if statistic == "mean" else row["err_median"])
    assert row["err_lo"] <= row["err"] <= row["err_hi"]
    summ = bench.error_summary(res)
    assert summ[("ring", 4)]["within"] == 2 and summ[("ring", 4)]["worst"] < 1e-9
    assert summ[("ring", 2)]["n"] == 2
    with pytest.raises(ValueError, match="statistic"):
        bench.calibrate(m, ["ring"], SIZES, 2, statistic="mode")


def test_calibrate_fits_the_background_load() -> None:
    m = _synthetic_measurement((2, 4), 2, 0.0, background=1.3)
    res = bench.calibrate(m, bench.IMPLS, SIZES, 2)
    assert res["background"] == pytest.approx(1.3)
    assert max(abs(r["err"]) for r in res["rows"]) < 1e-6
    assert bench.calibrate(m, ["ring"], SIZES, 2, background=0.5)["background"] == 0.5
    with pytest.raises(ValueError, match="background"):
        bench.calibrate(m, ["ring"], SIZES, 2, background="auto")
    # one world size: nothing separates the background from alpha and beta
    one = {2: m[2]}
    assert bench.calibrate(one, ["ring"], SIZES, 2)["background"] == 0.0


def test_mean_ci_and_slow_fraction() -> None:
    x = [1.0, 1.1, 0.9, 1.0, 5.0, 1.05]
    lo, hi = bench.mean_ci(x)
    assert lo < np.mean(x) < hi and lo >= min(x) and hi <= max(x)
    assert bench.mean_ci(x) == (lo, hi)  # deterministic
    assert bench.slow_fraction(x) == pytest.approx(1 / 6)
    assert bench.slow_fraction([2.0, 2.0]) == 0.0


def test_calibrate_never_uses_validation_points() -> None:
    m = _synthetic_measurement((2, 4), 2, 0.0)
    ref = bench.calibrate(m, ["ring"], SIZES, 2)["fits"]["ring"]
    for p in m:
        for nb in (256 << 10, 4 << 20):  # wreck the validation points: the fit must not move
            m[p]["samples"][(nb, "ring")] = [1e3] * 9
    res = bench.calibrate(m, ["ring"], SIZES, 2)
    assert res["fits"]["ring"] == ref
    assert all(r["err"] > 100 for r in res["rows"] if r["set"] == "val")


def test_calibrate_weights_points_by_their_standard_error() -> None:
    m = _synthetic_measurement((2, 4), 2, 0.0)
    ref = bench.calibrate(m, ["ring"], SIZES, 2)["fits"]["ring"]
    # a calibration point whose samples are two-mode (the mean is 1.6x the model, with a wide spread): the
    # weighted fit barely moves, the unweighted one is pulled towards it
    t = m[2]["samples"][(64 << 10, "ring")][0]
    m[2]["samples"][(64 << 10, "ring")] = [t * 0.2] * 6 + [t * 3.0] * 4
    w = bench.calibrate(m, ["ring"], SIZES, 2)
    u = bench.calibrate(m, ["ring"], SIZES, 2, weighted=False)
    assert w["weighted"] and not u["weighted"]
    row = next(r for r in w["rows"] if r["p"] == 2 and r["nbytes"] == 64 << 10)
    assert row["rel_se"] > 0.2 and row["cv"] > 0.8 and row["n"] == 10
    assert all(r["rel_se"] == 0.01 for r in w["rows"] if r["nbytes"] != 64 << 10 or r["p"] != 2)

    def gap(fit: cm.ContendedParams) -> float:
        return max(abs(cm.predict_contended("ring", nb, p, fit, 2) / cm.predict_contended("ring", nb, p, ref, 2) - 1)
                   for nb in SIZES for p in (2, 4))  # fmt: skip

    assert gap(w["fits"]["ring"]) < 0.05 < gap(u["fits"]["ring"])


def test_measure_bad_input() -> None:
    with pytest.raises(ValueError, match="rounds"):
        bench.measure((2,), SIZES, ["ring"], rounds=0)
    with pytest.raises(ValueError, match="rounds"):
        bench.measure((2, 4), SIZES, ["ring"], rounds={2: 3})
    with pytest.raises(ValueError, match="chunks"):
        bench.measure((2,), SIZES, ["ring"], rounds=3, chunks=0)
    with pytest.raises(ValueError, match="weights"):
        bench.measure((2,), SIZES, ["ring"], rounds=3, weights={SIZES[0]: 0})


def test_real_measurement_smoke() -> None:
    sizes = [64 << 10, 128 << 10, 256 << 10]
    m = bench.measure((2,), sizes, ["ring", "gloo"], rounds={2: 3}, chunks=2, weights={64 << 10: 2})
    assert m[2]["awake"] == hasattr(os, "SCHED_IDLE")  # spinners by default, where Linux has them
    assert all(len(v) == (6 if k[0] == 64 << 10 else 3) and all(x > 0 for x in v) for k, v in m[2]["samples"].items())
    res = bench.calibrate(m, ["ring", "gloo"], sizes, bench.cores_available())
    for fit in res["fits"].values():
        arr = fit.as_array()
        assert np.all(np.isfinite(arr)) and np.all(arr >= 0) and arr[0] + arr[2] > 0
    assert all(np.isfinite(r["err"]) and r["pred_s"] > 0 for r in res["rows"])


def _sched_policy(pid: int) -> int:
    return os.sched_getscheduler(pid)


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux-only")
def test_keep_cores_awake_spinners_are_idle_class_and_go_away() -> None:
    from tinylearn.dist.keep_awake import keep_cores_awake

    cores = sorted(os.sched_getaffinity(0))
    with keep_cores_awake() as ka:
        assert ka.active and len(ka.pids) == len(cores), ka.reason
        for pid, core in zip(ka.pids, cores):
            assert _sched_policy(pid) == os.SCHED_IDLE  # never takes time from a runnable rank
            assert os.sched_getaffinity(pid) == {core}
        pids = list(ka.pids)
    assert not ka.active
    for pid in pids:  # reaped: the pid is gone (or reused by an unrelated process, not ours)
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    with keep_cores_awake(enabled=False) as off:
        assert not off.active and "disabled" in off.reason
    with pytest.raises(ValueError, match="cores"):
        keep_cores_awake(cores=[-1])
    with pytest.raises(ValueError, match="cores"):
        keep_cores_awake(cores=[True])


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux-only")
def test_keep_cores_awake_spinner_exits_when_its_parent_dies(tmp_path) -> None:
    # a parent that starts spinners and is killed before it can stop them: the spinners notice and exit
    import signal
    import subprocess
    import sys
    import time

    code = (
        "from tinylearn.dist.keep_awake import keep_cores_awake\n"
        "import sys, time\n"
        "k = keep_cores_awake(cores=[0]).__enter__()\n"
        "print(k.pids[0], flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{child}/stat") as f:
            if f.read().split(")")[-1].split()[0] == "Z":  # exited, not yet reaped by init
                break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("spinner outlived its parent by 10 s")


def test_measure_reports_whether_cores_were_kept_awake() -> None:
    m = bench.measure((2,), [64 << 10, 128 << 10, 256 << 10], ["gloo"], rounds={2: 1}, chunks=1, keep_awake=False)
    assert m[2]["awake"] is False
