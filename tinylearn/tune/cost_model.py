"""A learned cost model over a search space, and the search it guides (TVM's AutoTVM / Ansor idea).

Measuring a configuration costs a compile-free kernel run here (tens of microseconds to milliseconds), but on a
real tuner it costs a compile plus a run: the model replaces most measurements by a prediction.

* Features: ``space.features(config, shape)``: log2 of every size and integer knob, one-hot categories, and the
  space's derived features (the GEMM space adds arithmetic intensity, the bytes of the packed A block and B panel,
  blocks per thread). The model never sees the kernel itself, only these numbers.
* ``kind="xgboost"`` (default): ``xgboost.XGBRanker`` with ``objective="rank:pairwise"``: the loss counts
  mis-ordered *pairs* of configurations of the same shape (one query group per shape), which is what a search
  needs (which config is faster), not how many microseconds it takes; the labels are the within-shape speed
  ranks. Scores are comparable only within one shape. ``kind="regress"``: ``XGBRegressor`` on log time (scores
  are predicted log seconds; comparable across shapes, so it also predicts *how much* faster).
* ``predict`` returns scores, lower = faster, for either kind; ``kendall_tau`` is scipy's Kendall rank correlation
  between the scores and the measured times (per shape, weighted by the number of configurations): 1 = the model
  orders every pair correctly, 0 = no better than chance.
* ``ModelGuidedSearch``: an initial random batch, then per round: fit the model on every measured (config, log
  time), score a random pool of unseen valid configurations and propose the ``batch`` best, each replaced with
  probability ``epsilon`` by a random one (exploration: a model fitted on few points is confidently wrong about the
  regions it has not seen).
* ``transfer``: fit on one shape's records, rank another shape's configurations (the features carry log2 of the
  sizes, so a tree can split on them; what transfers is the ordering of knobs, e.g. "AVX-512 beats scalar").
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..tunable import Space, class_of
from .searchers import Searcher, config_key

KINDS = ("xgboost", "regress")


def _key(shape: Mapping[str, int]) -> tuple:
    return tuple(sorted((k, int(v)) for k, v in shape.items()))


class CostModel:
    """Predicts which configurations of ``space`` run faster (see the module docstring)."""

    def __init__(
        self, space: Space, kind: str = "xgboost", *, n_estimators: int = 120, max_depth: int = 4, seed: int = 0
    ) -> None:
        if not isinstance(space, Space):
            raise TypeError(f"space: expected a tunable.Space, got {type(space).__name__}")
        if kind not in KINDS:
            raise ValueError(f"kind: expected one of {list(KINDS)}, got {kind!r}")
        if not isinstance(n_estimators, int) or n_estimators < 1:
            raise ValueError(f"n_estimators: expected an int >= 1, got {n_estimators!r}")
        if not isinstance(max_depth, int) or max_depth < 1:
            raise ValueError(f"max_depth: expected an int >= 1, got {max_depth!r}")
        self.space, self.kind = space, kind
        self.params = {"n_estimators": n_estimators, "max_depth": max_depth, "learning_rate": 0.1, "n_jobs": 1}
        self.seed = seed
        self.model: Any = None
        self.n_train = 0

    # -- data ------------------------------------------------------------------------------------------------
    def _broadcast(self, configs: Sequence[Mapping[str, Any]], shapes: Any) -> list[dict]:
        if isinstance(shapes, Mapping):
            return [dict(shapes)] * len(configs)
        shapes = list(shapes)
        if len(shapes) != len(configs):
            raise ValueError(f"shapes: {len(shapes)} shapes for {len(configs)} configs (pass one dict or one each)")
        return [dict(s) for s in shapes]

    def features(self, configs: Sequence[Mapping[str, Any]], shapes: Any) -> np.ndarray:
        """The feature matrix [n, f] of (config, shape) pairs (``shapes``: one dict for all, or one per config)."""
        shp = self._broadcast(configs, shapes)
        return np.array([self.space.features(c, s) for c, s in zip(configs, shp)], dtype=np.float64)

    # -- fit / predict ---------------------------------------------------------------------------------------
    def fit(self, configs: Sequence[Mapping[str, Any]], shapes: Any, seconds: Sequence[float | None]) -> CostModel:
        """Fit on measured configurations; entries with ``seconds`` None (failed or wrong) are dropped."""
        configs = list(configs)
        if len(seconds) != len(configs):
            raise ValueError(f"seconds: {len(seconds)} times for {len(configs)} configs")
        shp = self._broadcast(configs, shapes)
        keep = [i for i, s in enumerate(seconds) if s is not None]
        if len(keep) < 2:
            raise ValueError(f"seconds: need at least 2 measured (non-None) times to fit, got {len(keep)}")
        for i in keep:
            if not seconds[i] > 0:
                raise ValueError(f"seconds: expected positive times, got {seconds[i]!r} at index {i}")
        import xgboost

        # one query group per shape, rows sorted by group (XGBRanker needs qid ascending)
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i in keep:
            groups[_key(shp[i])].append(i)
        order = [i for g in groups.values() for i in g]
        X = self.features([configs[i] for i in order], [shp[i] for i in order])
        logt = np.log(np.array([seconds[i] for i in order], dtype=np.float64))
        if self.kind == "regress":
            self.model = xgboost.XGBRegressor(objective="reg:squarederror", random_state=self.seed, **self.params)
            self.model.fit(X, logt)
        else:
            qid, labels, start = [], [], 0
            for gi, g in enumerate(groups.values()):
                t = logt[start : start + len(g)]
                ranks = np.empty(len(g), dtype=np.float64)
                ranks[np.argsort(-t, kind="stable")] = np.arange(len(g))  # fastest: the highest relevance
                labels.append(ranks)
                qid += [gi] * len(g)
                start += len(g)
            self.model = xgboost.XGBRanker(objective="rank:pairwise", random_state=self.seed, **self.params)
            self.model.fit(X, np.concatenate(labels), qid=np.array(qid))
        self.n_train = len(order)
        return self

    def predict(self, configs: Sequence[Mapping[str, Any]], shapes: Any) -> np.ndarray:
        """Scores, lower = predicted faster (regress: predicted log seconds; xgboost: minus the ranking score)."""
        if self.model is None:
            raise RuntimeError("CostModel.predict: call fit() first")
        configs = list(configs)
        if not configs:
            return np.zeros(0)
        pred = np.asarray(self.model.predict(self.features(configs, shapes)), dtype=np.float64)
        return pred if self.kind == "regress" else -pred

    def kendall_tau(self, configs: Sequence[Mapping[str, Any]], shapes: Any, seconds: Sequence[float | None]) -> float:
        """Kendall's tau between predicted scores and measured times, per shape, weighted by configurations."""
        from scipy.stats import kendalltau

        configs = list(configs)
        shp = self._broadcast(configs, shapes)
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i, s in enumerate(seconds):
            if s is not None:
                groups[_key(shp[i])].append(i)
        total, weight = 0.0, 0
        for idx in groups.values():
            if len(idx) < 2:
                continue
            pred = self.predict([configs[i] for i in idx], [shp[i] for i in idx])
            tau = kendalltau(pred, [seconds[i] for i in idx]).statistic
            if np.isfinite(tau):
                total, weight = total + tau * len(idx), weight + len(idx)
        if weight == 0:
            raise ValueError("seconds: need at least 2 measured configurations of one shape to compute tau")
        return total / weight


