"""Shard-level lazy loading and Markov-chain prewarming [Q162].

A server holding many models (or one large model, or many LoRA adapters) cannot keep every weight shard in memory;
loading a shard on first use puts a cold read on the request's critical path. Prewarming learns which shard tends
to follow which from the access history and loads the likely next ones in the background while the current request
is being served.

    ShardedCheckpoint.save(state, dir, shard_of)   one safetensors file per shard (``shard_of(tensor_name)`` -> shard
                                                   name, e.g. the layer or the adapter), plus index.json
                                                   {tensor: shard}; ``ShardedCheckpoint(dir)`` reads the index
    LazyModel(dir, capacity=None)                  ``access(shard)`` returns the shard's tensors, reading the file on
                                                   first use (a *cold load on the critical path*, timed); at most
                                                   ``capacity`` shards stay resident (LRU); ``prefetch(shard)`` starts
                                                   a load on a background thread and returns at once; ``drop`` makes a
                                                   shard cold again (``drop_page_cache=True`` also asks the kernel to
                                                   forget the file's pages, posix_fadvise DONTNEED, so the next read
                                                   goes to the disk rather than the page cache)
    MarkovPrewarmer(order=1)                       transition counts N[s -> s'] over the access history (states are
                                                   the last ``order`` shards; an unseen state backs off to shorter
                                                   ones), P(s' | s) = N[s -> s'] / sum_s'' N[s -> s''];
                                                   ``prewarm(model, k)`` prefetches the top-k predicted next shards

Bookkeeping is synchronous, loading is not: ``prefetch`` reserves the slot (evicting the LRU shard) at once, so the
number of cold loads a replay sees depends only on the predictions and the capacity, never on thread timing; a
shard whose prefetch is still in flight when it is accessed counts as a *late prefetch* (the caller waits for the
rest of that load, timed) rather than a cold load.

``markov_trace`` is a SYNTHETIC seeded access trace (each shard has ``branching`` likely successors; with
probability ``noise`` the next shard is uniform) standing in for request routing to models/adapters. ``replay``
runs a trace against a LazyModel, with ``think_s`` of simulated serving work (a sleep) per request during which
background loads proceed, and reports cold loads on the critical path, access latency and prediction hit rate --
all measured from the real file reads.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
from safetensors.numpy import load_file, save_file

INDEX = "index.json"
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def _int(name: str, v: Any, lo: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < lo:
        raise ValueError(f"{name}: must be an int >= {lo}, got {v!r}")
    return int(v)


class ShardedCheckpoint:
    """A directory of per-shard safetensors files + index.json mapping each tensor to its shard."""

    def __init__(self, dir: str | os.PathLike) -> None:
        self.dir = os.fspath(dir)
        path = os.path.join(self.dir, INDEX)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"dir: no {INDEX} in {self.dir!r} (not a sharded checkpoint)")
        with open(path) as f:
            self.index: dict[str, str] = json.load(f)["tensors"]
        self.shards: list[str] = sorted(set(self.index.values()))

    @staticmethod
    def save(
        model_state: dict[str, np.ndarray], dir: str | os.PathLike, shard_of: Callable[[str], str]
    ) -> ShardedCheckpoint:
        """Write ``model_state`` as one ``<shard>.safetensors`` per shard (fsynced) and the index."""
        if not isinstance(model_state, dict) or not model_state:
            raise ValueError(f"model_state: expected a non-empty dict name -> array, got {type(model_state).__name__}")
        if not callable(shard_of):
            raise TypeError(f"shard_of: expected a callable tensor name -> shard name, got {shard_of!r}")
        groups: dict[str, dict[str, np.ndarray]] = {}
        for name, arr in model_state.items():
            if not isinstance(arr, np.ndarray) and callable(getattr(arr, "numpy", None)):
                arr = arr.numpy()  # a tl.Tensor from Module.state_dict()
            if not isinstance(arr, np.ndarray):
                raise TypeError(f"model_state: {name!r} is a {type(arr).__name__}, expected np.ndarray")
            shard = shard_of(name)
            if not isinstance(shard, str) or not _NAME.fullmatch(shard):
                raise ValueError(f"shard_of: returned {shard!r} for {name!r}; expected a file-name-safe string")
            groups.setdefault(shard, {})[name] = np.ascontiguousarray(arr)
        dir = os.fspath(dir)
        os.makedirs(dir, exist_ok=True)
        for shard, tensors in groups.items():
            path = os.path.join(dir, f"{shard}.safetensors")
            save_file(tensors, path)
            with open(path, "rb+") as f:
                os.fsync(f.fileno())
        with open(os.path.join(dir, INDEX), "w") as f:
            json.dump({"tensors": {n: shard_of(n) for n in model_state}}, f, indent=1, sort_keys=True)
        return ShardedCheckpoint(dir)

    def path(self, shard: str) -> str:
        if shard not in self.shards:
            raise KeyError(f"shard: {shard!r} is not in the checkpoint (shards: {self.shards[:8]}...)")
        return os.path.join(self.dir, f"{shard}.safetensors")

    def nbytes(self, shard: str) -> int:
        return os.path.getsize(self.path(shard))


def shard_by_layer(name: str) -> str:
    """``shard_of`` for TinyGPT-style names: "blocks.<i>.*" -> "layer<i>", anything else -> "shared"."""
    m = re.match(r"blocks\.(\d+)\.", name)
    return f"layer{m.group(1)}" if m else "shared"


class LazyModel:
    """Shards loaded on first access, at most ``capacity`` resident (LRU); see the module docstring."""

    def __init__(self, dir: str | os.PathLike, capacity: int | None = None, drop_page_cache: bool = False) -> None:
        self.ckpt = ShardedCheckpoint(dir)
        self.capacity = None if capacity is None else _int("capacity", capacity)
        self.drop_page_cache = bool(drop_page_cache)
        self._resident: OrderedDict[str, Future] = OrderedDict()
        self._by_prefetch: set[str] = set()  # resident because of a prefetch, not yet accessed
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prewarm")
        self.load_times: dict[str, list[float]] = {}
        self.reset_stats()

    def reset_stats(self) -> None:
        self.st = dict(accesses=0, hits=0, cold_loads=0, late_prefetches=0, prefetches=0, prefetch_used=0,
                       prefetch_wasted=0, access_s=0.0, stall_s=0.0)  # fmt: skip
        self.access_times: list[float] = []

    # -- loading -------------------------------------------------------------------------------------------------
    def _read(self, shard: str) -> dict[str, np.ndarray]:
        t0 = time.perf_counter()
        data = load_file(self.ckpt.path(shard))
        self.load_times.setdefault(shard, []).append(time.perf_counter() - t0)
        return data

    def _forget_pages(self, shard: str) -> None:
        if self.drop_page_cache and hasattr(os, "posix_fadvise"):
            fd = os.open(self.ckpt.path(shard), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)

    def _make_room(self) -> None:  # caller holds the lock
        while self.capacity is not None and len(self._resident) >= self.capacity:
            victim, _ = self._resident.popitem(last=False)
            if victim in self._by_prefetch:
                self._by_prefetch.discard(victim)
                self.st["prefetch_wasted"] += 1
            self._forget_pages(victim)

    def _check(self, shard: str) -> None:
        if shard not in self.ckpt.shards:
            raise KeyError(f"shard: {shard!r} is not in the checkpoint {self.ckpt.dir!r}")

    def access(self, shard: str) -> dict[str, np.ndarray]:
        """The shard's tensors, loading it on the caller's thread if it is cold (timed, counted)."""
        t0 = time.perf_counter()
        self._check(shard)
        cold = late = False
        with self._lock:
            fut = self._resident.get(shard)
            if fut is None:
                cold = True
                self._make_room()
                fut = Future()
                self._resident[shard] = fut
            else:
                self._resident.move_to_end(shard)
                if shard in self._by_prefetch:
                    self._by_prefetch.discard(shard)
                    self.st["prefetch_used"] += 1
        if cold:
            try:
                fut.set_result(self._read(shard))
            except BaseException as e:
                fut.set_exception(e)
                with self._lock:
                    self._resident.pop(shard, None)
                raise
            self.st["cold_loads"] += 1
        elif not fut.done():
            late = True
            self.st["late_prefetches"] += 1
        else:
            self.st["hits"] += 1
        data = fut.result()
        dt = time.perf_counter() - t0
        self.st["accesses"] += 1
        self.st["access_s"] += dt
        if cold or late:
            self.st["stall_s"] += dt
        self.access_times.append(dt)
        return data

    def get(self, name: str) -> np.ndarray:
        """One tensor by name (loads its shard if needed)."""
        if name not in self.ckpt.index:
            raise KeyError(f"name: no tensor {name!r} in the checkpoint")
        return self.access(self.ckpt.index[name])[name]

    def prefetch(self, shard: str) -> bool:
        """Start loading ``shard`` in the background; False if it is already resident (or loading) -- then it is only
        marked most recently used, so the loads for the other predictions do not evict it."""
        self._check(shard)
        with self._lock:
            if shard in self._resident:
                self._resident.move_to_end(shard)
                return False
            self._make_room()
            self._resident[shard] = self._pool.submit(self._read, shard)
            self._by_prefetch.add(shard)
            self.st["prefetches"] += 1
        return True

    def drop(self, shard: str) -> None:
        """Make ``shard`` cold (no error if it already is)."""
        self._check(shard)
        with self._lock:
            self._resident.pop(shard, None)
            self._by_prefetch.discard(shard)
        self._forget_pages(shard)

    def resident(self) -> list[str]:
        """Resident (or loading) shards, least recently used first."""
        with self._lock:
            return list(self._resident)

    def wait(self) -> None:
        """Block until every background load has finished."""
        for f in list(self._resident.values()):
            f.exception()

    def stats(self) -> dict[str, float]:
        s = dict(self.st)
        n = max(s["accesses"], 1)
        s["mean_access_s"] = s["access_s"] / n
        s["p99_access_s"] = float(np.quantile(self.access_times, 0.99)) if self.access_times else 0.0
        lt = [t for v in self.load_times.values() for t in v]
        s["mean_load_s"] = float(np.mean(lt)) if lt else 0.0
        return s

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __enter__(self) -> LazyModel:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class MarkovPrewarmer:
    """Order-``order`` Markov chain over shard accesses (back-off to shorter contexts); see the module docstring."""

    def __init__(self, order: int = 1) -> None:
        self.order = _int("order", order)
        self.counts: dict[tuple[str, ...], Counter] = {}
        self.history: deque[str] = deque(maxlen=self.order)
        self.predicted: list[str] | None = None
        self.n_predicted = self.n_correct = 0

    def observe(self, shard: str) -> None:
        """Record an access: counts for every context length 1..order ending at the previous accesses."""
        if not isinstance(shard, str):
            raise TypeError(f"shard: expected a str, got {type(shard).__name__}")
        if self.predicted is not None:
            self.n_predicted += 1
            self.n_correct += shard in self.predicted
            self.predicted = None
        h = list(self.history)
        for k in range(1, len(h) + 1):
            self.counts.setdefault(tuple(h[-k:]), Counter())[shard] += 1
        self.history.append(shard)

    def fit(self, trace: Sequence[str]) -> MarkovPrewarmer:
        """Learn from a past trace (then forget its last accesses as context)."""
        for s in trace:
            self.observe(s)
        self.history.clear()
        self.predicted = None
        return self

    def transition_probs(self, state: Sequence[str] | None = None) -> dict[str, float]:
        """P(next | state) from the counts; ``state`` defaults to the last ``order`` accesses; an unseen state backs
        off to its shorter suffixes; {} when nothing is known."""
        st = tuple(self.history) if state is None else tuple(state)
        if len(st) > self.order:
            raise ValueError(f"state: at most order={self.order} shards, got {len(st)}")
        for k in range(len(st), 0, -1):
            c = self.counts.get(st[-k:])
            if c:
                tot = sum(c.values())
                return {s: n / tot for s, n in c.items()}
        return {}

    def predict(self, k: int = 1, state: Sequence[str] | None = None) -> list[tuple[str, float]]:
        """Top-``k`` (shard, probability), most likely first (ties by name)."""
        k = _int("k", k)
        p = self.transition_probs(state)
        return sorted(p.items(), key=lambda x: (-x[1], x[0]))[:k]

    def transition_matrix(self, shards: Sequence[str]) -> np.ndarray:
        """Order-1 estimate P[i, j] = P(shards[j] | shards[i]) (rows without data are 0)."""
        out = np.zeros((len(shards), len(shards)))
        pos = {s: j for j, s in enumerate(shards)}
        for i, s in enumerate(shards):
            for t, p in self.transition_probs((s,)).items():
                if t in pos:
                    out[i, pos[t]] = p
        return out

    def prewarm(self, model: LazyModel, k: int = 1) -> list[str]:
        """Prefetch the top-``k`` predicted next shards that are not resident; returns the predicted shards."""
        pred = [s for s, _ in self.predict(k)]
        self.predicted = pred
        for s in pred:
            model.prefetch(s)
        return pred

    @property
    def hit_rate(self) -> float:
        """Fraction of accesses that were among the shards predicted just before them."""
        return self.n_correct / self.n_predicted if self.n_predicted else 0.0


def markov_trace(
    n_shards: int, n_steps: int, seed: int, *, branching: int = 2, noise: float = 0.1, prefix: str = "shard"
) -> tuple[list[str], np.ndarray]:
    """SYNTHETIC access trace: shard i is followed by one of ``branching`` fixed successors (Dirichlet weights) or,
    with probability ``noise``, by a uniform random shard. Returns (trace, true transition matrix)."""
    n_shards, n_steps = _int("n_shards", n_shards, 2), _int("n_steps", n_steps)
    branching = _int("branching", branching)
    if branching > n_shards:
        raise ValueError(f"branching: must be <= n_shards={n_shards}, got {branching}")
    if isinstance(noise, bool) or not isinstance(noise, int | float) or not 0 <= noise <= 1:
        raise ValueError(f"noise: must be a probability in [0, 1], got {noise!r}")
    rng = np.random.default_rng(seed)
    P = np.full((n_shards, n_shards), noise / n_shards)
    for i in range(n_shards):
        succ = rng.choice(n_shards, branching, replace=False)
        P[i, succ] += (1 - noise) * rng.dirichlet(np.ones(branching))
    s, out = int(rng.integers(n_shards)), []
    for _ in range(n_steps):
        out.append(f"{prefix}{s}")
        s = int(rng.choice(n_shards, p=P[s]))
    return out, P


def replay(
    model: LazyModel, trace: Sequence[str], prewarmer: MarkovPrewarmer | None = None, k: int = 1, think_s: float = 0.0
) -> dict[str, float]:
    """Serve ``trace`` (one shard access per request, ``think_s`` seconds of simulated work after it) with or without
    prewarming; the model's ``stats()`` plus the prewarmer's prediction ``hit_rate``."""
    if isinstance(think_s, bool) or not isinstance(think_s, int | float) or think_s < 0:
        raise ValueError(f"think_s: must be a number >= 0, got {think_s!r}")
    model.reset_stats()
    for s in trace:
        model.access(s)
        if prewarmer is not None:
            prewarmer.observe(s)
            prewarmer.prewarm(model, k)
        if think_s:
            time.sleep(think_s)
    model.wait()
    out = model.stats()
    out["hit_rate"] = prewarmer.hit_rate if prewarmer is not None else 0.0
    return out
