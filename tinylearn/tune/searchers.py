"""Search strategies over a ``tunable.Space``: ask for a configuration, measure it, tell its time.

Every searcher speaks the same two-call protocol the tuner drives::

    s = RandomSearch(space, shape, seed=0)
    while (cfg := s.ask()) is not None and budget_left:
        s.tell(cfg, seconds)          # seconds=None: the configuration failed or computed a wrong result

and never proposes a configuration twice (each keeps a ``seen`` set; ``tell`` of a configuration it did not
propose, e.g. the default the tuner measures first, marks it seen and feeds it to the strategy as well):

- ``GridSearch``: the space's valid configurations in their fixed order (exhaustive when the budget allows).
- ``RandomSearch``: uniform sampling without replacement.
- ``AnnealSearch``: simulated annealing: propose a random unseen neighbour (one knob one step), accept it as the
  new current point with the Metropolis rule on log time, ``exp(-(log t_new - log t_cur) / T)``, the temperature
  cooling geometrically (``T *= alpha`` per result); restart from a random point when a point has no unseen
  neighbour.
- ``EvolutionSearch``: a population of the best ``population`` results; a child is the per-parameter crossover of
  two tournament winners, mutated to a random neighbour with probability ``mutation``.

``tinylearn.tune.tpe.TPESearch`` adds optuna's Tree-structured Parzen Estimator on the same protocol.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..tunable import Space


def config_key(config: Mapping[str, Any]) -> tuple:
    """A hashable key of a configuration (its items, sorted by name)."""
    return tuple(sorted(config.items()))


class Searcher:
    """Base class: the ``seen`` bookkeeping, a seeded numpy Generator and random unseen draws."""

    name = "base"

    def __init__(self, space: Space, shape: Mapping[str, int], *, seed: int = 0) -> None:
        if not isinstance(space, Space):
            raise TypeError(f"space: expected a tunable.Space, got {type(space).__name__}")
        if not isinstance(shape, Mapping) or not shape:
            raise ValueError(f"shape: expected a non-empty dict of named sizes, got {shape!r}")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"seed: expected an int, got {type(seed).__name__}")
        self.space, self.shape, self.seed = space, dict(shape), seed
        self.rng = np.random.default_rng(seed)
        self.seen: set[tuple] = set()
        self.results: list[tuple[dict, float | None]] = []
        self._pool: list[dict] | None = None

    # -- protocol -------------------------------------------------------------------------------------------
    def ask(self) -> dict | None:
        """The next configuration to measure (marked seen), or None when the space is exhausted."""
        cfg = self._propose()
        if cfg is not None:
            self.seen.add(config_key(cfg))
        return cfg

    def tell(self, config: Mapping[str, Any], seconds: float | None) -> None:
        """Report ``config``'s median time (None: failed or wrong)."""
        cfg = self.space.check(config)
        if seconds is not None and (not isinstance(seconds, (int, float)) or not seconds > 0):
            raise ValueError(f"seconds: expected a positive time or None, got {seconds!r}")
        self.seen.add(config_key(cfg))
        self.results.append((cfg, None if seconds is None else float(seconds)))
        self._observe(cfg, None if seconds is None else float(seconds))

    # -- for subclasses -------------------------------------------------------------------------------------
    def _propose(self) -> dict | None:
        raise TypeError(f"{type(self).__name__}: a Searcher subclass must define _propose() (the next configuration)")

    def _observe(self, config: dict, seconds: float | None) -> None:
        """Strategy update after ``tell`` (default: nothing)."""

    def _unseen(self, cfg: Mapping[str, Any]) -> bool:
        return config_key(cfg) not in self.seen and self.space.is_valid(cfg, self.shape)

    def _all(self) -> list[dict]:
        if self._pool is None:
            self._pool = list(self.space.configs(self.shape))
        return self._pool

    def _random_unseen(self) -> dict | None:
        """A uniformly random valid configuration not seen yet, or None when none is left."""
        for _ in range(64):  # cheap rejection sampling while the space is mostly unexplored
            cfg = {p.name: p.values[int(self.rng.integers(len(p.values)))] for p in self.space.params}
            if self._unseen(cfg):
                return cfg
        left = [c for c in self._all() if config_key(c) not in self.seen]
        return left[int(self.rng.integers(len(left)))] if left else None

    def best(self) -> tuple[dict, float] | None:
        """The fastest (config, seconds) told so far."""
        ok = [(c, s) for c, s in self.results if s is not None]
        return min(ok, key=lambda t: t[1]) if ok else None


