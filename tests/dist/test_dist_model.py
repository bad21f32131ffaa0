"""alpha-beta-gamma cost model and the event-driven simulator (no processes needed)."""

from __future__ import annotations

import math
import time

import pytest

import tinylearn as tl
from tinylearn.dist import cost_model as cm
from tinylearn.dist.simulator import TwoLevel, simulate

ALGS = cm.ALGORITHMS


@pytest.mark.parametrize("algorithm", ALGS)
def test_simulator_agrees_with_closed_form_on_uniform_links(algorithm: str) -> None:
    for p in (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 31, 64, 100, 256):
        if algorithm == "hierarchical" and p % tl.dist.default_node_size(p):
            continue
        for n in (0, 1, 4096, 1 << 20, 123_456_789):
            for alpha, beta, gamma in ((1e-5, 1e-10, 0.0), (3e-6, 4e-9, 1e-10), (0.0, 1e-9, 0.0)):
                s = simulate(algorithm, p, n, alpha, beta, gamma_s_per_byte=gamma)
                c = cm.predict(algorithm, n, p, alpha, beta, gamma)
                assert math.isclose(s, c, rel_tol=1e-9, abs_tol=1e-15), (algorithm, p, n, s, c)


def test_hierarchical_explicit_node_sizes_agree_when_divisible() -> None:
    for p, k in ((8, 2), (8, 4), (12, 3), (64, 8), (1024, 16)):
        s = simulate("hierarchical", p, 1 << 24, 1e-5, 1e-10, node_size=k)
        c = cm.predict("hierarchical", 1 << 24, p, 1e-5, 1e-10, node_size=k)
        assert math.isclose(s, c, rel_tol=1e-9)
    # uneven nodes still simulate (serialised ports), no worse than the largest-node formula by much
    s = simulate("hierarchical", 10, 1 << 20, 1e-5, 1e-10, node_size=4)
    assert s > 0


def test_closed_form_values() -> None:
    a, b, n = 1e-5, 1e-9, 1 << 20
    assert cm.predict("ring", n, 4, a, b) == pytest.approx(6 * a + 1.5 * n * b)
    assert cm.predict("tree", n, 4, a, b) == pytest.approx(4 * (a + n * b))
    assert cm.predict("recursive_doubling", n, 8, a, b) == pytest.approx(3 * (a + n * b))
    assert cm.predict("halving_doubling", n, 8, a, b) == pytest.approx(6 * a + 2 * 7 / 8 * n * b)
    assert cm.predict("hierarchical", n, 16, a, b, node_size=4) == pytest.approx(12 * a + 2 * 15 / 16 * n * b)
    assert cm.predict("ring", n, 1, a, b) == 0.0
    # ring is bandwidth-optimal: at huge n it beats tree and recursive doubling; at tiny n it loses
    assert cm.predict("ring", 1 << 30, 64, a, b) < cm.predict("tree", 1 << 30, 64, a, b)
    assert cm.predict("ring", 8, 64, a, b) > cm.predict("recursive_doubling", 8, 64, a, b)
    with pytest.raises(ValueError, match="algorithm"):
        cm.predict("butterfly", 1, 2, a, b)
    with pytest.raises(ValueError, match="world_size"):
        cm.predict("ring", 1, 0, a, b)
    with pytest.raises(ValueError, match="algorithm"):
        simulate("butterfly", 4, 100)


def test_fit_alpha_beta_recovers_constants() -> None:
    sizes = [2**k for k in range(4, 26, 2)]
    times = [7e-5 + 3e-10 * s for s in sizes]
    a, b = cm.fit_alpha_beta(sizes, times)
    assert a == pytest.approx(7e-5, rel=1e-6) and b == pytest.approx(3e-10, rel=1e-6)
    with pytest.raises(ValueError, match="nbytes"):
        cm.fit_alpha_beta([1], [1.0])


def test_selector_and_crossovers() -> None:
    a, b = 1e-5, 1e-10
    algs = ("ring", "tree", "recursive_doubling")
    assert cm.select(8, 64, a, b, algorithms=algs) == "recursive_doubling"
    assert cm.select(1 << 30, 64, a, b, algorithms=algs) == "ring"
    pts = cm.crossover_points(64, a, b, algorithms=algs)
    assert len(pts) == 1 and pts[0][1:] == ("recursive_doubling", "ring")
    n = pts[0][0]
    assert cm.predict("ring", n * 1.01, 64, a, b) <= cm.predict("recursive_doubling", n * 1.01, 64, a, b)
    assert cm.predict("ring", n * 0.99, 64, a, b) >= cm.predict("recursive_doubling", n * 0.99, 64, a, b)
    assert cm.bus_bandwidth(1e9, 1.0, 4) == pytest.approx(1.5e9)


def test_two_level_topology_makes_hierarchical_win_at_scale_fast() -> None:
    topo = TwoLevel(node_size=8)
    t0 = time.perf_counter()
    ring = simulate("ring", 1024, 1 << 26, topology=topo)
    hier = simulate("hierarchical", 1024, 1 << 26, topology=topo)
    assert time.perf_counter() - t0 < 10
    assert hier < ring
    # a flat ring on a two-level network is paced by its slowest (inter-node) link every step
    expect = 2 * 1023 * (topo.inter_alpha_s + (1 << 26) / 1024 * topo.inter_beta_s_per_byte)
    assert ring == pytest.approx(expect, rel=1e-9)
    # a dict works as a topology, and one node of everything is the intra-node ring
    one = simulate("ring", 8, 1e6, topology={"node_size": 8})
    assert one == pytest.approx(cm.predict("ring", 1e6, 8, topo.intra_alpha_s, topo.intra_beta_s_per_byte))
    with pytest.raises(TypeError, match="topology"):
        simulate("ring", 8, 1e6, topology="fat-tree")


def test_topology_dict_aliases() -> None:
    a = simulate("hierarchical", 64, 1 << 20, topology={"gpus_per_node": 8, "inter_bandwidth": 25e9})
    b = simulate("hierarchical", 64, 1 << 20, topology=TwoLevel(node_size=8, inter_beta_s_per_byte=1 / 25e9))
    assert a == b
    with pytest.raises(TypeError, match="foo"):
        simulate("ring", 8, 1, topology={"foo": 1})
