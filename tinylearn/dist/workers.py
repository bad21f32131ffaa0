"""Rank functions for ``launch``: the correctness grid, failure drills, ping-pong and timing loops.

They live in a module (not in tests or notebooks) because child processes import the function by name.
Every function runs on every rank inside an initialised process group and returns a picklable value.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed as dist

from .collectives import ALGORITHMS, all_gather, all_reduce, broadcast, reduce_scatter

GRID_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int32, torch.int64)
GRID_SIZES = (0, 1, 2, 3, 7, 13, 31, 101, 257, 1009)
# (label, algorithm, extra kwargs): every algorithm, plus hierarchical with an explicit node size and a ring whose
# pipeline pieces are tiny (many pieces per chunk)
GRID_VARIANTS: tuple[tuple[str, str, dict], ...] = tuple((a, a, {}) for a in ALGORITHMS) + (
    ("hierarchical/node_size=2", "hierarchical", {"node_size": 2}),
    ("ring/chunk_bytes=8", "ring", {"chunk_bytes": 8}),
)
_REF_OP = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN, "avg": dist.ReduceOp.SUM}


def _data(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-4, 5, shape, generator=g).to(dtype)


def _reference(x: torch.Tensor, op: str, group: Any = None) -> torch.Tensor:
    ref = x.clone()
    dist.all_reduce(ref, op=_REF_OP[op], group=group)
    if op == "avg":
        ref = ref / dist.get_world_size(group)
    return ref


def _cmp(label: str, got: torch.Tensor, ref: torch.Tensor, exact: bool, fails: list[str]) -> None:
    if got.shape != ref.shape or got.dtype != ref.dtype:
        fails.append(f"{label}: shape/dtype {tuple(got.shape)}/{got.dtype} vs {tuple(ref.shape)}/{ref.dtype}")
        return
    if exact:
        if not torch.equal(got, ref):
            bad = int((got != ref).sum())
            fails.append(f"{label}: {bad} elements differ (exact comparison)")
        return
    from ..tolerance import assert_close

    try:
        assert_close(
            got.float() if got.dtype == torch.bfloat16 else got,
            ref.float() if ref.dtype == torch.bfloat16 else ref,
            dtype=got.dtype,
            reduction_size=dist.get_world_size() * 1000,
        )
    except AssertionError as e:
        fails.append(f"{label}: {str(e)[:200]}")


def check_grid(seed: int = 0, full: bool = False) -> dict[str, Any]:
    """Every algorithm x sizes (0, 1, primes ...) x dtypes x ops vs ``dist.all_reduce``, plus reduce_scatter,
    all_gather, broadcast, odd layouts, a sub-group and a size mismatch. Returns {"cases": n, "failures": [...]}.

    Default: sum over every dtype and size, max/min/avg on a prime length (each message costs ~1 ms on an
    oversubscribed 2-core box, so the grid is sized to a few hundred cases); ``full=True`` crosses everything.
    """
    rank, p = dist.get_rank(), dist.get_world_size()
    fails: list[str] = []
    n = 0
    sizes = GRID_SIZES if full else (0, 1, 13, 101)
    for label, alg, kw in GRID_VARIANTS:
        cases = [(size, dt, "sum") for size in sizes for dt in GRID_DTYPES]
        if full:
            cases += [(size, dt, op) for size in sizes for dt in GRID_DTYPES for op in ("max", "min", "avg")]
        else:
            cases += [(13, torch.float32, op) for op in ("max", "min", "avg")]
            cases += [(31, torch.int32, op) for op in ("max", "min")] + [(7, torch.float16, "avg")]
        for size, dt, op in cases:
            if op == "avg" and not dt.is_floating_point:
                continue
            x = _data((size,), dt, seed * 1_000_003 + rank * 7919 + size)
            ref = _reference(x, op)
            all_reduce(x, op=op, algorithm=alg, **kw)
            # integer-valued data: sums/max/min are exact in every dtype; avg divides by p (rounding)
            _cmp(f"{label} n={size} {dt} {op}", x, ref, exact=op != "avg", fails=fails)
            n += 1
        # random normal data: reduction order differs from gloo's -> tolerance, not bitwise
        for size, dt in ((1009, torch.float32), (10007, torch.float64)):
            if True:
                g = torch.Generator().manual_seed(seed + 31 * rank + size)
                x = torch.randn(size, generator=g, dtype=dt)
                ref = _reference(x, "sum")
                all_reduce(x, op="sum", algorithm=alg, **kw)
                _cmp(f"{label} randn n={size} {dt}", x, ref, exact=False, fails=fails)
                n += 1
        # layouts: multi-dim and non-contiguous (transposed view) tensors, reduced in place
        base = _data((5, 7), torch.float32, seed + rank)
        for name, x in (("3d", _data((3, 5, 7), torch.float32, seed + rank)), ("transposed", base.t())):
            ref = _reference(x.contiguous(), "sum")
            all_reduce(x, algorithm=alg, **kw)
            _cmp(f"{label} {name}", x.contiguous(), ref, exact=True, fails=fails)
            n += 1
        # every rank gets bitwise the same answer
        x = torch.randn(1013, generator=torch.Generator().manual_seed(seed + rank), dtype=torch.float32)
        all_reduce(x, algorithm=alg, **kw)
        copies = [torch.empty_like(x) for _ in range(p)]
        dist.all_gather(copies, x)
        if not all(torch.equal(c, copies[0]) for c in copies):
            fails.append(f"{label}: ranks disagree bitwise")
        n += 1
    # reduce_scatter / all_gather / broadcast
    for m in (0, 3, 17) if not full else (0, 1, 3, 17, 101):
        for dt, op in ((torch.float32, "sum"), (torch.float32, "avg"), (torch.int64, "max"), (torch.int32, "min")):
            inp = _data((p * m,), dt, seed + 11 * rank + m)
            out = torch.empty(m, dtype=dt)
            reduce_scatter(out, inp, op=op)
            _cmp(
                f"reduce_scatter m={m} {dt} {op}",
                out,
                _reference(inp, op)[rank * m : (rank + 1) * m],
                exact=op != "avg",
                fails=fails,
            )
            n += 1
        for dt in (torch.float32, torch.int64):
            inp = _data((m,), dt, seed + 13 * rank + m)
            out = torch.empty(p * m, dtype=dt)
            all_gather(out, inp)
            refs = [torch.empty_like(inp) for _ in range(p)]
            dist.all_gather(refs, inp)
            _cmp(f"all_gather m={m} {dt}", out, torch.cat(refs), exact=True, fails=fails)
            outs = [torch.empty_like(inp) for _ in range(p)]
            all_gather(outs, inp)
            _cmp(f"all_gather(list) m={m} {dt}", torch.cat(outs), torch.cat(refs), exact=True, fails=fails)
            n += 2
        for src in range(p):
            for balg in ("tree", "ring"):
                x = _data((m, 3), torch.float64, seed + 17 * rank + m)
                ref = x.clone()
                dist.broadcast(ref, src)
                broadcast(x, src=src, algorithm=balg, chunk_bytes=16)
                _cmp(f"broadcast/{balg} src={src} m={m}", x, ref, exact=True, fails=fails)
                n += 1
    # a size mismatch raises ValueError on every rank, and the group stays usable afterwards
    if p > 1:
        for alg in ALGORITHMS:
            x = torch.ones(5 + rank)
            try:
                all_reduce(x, algorithm=alg)
                fails.append(f"{alg}: size mismatch not detected on rank {rank}")
            except ValueError as e:
                if "mismatch" not in str(e):
                    fails.append(f"{alg}: mismatch message unclear: {e}")
            n += 1
    # a sub-group of ranks 1..p-1 (new_group is collective: every rank calls it)
    if p >= 3:
        sub = dist.new_group(list(range(1, p)))
        if rank >= 1:
            for alg in ALGORITHMS:
                x = _data((29,), torch.float32, seed + rank)
                ref = _reference(x, "sum", group=sub)
                all_reduce(x, algorithm=alg, group=sub)
                _cmp(f"{alg} subgroup", x, ref, exact=True, fails=fails)
                n += 1
        dist.barrier()
    return {"cases": n, "failures": fails}


# ------------------------------------------------------------------------------------------ failure drills
def raise_on(rank_to_fail: int) -> int:
    """Rank ``rank_to_fail`` raises ValueError before any communication; the others wait in a collective."""
    if dist.get_rank() == rank_to_fail:
        raise ValueError(f"deliberate failure on rank {rank_to_fail}")
    x = torch.ones(4)
    all_reduce(x)
    return dist.get_rank()


def exit_on(rank_to_exit: int, code: int = 3) -> int:
    """Rank ``rank_to_exit`` dies with os._exit(code) (no Python exception); the others wait on it."""
    if dist.get_rank() == rank_to_exit:
        os._exit(code)
    x = torch.ones(4)
    all_reduce(x)
    return dist.get_rank()


def hang_on(rank_to_hang: int, seconds: float = 3600.0) -> int:
    """Rank ``rank_to_hang`` sleeps (a live but stuck peer); the parent's timeout must stop everyone."""
    if dist.get_rank() == rank_to_hang:
        time.sleep(seconds)
    x = torch.ones(4)
    all_reduce(x)
    return dist.get_rank()


