"""Concurrent-kernel interference: measure it, predict it with a linear model, schedule to avoid it [Q228].

Two kernels running at once on two cores share the last-level cache and the DRAM bandwidth. A compute-bound
kernel whose working set fits its core's private L2 barely notices a neighbour; two streaming kernels (a large
copy) each get part of the bandwidth and slow down most. What a scheduler co-locating two jobs sees is two
*processes*, so that is what is measured (two threads of one process would also queue on the GIL and on the
process's page-fault / mmap lock, which no co-located pair of jobs shares):

``PairWorkers``        two worker processes ('fork' or 'forkserver'), each pinned to its own CPU (when the process
                       may run on >= 2), BLAS / OpenMP capped at one thread, each building the kernels once
                       (``default_kernels`` are rebuilt in the worker, so the two never share input pages) and then
                       serving commands over a pipe: "run kernel i for N reps (after a barrier), return seconds".
                       Every pipe receive has a timeout; a context manager stops (or kills) the workers.
``measure_pairs``      ``repeat`` rounds of: every kernel alone in each worker (the other idle), then every unordered
                       pair (self-pairs included) at once, released by a barrier; per side the median over rounds of
                       t_pair / t_alone (same round), ``slowdown`` = the mean of the two sides. Times are the workers'
                       CPU seconds by default: stalls on the shared cache / DRAM count, time the OS hands a third
                       process (other jobs on a shared machine) does not.
``pair_features``      three physical, symmetric features (few: 15 measured pairs cannot support more): the product
                       of the kernels' bandwidth demands alone (bytes moved / alone time / a measured streaming-copy
                       bandwidth, clipped to 1; 0 when the working set fits L2, whose bytes come from the private
                       cache), whether both working sets exceed L2 (they meet in the shared LLC), and whether, both
                       spilling, together they exceed the LLC (one evicts the other's data to DRAM).
``InterferenceModel``  ridge least squares ``slowdown - 1 = w . features + b``; ``loo_error`` refits leaving each
                       pair out and compares with predicting the mean of the others.
``order_by_interference`` pairs kernels (an even count: a perfect matching, exact for <= 10 kernels) to minimise
                       the summed predicted slowdown; the result is the co-schedule, best pair first.
"""

from __future__ import annotations

import functools
import math
import multiprocessing as mp
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._threads import limited_threads
from ..backends import load_C


@dataclass
class Kernel:
    """A runnable kernel with its static description: ``fn()`` runs it once; flops and bytes moved per call,
    working-set bytes (what must stay cached for it to run at speed). ``origin`` = (scale, index) for a kernel
    from ``default_kernels`` (a worker process rebuilds it from that)."""

    name: str
    fn: Callable[[], Any]
    flops: float
    bytes: float
    working_set: float
    alone_s: float | None = field(default=None, repr=False)  # seconds per call, filled by measure_pairs
    bw_demand: float | None = field(default=None, repr=False)  # filled by measure_pairs (see pair_features)
    origin: tuple[int, int] | None = field(default=None, repr=False)


def default_kernels(scale: int = 1) -> list[Kernel]:
    """Five kernels of the kinds a scheduler co-locates: GEMM 192 (C++ simd, one thread; compute bound, fits L2),
    a cache-resident GEMM 64, softmax over an 8 MiB matrix (C++; 16 MiB working set, exp-bound), a copy of 2 MiB
    (4 MiB working set: runs from the shared LLC, the cache-sensitive victim) and a copy of 32 MiB (64 MiB: streams
    from DRAM, the aggressor). ``scale`` multiplies the sizes."""
    if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
        raise ValueError(f"scale: expected an int >= 1, got {scale!r}")
    g, k = load_C("gemm"), load_C("kernels")
    isa = g.isa_paths()[0]
    rng = np.random.default_rng(0)
    out = []
    n = 192 * scale
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    out.append(Kernel(f"gemm {n}", lambda: g.matmul(a, b, "simd", isa, 1), 2.0 * n**3, 12.0 * n * n, 12.0 * n * n))
    s = 64
    sa, sb = (rng.standard_normal((s, s)).astype(np.float32) for _ in range(2))
    out.append(Kernel(f"gemm {s} (cached)", lambda: g.matmul(sa, sb, "simd", isa, 1), 2.0 * s**3, 12.0 * s * s,
                      12.0 * s * s))  # fmt: skip
    rows, cols = 1024 * scale, 2048
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    out.append(Kernel(f"softmax {rows}x{cols}", lambda: k.softmax_forward(x, "simd"), 5.0 * x.size, 8.0 * x.size,
                      8.0 * x.size))  # fmt: skip
    for mib, tag in ((2 * scale, "LLC"), (32 * scale, "DRAM")):
        src = rng.standard_normal(mib * 2**18).astype(np.float32)
        dst = np.empty_like(src)
        out.append(Kernel(f"copy {mib} MiB ({tag})", functools.partial(np.copyto, dst, src), float(src.size),
                          2.0 * src.nbytes, 2.0 * src.nbytes))  # fmt: skip
    for i, kern in enumerate(out):
        kern.origin = (scale, i)
    return out


