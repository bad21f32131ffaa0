"""Elastic training loop: resume from the newest committed checkpoint at whatever world size restarted the job,
keep the data order independent of the world size, checkpoint at the Young/Daly interval measured on this job.

``run(train_step, state, ckpt_dir=..., steps=...)`` is what every rank runs (one process, ``tl.dist.launch`` or
``torchrun``: RANK/WORLD_SIZE in the environment initialise a gloo group with a bounded timeout if none is):

1. **Resume.** ``latest_checkpoint(ckpt_dir)`` is the newest ``step_*`` directory whose manifest was committed (a
   crash mid-save leaves a directory without manifest, which is skipped). Rank 0's choice is broadcast, every rank
   calls ``state.from_checkpoint(dir)``, which reads its own slice under the *current* world size (the sharded
   layout reshards N -> N' by reading overlapping byte ranges), and training continues at saved step + 1. Newer
   ``step_*`` directories are never merged into: a torn one (no manifest) is deleted, a committed one that does not
   load (a lost file) is renamed ``unloadable_*`` for ``ec_files.repair``.
2. **Deterministic data.** The global batch of step t is a function of (t, sample index) only (``global_batch``);
   rank r of N takes rows ``shard_bounds(rows, N, r)`` (``local_rows``). Any world size sees the same global batch,
   so a resumed run replays exactly the steps that were lost; at the same world size it is bitwise the run that
   never failed (the reductions sum in the same order).
3. **Interval.** With ``interval="auto"`` the first step of this process is followed by a checkpoint whose cost C is
   measured; I* = sqrt(2 C · MTBF) seconds (Young/Daly, ``parallel.checkpoint_interval.young_daly_interval`` with
   λ = 1/MTBF) becomes steps through the median measured step time, and is re-estimated at every checkpoint. Ranks
   agree on (C, step time) by a MAX all-reduce, so they checkpoint at the same steps. An int interval checkpoints
   after every step t with (t + 1) % I == 0 (absolute, so a resumed run checkpoints where the first one did). The
   last step is always checkpointed.
4. **Memory.** Before a resume every rank checks that its part of the checkpoint under the current layout fits
   ``max_bytes_per_rank`` (default: the machine's available memory over its local ranks): a world too small for
   the state -- ZeRO-3 saved at 8 ranks, restarted on 1 -- is a ValueError naming the argument and the bytes.
5. **Failures.** A peer that dies makes the survivors' next collective fail within the group timeout; the error
   names this rank, the operation and the cause (``dist.group.peer_failure``). torchrun's agent then restarts the
   group (``--max-restarts``), possibly with fewer ranks, and step 1 resumes.
"""

from __future__ import annotations

import atexit
import math
import os
import shutil
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .._inputs import is_int, is_real
from ..dist.group import peer_failure
from ..parallel.checkpoint_interval import young_daly_interval
from ..parallel.zero_sharding import shard_bounds
from .atomic import CheckpointError
from .sharded import bytes_per_rank, latest_checkpoint, load_sharded, read_manifest, save_sharded, step_dir

DEFAULT_MTBF_S = 3600.0  # assumed when interval="auto" and no mtbf_s is given: one failure per hour of the job


@dataclass
class RunReport:
    """What ``run`` did on this rank. Times in seconds; ``*_wall`` are ``time.time()`` stamps (comparable across
    processes, e.g. with the moment a rank was killed)."""

    rank: int
    world_size: int
    resumed_from: int | None  # step of the checkpoint loaded, None for a fresh start
    start_step: int
    steps_run: int
    checkpoints: list[int] = field(default_factory=list)  # steps after which a checkpoint was committed
    checkpoint_s: float | None = None  # measured cost C of the first checkpoint (max over ranks)
    checkpoint_costs: list[float] = field(default_factory=list)
    interval_steps: int | None = None  # the interval in force at the end (steps)
    interval_s: float | None = None  # Young/Daly I* in seconds ("auto" only)
    step_s: float | None = None  # median step time
    load_s: float | None = None  # reading the checkpoint into the state
    recovery_s: float | None = None  # run() entry -> first step done (group init + load + one step), when resumed
    start_wall: float = 0.0
    first_step_wall: float | None = None
    losses: list[float] = field(default_factory=list)