def rank_info(*args: Any) -> dict[str, Any]:
    """What a rank sees: its rank, world size, env and the args it was given."""
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    return {
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "env": {k: os.environ.get(k) for k in keys},
        "args": args,
        "pid": os.getpid(),
    }


# ----------------------------------------------------------------------------------------------- timing
def ping_pong(sizes: list[int], repeats: int = 20) -> list[float] | None:
    """One-way message time (half the median round trip) between ranks 0 and 1 for each size in bytes."""
    rank = dist.get_rank()
    out = []
    for nb in sizes:
        buf = torch.zeros(max(1, nb // 4), dtype=torch.float32)
        times = []
        for i in range(repeats + 2):
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            if i >= 2:
                times.append((time.perf_counter() - t0) / 2)
        times.sort()
        out.append(times[len(times) // 2])
    return out if rank == 0 else None


def reduction_time(nbytes: int = 1 << 22, repeats: int = 20) -> float:
    """gamma: seconds per byte of ``a.add_(b)`` on fp32 (what a rank spends reducing a received chunk)."""
    a = torch.zeros(nbytes // 4)
    b = torch.ones(nbytes // 4)
    for _ in range(3):
        a.add_(b)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a.add_(b)
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2] / nbytes


def p2p_ring_floor(x: torch.Tensor) -> None:
    """The ring's message pattern with no arithmetic and no pipelining: 2(p-1) exchanges of n/p bytes with
    isend/irecv. What the point-to-point transport alone costs — the floor for any algorithm built on it."""
    p, r = dist.get_world_size(), dist.get_rank()
    if p == 1:
        return
    m = max(1, x.numel() // p)
    buf = torch.empty(m, dtype=x.dtype)
    for _ in range(2 * (p - 1)):
        wr = dist.irecv(buf, (r - 1) % p)
        ws = dist.isend(x[:m], (r + 1) % p)
        wr.wait()
        ws.wait()


def all_reduce_by(x: torch.Tensor, impl: str) -> None:
    """All-reduce ``x`` in place with the implementation the timing loops name ``impl``: "gloo" (``dist.all_reduce``),
    "p2p ring floor" (``p2p_ring_floor``, no arithmetic) or an algorithm of ``tinylearn.dist.all_reduce``."""
    if impl == "gloo":
        dist.all_reduce(x)
    elif impl == "p2p ring floor":
        p2p_ring_floor(x)
    else:
        all_reduce(x, algorithm=impl, check=False)


def time_allreduce(sizes: list[int], impls: list[str], repeats: int = 5, budget_s: float = 6.0) -> dict:
    """Median seconds per all-reduce for each (size in bytes, impl); impl "gloo" = ``dist.all_reduce``.

    Each sample is timed between two barriers and the max over ranks is kept (the collective is done when its
    slowest rank is done). Implementations take turns sample by sample, so a noisy neighbour on a shared box
    slows all of them alike; large sizes stop early once ``budget_s`` per size is spent (at least 3 rounds).
    """
    out: dict[tuple[int, str], float] = {}
    for nb in sizes:
        x = torch.ones(max(1, nb // 4), dtype=torch.float32)
        for impl in impls:
            all_reduce_by(x, impl)  # warm-up (connections, allocator)
        samples: dict[str, list[float]] = {impl: [] for impl in impls}
        spent = 0.0
        for i in range(repeats):
            for impl in impls:
                dist.barrier()
                t0 = time.perf_counter()
                all_reduce_by(x, impl)
                dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                dist.all_reduce(dt, op=dist.ReduceOp.MAX)
                samples[impl].append(float(dt))
                spent += float(dt)
            if i >= 2 and spent > budget_s:
                break
        for impl in impls:
            s = sorted(samples[impl])
            out[(nb, impl)] = s[len(s) // 2]
    return out


def bench_job(sizes: list[int], impls: list[str], repeats: int = 5, pingpong: bool = True) -> dict[str, Any] | None:
    """The benchmark's rank function: ping-pong (ranks 0-1), reduction speed, then every (size, impl) timing.
    Only rank 0 returns the numbers."""
    pp_sizes = [1 << k for k in range(12, 25, 2)]  # 4 KB .. 16 MB
    pp = ping_pong(pp_sizes, repeats=8) if pingpong else None
    gamma = reduction_time()
    times = time_allreduce(sizes, impls, repeats=repeats)
    if dist.get_rank() != 0:
        return None
    return {"pp_sizes": pp_sizes, "pp_times": pp, "gamma": gamma, "times": times}


def compare_algorithms(n: int = 1001, seed: int = 0) -> dict[str, dict[str, float]]:
    """For each algorithm: max |ours - dist.all_reduce| on integer-valued fp32 data (must be 0) and on randn
    fp32 data (reduction-order rounding only), plus whether all ranks got bitwise-identical results."""
    rank, p = dist.get_rank(), dist.get_world_size()
    out = {}
    for alg in ALGORITHMS:
        ints = _data((n,), torch.float32, seed + rank)
        ref_i = _reference(ints, "sum")
        all_reduce(ints, algorithm=alg)
        x = torch.randn(n, generator=torch.Generator().manual_seed(seed + 100 + rank))
        ref = _reference(x, "sum")
        all_reduce(x, algorithm=alg)
        copies = [torch.empty_like(x) for _ in range(p)]
        dist.all_gather(copies, x)
        out[alg] = {
            "int_err": float((ints - ref_i).abs().max()),
            "randn_err": float((x - ref).abs().max()),
            "same_on_all_ranks": float(all(torch.equal(c, copies[0]) for c in copies)),
        }
    return out