def _cache_bytes(index: int, default: float) -> float:
    try:
        with open(f"/sys/devices/system/cpu/cpu0/cache/index{index}/size") as f:
            s = f.read().strip()
        return float(int(s[:-1]) * {"K": 2**10, "M": 2**20}[s[-1]] if s[-1] in "KM" else int(s))
    except (OSError, ValueError, KeyError, IndexError):
        return default


def l2_bytes() -> float:
    """This machine's per-core L2 size (Linux sysfs; 1 MiB where unknown)."""
    return _cache_bytes(2, float(2**20))


def llc_bytes() -> float:
    """This machine's last-level cache size (Linux sysfs index3; 32 MiB where unknown)."""
    return _cache_bytes(3, float(32 * 2**20))


def _timed(fn: Callable[[], Any], reps: int) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) for ``reps`` calls."""
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(reps):
        fn()
    return time.perf_counter() - t0, time.process_time() - c0


def _stream_bandwidth(nbytes: int = 64 * 2**20) -> float:
    """Bytes per second (read + write) of a numpy copy of ``nbytes`` (well past the LLC): the DRAM reference."""
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    return 2.0 * src.nbytes / min(_timed(lambda: np.copyto(dst, src), 1)[1] for _ in range(3))


def _build(specs: list[Any]) -> list[Kernel]:
    built: dict[int, list[Kernel]] = {}
    out = []
    for s in specs:
        if isinstance(s, Kernel):  # 'fork': the parent's kernel object, inherited
            out.append(s)
            continue
        scale, i = s
        if scale not in built:
            built[scale] = default_kernels(scale)
        out.append(built[scale][i])
    return out


def _worker(conn: Any, barrier: Any, cpu: int | None, specs: list[Any], timeout_s: float) -> None:
    """A worker process: pin, cap threads, build the kernels, then serve ("run", i, reps, sync) / ("bandwidth",) /
    ("stop",) until told to stop or the pipe closes."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"
    try:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        with limited_threads(1):
            kernels = _build(specs)
            conn.send(("ready", [k.name for k in kernels]))
            while True:
                msg = conn.recv()
                if msg[0] == "stop":
                    break
                try:
                    if msg[0] == "bandwidth":
                        conn.send(("ok", _stream_bandwidth()))
                        continue
                    _, i, reps, sync = msg
                    kernels[i].fn()  # warm: caches, pages, the output buffer's allocation
                    if sync:
                        barrier.wait(timeout_s)
                    conn.send(("ok", _timed(kernels[i].fn, reps)))
                except Exception as e:  # reported to the parent, which raises
                    conn.send(("error", f"{type(e).__name__}: {e}"))
    except (EOFError, KeyboardInterrupt, BrokenPipeError):
        pass
    except Exception as e:  # building failed: tell the parent
        try:
            conn.send(("error", f"{type(e).__name__}: {e}"))
        except (OSError, ValueError):
            pass
    finally:
        conn.close()