def transfer(
    space: Space,
    train: tuple[Sequence[Mapping[str, Any]], Mapping[str, int], Sequence[float | None]],
    test: tuple[Sequence[Mapping[str, Any]], Mapping[str, int], Sequence[float | None]],
    *,
    kind: str = "xgboost",
    seed: int = 0,
) -> tuple[CostModel, float]:
    """Fit on shape A's records ``train = (configs, shape, seconds)``, rank shape B's ``test`` configurations:
    (the model, Kendall tau on B). No measurement of B enters the fit."""
    model = CostModel(space, kind, seed=seed).fit(*train)
    return model, model.kendall_tau(*test)


class ModelGuidedSearch(Searcher):
    """Random start, then the cost model's top-``batch`` of a random pool of unseen configurations (+ epsilon)."""

    name = "model"

    def __init__(
        self,
        space: Space,
        shape: Mapping[str, int],
        *,
        seed: int = 0,
        init: int = 8,
        batch: int = 4,
        pool: int = 512,
        epsilon: float = 0.1,
        kind: str = "xgboost",
    ) -> None:
        super().__init__(space, shape, seed=seed)
        for name, v, lo in (("init", init, 2), ("batch", batch, 1), ("pool", pool, 1)):
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"{name}: expected an int >= {lo}, got {v!r}")
        if not isinstance(epsilon, (int, float)) or not 0 <= epsilon <= 1:
            raise ValueError(f"epsilon: expected a probability in [0, 1], got {epsilon!r}")
        self.init, self.batch, self.pool, self.epsilon = init, batch, pool, float(epsilon)
        self.model = CostModel(space, kind, seed=seed)
        self.shape_class = class_of(self.shape)
        self._queue: list[dict] = []
        self.rounds = 0

    def _measured(self) -> list[tuple[dict, float]]:
        return [(c, s) for c, s in self.results if s is not None]

    def _candidates(self) -> list[dict]:
        """Up to ``pool`` distinct unseen valid configurations (all of them when the space is that small)."""
        left = [c for c in self._all() if config_key(c) not in self.seen]
        if len(left) <= self.pool:
            return left
        pick = self.rng.choice(len(left), size=self.pool, replace=False)
        return [left[int(i)] for i in pick]

    def _refill(self) -> None:
        measured = self._measured()
        cands = self._candidates()
        if not cands:
            return
        if len(measured) < max(self.init, 2) or len({s for _, s in measured}) < 2:
            self._queue = [cands[int(self.rng.integers(len(cands)))]]
            return
        configs, seconds = zip(*measured)
        self.model.fit(list(configs), self.shape, list(seconds))
        self.rounds += 1
        order = np.argsort(self.model.predict(cands, self.shape), kind="stable")
        top = [cands[int(i)] for i in order[: self.batch]]
        rest = [cands[int(i)] for i in order[self.batch :]]
        for j in range(len(top)):
            if rest and self.rng.random() < self.epsilon:  # explore: swap in a random unranked configuration
                top[j] = rest.pop(int(self.rng.integers(len(rest))))
        self._queue = top

    def _propose(self) -> dict | None:
        while True:
            while self._queue:
                cfg = self._queue.pop(0)
                if self._unseen(cfg):
                    return cfg
            self._refill()
            if not self._queue:
                return None
