"""Markets for a shared power budget, and strategies competing on a shared device as a game.

**Second-price (Vickrey) auction** [Q172] (W. Vickrey, "Counterspeculation, auctions, and competitive sealed
tenders", J. Finance 1961): tenants bid for ``units`` identical slots (a high-clock / extra-power slot of the
device's power budget, each tenant wanting one). The ``units`` highest bids at or above the reserve win, and every
winner pays the same price: the highest LOSING bid (the (k+1)-th bid), or the reserve if that is higher. A winner's
payment does not depend on its own bid, so bidding one's true value is a weakly dominant strategy: overbidding only
adds wins at a price above the value (negative utility), underbidding only loses wins that were profitable.
``power_slot_auction`` turns a power budget into slots: ``floor((budget - base) / slot_w)`` units.

**Proportional share** (F. Kelly, "Charging and rate control for elastic traffic", 1997): each tenant gets
``budget * b_i / sum_j b_j`` -- weighted fair, no losers, but not truthful (it is a game of its own).

**Normal-form games** [Q171]: each of n tenants picks a strategy (batch policy, quantisation level, KV reuse) and
gets a payoff that depends on everyone's choice, because they share one device. ``pure_nash`` finds every profile
where no player gains by deviating alone (best-response enumeration over all profiles), ``best_response_dynamics``
lets players in turn switch to a best response (it converges for potential games such as congestion games, and can
cycle otherwise; it stops after ``max_rounds``), ``price_of_anarchy`` = the best social welfare / the worst
equilibrium's (Koutsoupias & Papadimitriou, "Worst-case equilibria", STACS 1999).

``shared_device_game`` is a MODEL, not a measurement: a device of ``capacity`` requests/s is time-shared in
proportion to each tenant's per-launch work (a bigger batch holds the device longer and so gets a bigger share of
it), int8 serves ``quant_speedup`` times more requests per unit of device time at a quality cost, and every tenant's
latency grows with the TOTAL batch in flight (queueing behind everyone's batches). A tenant's payoff is
``goodput - latency_weight * latency`` -- selfish batch growth raises everyone's latency, the tragedy of the
commons the equilibrium analysis shows.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .._inputs import is_int, is_real

__all__ = [
    "AuctionResult",
    "second_price_auction",
    "power_slot_auction",
    "auction_utility",
    "proportional_share",
    "pure_nash",
    "best_response",
    "best_response_dynamics",
    "social_welfare",
    "price_of_anarchy",
    "shared_device_game",
]


@dataclass(frozen=True)
class AuctionResult:
    """Winners (highest bid first), the uniform price every winner pays, and each bidder's payment (0 for losers)."""

    winners: list
    price: float
    payments: dict


def _check_bids(bids: Mapping, name: str = "bids") -> dict:
    if not isinstance(bids, Mapping) or not bids:
        raise ValueError(f"{name}: expected a non-empty dict tenant -> bid, got {bids!r}")
    for t, b in bids.items():
        if not is_real(b) or not math.isfinite(b) or b < 0:
            raise ValueError(f"{name}: tenant {t!r} needs a finite bid >= 0, got {b!r}")
    return {t: float(b) for t, b in bids.items()}


def second_price_auction(bids: Mapping, units: int = 1, reserve: float = 0.0) -> AuctionResult:
    """Vickrey auction of ``units`` identical slots, one per bidder (module docstring). Ties: the bidder listed
    first in ``bids`` wins. Bids below ``reserve`` never win."""
    b = _check_bids(bids)
    if not is_int(units) or units < 1:
        raise ValueError(f"units: expected an int >= 1, got {units!r}")
    if not is_real(reserve) or not math.isfinite(reserve) or reserve < 0:
        raise ValueError(f"reserve: expected a finite price >= 0, got {reserve!r}")
    names = list(b)
    order = sorted(names, key=lambda t: (-b[t], names.index(t)))
    eligible = [t for t in order if b[t] >= reserve]
    winners = eligible[:units]
    losing = [b[t] for t in order if t not in winners]
    price = max(float(reserve), max(losing)) if losing else float(reserve)
    payments = {t: (price if t in winners else 0.0) for t in names}
    return AuctionResult(winners, price if winners else 0.0, payments)


