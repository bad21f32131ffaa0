"""``TPESearch``: optuna's Tree-structured Parzen Estimator behind the ``Searcher`` ask/tell protocol.

TPE splits the configurations measured so far into the fastest ``gamma`` fraction and the rest, fits a Parzen
(kernel density) estimator to each, ``l(x)`` and ``g(x)``, and proposes the candidate maximising ``l(x) / g(x)``:
configurations that look like the fast ones and unlike the slow ones. Every knob is a categorical distribution
here (``optuna.distributions.CategoricalDistribution`` of its values), the objective is log time, and

- a proposal that is invalid for the shape is told to optuna as a failed trial and another is asked;
- a proposal already measured is told its known time again (TPE learns nothing new) and another is asked; after
  a few repeats a random unseen configuration is enqueued instead, so the searcher never repeats a measurement;
- a configuration told without being asked (the tuner's default) is enqueued, asked and told, so TPE learns it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..tunable import Space
from .searchers import Searcher, config_key


class TPESearch(Searcher):
    """optuna ``TPESampler(seed=seed)`` through ``study.ask`` / ``study.tell``."""

    name = "tpe"

    def __init__(self, space: Space, shape: Mapping[str, int], *, seed: int = 0, n_startup: int = 8) -> None:
        super().__init__(space, shape, seed=seed)
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._optuna = optuna
        self._dists = {p.name: optuna.distributions.CategoricalDistribution(list(p.values)) for p in space.params}
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup)
        self.study = optuna.create_study(direction="minimize", sampler=sampler)
        self._pending: dict[tuple, Any] = {}
        self._known: dict[tuple, float | None] = {}

    def _tell_trial(self, trial: Any, seconds: float | None) -> None:
        if seconds is None:
            self.study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
        else:
            self.study.tell(trial, math.log(seconds))

    def _propose(self) -> dict | None:
        for _ in range(16):
            trial = self.study.ask(self._dists)
            cfg = {n: trial.params[n] for n in self.space.names}
            key = config_key(cfg)
            if not self.space.is_valid(cfg, self.shape):
                self._tell_trial(trial, None)
                self.seen.add(key)  # never valid: not worth asking again
                continue
            if key in self.seen:
                self._tell_trial(trial, self._known.get(key))
                continue
            self._pending[key] = trial
            return cfg
        cfg = self._random_unseen()
        if cfg is None:
            return None
        self.study.enqueue_trial(cfg)
        self._pending[config_key(cfg)] = self.study.ask(self._dists)
        return cfg

    def _observe(self, config: dict, seconds: float | None) -> None:
        key = config_key(config)
        self._known[key] = seconds
        trial = self._pending.pop(key, None)
        if trial is None:  # told without being asked: enqueue it so the sampler learns from it
            self.study.enqueue_trial(config)
            trial = self.study.ask(self._dists)
        self._tell_trial(trial, seconds)