class PairWorkers:
    """Two worker processes serving kernel runs (see the module docstring); use as a context manager.

    ``run(w, i, reps)`` times kernel i in worker w alone (the other idle); ``run_pair(i, ri, j, rj)`` times kernel i
    in worker 0 and kernel j in worker 1 started together by a barrier. Each receive waits at most ``timeout_s``.
    ``clock="cpu"`` (default) returns the worker's CPU seconds (``time.process_time``): stalls on a shared cache or
    on DRAM count, time the OS gave another process (a third job on a shared machine) does not; ``"wall"`` returns
    perf_counter seconds."""

    def __init__(self, kernels: Sequence[Kernel], *, start_method: str = "fork", timeout_s: float = 60.0,
                 clock: str = "cpu") -> None:  # fmt: skip
        if start_method not in ("fork", "forkserver"):
            raise ValueError(f"start_method: expected 'fork' or 'forkserver', got {start_method!r}")
        if clock not in ("cpu", "wall"):
            raise ValueError(f"clock: expected 'cpu' or 'wall', got {clock!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not timeout_s > 0:
            raise ValueError(f"timeout_s: expected a number > 0, got {timeout_s!r}")
        ks = list(kernels)
        if not ks or not all(isinstance(k, Kernel) for k in ks):
            raise ValueError(f"kernels: expected a non-empty sequence of Kernel, got {kernels!r}")
        if start_method == "forkserver" and any(k.origin is None for k in ks):
            bad = [k.name for k in ks if k.origin is None]
            raise ValueError(f"kernels: with 'forkserver' only default_kernels can be rebuilt in a worker, got {bad}")
        self.kernels, self.start_method, self.timeout_s, self.clock = ks, start_method, float(timeout_s), clock
        self.specs = [k.origin if k.origin is not None else k for k in ks]
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self.cpus: list[int | None] = cpus[:2] if len(cpus) >= 2 else [None, None]
        self._procs: list[Any] = []
        self._conns: list[Any] = []

    def __enter__(self) -> PairWorkers:
        ctx = mp.get_context(self.start_method)
        self._barrier = ctx.Barrier(2)
        try:
            for cpu in self.cpus:
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_worker, args=(child, self._barrier, cpu, self.specs, self.timeout_s),
                                daemon=True)  # fmt: skip
                p.start()
                child.close()
                self._procs.append(p)
                self._conns.append(parent)
            for w in range(2):
                names = self._recv(w, "ready")
                if names != [k.name for k in self.kernels]:
                    raise RuntimeError(f"worker {w} built kernels {names}, expected {[k.name for k in self.kernels]}")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _recv(self, w: int, expect: str = "ok") -> Any:
        conn = self._conns[w]
        if not conn.poll(self.timeout_s):
            raise TimeoutError(f"worker {w}: no answer within timeout_s={self.timeout_s}")
        try:
            tag, value = conn.recv()
        except EOFError:
            raise RuntimeError(f"worker {w} died (exit code {self._procs[w].exitcode})") from None
        if tag != expect:
            raise RuntimeError(f"worker {w}: {value}")
        return value

    def _check(self, i: int, reps: int) -> None:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(self.kernels):
            raise ValueError(f"i: expected a kernel index in [0, {len(self.kernels)}), got {i!r}")
        if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
            raise ValueError(f"reps: expected an int >= 1, got {reps!r}")
        if not self._conns:
            raise RuntimeError("PairWorkers: not started (use it as a context manager)")

    def run(self, w: int, i: int, reps: int) -> float:
        """Seconds for ``reps`` calls of kernel ``i`` in worker ``w`` (0 or 1) while the other worker idles."""
        if w not in (0, 1) or isinstance(w, bool):
            raise ValueError(f"w: expected worker 0 or 1, got {w!r}")
        self._check(i, reps)
        self._conns[w].send(("run", i, reps, False))
        return self._pick(self._recv(w))

    def run_pair(self, i: int, ri: int, j: int, rj: int) -> tuple[float, float]:
        """Seconds for ``ri`` calls of kernel ``i`` (worker 0) and ``rj`` of kernel ``j`` (worker 1), concurrently."""
        self._check(i, ri)
        self._check(j, rj)
        self._conns[0].send(("run", i, ri, True))
        self._conns[1].send(("run", j, rj, True))
        return self._pick(self._recv(0)), self._pick(self._recv(1))

    def _pick(self, wall_cpu: tuple[float, float]) -> float:
        return float(wall_cpu[1] if self.clock == "cpu" else wall_cpu[0])

    def bandwidth(self) -> float:
        """Streaming-copy bandwidth (bytes/s, read + write) measured in worker 0 with worker 1 idle."""
        self._conns[0].send(("bandwidth",))
        return float(self._recv(0))

    def close(self) -> None:
        """Ask the workers to stop; join them (terminate / kill any that does not exit)."""
        for c in self._conns:
            try:
                c.send(("stop",))
            except (OSError, ValueError):
                pass
        for p in self._procs:
            p.join(timeout=min(self.timeout_s, 5.0))
            if p.is_alive():
                p.terminate()
                p.join(timeout=2.0)
            if p.is_alive():
                p.kill()
                p.join()
        for c in self._conns:
            c.close()
        self._procs, self._conns = [], []


