"""Elastic resize without a restart: move a flat array sharded over N ranks to N' ranks with the fewest bytes, and
re-shard a live ZeRO optimizer (stages 1 and 2) over point-to-point messages among the processes that are alive.

Layout: ``shard_bounds(numel, N, r)`` (the layout ZeroOptimizer uses: slices of ceil(numel/N) elements). Going from
N to N' ranks, element e moves from old owner ``e // ceil(numel/N)`` to new owner ``e // ceil(numel/N')``; the
intersections of an old and a new shard are contiguous, so ``reshard_plan`` is the list of those intersections
(at most N + N' - 1 transfers, found by one sweep over both sets of boundaries). An element is sent over the
network only if its old and new owner are different processes, and then exactly once: no plan that keeps this
layout moves fewer bytes, and any consolidate-then-reshard path moves at least as many (``consolidate_bytes``
counts what ``ZeroOptimizer.state_dict()``'s all-gather moves: every rank receives every other rank's shard).

``reshard_zero`` is the live version for a running ``ZeroOptimizer``: every process of the old and of the new
world calls it at a step boundary (after ``step()``, before the next backward). Sharded optimizer state (Adam's
``exp_avg``/``exp_avg_sq``, the fp32 master copy of 16-bit parameters) moves by the plan, one message per (sender,
receiver) pair; replicated state (step counters, hyper-parameters) and the full parameters of processes that join
come along (stages 1/2 keep full parameters on every rank: a joiner receives from each old rank that rank's own
slice of every parameter). Members of the new world then build their optimizer on the new group (its slot bounds
and stage-2 gradient buckets are recomputed for N': the gradient-buffer remapping) and install what they
received; processes that leave return ``None`` after their sends completed. Gradients are not migrated: they are
recomputed every step (call it after ``step()``; what the last step left in ``.grad`` or the reduced shards is
dropped). Stage 3 (parameters sharded) is refused: use ``state_dict()`` / ``load_state_dict``.
"""

from __future__ import annotations

import math
import pickle
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from .._inputs import as_int, is_real
from ..dist.collectives import peer_failure
from .zero import ZeroOptimizer, shard_bounds

_TAG = 9100  # point-to-point tag of the resharding messages (one message per sender/receiver pair)
_MASTER = "__master__"  # pseudo state key: the fp32 master copy of a 16-bit parameter


class Transfer(NamedTuple):
    """``length`` elements from old rank ``src_rank``'s shard at ``src_offset`` to new rank ``dst_rank``'s shard at
    ``dst_offset`` (offsets are local to each shard)."""

    src_rank: int
    dst_rank: int
    src_offset: int
    dst_offset: int
    length: int


def reshard_plan(numel: int, old_world: int, new_world: int) -> list[Transfer]:
    """The contiguous transfers that turn ``shard_bounds(numel, old_world, ·)`` into ``shard_bounds(numel,
    new_world, ·)``, in element order: every element is covered exactly once, one transfer per non-empty overlap
    of an old and a new shard (at most old_world + new_world - 1). Pure: no process group needed."""
    numel = as_int(numel, "numel", min=0)
    old_world = as_int(old_world, "old_world", min=1)
    new_world = as_int(new_world, "new_world", min=1)
    plan: list[Transfer] = []
    src = dst = pos = 0
    while pos < numel:  # sweep: advance whichever shard ends first
        a0, a1 = shard_bounds(numel, old_world, src)
        b0, b1 = shard_bounds(numel, new_world, dst)
        end = min(a1, b1)
        if end > pos:
            plan.append(Transfer(src, dst, pos - a0, pos - b0, end - pos))
            pos = end
        if a1 <= pos:
            src += 1
        if b1 <= pos:
            dst += 1
    return plan


def _ranks(name: str, ranks: Sequence[int]) -> list[int]:
    """``ranks`` as a list of distinct process ids (non-negative ints)."""
    if isinstance(ranks, str | bytes) or not isinstance(ranks, Sequence):
        raise TypeError(f"{name}: expected a sequence of process ids, got {ranks!r}")
    out = [as_int(r, f"{name}[{i}]", min=0) for i, r in enumerate(ranks)]
    if len(set(out)) != len(out):
        raise ValueError(f"{name}: process ids must be distinct, got {out}")
    return out


