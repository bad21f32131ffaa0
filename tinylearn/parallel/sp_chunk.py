"""Choosing the sequence chunk size of a ring / sequence-parallel pass: probe a few sizes, fit a model, pick one.

The mechanism being tuned is ``chunked_ring_forward``: ring attention (non-causal, forward only) whose K/V stream
around the ring in chunks of ``chunk`` tokens instead of whole shards. Each rank holds q, k, v [b, h, n, d] for its
n = N/P tokens. The stream has (n/c)·P steps; at step (j, t) the rank holds chunk j of rank (me - t) mod P, posts
its send to rank me+1 and the receive of the next chunk from me-1 (while t < P-1), merges the [b, h, n, c] score
tile into the online softmax (running max m, sum l, unnormalised output o, as in ``ring_attention``) and waits.
Per rank it sends (P-1)·n/c messages of 2·b·h·c·d elements: the same bytes as the whole-shard ring
(``ring_bytes``' forward), in more, smaller messages.

The chunk size c trades three costs:

* memory: the score tile is b·h·n·c elements and two K/V chunks (held, incoming) are 4·b·h·c·d, so the peak per
  rank is M(c) = m0 + m1·c (m0: q, k, v, m, l, o; m1: the tile and the buffers);
* per-message latency: a send costs T_s(c) = α + β·bytes(c) (the alpha-beta model), so small chunks pay α
  (P-1)·n/c times;
* per-tile overhead: a tile costs T_c(c) = t0 + t1·c (t0: the fixed cost of launching ~8 small ops, t1: the
  matmul/exp work per key token), so small chunks pay t0 n/c·P times.

With the send of a chunk overlapped with its tile, a transfer step costs max(T_c, T_s) and the P-th step of each
chunk (nothing left to forward) costs T_c. What the isolated probes miss, mostly a rank waiting for its neighbour
(on shared cores a waiting process is descheduled), is a per-chunk s0 + s1·c fitted on whole passes, so

    T(c) = (n/c) · [ (P-1)·max(T_c(c), T_s(c)) + T_c(c) + s0 + s1·c ]

and the exposed communication is (n/c)·(P-1)·max(0, T_s - T_c). T(c) falls like 1/c (fixed costs amortised) and
M(c) grows like c: ``choose_chunk`` minimises T(c) + w·M(c) (w = seconds a byte is worth; w = 0: fastest) over the
candidate chunks (divisors of n) whose predicted M(c) fits ``mem_budget``. In the comm-bound regime the optimum of
the smooth objective is c* = sqrt(n·((P-1)·α + t0 + s0) / (w·m1)) (``ChunkModel.smooth_optimum``).

``probe_chunks`` measures on real processes (``tl.dist.launch``, rank function ``chunk_probe_rank``): per probed
chunk the time per message of a burst of ring exchanges of chunk messages, the time of one tile merge, the time of
a whole chunked pass (round-robin over the sizes, medians) and the peak bytes of one pass (``TensorMeter``);
``fit_chunk_model`` fits α, β, t0, t1, m0, m1 and then s0, s1 by least squares (``fit_linear``, slowest rank's
times) and returns a ``ChunkModel``; sizes passed as ``holdout`` are measured but not fitted, to validate the
prediction. Re-probing is cheap (a few sizes, fixed call counts), so a trainer can re-run it when the sequence
length, the world size or the memory budget changes.

Bad input raises ValueError / TypeError naming the argument: a chunk that does not divide seq_local, a chunk < 1,
mismatched shapes, a memory budget no candidate fits (naming the budget and the smallest predicted need).
"""

from __future__ import annotations

import importlib
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from .._inputs import as_int, is_real
from ..dist.group import _Group, check_same_across_ranks
from .bench_longctx import TensorMeter, traffic_meter
from .ring_attention import attention_reference, shard_sequence

__all__ = [
    "ChunkChoice",
    "ChunkModel",
    "choose_chunk",
    "chunk_bytes",
    "chunk_probe_rank",
    "chunked_ring_forward",
    "divisors",
    "fit_chunk_model",
    "fit_linear",
    "probe_chunks",
    "run_rank_jobs",
]

_TAG = 7900


# --------------------------------------------------------------------------------------------------- formulas
def divisors(n: int) -> list[int]:
    """The chunk sizes that split ``n`` tokens evenly, ascending."""
    n = as_int(n, "n", min=1)
    return [c for c in range(1, n + 1) if n % c == 0]


