"""A multi-stage inference pipeline on threads with bounded queues, an online stage rebalancer [Q189], and an
asynchronous CPU-side preprocessor for multi-turn requests overlapped with the model step [Q198].

Pipeline: stages s_0 .. s_{n-1} (callables item -> item) are grouped into *groups* of adjacent stages; each group
is a pool of ``workers`` threads reading bounded queue g and writing queue g + 1:

    put -> [q0] -> group 0 (stages 0..1, 1 thread) -> [q1] -> group 1 (stage 2, 2 threads) -> [q2] -> get (in order)

Items carry their submission index; ``get`` returns results in submission order (out-of-order ones wait in a
reorder buffer), so the outputs equal sequential execution. Bounded queues give backpressure: ``put`` blocks when
q0 is full (or raises ``queue.Full`` after ``timeout``), a slow group blocks the groups before it, and nothing is
dropped. Every stage call is timed (perf_counter), so ``stats()`` reports MEASURED per-stage service times and
per-group utilisation = busy time / (wall time x workers).

Rebalancer (``plan_rebalance``): throughput is 1 / max_g(sum of its stage times / workers_g). From measured times:
    1. merge adjacent groups while the merged group's time stays <= the bottleneck time: light stages share one
       thread (fewer queue hops, a thread freed) without lowering throughput;
    2. give the bottleneck group one more worker while the thread budget allows and every stage in it is
       parallel-safe (stateless); stop at a serial bottleneck (only a faster stage helps there).
Threads help where stage work releases the GIL (numpy/BLAS, the C++ kernels, I/O); pure-Python stages serialise
on the GIL, so ``run_adaptive`` closes the loop: it tries each proposed plan on the next chunk of requests, keeps it
only if the MEASURED throughput improved, and otherwise reverts and stops replicating those stages.

AsyncPreprocessor [Q198]: multi-turn chat requests repeat their history, so per batch the CPU side must tokenize
every turn, compute the prefix-cache lookup keys (chained block hashes, the scheme of ``PagedKVCache``:
h_i = hash((h_{i-1}, tokens of block i))) and pack a padded [B, T] batch. ``serve(..., overlap=True)`` runs that in
a thread pool feeding a bounded ``asyncio.Queue`` whose consumer runs the model step on the event-loop thread
(the serving loop; no thread hop per step), so the preprocessing of batch i+1 overlaps the model step of batch i;
``overlap=False`` runs them back to back. Both return the same outputs and MEASURED wall time, preprocessing and
model-step time. Gain <= min(preprocess, step) / (preprocess + step) (Amdahl): the byte tokenizer's preprocessing
is ~1-2 % of a TinyGPT step here, so overlap saves little (a BPE tokenizer over long histories is what makes it
matter); pure-Python preprocessing holds the GIL, so it overlaps only the GIL-free (numpy/BLAS) part of a step.

Autograd's no_grad switch is process-global: wrap a run whose stages call a model in ``tl.no_grad()`` on the
calling thread rather than inside the stages (a context entered and left on several threads can race).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

_STOP = object()


@dataclass(frozen=True)
class Stage:
    """One pipeline stage: ``fn(item) -> item``; ``parallel_safe``: may run on several threads at once."""

    name: str
    fn: Callable[[Any], Any]
    parallel_safe: bool = True


@dataclass(frozen=True)
class Group:
    """Adjacent stages (indices) run one after the other by each of ``workers`` threads."""

    stages: tuple[int, ...]
    workers: int = 1


def _check_plan(plan: Sequence[Group], stages: Sequence[Stage]) -> list[Group]:
    plan = list(plan)
    flat = [i for g in plan for i in g.stages]
    if not all(isinstance(g, Group) for g in plan) or flat != list(range(len(stages))):
        raise ValueError(f"plan: groups must cover stages 0..{len(stages) - 1} in order, got {plan!r}")
    for g in plan:
        if not isinstance(g.workers, int) or g.workers < 1:
            raise ValueError(f"plan: workers must be an int >= 1, got {g.workers!r} in {g!r}")
        if g.workers > 1 and not all(stages[i].parallel_safe for i in g.stages):
            raise ValueError(f"plan: group {g.stages} has {g.workers} workers but a stage that is not parallel-safe")
    return plan


class Pipeline:
    """Threads + bounded queues; see the module docstring. ``plan`` None = one group per stage, one worker each."""

    def __init__(self, stages: Sequence[Stage], plan: Sequence[Group] | None = None, queue_size: int = 4) -> None:
        stages = list(stages)
        if not stages or not all(isinstance(s, Stage) and callable(s.fn) for s in stages):
            raise ValueError(f"stages: expected a non-empty list of Stage(name, callable), got {stages!r}")
        if isinstance(queue_size, bool) or not isinstance(queue_size, int) or queue_size < 1:
            raise ValueError(f"queue_size: must be an int >= 1, got {queue_size!r}")
        self.stages = stages
        self.plan = _check_plan([Group((i,)) for i in range(len(stages))] if plan is None else plan, stages)
        self.queue_size = queue_size
        self._threads: list[threading.Thread] = []
        self._started = False

    # -- lifecycle ------------------------------------------------------------------------------------------------
    def start(self) -> Pipeline:
        if self._started:
            raise RuntimeError("start: this pipeline is already running")
        self._queues = [queue.Queue(self.queue_size) for _ in range(len(self.plan) + 1)]
        self._busy, self._calls = [0.0] * len(self.stages), [0] * len(self.stages)
        self._lock, self._alive = threading.Lock(), [g.workers for g in self.plan]
        self._next_in, self._next_out, self._reorder = 0, 0, {}
        self.max_depth = [0] * len(self._queues)
        for gi, g in enumerate(self.plan):
            for w in range(g.workers):
                t = threading.Thread(target=self._work, args=(gi,), name=f"pipe-g{gi}-w{w}", daemon=True)
                t.start()
                self._threads.append(t)
        self._t0 = time.perf_counter()
        self._started = True
        return self

    def _work(self, gi: int) -> None:
        q_in, q_out = self._queues[gi], self._queues[gi + 1]
        stage_ids = self.plan[gi].stages
        while True:
            msg = q_in.get()
            if msg is _STOP:
                with self._lock:
                    self._alive[gi] -= 1
                    last = self._alive[gi] == 0
                if last:  # the last worker of this group passes the stop on, once per next-group worker
                    for _ in range(self.plan[gi + 1].workers if gi + 1 < len(self.plan) else 1):
                        q_out.put(_STOP)
                return
            idx, item, err = msg
            if err is None:
                for si in stage_ids:
                    t0 = time.perf_counter()
                    try:
                        item = self.stages[si].fn(item)
                    except BaseException as e:  # delivered to get(), in order
                        err = (self.stages[si].name, e)
                    dt = time.perf_counter() - t0
                    with self._lock:
                        self._busy[si], self._calls[si] = self._busy[si] + dt, self._calls[si] + 1
                    if err is not None:
                        break
            q_out.put((idx, item, err))
            self.max_depth[gi + 1] = max(self.max_depth[gi + 1], q_out.qsize())

    def put(self, item: Any, timeout: float | None = None) -> int:
        """Submit ``item``; blocks while the first queue is full (backpressure); ``queue.Full`` after ``timeout``
        seconds. Returns the item's index."""
        if not self._started:
            raise RuntimeError("put: call start() first")
        idx = self._next_in
        self._queues[0].put((idx, item, None), timeout=timeout)
        self.max_depth[0] = max(self.max_depth[0], self._queues[0].qsize())
        self._next_in += 1
        return idx

    def get(self, timeout: float | None = None) -> Any:
        """The next result in submission order; re-raises a stage's exception (RuntimeError naming the stage);
        ``queue.Empty`` after ``timeout`` seconds."""
        want = self._next_out
        deadline = None if timeout is None else time.perf_counter() + timeout
        while want not in self._reorder:
            left = None if deadline is None else max(0.0, deadline - time.perf_counter())
            msg = self._queues[-1].get(timeout=left)
            if msg is _STOP:
                raise RuntimeError("get: the pipeline was closed with no result pending")
            self._reorder[msg[0]] = msg
        _, item, err = self._reorder.pop(want)
        self._next_out += 1
        if err is not None:
            raise RuntimeError(f"stage {err[0]!r} failed on item {want}: {err[1]!r}") from err[1]
        return item

    def close(self, timeout: float = 10.0) -> None:
        """Stop the workers (after the items already queued) and join them."""
        if not self._started:
            return
        for _ in range(self.plan[0].workers):
            self._queues[0].put(_STOP, timeout=timeout)
        end = time.perf_counter() + timeout
        for t in self._threads:
            while t.is_alive() and time.perf_counter() < end:
                try:  # drain unread results so no worker stays blocked on a full queue
                    msg = self._queues[-1].get(timeout=0.01)
                    if msg is not _STOP:
                        self._reorder[msg[0]] = msg
                except queue.Empty:
                    pass
            t.join(max(0.0, end - time.perf_counter()))
        self.wall_s = time.perf_counter() - self._t0
        self._threads, self._started = [], False

    def run(self, items: Sequence[Any], timeout_s: float = 120.0) -> list[Any]:
        """Push ``items`` through (a feeder thread puts, this thread gets) and return the results in order.
        ``self.wall_s``: the measured wall time."""
        items = list(items)
        self.start()
        t0 = time.perf_counter()
        feeder = threading.Thread(target=lambda: [self.put(x, timeout=timeout_s) for x in items], daemon=True)
        feeder.start()
        try:
            out = [self.get(timeout=max(0.0, timeout_s - (time.perf_counter() - t0))) for _ in items]
        finally:
            feeder.join(timeout_s)
            self.close()
        self.wall_s = time.perf_counter() - t0
        return out

    # -- measurement ------------------------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """MEASURED: per-stage mean service seconds, per-group utilisation, wall time and throughput of the last run."""
        if not hasattr(self, "_busy"):
            raise RuntimeError("stats: the pipeline has not run yet")
        wall = getattr(self, "wall_s", time.perf_counter() - self._t0)
        svc = [b / c if c else 0.0 for b, c in zip(self._busy, self._calls)]
        util = [sum(self._busy[i] for i in g.stages) / (wall * g.workers) for g in self.plan]
        n = min(self._calls) if self._calls else 0
        thr = n / wall if wall > 0 else 0.0
        names = {s.name: t for s, t in zip(self.stages, svc)}
        return dict(stage_s=names, service_s=svc, group_util=util, wall_s=wall, items=n, throughput=thr,
                    max_queue_depth=list(self.max_depth))  # fmt: skip

    def rebalance(self, max_workers: int) -> tuple[list[Group], list[str]]:
        """A new plan from this pipeline's measured per-stage service times (``plan_rebalance``)."""
        return plan_rebalance(self.stats()["service_s"], [s.parallel_safe for s in self.stages], max_workers)

    def __repr__(self) -> str:
        groups = ", ".join("+".join(self.stages[i].name for i in g.stages) + f" x{g.workers}" for g in self.plan)
        return f"Pipeline([{groups}], queue_size={self.queue_size})"