def measure_pairs(
    kernels: Sequence[Kernel],
    target_s: float = 0.02,
    repeat: int = 3,
    *,
    start_method: str = "fork",
    timeout_s: float = 60.0,
    stat: str = "median",
    clock: str = "cpu",
) -> list[dict[str, Any]]:
    """Every unordered pair (itself included) alone and concurrently in two worker processes (``PairWorkers``);
    rows {"a", "b", "alone_a_s", "alone_b_s", "pair_a_s", "pair_b_s", "slowdown_a", "slowdown_b", "slowdown",
    "reps_a", "reps_b", "dram_bw"} (``clock`` seconds of ``reps`` calls, medians over ``repeat`` rounds; reps chosen
    so a loop takes about ``target_s``; ``stat="min"``: best pair over best alone instead of the median ratio).
    Sets each kernel's ``alone_s`` (seconds per call) and ``bw_demand`` (see ``bandwidth_demand``)."""
    if len(kernels) < 2:
        raise ValueError(f"kernels: need at least 2 kernels, got {len(kernels)}")
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise ValueError(f"repeat: expected an int >= 1, got {repeat!r}")
    if isinstance(target_s, bool) or not isinstance(target_s, int | float) or not 0 < target_s <= 10:
        raise ValueError(f"target_s: expected seconds in (0, 10], got {target_s!r}")
    if stat not in ("median", "min"):
        raise ValueError(f"stat: expected 'median' or 'min', got {stat!r}")
    n = len(kernels)
    with PairWorkers(kernels, start_method=start_method, timeout_s=timeout_s, clock=clock) as pw:
        bw = pw.bandwidth()
        reps = []
        for i in range(n):
            t = min(pw.run(0, i, 1) for _ in range(2))
            reps.append(max(1, min(5000, int(target_s / max(t, 1e-7)))))
        pairs = [(i, j) for i in range(n) for j in range(i, n)]
        alone = np.zeros((repeat, 2, n))  # [round, worker, kernel] seconds of reps[kernel] calls
        paired = np.zeros((repeat, len(pairs), 2))  # [round, pair, side]
        for r in range(repeat):  # each round: every kernel alone in each worker, then every pair
            for w in range(2):
                for i in range(n):
                    alone[r, w, i] = pw.run(w, i, reps[i])
            for p, (i, j) in enumerate(pairs):
                paired[r, p] = pw.run_pair(i, reps[i], j, reps[j])
    rows = []
    for p, (i, j) in enumerate(pairs):
        ta, tb, pa, pb = alone[:, 0, i], alone[:, 1, j], paired[:, p, 0], paired[:, p, 1]
        if stat == "min":  # best pair time over best alone time: drops rounds hit by background load
            s_a, s_b = pa.min() / ta.min(), pb.min() / tb.min()
        else:  # the median over rounds of the ratio within a round (slow drift of the machine cancels)
            s_a, s_b = float(np.median(pa / ta)), float(np.median(pb / tb))
        rows.append({"a": kernels[i].name, "b": kernels[j].name, "alone_a_s": float(np.median(ta)),
                     "alone_b_s": float(np.median(tb)), "pair_a_s": float(np.median(pa)),
                     "pair_b_s": float(np.median(pb)), "slowdown_a": float(s_a), "slowdown_b": float(s_b),
                     "slowdown": float(0.5 * (s_a + s_b)), "reps_a": reps[i], "reps_b": reps[j],
                     "dram_bw": bw})  # fmt: skip
    l2 = l2_bytes()
    for i, k in enumerate(kernels):
        k.alone_s = float(np.median(alone[:, :, i])) / reps[i]
        k.bw_demand = bandwidth_demand(k, bw, l2)
    return rows