def plan_traffic(
    plan: Sequence[Transfer],
    itemsize: int = 4,
    old_ranks: Sequence[int] | None = None,
    new_ranks: Sequence[int] | None = None,
) -> dict[str, int]:
    """Elements/bytes a plan keeps local vs sends between processes. Old rank i is process ``old_ranks[i]``, new
    rank j is process ``new_ranks[j]`` (default: the same number, i.e. the first ranks survive a shrink and new
    ranks are appended on a grow). ``messages``: distinct (sender, receiver) pairs that exchange data."""
    itemsize = as_int(itemsize, "itemsize", min=1)
    plan = list(plan)
    for i, t in enumerate(plan):
        if not isinstance(t, Transfer):
            raise TypeError(f"plan[{i}]: expected a Transfer, got {type(t).__name__}")
    n_old = 1 + max((t.src_rank for t in plan), default=-1)
    n_new = 1 + max((t.dst_rank for t in plan), default=-1)
    olds = _ranks("old_ranks", old_ranks) if old_ranks is not None else list(range(n_old))
    news = _ranks("new_ranks", new_ranks) if new_ranks is not None else list(range(n_new))
    if len(olds) < n_old or len(news) < n_new:
        raise ValueError(f"old_ranks/new_ranks: the plan uses {n_old} old and {n_new} new ranks, got {olds}, {news}")
    local = sum(t.length for t in plan if olds[t.src_rank] == news[t.dst_rank])
    total = sum(t.length for t in plan)
    pairs = {(t.src_rank, t.dst_rank) for t in plan if olds[t.src_rank] != news[t.dst_rank]}
    return {
        "local_elements": local,
        "moved_elements": total - local,
        "local_bytes": local * itemsize,
        "moved_bytes": (total - local) * itemsize,
        "messages": len(pairs),
    }


def apply_plan(shards: Sequence[torch.Tensor], plan: Sequence[Transfer], new_world: int) -> list[torch.Tensor]:
    """Single-process model of the data movement: the ``new_world`` shards that ``plan`` builds from the old
    ``shards`` (one flat tensor per old rank). The live version is ``reshard_zero``; tests use this one."""
    new_world = as_int(new_world, "new_world", min=1)
    shards = list(shards)
    for i, s in enumerate(shards):
        if not isinstance(s, torch.Tensor) or s.dim() != 1:
            raise TypeError(f"shards[{i}]: expected a 1-D torch.Tensor, got {getattr(s, 'shape', type(s).__name__)}")
    numel = sum(s.numel() for s in shards)
    dtype = shards[0].dtype if shards else torch.float32
    out = [
        torch.zeros(hi - lo, dtype=dtype) for lo, hi in (shard_bounds(numel, new_world, r) for r in range(new_world))
    ]
    for i, t in enumerate(plan):
        if not 0 <= t.src_rank < len(shards) or not 0 <= t.dst_rank < new_world:
            raise ValueError(f"plan[{i}]: ranks out of range for {len(shards)} -> {new_world} ranks: {t}")
        out[t.dst_rank][t.dst_offset : t.dst_offset + t.length] = shards[t.src_rank][
            t.src_offset : t.src_offset + t.length
        ]
    return out


def consolidate_bytes(numel: int, old_world: int, itemsize: int = 4) -> int:
    """Bytes ``ZeroOptimizer.state_dict()`` moves per sharded tensor of ``numel`` elements: a ring all-gather of
    the padded shards, every one of the N ranks receives the other N-1 shards of ceil(numel/N) elements (from the
    algorithm, not measured). A checkpoint file instead writes numel and reads numel elements per tensor."""
    numel = as_int(numel, "numel", min=0)
    n = as_int(old_world, "old_world", min=1)
    itemsize = as_int(itemsize, "itemsize", min=1)
    return n * (n - 1) * math.ceil(numel / n) * itemsize


# ------------------------------------------------------------------------------------------- live resharding
def _wait(work: Any, what: str, me: int, timeout_s: float) -> None:
    try:
        work.wait(timedelta(seconds=timeout_s))
    except RuntimeError as e:
        raise peer_failure(what, f"rank {me}", e) from e