def bottleneck_s(plan: Sequence[Group], service_s: Sequence[float]) -> float:
    """Seconds per item of the slowest group: max_g sum(stage times) / workers (1 / modelled throughput)."""
    return max(sum(service_s[i] for i in g.stages) / g.workers for g in plan)


def plan_rebalance(
    service_s: Sequence[float], parallel_safe: Sequence[bool], max_workers: int
) -> tuple[list[Group], list[str]]:
    """(plan, decisions) from per-stage service times: merge adjacent light groups under the bottleneck, then give
    the bottleneck group workers while ``max_workers`` threads allow and its stages are parallel-safe."""
    t = [float(x) for x in service_s]
    if not t or any(not np.isfinite(x) or x < 0 for x in t):
        raise ValueError(f"service_s: expected a non-empty list of finite times >= 0, got {service_s!r}")
    if len(parallel_safe) != len(t):
        raise ValueError(f"parallel_safe: expected {len(t)} flags, got {len(parallel_safe)}")
    if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
        raise ValueError(f"max_workers: must be an int >= 1, got {max_workers!r}")
    plan = [Group((i,)) for i in range(len(t))]
    log: list[str] = []

    def time_of(g: Group) -> float:
        return sum(t[i] for i in g.stages) / g.workers

    while True:  # 1. merges (cheapest adjacent pair first) that do not raise the bottleneck
        bott = bottleneck_s(plan, t)
        best = None
        for j in range(len(plan) - 1):
            merged = sum(t[i] for i in plan[j].stages + plan[j + 1].stages)
            if merged <= bott and (best is None or merged < best[1]):
                best = (j, merged)
        if best is None and len(plan) > max_workers:  # over budget: merge the cheapest pair anyway
            best = min(
                ((j, sum(t[i] for i in plan[j].stages + plan[j + 1].stages)) for j in range(len(plan) - 1)),
                key=lambda x: x[1],
            )
        if best is None or len(plan) == 1:
            break
        j, merged = best
        g = Group(plan[j].stages + plan[j + 1].stages)
        log.append(f"merge stages {list(g.stages)}: {merged * 1e3:.3g} ms/item <= bottleneck {bott * 1e3:.3g} ms")
        plan[j : j + 2] = [g]
    while sum(g.workers for g in plan) < max_workers:  # 2. replicate the bottleneck
        j = max(range(len(plan)), key=lambda k: time_of(plan[k]))
        g = plan[j]
        if not all(parallel_safe[i] for i in g.stages):
            log.append(f"bottleneck stages {list(g.stages)} are not parallel-safe: no more workers help")
            break
        plan[j] = Group(g.stages, g.workers + 1)
        log.append(
            f"stages {list(g.stages)}: {g.workers + 1} workers, {time_of(g) * 1e3:.3g} -> "
            f"{time_of(plan[j]) * 1e3:.3g} ms/item"
        )
    return plan, log