def bandwidth_demand(k: Kernel, dram_bw: float, l2: float | None = None) -> float:
    """Fraction of the DRAM bandwidth ``dram_bw`` (bytes/s) kernel ``k`` uses alone: bytes / alone time / dram_bw,
    clipped to [0, 1]; 0 when its working set fits the per-core L2 (its bytes then come from its private cache)."""
    if k.alone_s is None or not k.alone_s > 0:
        raise ValueError(f"k: kernel {k.name!r} has no measured alone time (run measure_pairs first)")
    if not dram_bw > 0:
        raise ValueError(f"dram_bw: expected bytes/s > 0, got {dram_bw!r}")
    if k.working_set <= (l2_bytes() if l2 is None else l2):
        return 0.0
    return float(min(1.0, k.bytes / k.alone_s / dram_bw))


NOMINAL_DRAM_BW = 20e9  # bytes/s, used only for a kernel whose bw_demand measure_pairs did not set
FEATURES = ("demand product", "both spill L2", "together exceed LLC")


def kernel_features(k: Kernel, l2: float | None = None) -> dict[str, float]:
    """Per-kernel features: DRAM bandwidth demand (``k.bw_demand``, else against ``NOMINAL_DRAM_BW``) and whether
    its working set exceeds the per-core L2 (``l2`` bytes; this machine's by default)."""
    if k.alone_s is None:
        raise ValueError(f"k: kernel {k.name!r} has no measured alone time (run measure_pairs first)")
    l2 = l2_bytes() if l2 is None else l2
    d = k.bw_demand if k.bw_demand is not None else bandwidth_demand(k, NOMINAL_DRAM_BW, l2)
    return {"bw_demand": float(d), "spills_l2": float(k.working_set > l2)}


def pair_features(a: Kernel, b: Kernel, l2: float | None = None, llc: float | None = None) -> np.ndarray:
    """Symmetric features of running ``a`` beside ``b`` (names in ``FEATURES``): the product of the two bandwidth
    demands (both must stream for them to fight over bandwidth), whether both working sets spill out of the private
    L2 (so they meet in the shared LLC) and whether, both spilling, their working sets together exceed the LLC (so
    one evicts the other's data: a cache-resident kernel is pushed out to DRAM)."""
    fa, fb = kernel_features(a, l2), kernel_features(b, l2)
    llc = llc_bytes() if llc is None else llc
    both = fa["spills_l2"] * fb["spills_l2"]
    return np.array([fa["bw_demand"] * fb["bw_demand"], both, both * float(a.working_set + b.working_set > llc)])


class InterferenceModel:
    """Linear model of a pair's slowdown (see the module docstring); ``ridge`` shrinks the weights (not the bias)."""

    def __init__(self, ridge: float = 1e-3) -> None:
        if isinstance(ridge, bool) or not isinstance(ridge, int | float) or ridge < 0:
            raise ValueError(f"ridge: expected a number >= 0, got {ridge!r}")
        self.ridge = float(ridge)
        self.coef: np.ndarray | None = None
        self.mu: np.ndarray | None = None
        self.sd: np.ndarray | None = None

    def fit(self, x: np.ndarray, slowdown: np.ndarray) -> InterferenceModel:
        x, y = np.asarray(x, dtype=np.float64), np.asarray(slowdown, dtype=np.float64) - 1.0
        if x.ndim != 2 or x.shape[0] != y.size or y.size < 2:
            raise ValueError(f"x: expected [n >= 2, features] rows matching slowdown ({y.size}), got {x.shape}")
        if not (np.isfinite(x).all() and np.isfinite(y).all()):
            raise ValueError("slowdown: x and slowdown must be finite")
        self.mu, self.sd = x.mean(0), x.std(0)
        self.sd[self.sd < 1e-12] = 1.0  # a constant column: its weight stays 0 under ridge
        z = np.concatenate([np.ones((len(y), 1)), (x - self.mu) / self.sd], 1)
        reg = self.ridge * np.eye(z.shape[1])
        reg[0, 0] = 0.0
        self.coef = np.linalg.lstsq(z.T @ z + reg, z.T @ y, rcond=None)[0]
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        if self.coef is None:
            raise ValueError("self: fit() the model before predict()")
        z = (np.atleast_2d(np.asarray(x, dtype=np.float64)) - self.mu) / self.sd
        return 1.0 + np.concatenate([np.ones((len(z), 1)), z], 1) @ self.coef

    def predict_pair(self, a: Kernel, b: Kernel) -> float:
        return float(self.predict(pair_features(a, b)[None])[0])