def power_slot_auction(
    bids: Mapping, budget_w: float, slot_w: float, base_w: float = 0.0, reserve: float = 0.0
) -> AuctionResult:
    """Auction the power headroom ``budget_w - base_w`` as ``floor(headroom / slot_w)`` slots of ``slot_w`` watts
    (e.g. the extra power of running one tenant's device at boost clock instead of base clock; MODEL watts)."""
    for nm, v in (("budget_w", budget_w), ("slot_w", slot_w), ("base_w", base_w)):
        if not is_real(v) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{nm}: expected a finite number >= 0, got {v!r}")
    if slot_w <= 0:
        raise ValueError(f"slot_w: expected > 0, got {slot_w!r}")
    units = int(math.floor((budget_w - base_w) / slot_w + 1e-9))
    if units < 1:
        return AuctionResult([], 0.0, {t: 0.0 for t in _check_bids(bids)})
    return second_price_auction(bids, units=units, reserve=reserve)


def auction_utility(value: float, bid: float, others: Mapping, units: int = 1, me: Hashable = "_me") -> float:
    """Quasi-linear utility of a bidder with private ``value`` who bids ``bid`` against ``others``' bids:
    ``value - price`` if it wins, else 0 (it is listed last: ties go to the others)."""
    allb = dict(_check_bids(others, "others"))
    if me in allb:
        raise ValueError(f"me: {me!r} is also one of the other bidders")
    allb[me] = bid
    res = second_price_auction(allb, units=units)
    return float(value - res.price) if me in res.winners else 0.0


def proportional_share(bids: Mapping, budget: float) -> dict:
    """Kelly's proportional share: ``{tenant: budget * b_i / sum b}`` (all zero bids: an equal split)."""
    b = _check_bids(bids)
    if not is_real(budget) or not math.isfinite(budget) or budget < 0:
        raise ValueError(f"budget: expected a finite amount >= 0, got {budget!r}")
    tot = sum(b.values())
    if tot == 0:
        return {t: budget / len(b) for t in b}
    return {t: budget * v / tot for t, v in b.items()}


# ------------------------------------------------------------------------------------------------ games
def _check_payoffs(payoffs: np.ndarray) -> np.ndarray:
    p = np.asarray(payoffs, dtype=float)
    if p.ndim < 2 or p.shape[-1] != p.ndim - 1 or not np.all(np.isfinite(p)):
        raise ValueError(
            f"payoffs: expected a finite array of shape (s_1, ..., s_n, n) (payoff of each player for each profile), "
            f"got shape {p.shape}"
        )
    return p


def best_response(payoffs: np.ndarray, profile: Sequence[int], player: int) -> int:
    """The strategy of ``player`` maximising its payoff against the others' strategies in ``profile`` (ties: the
    current strategy if it is among the best, else the lowest index)."""
    p = _check_payoffs(payoffs)
    idx = list(profile)
    row = []
    for s in range(p.shape[player]):
        idx[player] = s
        row.append(p[tuple(idx)][player])
    best = max(row)
    if row[profile[player]] >= best - 1e-12:
        return int(profile[player])
    return int(np.argmax(row))


def pure_nash(payoffs: np.ndarray) -> list[tuple[int, ...]]:
    """Every pure-strategy Nash equilibrium: profiles where each player's strategy is a best response."""
    p = _check_payoffs(payoffs)
    n = p.ndim - 1
    out = []
    for prof in itertools.product(*(range(k) for k in p.shape[:-1])):
        mine = p[prof]
        ok = True
        for i in range(n):
            idx = list(prof)
            for s in range(p.shape[i]):
                idx[i] = s
                if p[tuple(idx)][i] > mine[i] + 1e-12:
                    ok = False
                    break
            if not ok:
                break
        if ok:
            out.append(tuple(int(x) for x in prof))
    return out