def run_adaptive(
    stages: Sequence[Stage],
    chunks: Sequence[Sequence[Any]],
    max_workers: int,
    queue_size: int = 4,
    min_gain: float = 1.1,
) -> tuple[list[Any], list[dict[str, Any]]]:
    """The online rebalancer: run ``chunks`` of items one after another; after each, propose a plan from the
    MEASURED stage times (``plan_rebalance``) and try it on the next chunk. A trial is kept only if its measured
    throughput beats the previous plan's by ``min_gain``; otherwise the previous plan comes back and the stages
    that got extra workers are marked non-scaling (e.g. GIL-bound Python: two threads run no faster than one).
    Returns (outputs in order, history [{plan, throughput, service_s, decision}])."""
    stages = list(stages)
    safe = [st.parallel_safe for st in stages]
    plan: list[Group] = [Group((i,)) for i in range(len(stages))]
    best: tuple[list[Group], float] | None = None
    outs: list[Any] = []
    hist: list[dict[str, Any]] = []
    for chunk in chunks:
        p = Pipeline(stages, plan, queue_size)
        outs += p.run(chunk)
        st = p.stats()
        thr, decision = st["throughput"], "kept"
        if best is not None and plan != best[0]:
            if thr >= min_gain * best[1]:
                decision = f"trial kept: {thr:.0f} >= {min_gain} x {best[1]:.0f} items/s"
            else:
                grown = {i for g in plan if g.workers > 1 for i in g.stages}
                grown -= {i for g in best[0] if g.workers > 1 for i in g.stages}
                for i in grown:
                    safe[i] = False
                decision = f"trial reverted: {thr:.0f} < {min_gain} x {best[1]:.0f} items/s; no-scale {sorted(grown)}"
                plan, thr = best
        hist.append(dict(plan=list(p.plan), throughput=st["throughput"], service_s=st["service_s"], decision=decision))
        best = (plan, thr)
        plan, _ = plan_rebalance(st["service_s"], safe, max_workers)
    return outs, hist