class GridSearch(Searcher):
    """The space's valid configurations in order."""

    name = "grid"

    def __init__(self, space: Space, shape: Mapping[str, int], *, seed: int = 0) -> None:
        super().__init__(space, shape, seed=seed)
        self._it = iter(space.configs(self.shape))

    def _propose(self) -> dict | None:
        for cfg in self._it:
            if config_key(cfg) not in self.seen:
                return cfg
        return None


class RandomSearch(Searcher):
    """Uniform sampling without replacement."""

    name = "random"

    def _propose(self) -> dict | None:
        return self._random_unseen()


class AnnealSearch(Searcher):
    """Simulated annealing on log time (see the module docstring)."""

    name = "anneal"

    def __init__(
        self, space: Space, shape: Mapping[str, int], *, seed: int = 0, t0: float = 0.3, alpha: float = 0.9
    ) -> None:
        super().__init__(space, shape, seed=seed)
        if not t0 > 0:
            raise ValueError(f"t0: expected a positive temperature, got {t0!r}")
        if not 0 < alpha < 1:
            raise ValueError(f"alpha: expected a cooling factor in (0, 1), got {alpha!r}")
        self.temperature, self.alpha = float(t0), float(alpha)
        self.current: tuple[dict, float] | None = None

    def _propose(self) -> dict | None:
        if self.current is not None:
            options = [n for n in self.space.neighbours(self.current[0], self.shape) if self._unseen(n)]
            if options:
                return options[int(self.rng.integers(len(options)))]
            best = self.best()  # stuck: restart from the best point's unexplored surroundings or anywhere
            self.current = best
        return self._random_unseen()

    def _observe(self, config: dict, seconds: float | None) -> None:
        if seconds is None:
            return
        if self.current is None:
            self.current = (config, seconds)
        else:
            delta = math.log(seconds) - math.log(self.current[1])
            if delta <= 0 or self.rng.random() < math.exp(-delta / self.temperature):
                self.current = (config, seconds)
        self.temperature *= self.alpha


class EvolutionSearch(Searcher):
    """A genetic search: tournament selection, per-parameter crossover, neighbour mutation."""

    name = "evolution"

    def __init__(
        self,
        space: Space,
        shape: Mapping[str, int],
        *,
        seed: int = 0,
        population: int = 8,
        tournament: int = 3,
        mutation: float = 0.5,
    ) -> None:
        super().__init__(space, shape, seed=seed)
        if not isinstance(population, int) or population < 2:
            raise ValueError(f"population: expected an int >= 2, got {population!r}")
        if not isinstance(tournament, int) or tournament < 1:
            raise ValueError(f"tournament: expected an int >= 1, got {tournament!r}")
        if not 0 <= mutation <= 1:
            raise ValueError(f"mutation: expected a probability in [0, 1], got {mutation!r}")
        self.size, self.k, self.mutation = population, tournament, float(mutation)
        self.population: list[tuple[dict, float]] = []

    def _select(self) -> dict:
        idx = self.rng.choice(len(self.population), size=min(self.k, len(self.population)), replace=False)
        return min((self.population[int(i)] for i in idx), key=lambda t: t[1])[0]

    def _propose(self) -> dict | None:
        if len(self.population) < self.size:
            return self._random_unseen()
        for _ in range(50):
            a, b = self._select(), self._select()
            child = {n: (a[n] if self.rng.random() < 0.5 else b[n]) for n in self.space.names}
            if self.rng.random() < self.mutation or not self._unseen(child):
                options = [n for n in self.space.neighbours(child) if self._unseen(n)]
                if options:
                    child = options[int(self.rng.integers(len(options)))]
            if self._unseen(child):
                return child
        return self._random_unseen()

    def _observe(self, config: dict, seconds: float | None) -> None:
        if seconds is None:
            return
        self.population.append((config, seconds))
        self.population.sort(key=lambda t: t[1])
        del self.population[self.size :]


SEARCHERS: dict[str, type[Searcher]] = {
    "grid": GridSearch,
    "random": RandomSearch,
    "anneal": AnnealSearch,
    "evolution": EvolutionSearch,
}
