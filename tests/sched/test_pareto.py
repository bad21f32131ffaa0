"""Online Pareto front vs a brute-force non-dominated filter on random streams; exact 2-D and Monte Carlo
hypervolume; weighted sum vs epsilon-constraint on a non-convex front; Tchebycheff queue order; kernel objective."""

from __future__ import annotations

import numpy as np
import pytest

from tinylearn.sched.device_model import A100
from tinylearn.sched.pareto import (
    ParetoFront,
    TchebycheffQueue,
    choose_kernel,
    dominates,
    epsilon_constraint,
    hypervolume_2d,
    job_objectives,
    kernel_objective,
    pareto_choice,
    supported_by_weighted_sum,
    tchebycheff,
    weighted_sum,
)


def _brute(points: list[tuple]) -> set[tuple]:
    return {p for p in points if not any(dominates(q, p) for q in points)}


@pytest.mark.parametrize("k", [2, 3, 4])
def test_online_front_equals_brute_force(k: int) -> None:
    rng = np.random.default_rng(k)
    for _ in range(20):
        pts = [tuple(map(float, rng.integers(0, 12, size=k))) for _ in range(60)]
        f = ParetoFront(k)
        for i, p in enumerate(pts):
            f.insert(p, payload=i)
            assert set(f.points()) == _brute(pts[: i + 1])  # the invariant after every insert
        for p, payload in f.items():
            assert pts[payload] == p


def test_insert_return_values() -> None:
    f = ParetoFront(2)
    assert f.insert((2, 2)) and not f.insert((3, 3)) and not f.insert((2, 2))
    assert f.insert((1, 3)) and f.insert((1, 1))  # (1, 1) prunes both members
    assert f.points() == [(1.0, 1.0)] and f.pruned == 2


def test_hypervolume_2d_and_mc() -> None:
    pts = [(1, 3), (2, 2), (3, 1)]
    assert hypervolume_2d(pts, (4, 4)) == pytest.approx(6.0)
    rng = np.random.default_rng(0)
    raw = [tuple(rng.uniform(0, 1, size=2)) for _ in range(30)]
    f = ParetoFront(2)
    for p in raw:
        f.insert(p)
    # grid estimate of the same area
    g = np.linspace(0, 1.2, 601)[:-1] + 0.001
    xx, yy = np.meshgrid(g, g)
    dom = np.zeros_like(xx, dtype=bool)
    for p in f.points():
        dom |= (xx >= p[0]) & (yy >= p[1])
    assert f.hypervolume((1.2, 1.2)) == pytest.approx(dom.mean() * 1.44, abs=0.01)
    # 3-D Monte Carlo on a single point: the box [p, ref] exactly
    f3 = ParetoFront(3)
    f3.insert((0.5, 0.5, 0.5))
    f3.insert((0.2, 0.8, 0.9))
    hv, se = f3.hypervolume_mc((1, 1, 1), samples=40000, seed=1)
    exact = 0.125 + 0.8 * 0.2 * 0.1 - 0.5 * 0.2 * 0.1  # union of the two boxes by inclusion-exclusion
    assert abs(hv - exact) <= 5 * se + 1e-9


def test_weighted_sum_misses_nonconvex_point() -> None:
    # (time, energy): b lies above the segment a-c, so no weighted sum picks it, but it is Pareto-optimal
    cands = [(1.0, 10.0), (6.0, 6.0), (10.0, 1.0), (9.0, 9.0)]
    front = pareto_choice(cands)
    assert front == [0, 1, 2]
    assert 1 not in supported_by_weighted_sum(cands)
    assert epsilon_constraint(cands, primary=0, bounds={1: 7.0}) == 1
    assert epsilon_constraint(cands, primary=0, bounds={1: 0.5}) is None
    assert weighted_sum(cands, [1, 0]) == 0 and weighted_sum(cands, [0, 1]) == 2
    # Tchebycheff reaches it: equal weights, ideal (1, 1)
    scores = [tchebycheff(c, (1, 1), (1, 1), (1, 1)) for c in cands]
    assert int(np.argmin(scores)) == 1


def test_tchebycheff_queue_order_and_model_objectives() -> None:
    q = TchebycheffQueue(weights=(1.0, 1.0, 1.0), ideal=(0.0, 0.0, -10.0), scale=(100.0, 10.0, 1.0))
    jobs = {"cool": (150.0, 45.0, -8.0), "hot": (400.0, 75.0, -10.0), "slow": (100.0, 40.0, -2.0)}
    for name, obj in jobs.items():
        q.push(name, obj)
    order = [q.pop()[0] for _ in range(3)]
    expect = sorted(jobs, key=lambda n: max(abs(a - z) / s for a, z, s in zip(jobs[n], (0, 0, -10), (100, 10, 1))))
    assert order == expect
    with pytest.raises(IndexError):
        q.pop()
    lo = job_objectives(A100, 1e12, 1e9, A100.f_min_mhz, 1.0)
    hi = job_objectives(A100, 1e12, 1e9, A100.f_max_mhz, 1.0)
    assert lo[0] < hi[0] and lo[1] < hi[1] and lo[2] > hi[2]  # lower clock: less power, cooler, slower


def test_kernel_objective_and_choice() -> None:
    assert kernel_objective(2.0, 8.0, 0.5) == pytest.approx(4.0)
    cands = {"fast": (1.0, 10.0), "frugal": (4.0, 2.0), "mid": (2.0, 4.5)}
    picks = {a: choose_kernel(cands, a) for a in (0.0, 0.5, 1.0)}
    assert picks == {0.0: "frugal", 0.5: "frugal", 1.0: "fast"}
    for a in np.linspace(0, 1, 11):
        best = min(cands, key=lambda k: cands[k][0] ** a * cands[k][1] ** (1 - a))
        assert choose_kernel(cands, float(a)) == best


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="^n_obj"):
        ParetoFront(0)
    with pytest.raises(ValueError, match="^point"):
        ParetoFront(2).insert((1.0,))
    with pytest.raises(ValueError, match="^alpha"):
        kernel_objective(1.0, 1.0, 1.5)
    with pytest.raises(ValueError, match="^joules"):
        kernel_objective(1.0, 0.0, 0.5)
    with pytest.raises(ValueError, match="^weights"):
        weighted_sum([(1, 2)], [0, 0])
    with pytest.raises(ValueError, match="^candidates"):
        pareto_choice([])
    with pytest.raises(ValueError, match="^bounds"):
        epsilon_constraint([(1, 2)], 0, {0: 1.0})
