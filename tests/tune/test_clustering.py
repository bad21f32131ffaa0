"""Clustering variants [Q236]: k-means over space features, one measured medoid per cluster, estimates for new
variants without measuring them, bounded reuse error (GEMM variants at 128^3 timed by the deterministic proxy MODEL;
one test compiles and runs real schedule variants)."""

from __future__ import annotations

import numpy as np
import pytest

from tinylearn import tunable
from tinylearn.tune.clustering import VariantClusters, time_config
from tinylearn.tune.proxy_model import cpu_params, gemm_cost
from tinylearn.tune.searchers import config_key

SHAPE = {"M": 128, "K": 128, "N": 128}


@pytest.fixture(scope="module")
def table():
    """The GEMM space's valid configurations at 128^3 and a deterministic time for each: the analytic proxy MODEL's
    cycles on this ISA's parameters over the thread count (the clustering mechanism is what is tested here; measured
    times would make the bounds below timing asserts, and the notebook's section measures real variants)."""
    space = tunable.get("gemm.matmul")
    configs = list(space.configs(SHAPE))
    times = np.array(
        [
            gemm_cost(cpu_params(c["isa"]), 128, 128, 128, c["mc"], c["kc"], c["nc"]).cycles / c["threads"] * 1e-9
            for c in configs
        ]
    )
    return space, configs, times


def _lookup(configs, times):
    t = {config_key(c): s for c, s in zip(configs, times)}
    calls = []

    def measure_(cfg):
        calls.append(cfg)
        return t[config_key(cfg)]

    return measure_, calls


def test_one_measurement_per_cluster_and_medoids_estimate_themselves(table):
    space, configs, times = table
    meas, calls = _lookup(configs, times)
    vc = VariantClusters(space, 8, measure=meas).fit(configs, SHAPE)
    assert vc.measured == len(calls) == len(vc.clusters) <= 8
    assert sum(len(c.members) for c in vc.clusters) == len(configs)
    for cl in vc.clusters:
        assert cl.medoid in cl.members
        assert vc.estimate(cl.medoid) == cl.seconds
        assert all(vc.cluster_of(m) is cl for m in cl.members)


def test_reuse_error_is_bounded_and_vanishes_with_one_cluster_per_variant(table):
    space, configs, times = table
    meas, _ = _lookup(configs, times)
    err12 = VariantClusters(space, 12, measure=meas).fit(configs, SHAPE).reuse_error(configs, times)
    err1 = VariantClusters(space, 1, measure=meas).fit(configs, SHAPE).reuse_error(configs, times)
    assert np.median(err12) < np.median(err1), (np.median(err12), np.median(err1))  # clusters beat one estimate
    distinct = len({tuple(space.features(c, SHAPE)) for c in configs})
    err_all = VariantClusters(space, distinct, measure=meas).fit(configs, SHAPE).reuse_error(configs, times)
    assert np.median(err_all) <= np.median(err12) and np.median(err_all) == 0.0


def test_new_variants_are_estimated_without_measuring_them(table):
    space, configs, times = table
    idx = np.random.default_rng(3).permutation(len(configs))
    old, new = idx[: 2 * len(idx) // 3], idx[2 * len(idx) // 3 :]
    meas, calls = _lookup(configs, times)
    vc = VariantClusters(space, 8, measure=meas).fit([configs[i] for i in old], SHAPE)
    n_calls = len(calls)
    err = vc.reuse_error([configs[i] for i in new], times[new])
    assert len(calls) == n_calls  # nothing new was measured
    medoid_times = {cl.seconds for cl in vc.clusters}
    assert all(vc.estimate(configs[i]) in medoid_times for i in new)  # each estimate is a measured medoid's time
    assert len(err) == len(new) and np.all(np.isfinite(err))
    # the fastest cluster's representative is close to the best variant overall
    assert vc.best().seconds <= 2.0 * times.min()


def test_default_measurer_runs_the_compiled_schedule_variants():
    space = tunable.get("compiler.schedule")
    shape = {"R": 8, "C": 256}
    configs = [c for c in space.configs(shape) if c["unroll"] in (1, 4) and c["tile"] in (1, 64)][:8]
    vc = VariantClusters(space, 3).fit(configs, shape)
    assert vc.measured == 3 and all(c.seconds > 0 for c in vc.clusters)
    assert time_config(space, shape)(configs[0]) > 0


def test_bad_arguments(table):
    space, configs, times = table
    with pytest.raises(ValueError, match="k"):
        VariantClusters(space, 0)
    with pytest.raises(ValueError, match="configs"):
        VariantClusters(space, 5, measure=lambda c: 1.0).fit(configs[:3], SHAPE)
    with pytest.raises(ValueError, match="not valid"):
        VariantClusters(space, 1, measure=lambda c: 1.0).fit([dict(configs[0], kc=1024)], SHAPE)
    with pytest.raises(RuntimeError, match="fit"):
        VariantClusters(space, 2).estimate(configs[0])
    with pytest.raises(TypeError, match="measure"):
        VariantClusters(space, 2, measure=3)
