"""Shapley values: who caused which part of a shared cluster's cost, exactly and by permutation sampling.

A cooperative game is a set of players (tenants) N and a value (here: cost) function ``v(S)`` for every coalition
S of them, ``v(empty) = 0``. The Shapley value (L. S. Shapley, "A value for n-person games", 1953) gives player i

    phi_i = sum over S not containing i of  |S|! (n - |S| - 1)! / n!  *  (v(S + i) - v(S))

= i's marginal contribution averaged over all n! orders in which the players could join. It is the unique rule with
efficiency (sum_i phi_i = v(N)), symmetry (interchangeable players get the same), the dummy property (a player who
never changes v gets 0) and additivity -- which is why it is the textbook answer to "split the cluster's bill (or its
peak power, or its makespan) fairly between tenants" and to weight their fair shares by what they cost [Q227].

``shapley_exact`` evaluates all 2^n coalitions (n <= 12 here: 4096 evaluations). ``shapley_mc`` samples random
join orders (Castro, Gomez & Tejada, "Polynomial calculation of the Shapley value based on sampling", Computers &
OR 2009): each order yields one marginal contribution per player, an unbiased sample of phi_i. Every order's
marginals sum to v(N) - v(empty), so the estimate is efficient EXACTLY whatever the sample count. Its error:

* CLT: ``stderr_i = std(samples_i) / sqrt(m)``, a 95% interval ``phi_i +- 1.96 stderr_i`` (asymptotic);
* Hoeffding (non-asymptotic): if every marginal lies in an interval of width R, then with probability >= 1 - delta
  |estimate - phi_i| <= R sqrt(ln(2 / delta) / (2 m))  (``hoeffding_halfwidth``; a union bound over n players
  divides delta by n).

``peak_cost_game`` is the MODEL cost used in the notebook: tenants with per-time-slot demand profiles share one
cluster that must be provisioned for the coalition's PEAK total demand (a power or GPU-count bill), so a tenant that
peaks when the others are idle costs little and one that peaks with them costs a lot -- a cost a proportional-to-
usage split does not see.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Hashable, Mapping, Sequence

import numpy as np

from .._inputs import is_int, is_real

__all__ = ["shapley_exact", "shapley_mc", "hoeffding_halfwidth", "peak_cost_game", "marginal_range"]

ValueFn = Callable[[frozenset], float]


def _check_players(players: Sequence[Hashable], max_n: int | None = None) -> list:
    if isinstance(players, str) or not isinstance(players, Sequence) or not players:
        raise ValueError(f"players: expected a non-empty list of player names, got {players!r}")
    if len(set(players)) != len(players):
        raise ValueError(f"players: names must be distinct, got {list(players)!r}")
    if max_n is not None and len(players) > max_n:
        raise ValueError(f"players: exact Shapley values enumerate 2^n coalitions; n <= {max_n}, got {len(players)}")
    return list(players)


def _value(value_fn: ValueFn, s: frozenset) -> float:
    v = value_fn(s)
    try:
        v = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"value_fn: must return a number, got {v!r} for coalition {sorted(s, key=str)}") from None
    if not math.isfinite(v):
        raise ValueError(f"value_fn: returned {v!r} for coalition {sorted(s, key=str)}")
    return v


def shapley_exact(players: Sequence[Hashable], value_fn: ValueFn) -> dict:
    """Exact Shapley values ``{player: phi}`` from all 2^n coalitions (n <= 12); ``value_fn(frozenset) -> float``."""
    ps = _check_players(players, max_n=12)
    if not callable(value_fn):
        raise ValueError(f"value_fn: expected a callable frozenset -> float, got {value_fn!r}")
    n = len(ps)
    v = {}
    for k in range(n + 1):
        for comb in itertools.combinations(ps, k):
            s = frozenset(comb)
            v[s] = _value(value_fn, s)
    fact = [math.factorial(k) for k in range(n + 1)]
    phi = {}
    for p in ps:
        tot = 0.0
        for s, vs in v.items():
            if p in s:
                continue
            tot += fact[len(s)] * fact[n - len(s) - 1] / fact[n] * (v[s | {p}] - vs)
        phi[p] = tot
    return phi


def shapley_mc(
    players: Sequence[Hashable], value_fn: ValueFn, samples: int, seed: int = 0, cache: bool = True
) -> tuple[dict, dict]:
    """Permutation-sampling estimate: ``(phi, stderr)`` dicts over players (module docstring).

    ``samples`` random join orders (``numpy.random.default_rng(seed)``); ``stderr`` is the sample standard deviation
    of each player's marginals / sqrt(samples) (0 for samples == 1). ``cache`` memoises ``value_fn`` per coalition
    (turn it off to count the evaluations a real, uncached estimator pays: n per order).
    """
    ps = _check_players(players)
    if not callable(value_fn):
        raise ValueError(f"value_fn: expected a callable frozenset -> float, got {value_fn!r}")
    if not is_int(samples) or samples < 1:
        raise ValueError(f"samples: expected an int >= 1, got {samples!r}")
    rng = np.random.default_rng(seed)
    memo: dict[frozenset, float] = {}

    def val(s: frozenset) -> float:
        if not cache:
            return _value(value_fn, s)
        if s not in memo:
            memo[s] = _value(value_fn, s)
        return memo[s]

    n = len(ps)
    marg = np.zeros((samples, n))
    v0 = val(frozenset())
    for m in range(samples):
        order = rng.permutation(n)
        s: frozenset = frozenset()
        prev = v0
        for j in order:
            s = s | {ps[j]}
            cur = val(s)
            marg[m, j] = cur - prev
            prev = cur
    mean = marg.mean(axis=0)
    sd = marg.std(axis=0, ddof=1) if samples > 1 else np.zeros(n)
    se = sd / math.sqrt(samples)
    return {p: float(mean[i]) for i, p in enumerate(ps)}, {p: float(se[i]) for i, p in enumerate(ps)}


def hoeffding_halfwidth(value_range: float, samples: int, delta: float = 0.05, players: int = 1) -> float:
    """Half-width ``R sqrt(ln(2 players / delta) / (2 samples))`` that bounds every player's error with probability
    >= 1 - delta, when each marginal contribution lies in an interval of width ``value_range`` = R."""
    if not (is_real(value_range) and math.isfinite(value_range) and value_range >= 0):
        raise ValueError(f"value_range: expected a finite width >= 0, got {value_range!r}")
    if not is_int(samples) or samples < 1:
        raise ValueError(f"samples: expected an int >= 1, got {samples!r}")
    if not 0 < delta < 1:
        raise ValueError(f"delta: expected a probability in (0, 1), got {delta!r}")
    if not is_int(players) or players < 1:
        raise ValueError(f"players: expected an int >= 1, got {players!r}")
    return float(value_range * math.sqrt(math.log(2 * players / delta) / (2 * samples)))


def marginal_range(players: Sequence[Hashable], value_fn: ValueFn) -> float:
    """Width of the interval holding every marginal contribution, by enumeration (small n) -- for the bound.

    For a monotone subadditive cost like ``peak_cost_game`` a cheaper valid width is max_i v({i}) (each marginal
    lies in [0, v({i})]); this function computes the exact one for tests and small games.
    """
    ps = _check_players(players, max_n=12)
    lo, hi = math.inf, -math.inf
    for k in range(len(ps)):
        for comb in itertools.combinations(ps, k):
            s = frozenset(comb)
            vs = _value(value_fn, s)
            for p in ps:
                if p not in s:
                    d = _value(value_fn, s | {p}) - vs
                    lo, hi = min(lo, d), max(hi, d)
    return float(hi - lo)


def peak_cost_game(profiles: Mapping[Hashable, Sequence[float]], price: float = 1.0) -> ValueFn:
    """MODEL cost game: ``v(S) = price * max_t sum_{i in S} profiles[i][t]`` (provision for the coalition's peak).

    ``profiles``: {tenant: demand per time slot (GPUs, kW, ...)}, all the same length, every value >= 0.
    """
    if not isinstance(profiles, Mapping) or not profiles:
        raise ValueError(f"profiles: expected a non-empty dict tenant -> demand per slot, got {profiles!r}")
    arrs = {k: np.asarray(v, dtype=float) for k, v in profiles.items()}
    lens = {a.shape for a in arrs.values()}
    if len(lens) != 1 or next(iter(lens)) == (0,) or len(next(iter(lens))) != 1:
        raise ValueError(f"profiles: expected 1-D profiles of one common non-zero length, got shapes {lens}")
    for k, a in arrs.items():
        if not np.all(np.isfinite(a)) or np.any(a < 0):
            raise ValueError(f"profiles: tenant {k!r} has a negative or non-finite demand: {a.tolist()}")
    if not (is_real(price) and math.isfinite(price) and price > 0):
        raise ValueError(f"price: expected a finite number > 0, got {price!r}")
    length = next(iter(lens))[0]

    def v(s: frozenset) -> float:
        tot = np.zeros(length)
        for k in s:
            tot += arrs[k]
        return float(price * tot.max()) if s else 0.0

    return v