def _meta_of(opt: ZeroOptimizer) -> dict[str, Any]:
    """What every participant must agree on: per parameter its numel, dtypes, sharded state keys (+ the master
    copy), replicated state (step counters) and the hyper-parameters of every param group."""
    slots = []
    for i, sl in enumerate(opt.slots):
        st = opt.optimizer.state.get(sl.master, {})
        sharded = {k: v.dtype for k, v in st.items() if isinstance(v, torch.Tensor) and v.dim() > 0}
        for k, v in st.items():
            if k in sharded and v.numel() != sl.master.numel():
                raise ValueError(
                    f"opt: state {k!r} of params[{i}] has {v.numel()} elements, its shard {sl.master.numel()}"
                )
        if sl.master.dtype != sl.p.dtype:
            sharded[_MASTER] = sl.master.dtype
        repl = {k: v for k, v in st.items() if k not in sharded}
        slots.append({"numel": sl.numel, "dtype": sl.p.dtype, "sharded": sharded, "replicated": repl})
    groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.optimizer.param_groups]
    return {"stage": opt.stage, "slots": slots, "groups": groups}


def _signature(meta: dict[str, Any]) -> list[Any]:
    return [meta["stage"]] + [(s["numel"], s["dtype"], sorted(s["sharded"].items())) for s in meta["slots"]]


def _manifest(
    meta: dict[str, Any], n_old: int, n_new: int, joiners: set[int], plan_fn: Callable[..., list[Transfer]]
) -> list[tuple[int, int, int, str, int, int, int]]:
    """Every piece to move, in one order all processes compute alike: (src old rank, dst new rank, slot, key,
    src offset, dst offset, length); key "param" pieces fill the full parameters of joining new ranks."""
    out = []
    for i, s in enumerate(meta["slots"]):
        plan = plan_fn(s["numel"], n_old, n_new)
        for key in sorted(s["sharded"]):
            out += [(t.src_rank, t.dst_rank, i, key, t.src_offset, t.dst_offset, t.length) for t in plan]
        for dst in sorted(joiners):
            for src in range(n_old):
                lo, hi = shard_bounds(s["numel"], n_old, src)
                if hi > lo:
                    out.append((src, dst, i, "param", lo, lo, hi - lo))
    return out