def _check_chunk(chunk: Any, seq_local: int) -> int:
    chunk = as_int(chunk, "chunk", min=1)
    if seq_local % chunk:
        raise ValueError(
            f"chunk: {chunk} does not divide seq_local={seq_local} (the K/V shard is streamed in equal chunks; "
            f"divisors: {divisors(seq_local)[:12]}...)"
        )
    return chunk


def chunk_bytes(
    batch: int, heads: int, seq_local: int, head_dim: int, world_size: int, chunk: int, element_size: int = 4
) -> dict[str, int]:
    """Per rank, one chunked forward: messages sent, bytes per message, bytes sent (== ring_bytes' fwd_bytes),
    and the bytes of one score tile [b, h, n, c]."""
    b, h, n, d, p = (
        as_int(v, name, min=1)
        for v, name in (
            (batch, "batch"),
            (heads, "heads"),
            (seq_local, "seq_local"),
            (head_dim, "head_dim"),
            (world_size, "world_size"),
        )
    )
    c = _check_chunk(chunk, n)
    es = as_int(element_size, "element_size", min=1)
    msgs = (p - 1) * (n // c)
    per = 2 * b * h * c * d * es
    return {"messages": msgs, "message_bytes": per, "bytes_sent": msgs * per, "score_tile_bytes": b * h * n * c * es}


# --------------------------------------------------------------------------------------------------- the pass
def _merge(
    q: torch.Tensor,
    kc: torch.Tensor,
    vc: torch.Tensor,
    scale: float,
    m: torch.Tensor,
    l_sum: torch.Tensor,
    o: torch.Tensor,
) -> None:
    """Online-softmax merge of one K/V chunk into (m, l, o), in place; the score tile is [b, h, n, c]."""
    s = torch.matmul(q, kc.transpose(-1, -2)).mul_(scale)
    m_new = torch.maximum(m, s.amax(-1))
    s.sub_(m_new.unsqueeze(-1)).exp_()
    a = torch.exp(m - m_new)
    l_sum.mul_(a).add_(s.sum(-1))
    o.mul_(a.unsqueeze(-1)).add_(torch.matmul(s, vc))
    m.copy_(m_new)


def chunked_ring_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: Any = None,
    chunk: int = 64,
    scale: float | None = None,
) -> torch.Tensor:
    """Non-causal attention over the sequence sharded contiguously on ``group`` ([b, h, seq_local, d] per rank),
    K/V streamed around the ring ``chunk`` tokens at a time (see the module docstring). Forward only (runs under
    no_grad; the differentiable op is ``ring_attention``). Collective: every rank passes the same shapes and chunk."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4 or not t.dtype.is_floating_point:
            raise ValueError(f"{name}: expected a floating [batch, heads, seq_local, head_dim], got {tuple(t.shape)}")
    if not (q.shape == k.shape == v.shape) or not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v: shapes/dtypes must match, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    b, h, n, d = q.shape
    c = _check_chunk(chunk, n)
    g = _Group(group)
    check_same_across_ranks(
        f"chunked_ring_forward input (q shape {tuple(q.shape)} here)",
        [("batch", b), ("heads", h), ("seq_local", n), ("head_dim", d), ("chunk", c)],
        group,
        count_first=False,
    )
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    p, me = g.size, g.me
    nxt, prv = (me + 1) % p, (me - 1) % p
    with torch.no_grad():
        q = q.contiguous()
        m = torch.full((b, h, n), float("-inf"), dtype=q.dtype)
        l_sum = torch.zeros(b, h, n, dtype=q.dtype)
        o = torch.zeros_like(q)
        for j in range(n // c):
            cur = torch.stack([k[:, :, j * c : (j + 1) * c], v[:, :, j * c : (j + 1) * c]])  # own chunk j
            for t in range(p):  # chunk j of rank me - t
                if t < p - 1:  # post the transfer first: it runs while this chunk's tile is computed
                    incoming = torch.empty_like(cur)
                    recv = g.irecv(incoming, prv, _TAG + j * p + t)
                    send = g.isend(cur, nxt, _TAG + j * p + t)
                _merge(q, cur[0], cur[1], scale, m, l_sum, o)
                if t < p - 1:
                    recv.wait()
                    send.wait()
                    cur = incoming
        return o.div_(l_sum.unsqueeze(-1))


# --------------------------------------------------------------------------------------------------- the model
def fit_linear(x: Any, y: Any, name: str = "y") -> tuple[float, float]:
    """Least-squares (intercept, slope) of y = a + b·x; needs >= 2 distinct x. The intercept is clamped at 0
    (a latency or a fixed cost is never negative; the slope is then refitted through the origin)."""
    xs, ys = [float(v) for v in x], [float(v) for v in y]
    if len(xs) != len(ys):
        raise ValueError(f"{name}: {len(xs)} x values but {len(ys)} y values")
    if len(set(xs)) < 2:
        raise ValueError(f"{name}: need measurements at >= 2 distinct sizes, got x={xs}")
    if not all(math.isfinite(v) for v in xs + ys):
        raise ValueError(f"{name}: non-finite measurement in x={xs}, y={ys}")
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((a - mx) ** 2 for a in xs)
    slope = sum((a - mx) * (b - my) for a, b in zip(xs, ys, strict=True)) / sxx
    icpt = my - slope * mx
    if icpt < 0:
        icpt, slope = 0.0, sum(a * b for a, b in zip(xs, ys, strict=True)) / sum(a * a for a in xs)
    return icpt, slope


@dataclass
class ChunkModel:
    """T_s(c) = alpha + beta·bytes(c), T_c(c) = t0 + t1·c, M(c) = m0 + m1·c for one shape (seq_local n, world P,
    bytes_per_token = 2·b·h·d·element size of K/V); s0 + s1·c: the per-chunk cost the isolated probes miss
    (synchronisation: a rank waiting for its neighbour), fitted on whole passes (0 when not calibrated)."""

    seq_local: int
    world_size: int
    bytes_per_token: int
    alpha: float
    beta: float
    t0: float
    t1: float
    m0: float
    m1: float
    s0: float = 0.0
    s1: float = 0.0
    probe: dict[str, Any] = field(default_factory=dict)

    def send_s(self, c: int) -> float:
        return self.alpha + self.beta * self.bytes_per_token * c

    def compute_s(self, c: int) -> float:
        return self.t0 + self.t1 * c

    def memory_bytes(self, c: int) -> float:
        return self.m0 + self.m1 * c

    def time_s(self, c: int) -> float:
        """Predicted seconds of one chunked pass (the module docstring's T(c))."""
        c = _check_chunk(c, self.seq_local)
        return self.seq_local // c * (self.pipeline_s(c) + self.s0 + self.s1 * c)

    def pipeline_s(self, c: int) -> float:
        """Per chunk, from the isolated probes: (P-1)·max(T_c, T_s) + T_c (overlapped sends, the last step alone)."""
        tc, ts = self.compute_s(c), self.send_s(c)
        return (self.world_size - 1) * max(tc, ts) + tc

    def exposed_comm_s(self, c: int) -> float:
        c = _check_chunk(c, self.seq_local)
        return self.seq_local // c * (self.world_size - 1) * max(0.0, self.send_s(c) - self.compute_s(c))

    def smooth_optimum(self, mem_weight: float) -> float:
        """argmin over real c of T(c) + w·M(c) when every step is comm-bound: sqrt(n((P-1)α + t0 + s0) / (w·m1))."""
        if not (is_real(mem_weight) and mem_weight > 0) or self.m1 <= 0:
            raise ValueError(f"mem_weight: expected > 0 (with m1 > 0), got {mem_weight!r} (m1={self.m1})")
        fixed = (self.world_size - 1) * self.alpha + self.t0 + self.s0
        return math.sqrt(self.seq_local * fixed / (mem_weight * self.m1))


@dataclass
class ChunkChoice:
    chunk: int
    time_s: float
    memory_bytes: float
    objective: float
    rows: list[dict[str, float]]  # every candidate: chunk, time_s, memory_bytes, exposed_comm_s, objective, fits


def choose_chunk(
    model: ChunkModel,
    candidates: list[int] | None = None,
    mem_budget: float | None = None,
    mem_weight: float = 0.0,
) -> ChunkChoice:
    """The candidate chunk minimising T(c) + mem_weight·M(c) among those with M(c) <= mem_budget (None: no cap).
    ``candidates`` default to the divisors of seq_local."""
    if not isinstance(model, ChunkModel):
        raise TypeError(f"model: expected a ChunkModel, got {type(model).__name__}")
    if not (is_real(mem_weight) and mem_weight >= 0):
        raise ValueError(f"mem_weight: expected a number >= 0 (seconds per byte), got {mem_weight!r}")
    if mem_budget is not None and not (is_real(mem_budget) and mem_budget > 0):
        raise ValueError(f"mem_budget: expected None or bytes > 0, got {mem_budget!r}")
    cands = divisors(model.seq_local) if candidates is None else [_check_chunk(c, model.seq_local) for c in candidates]
    if not cands:
        raise ValueError("candidates: empty list")
    rows = []
    for c in sorted(set(cands)):
        t, mem = model.time_s(c), model.memory_bytes(c)
        fits = mem_budget is None or mem <= mem_budget
        rows.append(
            {
                "chunk": c,
                "time_s": t,
                "memory_bytes": mem,
                "exposed_comm_s": model.exposed_comm_s(c),
                "objective": t + mem_weight * mem,
                "fits": float(fits),
            }
        )
    ok = [r for r in rows if r["fits"]]
    if not ok:
        least = min(rows, key=lambda r: r["memory_bytes"])
        raise ValueError(
            f"mem_budget: {mem_budget:.0f} bytes fits no candidate; the smallest (chunk {least['chunk']}) needs "
            f"{least['memory_bytes']:.0f} bytes"
        )
    best = min(ok, key=lambda r: (r["objective"], r["chunk"]))
    return ChunkChoice(int(best["chunk"]), best["time_s"], best["memory_bytes"], best["objective"], rows)


# --------------------------------------------------------------------------------------------------- the probe
def chunk_probe_rank(cfg: dict[str, Any]) -> dict[str, Any]:
    """Rank function (``tl.dist.launch``): per chunk in cfg["sizes"] the median time of one message in a burst of
    ring exchanges of chunk messages (as many as one chunked pass sends), of one tile merge and of one whole
    chunked pass; its peak bytes (TensorMeter), bytes sent and max error vs the single-process reference.

    The sizes are measured round-robin (repeat rounds, every size once per round, a barrier before each timing) so
    that load drift on a shared machine hits all sizes alike; call counts are fixed so the ranks stay in step."""
    rank, world = dist.get_rank(), dist.get_world_size()
    b, h, n, d = cfg["batch"], cfg["heads"], cfg["seq"], cfg["head_dim"]
    sizes, repeat, warmup = cfg["sizes"], cfg["repeat"], cfg["warmup"]
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, generator=gen) for _ in range(3))
    ref = shard_sequence(attention_reference(q, k, v), rank, world)
    ql, kl, vl = (shard_sequence(t, rank, world) for t in (q, k, v))
    nl = n // world
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    state = (torch.full((b, h, nl), -1.0), torch.ones(b, h, nl), torch.zeros(b, h, nl, d))

    def burst(c: int) -> None:  # (P-1)·n/c exchanges, like one chunked pass without the tiles
        msg = torch.randn(2, b, h, c, d)
        buf = torch.empty_like(msg)
        for i in range(max(1, (world - 1) * (nl // c))):
            r = dist.irecv(buf, prv, tag=_TAG - 1 - i)
            s_ = dist.isend(msg, nxt, tag=_TAG - 1 - i)
            r.wait()
            s_.wait()

    def timed(fn: Any) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    raw: dict[str, list[list[float]]] = {key: [[] for _ in sizes] for key in ("send_s", "compute_s", "run_s")}
    for rnd in range(warmup + repeat):
        for i, c in enumerate(sizes):
            t_send = timed(lambda c=c: burst(c)) / max(1, (world - 1) * (nl // c))
            t_comp = timed(lambda c=c: _merge(ql, kl[:, :, :c], vl[:, :, :c], 0.1, *state))
            t_run = timed(lambda c=c: chunked_ring_forward(ql, kl, vl, chunk=c))
            if rnd >= warmup:
                for key, val in (("send_s", t_send), ("compute_s", t_comp), ("run_s", t_run)):
                    raw[key][i].append(val)
    out: dict[str, list[float]] = {key: [statistics.median(x) for x in vals] for key, vals in raw.items()}
    out.update(peak_bytes=[], sent=[], err=[])
    for c in sizes:
        meter = TensorMeter()
        with traffic_meter() as traffic, meter:
            res = chunked_ring_forward(ql, kl, vl, chunk=c)
        out["peak_bytes"].append(float(meter.peak_bytes))
        out["sent"].append(float(traffic["p2p_bytes"]))
        out["err"].append(float((res - ref).abs().max()))
    return out


def probe_chunks(
    batch: int = 1,
    heads: int = 4,
    seq: int = 1024,
    head_dim: int = 32,
    world_size: int = 2,
    sizes: tuple[int, ...] | list[int] = (16, 64, 256),
    holdout: tuple[int, ...] | list[int] = (),
    repeat: int = 5,
    warmup: int = 2,
    timeout_s: float = 120,
) -> ChunkModel:
    """Measure the probe sizes on ``world_size`` real ranks (global sequence ``seq``) and fit a ``ChunkModel``
    (slowest rank's medians, largest peak). ``model.probe`` keeps the raw measurements per size."""
    from ..dist import launch

    b, h, n, d, p = (
        as_int(v, name, min=1)
        for v, name in (
            (batch, "batch"),
            (heads, "heads"),
            (seq, "seq"),
            (head_dim, "head_dim"),
            (world_size, "world_size"),
        )
    )
    if n % p:
        raise ValueError(f"seq: length {n} is not divisible by world size {p}")
    if not isinstance(sizes, list | tuple) or len(set(sizes)) < 2:
        raise ValueError(f"sizes: expected >= 2 distinct chunk sizes to fit a line, got {sizes!r}")
    if not isinstance(holdout, list | tuple) or set(holdout) & set(sizes):
        raise ValueError(f"holdout: expected chunk sizes not in sizes={sorted(sizes)}, got {holdout!r}")
    fit_sizes = sorted({_check_chunk(c, n // p) for c in sizes})
    all_sizes = sorted(set(fit_sizes) | {_check_chunk(c, n // p) for c in holdout})
    cfg = dict(batch=b, heads=h, seq=n, head_dim=d, sizes=all_sizes, repeat=as_int(repeat, "repeat", min=1))
    cfg["warmup"] = as_int(warmup, "warmup", min=0)
    ranks = launch(chunk_probe_rank, p, cfg, timeout_s=timeout_s)
    return fit_chunk_model(ranks, cfg, fit_sizes, p)


def fit_chunk_model(ranks: list[dict[str, Any]], cfg: dict[str, Any], fit_sizes: list[int], world: int) -> ChunkModel:
    """Fit a ``ChunkModel`` from ``chunk_probe_rank`` results (one dict per rank; slowest rank's times, largest
    peak) on the sizes ``fit_sizes`` (the others are held out: measured, not fitted)."""
    sizes = list(cfg["sizes"])
    agg = {key: [max(r[key][i] for r in ranks) for i in range(len(sizes))] for key in ranks[0]}
    idx = [sizes.index(c) for c in fit_sizes]
    fit = {key: [vals[i] for i in idx] for key, vals in agg.items()}
    n, bpt = cfg["seq"] // world, 2 * cfg["batch"] * cfg["heads"] * cfg["head_dim"] * 4
    alpha, beta = fit_linear([bpt * c for c in fit_sizes], fit["send_s"], "send_s")
    t0, t1 = fit_linear(fit_sizes, fit["compute_s"], "compute_s")
    m0, m1 = fit_linear(fit_sizes, fit["peak_bytes"], "peak_bytes")
    model = ChunkModel(n, world, bpt, alpha, beta, t0, t1, m0, m1)
    # per chunk, what the whole pass took beyond the isolated probes: s0 + s1·c
    extra = [run / (n // c) - model.pipeline_s(c) for c, run in zip(fit_sizes, fit["run_s"], strict=True)]
    model.s0, model.s1 = fit_linear(fit_sizes, extra, "run_s residual")
    model.s1 = max(0.0, model.s1)
    model.probe = dict(agg, sizes=sizes, fit_sizes=fit_sizes, **{k: cfg[k] for k in ("batch", "heads", "head_dim")})
    return model


def run_rank_jobs(jobs: list[tuple[str, tuple[Any, ...]]]) -> list[Any]:
    """Rank function: run several importable rank functions, ``("package.module:function", args)``, in order in
    ONE ``tl.dist.launch`` (each launch starts P Python processes: seconds on a loaded box). Returns their results."""
    if not isinstance(jobs, list | tuple):
        raise TypeError(f"jobs: expected a list of ('module:function', args), got {type(jobs).__name__}")
    out = []
    for i, job in enumerate(jobs):
        if not (isinstance(job, list | tuple) and len(job) == 2 and isinstance(job[0], str) and ":" in job[0]):
            raise ValueError(f"jobs[{i}]: expected ('package.module:function', args), got {job!r}")
        mod, _, name = job[0].partition(":")
        out.append(getattr(importlib.import_module(mod), name)(*job[1]))
        dist.barrier()
    return out
