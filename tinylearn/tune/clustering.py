"""Clustering kernel variants so a new variant reuses a measured representative's time instead of being measured.

A compiler that keeps generating variants of an op (tile x unroll x vectorize x loop order ...) cannot time them
all. The mechanism here:

1. encode each variant with ``space.features(config, shape)`` (log2 of integer knobs, one-hot categories, the
   space's derived features), drop the columns that do not vary and standardise the rest (z-scores, so a knob with
   large logs does not dominate the distance);
2. k-means (``sklearn.cluster.KMeans``) into ``k`` clusters;
3. per cluster, the *medoid* (the member with the smallest summed distance to the other members: a real variant,
   unlike the centroid) is measured once;
4. ``estimate(config)``: a variant (seen or new) is assigned to the nearest centroid and gets that cluster's medoid
   time: no compile, no run. ``reuse_error`` compares estimates with measured times (relative error per variant)
   when the ground truth is available, which is how ``k`` is chosen: the smallest ``k`` whose error is acceptable.

Where it fails: variants that differ in a knob the features do not expose (or a cliff inside one cluster, e.g. a
block that just stops fitting a cache) get their neighbours' time; a tuner therefore uses the cluster estimates to
*rank and prune* (measure the members of the best clusters), not as final answers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._inputs import is_int
from ..tunable import Space


def time_config(space: Space, shape: Mapping[str, int], *, repeat: int = 5, seed: int = 0) -> Callable[[dict], float]:
    """A measurer: config -> best-of-``repeat`` seconds of ``space.build(config)`` on ``space.make_args(shape)``."""
    from ..bench.timing import measure

    args, kwargs = space.make_args(dict(shape), np.random.default_rng(seed))

    def run(config: dict) -> float:
        fn = space.build(config)
        fn(*args, **kwargs)  # first call: compile (generated kernels) and warm up, never timed
        return float(min(measure(lambda: fn(*args, **kwargs), warmup=1, repeat=repeat).times))

    return run


@dataclass
class Cluster:
    medoid: dict
    members: list[dict]
    seconds: float  # the medoid's measured time


class VariantClusters:
    """k-means over variant features; each cluster's medoid is measured and stands for its members."""

    def __init__(
        self, space: Space, k: int = 6, *, measure: Callable[[dict], float] | None = None, seed: int = 0
    ) -> None:
        if not isinstance(space, Space):
            raise TypeError(f"space: expected a tunable.Space, got {type(space).__name__}")
        if not is_int(k) or not 1 <= k <= 1 << 20:
            raise ValueError(f"k: expected an int in [1, 2**20] (clusters), got {k!r}")
        k = int(k)
        if measure is not None and not callable(measure):
            raise TypeError(f"measure: expected a callable config -> seconds, got {type(measure).__name__}")
        self.space, self.k, self.seed, self._measure = space, k, seed, measure
        self.shape: dict | None = None
        self.clusters: list[Cluster] = []
        self.measured = 0

    def _x(self, configs: Sequence[Mapping[str, Any]]) -> np.ndarray:
        raw = np.array([self.space.features(c, self.shape) for c in configs], dtype=np.float64)
        return (raw[:, self._cols] - self._mean) / self._std

    def fit(self, configs: Sequence[Mapping[str, Any]], shape: Mapping[str, int]) -> VariantClusters:
        """Cluster ``configs`` (valid for ``shape``) and measure one medoid per cluster."""
        from sklearn.cluster import KMeans

        configs = [self.space.check(c) for c in configs]
        if len(configs) < self.k:
            raise ValueError(f"configs: {len(configs)} variants for k={self.k} clusters (need at least k)")
        bad = [c for c in configs if not self.space.is_valid(c, dict(shape))]
        if bad:
            raise ValueError(f"configs: {bad[0]} is not valid for shape {dict(shape)}")
        self.shape = dict(shape)
        raw = np.array([self.space.features(c, self.shape) for c in configs], dtype=np.float64)
        self._cols = np.flatnonzero(raw.std(axis=0) > 0)
        if self._cols.size == 0:
            self._cols = np.arange(raw.shape[1])
        sub = raw[:, self._cols]
        self._mean, std = sub.mean(axis=0), sub.std(axis=0)
        self._std = np.where(std > 0, std, 1.0)
        x = (sub - self._mean) / self._std
        self.kmeans = KMeans(n_clusters=self.k, n_init=10, random_state=self.seed).fit(x)
        measure = self._measure or time_config(self.space, self.shape, seed=self.seed)
        self.clusters, self._by_label = [], {}
        for c in range(self.k):
            idx = np.flatnonzero(self.kmeans.labels_ == c)
            if idx.size == 0:
                continue
            d = np.linalg.norm(x[idx, None, :] - x[None, idx, :], axis=-1).sum(axis=1)
            medoid = configs[int(idx[int(np.argmin(d))])]
            cl = Cluster(medoid, [configs[int(i)] for i in idx], float(measure(medoid)))
            self.clusters.append(cl)
            self._by_label[c] = cl
        self.measured = len(self.clusters)
        return self

    def cluster_of(self, config: Mapping[str, Any]) -> Cluster:
        """The cluster a (possibly new) variant falls in: the nearest k-means centroid."""
        if self.shape is None:
            raise RuntimeError("VariantClusters: call fit() first")
        label = int(self.kmeans.predict(self._x([self.space.check(config)]))[0])
        return self._by_label[label]

    def estimate(self, config: Mapping[str, Any]) -> float:
        """The estimated seconds of ``config``: its cluster medoid's measured time (nothing is run)."""
        return self.cluster_of(config).seconds

    def reuse_error(self, configs: Sequence[Mapping[str, Any]], seconds: Sequence[float]) -> np.ndarray:
        """Relative error |estimate - measured| / measured of each variant (ground truth ``seconds``)."""
        if len(configs) != len(seconds):
            raise ValueError(f"seconds: {len(seconds)} times for {len(configs)} configs")
        est = np.array([self.estimate(c) for c in configs])
        t = np.asarray(seconds, dtype=np.float64)
        if np.any(~(t > 0)):
            raise ValueError("seconds: expected positive measured times")
        return np.abs(est - t) / t

    def best(self) -> Cluster:
        """The cluster whose medoid measured fastest (where a tuner spends its next measurements)."""
        if not self.clusters:
            raise RuntimeError("VariantClusters: call fit() first")
        return min(self.clusters, key=lambda c: c.seconds)