def reshard_zero(
    opt: ZeroOptimizer | None,
    build: Callable[[Any], ZeroOptimizer],
    old_ranks: Sequence[int],
    new_ranks: Sequence[int],
    new_group: Any = None,
    *,
    timeout_s: float = 60.0,
    plan_fn: Callable[..., list[Transfer]] = reshard_plan,
) -> tuple[ZeroOptimizer | None, dict[str, Any]]:
    """Move a running ZeRO-1/2 optimizer from the processes ``old_ranks`` (its group, in group-rank order) to
    ``new_ranks`` without a checkpoint. Every process in either list calls it at a step boundary; ``opt`` is its
    optimizer (``None`` on a process that joins), ``new_group`` the process group of ``new_ranks`` (created by
    every process beforehand, as ``torch.distributed.new_group`` requires) and ``build(new_group)`` constructs the
    ZeroOptimizer there (same parameters, class and stage: it runs only on members of the new world).

    Returns ``(new optimizer or None if this process left, stats)``; stats counts the bytes this process sent and
    received (payload of the plan's messages), kept local, and the wall time. Every wait of this function is
    bounded by ``timeout_s`` (a joining process waits that long for the others to reach the resize; ``build``'s
    handshake uses the group's timeout); a peer that dies or hangs surfaces as a RuntimeError naming it, with
    the cause. ``plan_fn`` replaces ``reshard_plan`` (tests inject a mis-routed plan to prove that the equality
    checks would catch one)."""
    t0 = time.perf_counter()
    if not callable(build):
        raise TypeError(f"build: expected a callable new_group -> ZeroOptimizer, got {build!r}")
    if not is_real(timeout_s) or not 0 < timeout_s < math.inf:
        raise ValueError(f"timeout_s: expected a positive number of seconds, got {timeout_s!r}")
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("reshard_zero: torch.distributed is not initialized; run inside tl.dist.launch(...)")
    olds, news = _ranks("old_ranks", old_ranks), _ranks("new_ranks", new_ranks)
    if not olds or not news:
        raise ValueError(f"old_ranks/new_ranks: need at least one process each, got {olds} -> {news}")
    me = dist.get_rank()
    if me not in olds and me not in news:
        raise ValueError(f"old_ranks/new_ranks: this process (rank {me}) is in neither {olds} nor {news}")
    if me in olds:
        if not isinstance(opt, ZeroOptimizer):
            raise TypeError(f"opt: process {me} is in old_ranks {olds}: expected its ZeroOptimizer, got {opt!r}")
        if opt.stage not in (1, 2):
            raise ValueError(f"opt: live resharding supports ZeRO stages 1 and 2, got stage {opt.stage}")
        group_ranks = (
            list(range(dist.get_world_size())) if opt.group is None else dist.get_process_group_ranks(opt.group)
        )
        if list(group_ranks) != olds:
            raise ValueError(f"old_ranks: {olds} differs from the optimizer's group {list(group_ranks)}")
        if any(getattr(opt, "_ready", [])):  # stage 2: some buckets of a backward are still waiting for the rest
            raise ValueError("opt: a backward is in flight (gradient buckets pending); reshard after step()")
    elif opt is not None:
        raise TypeError(f"opt: process {me} joins (not in old_ranks {olds}): expected None, got {opt!r}")
    n_old, n_new = len(olds), len(news)
    me_new = news.index(me) if me in news else None
    joiners = {j for j, r in enumerate(news) if r not in olds}

    # 1. replicated metadata from old rank 0 to every other participant (a small pickled object, bounded waits)
    root = olds[0]
    meta = _meta_of(opt) if opt is not None else None
    others = [r for r in dict.fromkeys(olds + news) if r != root]
    meta_bytes = 0
    if me == root:
        blob = torch.frombuffer(bytearray(pickle.dumps(meta)), dtype=torch.uint8)
        size = torch.tensor([blob.numel()], dtype=torch.int64)
        works = [(dist.isend(t, dst=r, tag=_TAG + 1 + k), r) for r in others for k, t in enumerate((size, blob))]
        for work, r in works:
            _wait(work, f"send the resharding metadata to rank {r}", me, timeout_s)
        meta_bytes = blob.numel() * len(others)
    else:
        size = torch.zeros(1, dtype=torch.int64)
        _wait(
            dist.irecv(size, src=root, tag=_TAG + 1), f"receive the resharding metadata from rank {root}", me, timeout_s
        )
        blob = torch.empty(int(size), dtype=torch.uint8)
        _wait(
            dist.irecv(blob, src=root, tag=_TAG + 2), f"receive the resharding metadata from rank {root}", me, timeout_s
        )
        theirs = pickle.loads(blob.numpy().tobytes())
        if meta is not None and _signature(meta) != _signature(theirs):
            raise ValueError(
                f"opt: process {me}'s optimizer differs from rank {root}'s (stage, numel, dtype, state keys): "
                f"{_signature(meta)} vs {_signature(theirs)}"
            )
        meta = theirs
    assert meta is not None

    # 2. pack one byte message per (sender, receiver) process pair; post receives, then sends
    pieces = _manifest(meta, n_old, n_new, joiners, plan_fn)

    def source(slot: int, key: str) -> torch.Tensor:
        assert opt is not None
        sl = opt.slots[slot]
        if key == "param":
            return sl.p.detach().reshape(-1)
        return sl.master if key == _MASTER else opt.optimizer.state[sl.master][key]

    def dtype_of(slot: int, key: str) -> torch.dtype:
        s = meta["slots"][slot]
        return s["dtype"] if key == "param" else s["sharded"][key]

    new_bounds = [shard_bounds(s["numel"], n_new, me_new) if me_new is not None else (0, 0) for s in meta["slots"]]
    dest: dict[tuple[int, str], torch.Tensor] = {}
    if me_new is not None:
        for i, s in enumerate(meta["slots"]):
            lo, hi = new_bounds[i]
            # a separate master copy (16-bit parameters) and its state span the padded shard ceil(numel/N')
            size = math.ceil(s["numel"] / n_new) if _MASTER in s["sharded"] else hi - lo
            for key, dt in s["sharded"].items():
                dest[(i, key)] = torch.zeros(size, dtype=dt)
            if me_new in joiners:
                dest[(i, "param")] = torch.empty(s["numel"], dtype=s["dtype"])
    by_pair: dict[tuple[int, int], list[tuple[int, str, int, int, int]]] = {}
    local_bytes = 0
    for src, dst, i, key, so, do, n in pieces:
        if news[dst] == olds[src] == me:  # stays in this process
            dest[(i, key)][do : do + n] = source(i, key)[so : so + n]
            local_bytes += n * dtype_of(i, key).itemsize
        elif olds[src] == me or news[dst] == me:
            by_pair.setdefault((src, dst), []).append((i, key, so, do, n))
    recvs, sends = [], []
    sent = received = 0
    for (src, dst), items in sorted(by_pair.items()):
        nbytes = sum(n * dtype_of(i, key).itemsize for i, key, _, _, n in items)
        if news[dst] == me:
            buf = torch.empty(nbytes, dtype=torch.uint8)
            recvs.append((dist.irecv(buf, src=olds[src], tag=_TAG), buf, items, olds[src]))
            received += nbytes
    for (src, dst), items in sorted(by_pair.items()):
        if olds[src] == me:
            parts = [source(i, key)[so : so + n].contiguous().view(torch.uint8) for i, key, so, _, n in items]
            buf = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8)
            sends.append((dist.isend(buf, dst=news[dst], tag=_TAG), buf, news[dst]))
            sent += buf.numel()
    for work, buf, items, peer in recvs:
        _wait(work, f"receive shards from rank {peer}", me, timeout_s)
        off = 0
        for i, key, _, do, n in items:
            nb = n * dtype_of(i, key).itemsize
            dest[(i, key)][do : do + n] = buf[off : off + nb].clone().view(dtype_of(i, key))  # clone: aligned
            off += nb
    for work, _, peer in sends:
        _wait(work, f"send shards to rank {peer}", me, timeout_s)
    if opt is not None:
        opt.remove_hooks()  # stage 2's gradient hooks belong to the old world
    stats: dict[str, Any] = {
        "sent_bytes": sent,
        "received_bytes": received,
        "local_bytes": local_bytes,
        "meta_bytes": meta_bytes,
        "messages_sent": len(sends),
        "joined": me_new in joiners,
        "left": me_new is None,
    }
    if me_new is None:  # this process leaves the job: its shards live elsewhere now
        stats["seconds"] = time.perf_counter() - t0
        return None, stats

    # 3. members of the new world: new optimizer (slot bounds, gradient buckets for N'), install the shards
    new = build(new_group)
    if not isinstance(new, ZeroOptimizer) or new.world_size != n_new or new.rank != me_new:
        raise ValueError(f"build: expected a ZeroOptimizer over new_ranks {news} (rank {me_new}), got {new!r}")
    with torch.no_grad():
        if me_new in joiners:
            for i, sl in enumerate(new.slots):
                sl.p.data.copy_(dest[(i, "param")].view(sl.shape))
        for i, (sl, s) in enumerate(zip(new.slots, meta["slots"], strict=True)):
            if (sl.lo, sl.hi) != new_bounds[i]:
                raise RuntimeError(f"build: params[{i}] shard {(sl.lo, sl.hi)} differs from the plan {new_bounds[i]}")
            if _MASTER in s["sharded"]:
                sl.master.copy_(dest[(i, _MASTER)])
            st = {k: dest[(i, k)] for k in s["sharded"] if k != _MASTER}
            st.update({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s["replicated"].items()})
            if st:
                new.optimizer.state[sl.master] = st
        for g, hyper in zip(new.optimizer.param_groups, meta["groups"], strict=True):
            g.update(hyper)
    stats["new_bounds"] = new_bounds
    stats["seconds"] = time.perf_counter() - t0
    return new, stats
