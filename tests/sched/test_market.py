"""Vickrey auction (prices, k units, reserve, truthfulness by sweeping bids), power-slot auction, proportional share,
and normal-form games: pure Nash equilibria vs brute force on known games, best-response dynamics, price of
anarchy of the MODEL shared-device game."""

from __future__ import annotations

import numpy as np
import pytest

from tinylearn.sched.market import (
    auction_utility,
    best_response_dynamics,
    power_slot_auction,
    price_of_anarchy,
    proportional_share,
    pure_nash,
    second_price_auction,
    shared_device_game,
)


def test_second_price_one_and_k_units() -> None:
    r = second_price_auction({"a": 10.0, "b": 7.0, "c": 3.0})
    assert r.winners == ["a"] and r.price == 7.0 and r.payments == {"a": 7.0, "b": 0.0, "c": 0.0}
    r2 = second_price_auction({"a": 10.0, "b": 7.0, "c": 3.0, "d": 5.0}, units=2)
    assert r2.winners == ["a", "b"] and r2.price == 5.0
    r3 = second_price_auction({"a": 10.0, "b": 7.0}, units=1, reserve=8.0)
    assert r3.winners == ["a"] and r3.price == 8.0
    r4 = second_price_auction({"a": 1.0, "b": 2.0}, reserve=5.0)
    assert r4.winners == [] and r4.price == 0.0
    r5 = second_price_auction({"a": 4.0, "b": 4.0})
    assert r5.winners == ["a"] and r5.price == 4.0


@pytest.mark.parametrize("units", [1, 2])
def test_truthful_bidding_is_optimal(units: int) -> None:
    rng = np.random.default_rng(5)
    for _ in range(50):
        others = {f"o{i}": float(rng.uniform(0, 10)) for i in range(4)}
        value = float(rng.uniform(0, 10))
        truthful = auction_utility(value, value, others, units)
        for bid in np.linspace(0, 12, 49):
            assert auction_utility(value, float(bid), others, units) <= truthful + 1e-12
    # and first-price-style shading would help in a pay-your-bid auction, but here overbidding can hurt:
    assert auction_utility(5.0, 9.0, {"x": 8.0}) == pytest.approx(-3.0)


def test_power_slot_auction_and_proportional_share() -> None:
    bids = {"a": 9.0, "b": 6.0, "c": 4.0, "d": 1.0}
    r = power_slot_auction(bids, budget_w=1000.0, slot_w=150.0, base_w=700.0)  # 2 slots
    assert r.winners == ["a", "b"] and r.price == 4.0
    assert power_slot_auction(bids, budget_w=700.0, slot_w=150.0, base_w=650.0).winners == []
    ps = proportional_share({"a": 3.0, "b": 1.0}, 400.0)
    assert ps == pytest.approx({"a": 300.0, "b": 100.0})
    assert proportional_share({"a": 0.0, "b": 0.0}, 10.0) == {"a": 5.0, "b": 5.0}


def test_pure_nash_known_games() -> None:
    # prisoner's dilemma (payoffs: (row, col)); strategy 0 = cooperate, 1 = defect
    pd = np.array([[[3, 3], [0, 5]], [[5, 0], [1, 1]]], dtype=float)
    assert pure_nash(pd) == [(1, 1)]
    poa, opt, eqs = price_of_anarchy(pd)
    assert opt == (0, 0) and poa == pytest.approx(3.0)
    # matching pennies: no pure equilibrium, best-response dynamics cycles
    mp = np.array([[[1, -1], [-1, 1]], [[-1, 1], [1, -1]]], dtype=float)
    assert pure_nash(mp) == []
    _, _, conv = best_response_dynamics(mp, (0, 0), max_rounds=20)
    assert not conv


def test_shared_device_game_tragedy_of_the_commons() -> None:
    strategies = {"b1": (1, False), "b8": (8, False), "b32": (32, False), "b8-int8": (8, True)}
    pay, names = shared_device_game(strategies, n_players=3)
    eqs = pure_nash(pay)
    assert eqs
    # brute-force check of the equilibrium property
    for e in eqs:
        for i in range(3):
            for s in range(len(names)):
                dev = list(e)
                dev[i] = s
                assert pay[tuple(dev)][i] <= pay[e][i] + 1e-9
    prof, path, conv = best_response_dynamics(pay, (0, 0, 0))
    assert conv and prof in eqs
    poa, opt, _ = price_of_anarchy(pay)
    assert poa > 1.05  # selfish batching costs welfare in this MODEL
    assert pay.sum(axis=-1)[opt] >= max(pay.sum(axis=-1)[e] for e in eqs)


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="^bids"):
        second_price_auction({"a": -1.0})
    with pytest.raises(ValueError, match="^units"):
        second_price_auction({"a": 1.0}, units=0)
    with pytest.raises(ValueError, match="^payoffs"):
        pure_nash(np.zeros((2, 2, 3)))
    with pytest.raises(ValueError, match="^start"):
        best_response_dynamics(np.zeros((2, 2, 2)), (0, 5))
    with pytest.raises(ValueError, match="^budget"):
        proportional_share({"a": 1.0}, -5.0)