def fit_from_rows(kernels: Sequence[Kernel], rows: Sequence[dict[str, Any]], ridge: float = 1.0) -> tuple[
    InterferenceModel, np.ndarray, np.ndarray]:  # fmt: skip
    """(model fit on the measured pairs, features [pairs, F], measured slowdowns)."""
    by_name = {k.name: k for k in kernels}
    missing = sorted({r[c] for r in rows for c in ("a", "b")} - set(by_name))
    if missing:
        raise ValueError(f"rows: kernels {missing} are not in kernels")
    x = np.stack([pair_features(by_name[r["a"]], by_name[r["b"]]) for r in rows])
    y = np.array([r["slowdown"] for r in rows])
    return InterferenceModel(ridge).fit(x, y), x, y


def loo_error(x: np.ndarray, y: np.ndarray, ridge: float = 1.0) -> dict[str, float]:
    """Leave-one-out mean absolute error of the linear model and of predicting the mean slowdown (baseline)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    n = len(y)
    if n < 3:
        raise ValueError(f"x: leave-one-out needs at least 3 pairs, got {n}")
    err, base = [], []
    for i in range(n):
        keep = np.arange(n) != i
        m = InterferenceModel(ridge).fit(x[keep], y[keep])
        err.append(abs(float(m.predict(x[i : i + 1])[0]) - y[i]))
        base.append(abs(float(y[keep].mean()) - y[i]))
    return {"model_mae": float(np.mean(err)), "mean_baseline_mae": float(np.mean(base)), "n": n}


def _matchings(items: list[int]) -> Any:
    if not items:
        yield []
        return
    first = items[0]
    for k in range(1, len(items)):
        rest = items[1:k] + items[k + 1 :]
        for m in _matchings(rest):
            yield [(first, items[k]), *m]


def order_by_interference(kernels: Sequence[Kernel], model: InterferenceModel | Callable[[Kernel, Kernel], float]
                          ) -> list[tuple[str, str, float]]:  # fmt: skip
    """Pair ``kernels`` (even count; an odd one out runs alone, slowdown 1.0) to minimise the summed predicted
    slowdown: every perfect matching for <= 10 kernels, greedy beyond. Returns [(a, b, predicted slowdown)] sorted
    best first: the order to launch the co-scheduled pairs."""
    ks = list(kernels)
    if len(ks) < 2:
        raise ValueError(f"kernels: need at least 2 kernels to pair, got {len(ks)}")
    pred = model.predict_pair if isinstance(model, InterferenceModel) else model
    cost = {(i, j): float(pred(ks[i], ks[j])) for i in range(len(ks)) for j in range(i + 1, len(ks))}
    idx = list(range(len(ks)))
    solo: list[int] = []
    if len(idx) % 2:  # try each kernel as the one that runs alone
        options = [([i], [j for j in idx if j != i]) for i in idx]
    else:
        options = [(solo, idx)]
    best, best_cost = None, math.inf
    for alone, rest in options:
        if len(rest) <= 10:
            cands = _matchings(rest)
        else:  # greedy: the cheapest remaining pair first
            left, m = set(rest), []
            for (i, j), _ in sorted(cost.items(), key=lambda kv: kv[1]):
                if i in left and j in left:
                    m.append((i, j))
                    left -= {i, j}
            cands = [m]
        for m in cands:
            c = sum(cost[p] for p in m)
            if c < best_cost:
                best, best_cost = (alone, m), c
    alone, m = best  # type: ignore[misc]
    out = sorted(((ks[i].name, ks[j].name, cost[(i, j)]) for i, j in m), key=lambda t: t[2])
    return out + [(ks[i].name, "", 1.0) for i in alone]