def best_response_dynamics(
    payoffs: np.ndarray, start: Sequence[int], max_rounds: int = 100
) -> tuple[tuple[int, ...], list[tuple[int, ...]], bool]:
    """Players 0..n-1 in turn switch to a best response; ``(final profile, path of profiles, converged)`` --
    converged when a whole round changes nothing (the final profile is then a pure Nash equilibrium)."""
    p = _check_payoffs(payoffs)
    n = p.ndim - 1
    if len(start) != n or any(not is_int(s) or not 0 <= s < p.shape[i] for i, s in enumerate(start)):
        raise ValueError(f"start: expected {n} strategy indices within {p.shape[:-1]}, got {list(start)!r}")
    if not is_int(max_rounds) or max_rounds < 1:
        raise ValueError(f"max_rounds: expected an int >= 1, got {max_rounds!r}")
    prof = [int(s) for s in start]
    path = [tuple(prof)]
    for _ in range(max_rounds):
        changed = False
        for i in range(n):
            br = best_response(p, prof, i)
            if br != prof[i]:
                prof[i] = br
                path.append(tuple(prof))
                changed = True
        if not changed:
            return tuple(prof), path, True
    return tuple(prof), path, False


def social_welfare(payoffs: np.ndarray, profile: Sequence[int]) -> float:
    """Sum of all players' payoffs at ``profile``."""
    p = _check_payoffs(payoffs)
    return float(p[tuple(profile)].sum())


def price_of_anarchy(payoffs: np.ndarray) -> tuple[float, tuple[int, ...], list[tuple[int, ...]]]:
    """``(PoA, social optimum profile, equilibria)``: best welfare / worst pure-equilibrium welfare (welfare must be
    positive there); ``inf`` when no pure equilibrium exists."""
    p = _check_payoffs(payoffs)
    w = p.sum(axis=-1)
    opt = tuple(int(x) for x in np.unravel_index(int(np.argmax(w)), w.shape))
    eqs = pure_nash(p)
    if not eqs:
        return math.inf, opt, eqs
    worst = min(float(w[e]) for e in eqs)
    if worst <= 0 or w[opt] <= 0:
        raise ValueError(
            f"payoffs: price of anarchy needs positive welfare, got opt {w[opt]:.4g}, worst NE {worst:.4g}"
        )
    return float(w[opt] / worst), opt, eqs


def shared_device_game(
    strategies: Mapping[str, tuple[float, bool]],
    n_players: int = 2,
    capacity: float = 1000.0,
    quant_speedup: float = 1.8,
    quant_quality: float = 0.9,
    base_latency_ms: float = 5.0,
    ms_per_request: float = 0.5,
    latency_weight: float = 4.0,
) -> tuple[np.ndarray, list[str]]:
    """MODEL payoff array for ``n_players`` tenants choosing among ``strategies`` {name: (batch size, int8?)}.

    Device time shares are proportional to each tenant's batch work ``batch / (quant_speedup if int8 else 1)``;
    tenant i serves ``capacity * share_i * speed_i`` requests/s at quality ``quant_quality`` (int8) or 1.0; every
    tenant's latency is ``base_latency_ms + ms_per_request * sum of all batches`` (waiting behind all batches).
    Payoff = ``quality * goodput - latency_weight * latency``. Returns ``(payoffs, strategy names)``.
    """
    if not isinstance(strategies, Mapping) or not strategies:
        raise ValueError(f"strategies: expected a non-empty dict name -> (batch, int8), got {strategies!r}")
    for k, (b, q) in strategies.items():
        if not is_real(b) or b <= 0 or not isinstance(q, bool):
            raise ValueError(f"strategies: {k!r} needs (batch > 0, int8 bool), got {(b, q)!r}")
    if not is_int(n_players) or n_players < 2:
        raise ValueError(f"n_players: expected an int >= 2, got {n_players!r}")
    names = list(strategies)
    k = len(names)
    pay = np.zeros((k,) * n_players + (n_players,))
    for prof in itertools.product(range(k), repeat=n_players):
        batch = [float(strategies[names[s]][0]) for s in prof]
        int8 = [strategies[names[s]][1] for s in prof]
        speed = [quant_speedup if q else 1.0 for q in int8]
        work = [b / sp for b, sp in zip(batch, speed)]
        lat = base_latency_ms + ms_per_request * sum(batch)
        for i in range(n_players):
            share = work[i] / sum(work)
            goodput = capacity * share * speed[i] * (quant_quality if int8[i] else 1.0)
            pay[prof + (i,)] = goodput - latency_weight * lat
    return pay, names