# ------------------------------------------------------------------------------------------------- data order
def global_batch(
    step: int, rows: int, in_dim: int, out_dim: int, seed: int = 0, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s global batch: row i of (x, y) depends only on (seed, step, i) -- every sample is drawn from
    its own counter-based stream (numpy Philox keyed by (seed, step, i)), so any split over ranks sees the same."""
    for name, v, lo in (("step", step, 0), ("rows", rows, 1), ("in_dim", in_dim, 1), ("out_dim", out_dim, 1)):
        if not is_int(v) or int(v) < lo:
            raise ValueError(f"{name}: expected an int >= {lo}, got {v!r}")
    x = np.empty((rows, in_dim), dtype=np.float32)
    y = np.empty((rows, out_dim), dtype=np.float32)
    for i in range(rows):
        g = np.random.Generator(np.random.Philox(key=[seed * 1_000_003 + step, i]))
        x[i] = g.standard_normal(in_dim, dtype=np.float32)
        y[i] = g.standard_normal(out_dim, dtype=np.float32)
    return torch.from_numpy(x).to(dtype), torch.from_numpy(y).to(dtype)


def local_rows(rows: int, world_size: int, rank: int) -> slice:
    """Rank ``rank``'s rows of a global batch of ``rows``: ``shard_bounds``' ceil split."""
    lo, hi = shard_bounds(rows, world_size, rank)
    return slice(lo, hi)


# ------------------------------------------------------------------------------------------------- group
def ensure_group(timeout_s: float = 60.0) -> tuple[int, int]:
    """(world_size, rank). Initialises a gloo group from RANK/WORLD_SIZE/MASTER_* (torchrun) with a bounded
    ``timeout_s`` when the environment asks for one and none exists; a plain process is (1, 0)."""
    if not (is_real(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s: expected a positive number of seconds, got {timeout_s!r}")
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ:
        timeout = timedelta(seconds=float(timeout_s))
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            # torchrun's agent keeps ONE store across restarts and env:// adds no per-attempt prefix: a restarted
            # rank could read a dead rank's gloo address ("Connection refused"). Key the attempt ourselves.
            world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
            base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, False, timeout)
            attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
            store = dist.PrefixStore(f"tinylearn/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/attempt_{attempt}", base)
            dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
        else:
            dist.init_process_group("gloo", timeout=timeout)
        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def _agree(values: list[float], group: Any, what: str, rank: int) -> list[float]:
    """MAX of ``values`` over the group (a peer that died: RuntimeError naming this rank and the cause)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    try:
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    except RuntimeError as e:
        n = dist.get_world_size(group)
        others = ", ".join(f"rank {r}" for r in range(n) if r != rank)
        raise peer_failure(f"all-reduce of {what} with {others}", f"rank {rank}", e) from e
    return t.tolist()


# ------------------------------------------------------------------------------------------------- state
class TensorState:
    """Whole tensors replicated on every rank (a model's ``state_dict()``, a dict of tensors): rank 0 writes
    them, every rank reads them back in place."""

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        if not isinstance(tensors, Mapping) or not tensors:
            raise TypeError(f"state: expected a non-empty mapping of str -> torch.Tensor, got {type(tensors).__name__}")
        for k, v in tensors.items():
            if not isinstance(v, torch.Tensor):
                raise TypeError(f"state[{k!r}]: expected a torch.Tensor, got {type(v).__name__}")
        self.tensors = tensors

    def to_checkpoint(self) -> dict[str, Any]:
        return {k: v.detach().clone() for k, v in self.tensors.items()}

    def bytes_needed(self, path: str | Path) -> int:
        return bytes_per_rank(path, keys=[k for k in self.tensors if k in read_manifest(path)["tensors"]])

    def from_checkpoint(self, path: str | Path) -> None:
        tpl = {k: v.detach() for k, v in self.tensors.items()}
        got = load_sharded(path, template=tpl, keys=list(self.tensors))
        with torch.no_grad():
            for k, v in self.tensors.items():
                v.copy_(torch.from_numpy(np.array(got[k])).view(v.shape))


def as_state(state: Any) -> Any:
    """``state`` if it has ``to_checkpoint``/``from_checkpoint``, a ``TensorState`` for a mapping of tensors or an
    ``nn.Module`` (its ``state_dict()``), else TypeError."""
    if hasattr(state, "to_checkpoint") and hasattr(state, "from_checkpoint"):
        return state
    if isinstance(state, torch.nn.Module):
        return TensorState(state.state_dict())
    if isinstance(state, Mapping):
        return TensorState(state)
    raise TypeError(
        f"state: expected an object with to_checkpoint()/from_checkpoint(path) (ZeroState, DDPState, ...), an "
        f"nn.Module or a mapping of tensors, got {type(state).__name__}"
    )


# ------------------------------------------------------------------------------------------------- memory
def available_memory() -> int | None:
    """Bytes of memory this machine can give without swapping (``MemAvailable`` of /proc/meminfo; else free
    physical pages from ``sysconf``); None when neither is known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def _memory_budget(max_bytes_per_rank: Any) -> tuple[int | None, str]:
    """(bytes, where they come from) for run's ``max_bytes_per_rank``: "auto" = available memory / local ranks."""
    if max_bytes_per_rank is None:
        return None, "no limit"
    if max_bytes_per_rank == "auto":
        avail = available_memory()
        if avail is None:
            return None, "no limit (available memory unknown)"
        local = os.environ.get("LOCAL_WORLD_SIZE", "1")
        n = int(local) if local.isdigit() and int(local) > 0 else 1
        return avail // n, f"'auto': {avail} bytes available on this machine / {n} local rank(s)"
    if not is_int(max_bytes_per_rank) or int(max_bytes_per_rank) < 0:
        raise ValueError(f"max_bytes_per_rank: expected 'auto', an int >= 0 or None, got {max_bytes_per_rank!r}")
    return int(max_bytes_per_rank), "given"


def check_fits(state: Any, path: str | Path, world_size: int, rank: int, max_bytes_per_rank: Any = "auto") -> int:
    """The bytes of checkpoint ``path`` that ``state`` holds on rank ``rank`` of ``world_size`` (its
    ``bytes_needed``, else the default dim-0 split of every sharded tensor); ValueError naming
    ``max_bytes_per_rank``, the world size and the bytes when they exceed the budget -- before anything is read."""
    budget, why = _memory_budget(max_bytes_per_rank)
    if hasattr(state, "bytes_needed"):
        need = int(state.bytes_needed(path))
    else:
        need = bytes_per_rank(path, world_size=world_size, rank=rank)
    if budget is not None and need > budget:
        raise ValueError(
            f"max_bytes_per_rank: rank {rank} of world_size={world_size} needs {need} bytes to hold its part of "
            f"the checkpoint {path}, more than max_bytes_per_rank={budget} ({why}); restart with more ranks, a "
            "layout that shards more of the state (ZeRO-3), or a larger max_bytes_per_rank"
        )
    return need


# ------------------------------------------------------------------------------------------------- the loop
def _check_args(steps: Any, interval: Any, mtbf_s: Any, ckpt_dir: Any, keep: Any) -> Path:
    if not is_int(steps) or int(steps) < 1:
        raise ValueError(f"steps: expected an int >= 1, got {steps!r}")
    if interval != "auto" and (not is_int(interval) or int(interval) < 1):
        raise ValueError(f"interval: expected 'auto' or an int >= 1, got {interval!r}")
    if mtbf_s is not None and not (is_real(mtbf_s) and math.isfinite(mtbf_s) and mtbf_s > 0):
        raise ValueError(f"mtbf_s: expected a finite number of seconds > 0 or None, got {mtbf_s!r}")
    if keep is not None and (not is_int(keep) or int(keep) < 1):
        raise ValueError(f"keep: expected an int >= 1 or None, got {keep!r}")
    if not isinstance(ckpt_dir, str | os.PathLike):
        raise TypeError(f"ckpt_dir: expected a path, got {type(ckpt_dir).__name__}")
    root = Path(ckpt_dir)
    if root.exists() and not root.is_dir():
        raise ValueError(f"ckpt_dir: {str(root)!r} exists and is not a directory")
    return root


def _prune(root: Path, keep: int) -> None:
    dirs = sorted(p for p in root.glob("step_*") if p.is_dir() and (p / "manifest.json").exists())
    for p in dirs[:-keep]:
        shutil.rmtree(p, ignore_errors=True)


def run(
    train_step: Callable[[int, Any], Any],
    state: Any,
    *,
    ckpt_dir: str | os.PathLike[str],
    steps: int,
    interval: int | str = "auto",
    mtbf_s: float | None = None,
    group: Any = None,
    timeout_s: float = 60.0,
    keep: int | None = 2,
    fsync: bool = True,
    meta: dict[str, Any] | None = None,
    max_bytes_per_rank: int | str | None = "auto",
) -> RunReport:
    """Run steps ``start .. steps-1`` of ``train_step(step, state)`` (see the module docstring), resuming from
    ``latest_checkpoint(ckpt_dir)``. ``state``: an object with ``to_checkpoint() -> dict`` (for ``save_sharded``)
    and ``from_checkpoint(path)`` (``ZeroState``, ``DDPState``, ``MultiState`` in ``zero_state``), or a mapping of
    replicated tensors. ``keep``: committed checkpoints kept (older ones are deleted by rank 0; None keeps all).
    ``train_step`` may return a loss (recorded in the report). ``max_bytes_per_rank``: before a resume, the bytes
    this rank would hold (``check_fits``) must fit -- "auto": the machine's available memory / LOCAL_WORLD_SIZE, an
    int, or None (no check); a world too small for the state is a ValueError naming it, before anything is read.
    Returns this rank's ``RunReport``."""
    t_entry = time.perf_counter()
    start_wall = time.time()
    root = _check_args(steps, interval, mtbf_s, ckpt_dir, keep)
    if not callable(train_step):
        raise TypeError(f"train_step: expected a callable (step, state) -> loss, got {type(train_step).__name__}")
    st = as_state(state)
    _memory_budget(max_bytes_per_rank)  # bad input fails before any collective
    steps = int(steps)
    world, rank = ensure_group(timeout_s)
    if group is not None:
        world, rank = dist.get_world_size(group), dist.get_rank(group)
    live = dist.is_available() and dist.is_initialized()
    root.mkdir(parents=True, exist_ok=True)

    # 1. resume: rank 0's newest committed checkpoint, agreed by every rank
    latest = latest_checkpoint(root)
    saved = -1 if latest is None else int(read_manifest(latest)["step"])
    if live and world > 1:
        t = torch.tensor([saved], dtype=torch.int64)
        try:
            dist.broadcast(t, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
        except RuntimeError as e:
            raise peer_failure("broadcast of the checkpoint step from rank 0", f"rank {rank}", e) from e
        if int(t) != saved:
            raise CheckpointError(f"{root}: rank {rank} sees newest checkpoint step {saved}, rank 0 step {int(t)}")
    if rank == 0:  # newer step dirs are rewritten by this run: never merge into them
        for p in root.glob("step_*"):
            tail = p.name[5:]
            if p.is_dir() and tail.isdigit() and int(tail) > saved:
                if (p / "manifest.json").exists():  # committed but not loadable (a file lost?): keep it aside
                    p.rename(root / f"unloadable_{p.name}_{int(time.time())}")  # for repair (ec_files.repair)
                else:  # a save a crash interrupted: nothing committed, nothing to keep
                    shutil.rmtree(p, ignore_errors=True)
    if live and world > 1:
        try:
            dist.barrier(group=group)
        except RuntimeError as e:
            raise peer_failure("barrier after choosing the checkpoint", f"rank {rank}", e) from e
    rep = RunReport(rank, world, None if saved < 0 else saved, saved + 1, 0, start_wall=start_wall)
    if saved >= 0:
        t0 = time.perf_counter()
        try:
            check_fits(st, step_dir(root, saved), world, rank, max_bytes_per_rank)
            err = None
        except ValueError as e:
            err = e
        if _agree([0.0 if err is None else 1.0], group, "the memory check", rank)[0] > 0 or err is not None:
            if err is not None:
                raise err
            raise ValueError(
                f"max_bytes_per_rank: another rank of world_size={world} cannot hold its part of the checkpoint "
                f"{step_dir(root, saved)} (its error names the bytes); rank {rank} stops too"
            )
        st.from_checkpoint(step_dir(root, saved))
        rep.load_s = time.perf_counter() - t0
    if saved + 1 >= steps:
        return rep

    # 2. the loop: checkpoint at the agreed interval
    every = int(interval) if interval != "auto" else None
    mtbf = float(mtbf_s) if mtbf_s is not None else DEFAULT_MTBF_S
    step_times: list[float] = []
    last_ckpt = saved
    for step in range(saved + 1, steps):
        t0 = time.perf_counter()
        loss = train_step(step, st)
        step_times.append(time.perf_counter() - t0)
        if loss is not None:
            rep.losses.append(float(loss))
        rep.steps_run += 1
        if rep.first_step_wall is None:
            rep.first_step_wall = time.time()
            if saved >= 0:
                rep.recovery_s = time.perf_counter() - t_entry
        if every is not None:
            due = (step + 1) % every == 0
        else:
            due = rep.interval_steps is None or step - last_ckpt >= rep.interval_steps
        if not (due or step == steps - 1):
            continue
        t0 = time.perf_counter()
        save_sharded(
            st.to_checkpoint(),
            step_dir(root, step),
            step=step,
            rank=rank,
            world_size=world,
            group=group,
            fsync=fsync,
            meta=meta,
        )
        cost = time.perf_counter() - t0
        cost, step_s = _agree([cost, statistics.median(step_times)], group, "checkpoint cost and step time", rank)
        rep.checkpoints.append(step)
        rep.checkpoint_costs.append(cost)
        rep.checkpoint_s = rep.checkpoint_costs[0]
        rep.step_s = step_s
        last_ckpt = step
        if every is None:  # Young/Daly with the measured C (the first checkpoint's) and step time
            rep.interval_s = young_daly_interval(1.0 / mtbf, max(rep.checkpoint_s, 1e-9))
            rep.interval_steps = max(1, round(rep.interval_s / max(step_s, 1e-9)))
        else:
            rep.interval_steps = every
        if keep is not None and rank == 0:
            _prune(root, int(keep))
    return rep