# -- [Q198] asynchronous preprocessing of multi-turn requests ------------------------------------------------------
@dataclass
class Packed:
    """One preprocessed batch: padded ids [B, T], true lengths, prefix-cache keys per request, hit blocks."""

    ids: np.ndarray
    lengths: np.ndarray
    keys: list[list[int]]
    cached_blocks: list[int]


class AsyncPreprocessor:
    """CPU-side preprocessing of multi-turn chat requests in a thread pool, pipelined with the model step.

    A request is a list of (role, text) turns; it is rendered "<role>: text\\n" per turn, tokenized, its chained
    block hashes computed (prefix-cache lookup keys) and looked up in a key set shared by all requests (the blocks a
    prefix cache would already hold), and the batch packed into a [B, T] array (left-truncated to ``max_len``,
    right-padded with ``pad_id``)."""

    def __init__(
        self, tokenizer: Any, block_size: int = 16, max_len: int = 128, workers: int = 2, depth: int = 2
    ) -> None:
        if not hasattr(tokenizer, "encode"):
            raise TypeError(f"tokenizer: expected an object with encode(text), got {type(tokenizer).__name__}")
        for name, v in (("block_size", block_size), ("max_len", max_len), ("workers", workers), ("depth", depth)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: must be an int >= 1, got {v!r}")
        self.tokenizer, self.block_size, self.max_len = tokenizer, block_size, max_len
        self.workers, self.depth, self.pad_id, self._seen = workers, depth, 0, set()

    def keys(self, ids: Sequence[int]) -> list[int]:
        """Chained hashes of the full blocks of ``ids`` (PagedKVCache's prefix-index scheme)."""
        out, h, bs = [], 0, self.block_size
        for i in range(len(ids) // bs):
            out.append(h := hash((h, tuple(ids[i * bs : (i + 1) * bs]))))
        return out

    def preprocess(self, batch: Sequence[Sequence[tuple[str, str]]]) -> Packed:
        if not batch:
            raise ValueError("batch: expected at least one request")
        rows, keys = [], []
        for req in batch:
            text = "".join(f"<{role}>: {msg}\n" for role, msg in req)
            ids = self.tokenizer.encode(text)
            rows.append(ids[-self.max_len :])
            keys.append(self.keys(ids))
        t = max(len(r) for r in rows)
        arr = np.full((len(rows), t), self.pad_id, dtype=np.int64)
        for i, r in enumerate(rows):
            arr[i, : len(r)] = r
        return Packed(arr, np.array([len(r) for r in rows]), keys, [])

    def lookup(self, packed: Packed) -> Packed:
        """Fill ``cached_blocks``: per request, the leading blocks whose keys an earlier request already produced
        (what a prefix cache would hold). Run in batch order (cheap), so the result does not depend on threads."""
        packed.cached_blocks = []
        for k in packed.keys:
            n = 0
            while n < len(k) and k[n] in self._seen:
                n += 1
            self._seen.update(k)
            packed.cached_blocks.append(n)
        return packed

    def serve(self, batches: Sequence[Sequence[Sequence[tuple[str, str]]]], step: Callable[[Packed], Any],
              overlap: bool = True) -> tuple[list[Any], dict[str, Any]]:  # fmt: skip
        """(outputs in batch order, MEASURED timings). overlap=False: preprocess then step, batch by batch;
        overlap=True: the asyncio pipeline of the module docstring. Timings: wall_s, preprocess_s and step_s (sums
        of the calls), pre_spans / step_spans ((start, end) perf_counter seconds per batch) and overlap_s (time
        during which a preprocess call and a model step ran at once)."""
        if not callable(step):
            raise TypeError(f"step: expected a callable(Packed), got {type(step).__name__}")
        batches = list(batches)
        self._seen = set()
        pre: dict[int, tuple[float, float]] = {}
        stp: dict[int, tuple[float, float]] = {}

        def timed(fn: Callable[[Any], Any], arg: Any, spans: dict, i: int) -> Any:
            t0 = time.perf_counter()
            out = fn(arg)
            spans[i] = (t0, time.perf_counter())
            return out

        t0 = time.perf_counter()
        if not overlap:
            outs = [timed(step, self.lookup(timed(self.preprocess, b, pre, i)), stp, i) for i, b in enumerate(batches)]
        else:
            coro = self._serve_async(batches, step, timed, pre, stp)
            try:
                asyncio.get_running_loop()
            except RuntimeError:  # no loop in this thread: run ours here
                outs = asyncio.run(coro)
            else:  # called from a running loop (a Jupyter kernel, an async server): ours gets its own thread
                with concurrent.futures.ThreadPoolExecutor(1) as ex:
                    outs = ex.submit(asyncio.run, coro).result()
        wall = time.perf_counter() - t0
        ps, ss = [pre[i] for i in range(len(batches))], [stp[i] for i in range(len(batches))]
        both = sum(max(0.0, min(a[1], b[1]) - max(a[0], b[0])) for a in ps for b in ss)
        pre_s, step_s = sum(e - s for s, e in ps), sum(e - s for s, e in ss)
        return outs, dict(wall_s=wall, preprocess_s=pre_s, step_s=step_s, overlap_s=both, pre_spans=ps, step_spans=ss)

    async def _serve_async(self, batches: list, step: Callable, timed: Callable, pre: dict, stp: dict) -> list:
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue(self.depth)  # bounded: preprocessing runs at most 2 x depth batches ahead
        with ThreadPoolExecutor(self.workers) as pool:

            def submit(i: int) -> asyncio.Future:
                return loop.run_in_executor(pool, timed, self.preprocess, batches[i], pre, i)

            pending = [submit(i) for i in range(min(self.depth, len(batches)))]

            async def produce() -> None:
                for i in range(len(batches)):
                    await q.put(self.lookup(await pending[i]))  # in order; blocks while the consumer lags
                    if i + self.depth < len(batches):
                        pending.append(submit(i + self.depth))

            async def consume() -> list:
                outs = []
                for i in range(len(batches)):
                    packed = await q.get()
                    outs.append(timed(step, packed, stp, i))  # on the loop thread; the pool keeps preprocessing
                return outs

            _, outs = await asyncio.gather(produce(), consume())
        return outs


# -- a real workload ------------------------------------------------------------------------------------------------
def demo_stages(model: Any, tokenizer: Any, seq_len: int = 64, feat_dim: int = 384, seed: int = 0) -> list[Stage]:
    """tokenize (Python) -> embed (numpy: embedding rows + two [T, F] x [F, F] GEMMs, GIL released) -> decode
    (a TinyGPT forward over the ids; call under ``tl.no_grad()``) -> postprocess (softmax, top-5, detokenize).
    Every stage is stateless, hence parallel-safe."""
    rng = np.random.default_rng(seed)
    v, d = model.config.vocab_size, model.config.d_model
    w_in = rng.standard_normal((d, feat_dim)).astype(np.float32) / np.sqrt(d)
    w_ff = rng.standard_normal((feat_dim, feat_dim)).astype(np.float32) / np.sqrt(feat_dim)
    emb = model.tok_emb.weight.data

    def tokenize(text: str) -> dict[str, Any]:
        ids = [i % v for i in tokenizer.encode(text)][-seq_len:]
        return {"ids": np.array(ids, dtype=np.int64)}

    def embed(x: dict[str, Any]) -> dict[str, Any]:
        h = np.tanh(emb[x["ids"]] @ w_in)
        for _ in range(3):
            h = np.tanh(h @ w_ff)
        return {**x, "feature": h.mean(0)}

    def decode(x: dict[str, Any]) -> dict[str, Any]:
        return {**x, "logits": model(x["ids"][None]).data[0, -1]}

    def postprocess(x: dict[str, Any]) -> dict[str, Any]:
        z = x["logits"] - x["logits"].max()
        p = np.exp(z) / np.exp(z).sum()
        top = np.argsort(-p)[:5]
        return {"top": top.tolist(), "p": p[top].tolist(), "text": tokenizer.decode(top.tolist()), "f": x["feature"]}

    return [Stage(f.__name__, f) for f in (tokenize, embed, decode, postprocess)]


def chat_requests(n: int, turns: int, seed: int = 0) -> list[list[list[tuple[str, str]]]]:
    """``turns`` batches: batch j holds the n conversations after j + 1 turns (user + assistant per turn), so batch
    j + 1 repeats batch j's history as its prefix (multi-turn chat)."""
    rng = np.random.default_rng(seed)
    words = "the a model token cache block serve queue batch prefix decode stream latency kernel".split()
    convs: list[list[tuple[str, str]]] = [[] for _ in range(n)]
    out = []
    for _ in range(turns):
        for c in convs:
            for role in ("user", "assistant"):
                c.append((role, " ".join(rng.choice(words, size=int(rng.integers(8, 20))))))
        out.append([list(c) for c in convs])
    return out
