"""ZeRO-1/2/3 and DDP training state as ``Shard``s of the flat ceil(numel/N) layout: every rank saves only its own
slice, any world size loads it back.

**Layout.** Every parameter (and every per-parameter optimizer tensor: Adam's ``exp_avg``/``exp_avg_sq``, the fp32
master copy of a 16-bit parameter) is viewed as a flat vector of ``numel`` elements; rank r of N owns
``shard_bounds(numel, N, r)`` = [r·s, (r+1)·s) ∩ [0, numel) with s = ceil(numel/N) -- exactly the slice
``ZeroOptimizer`` keeps, so saving is a copy of what the rank already holds (no gather, no communication) and
``save_sharded`` writes one chunk per rank per tensor (global shape ``(numel,)``). Replicated scalars (Adam's
``step``) and the hyper-parameters of the param groups go to the manifest's objects.

**Load at N'.** ``load_sharded(world_size=N', rank=r')`` intersects the saved chunks with rank r''s new slice (the
same ceil rule for N'): resharding N -> N' is a read of the overlapping byte ranges, no consolidation. Stages 1/2
keep full parameters on every rank, so their parameters are read whole (a template box of the full range); stage 3
reads only its slice. The template is built from the live optimizer, so a checkpoint of another model (different
key, numel or dtype) raises ``CheckpointError`` naming the key before anything is installed.

The same keys serve a plain DDP model (parameters and a torch optimizer replicated on every rank): each rank saves
its 1/N slice of the replicated tensors (N times less writing per rank than rank 0 writing everything) and a load
reads the whole tensors back. Accessors live here so that ``parallel/zero.py`` stays within its size budget.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..parallel.zero import ZeroOptimizer
from ..parallel.zero_sharding import shard_bounds
from .atomic import CheckpointError
from .sharded import Shard, bytes_per_rank, load_sharded

_DTYPES = {str(d).removeprefix("torch."): d for d in (torch.float16, torch.float32, torch.float64, torch.int64)}


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().numpy().copy()


def _scalar(v: Any) -> Any:
    """A replicated state entry as a manifest object: a 0-dim tensor becomes [value, dtype name]."""
    if isinstance(v, torch.Tensor):
        if v.dim() != 0:
            raise TypeError(f"replicated optimizer state: expected a 0-dim tensor, got shape {tuple(v.shape)}")
        return [v.item(), str(v.dtype).removeprefix("torch.")]
    return v


def _unscalar(v: Any) -> Any:
    if isinstance(v, list) and len(v) == 2 and isinstance(v[1], str) and v[1] in _DTYPES:
        return torch.tensor(v[0], dtype=_DTYPES[v[1]])
    return v


def _groups_json(groups: list[dict[str, Any]]) -> str:
    return json.dumps([{k: v for k, v in g.items() if k != "params"} for g in groups])


def _install_groups(optimizer: torch.optim.Optimizer, text: Any, prefix: str) -> None:
    groups = json.loads(text) if isinstance(text, str) else None
    if not isinstance(groups, list) or len(groups) != len(optimizer.param_groups):
        raise CheckpointError(
            f"{prefix}groups: the checkpoint has {len(groups) if isinstance(groups, list) else groups!r} param groups, "
            f"the optimizer {len(optimizer.param_groups)} (a checkpoint of another model)"
        )
    for g, saved in zip(optimizer.param_groups, groups, strict=True):
        for k, v in saved.items():
            g[k] = tuple(v) if isinstance(g.get(k), tuple) and isinstance(v, list) else v


def _sharded_keys(st: dict[str, Any], numel: int) -> list[str]:
    return sorted(k for k, v in st.items() if isinstance(v, torch.Tensor) and v.dim() > 0 and v.numel() >= numel)


# ----------------------------------------------------------------------------------------------------- ZeRO
def zero_shards(opt: ZeroOptimizer, prefix: str = "zero.") -> dict[str, Any]:
    """This rank's part of ``opt``'s training state for ``save_sharded``: parameters, fp32 masters and optimizer
    state tensors as Shards of the flat layout, replicated state and hyper-parameters as objects."""
    if not isinstance(opt, ZeroOptimizer):
        raise TypeError(f"opt: expected a ZeroOptimizer, got {type(opt).__name__}")
    out: dict[str, Any] = {f"{prefix}stage": opt.stage, f"{prefix}groups": _groups_json(opt.optimizer.param_groups)}
    for i, sl in enumerate(opt.slots):
        n = sl.hi - sl.lo
        src = sl.p_shard if opt.stage == 3 else sl.p.detach().reshape(-1)[sl.lo : sl.hi]
        assert src is not None
        out[f"{prefix}param.{i}"] = Shard(_np(src[:n]), (sl.lo,), (sl.numel,))
        if sl.master.dtype != sl.p.dtype:
            out[f"{prefix}master.{i}"] = Shard(_np(sl.master[:n]), (sl.lo,), (sl.numel,))
        st = opt.optimizer.state.get(sl.master, {})
        big = _sharded_keys(st, sl.master.numel())
        for k in big:
            out[f"{prefix}state.{i}.{k}"] = Shard(_np(st[k][:n]), (sl.lo,), (sl.numel,))
        for k, v in st.items():
            if k not in big:
                out[f"{prefix}state.{i}.{k}"] = _scalar(v)
    return out


def _zero_template(opt: ZeroOptimizer, keys: list[str], prefix: str) -> dict[str, Shard]:
    """The box every tensor key of ``opt`` needs on this rank (full parameters for stages 1/2, own slices else)."""
    tpl: dict[str, Shard] = {}
    for key in keys:
        if not key.startswith(prefix) or key.count(".") < prefix.count(".") + 1:
            continue
        kind, rest = key[len(prefix) :].split(".", 1)
        if kind not in ("param", "master", "state"):
            continue
        i = int(rest.split(".", 1)[0])
        if i >= len(opt.slots):
            raise CheckpointError(f"{key!r}: the checkpoint has more parameters than the optimizer ({len(opt.slots)})")
        sl = opt.slots[i]
        dtype = sl.p.dtype if kind == "param" else sl.master.dtype
        full = kind == "param" and opt.stage != 3
        lo, n = (0, sl.numel) if full else (sl.lo, sl.hi - sl.lo)
        tpl[key] = Shard(np.empty(n, dtype=torch.empty(0, dtype=dtype).numpy().dtype), (lo,), (sl.numel,))
    return tpl


def _tensor_keys(path: Path) -> list[str]:
    from .sharded import read_manifest

    return list(read_manifest(path)["tensors"])


def load_zero_state(
    opt: ZeroOptimizer, path: str | Path, prefix: str = "zero.", max_bytes_per_rank: int | None = None
) -> None:
    """Install the state saved by ``zero_shards`` (any world size) into ``opt`` (this world size: collective-free,
    each rank reads its own boxes). Raises CheckpointError naming the key for a checkpoint of another model, and
    ValueError naming ``max_bytes_per_rank`` when this rank's boxes exceed it (checked before anything is read)."""
    if not isinstance(opt, ZeroOptimizer):
        raise TypeError(f"opt: expected a ZeroOptimizer, got {type(opt).__name__}")
    path = Path(path)
    names = [k for k in _tensor_keys(path) if k.startswith(prefix)]
    for i in range(len(opt.slots)):  # a checkpoint with fewer parameters: name the first missing one
        if f"{prefix}param.{i}" not in names:
            raise CheckpointError(f"{prefix}param.{i}: not in the checkpoint {path} (a checkpoint of another model)")
    tpl = _zero_template(opt, names, prefix)
    got = load_sharded(
        path, world_size=opt.world_size, rank=opt.rank, template=tpl, max_bytes_per_rank=max_bytes_per_rank
    )
    if got.get(f"{prefix}stage") not in (None, 1, 2, 3):
        raise CheckpointError(f"{prefix}stage: unexpected value {got.get(f'{prefix}stage')!r}")
    opt.zero_grad()
    with torch.no_grad():
        for i, sl in enumerate(opt.slots):
            n = sl.hi - sl.lo
            p = torch.from_numpy(np.array(got[f"{prefix}param.{i}"].data))
            if opt.stage == 3:
                assert sl.p_shard is not None
                sl.p_shard.zero_()
                sl.p_shard[:n].copy_(p)
            else:
                sl.p.data.copy_(p.view(sl.shape))
            if sl.master.dtype != sl.p.dtype:
                m = got.get(f"{prefix}master.{i}")
                if m is not None:
                    src = torch.from_numpy(np.array(m.data))
                else:  # saved without masters: the 16-bit parameters are the best value there is
                    src = p.float() if opt.stage == 3 else p.float()[sl.lo : sl.hi]
                sl.master.zero_()
                sl.master[:n].copy_(src)
            elif opt.stage == 3 and sl.p_shard is not sl.master:
                sl.master.copy_(sl.p_shard)
            st: dict[str, Any] = {}
            head = f"{prefix}state.{i}."
            for key, v in got.items():
                if not key.startswith(head):
                    continue
                k = key[len(head) :]
                if isinstance(v, Shard):
                    t = torch.zeros(sl.master.numel(), dtype=sl.master.dtype)
                    t[:n] = torch.from_numpy(np.array(v.data))
                    st[k] = t
                else:
                    st[k] = _unscalar(v)
            if st:
                opt.optimizer.state[sl.master] = st
            else:
                opt.optimizer.state.pop(sl.master, None)
    _install_groups(opt.optimizer, got.get(f"{prefix}groups"), prefix)


# ----------------------------------------------------------------------------------------------------- DDP
def ddp_shards(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, world_size: int, rank: int, prefix: str = "ddp."
) -> dict[str, Any]:
    """A replicated model + torch optimizer as this rank's 1/N slices (flat layout) for ``save_sharded``."""
    out: dict[str, Any] = {f"{prefix}groups": _groups_json(optimizer.param_groups)}
    for i, p in enumerate(model.parameters()):
        lo, hi = shard_bounds(p.numel(), world_size, rank)
        out[f"{prefix}param.{i}"] = Shard(_np(p.detach().reshape(-1)[lo:hi]), (lo,), (p.numel(),))
        st = optimizer.state.get(p, {})
        big = _sharded_keys(st, p.numel())
        for k in big:
            out[f"{prefix}state.{i}.{k}"] = Shard(_np(st[k].reshape(-1)[lo:hi]), (lo,), (p.numel(),))
        for k, v in st.items():
            if k not in big:
                out[f"{prefix}state.{i}.{k}"] = _scalar(v)
    return out


def load_ddp_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    path: str | Path,
    prefix: str = "ddp.",
    max_bytes_per_rank: int | None = None,
) -> None:
    """Read whole parameters and optimizer state (saved by ``ddp_shards`` at any world size) into every rank;
    ValueError naming ``max_bytes_per_rank`` when they exceed it (checked before anything is read)."""
    path = Path(path)
    params = list(model.parameters())
    names = [k for k in _tensor_keys(path) if k.startswith(prefix)]
    tpl = {}
    for i in range(len(params)):
        key = f"{prefix}param.{i}"
        if key not in names:
            raise CheckpointError(f"{key}: not in the checkpoint {path} (a checkpoint of another model)")
    for key in names:
        i = int(key[len(prefix) :].split(".")[1])
        if i >= len(params):
            raise CheckpointError(f"{key!r}: the checkpoint has more parameters than the model ({len(params)})")
        dt = params[i].detach().numpy().dtype
        tpl[key] = Shard(np.empty(params[i].numel(), dtype=dt), (0,), (params[i].numel(),))
    got = load_sharded(path, world_size=1, rank=0, template=tpl, max_bytes_per_rank=max_bytes_per_rank)
    with torch.no_grad():
        for i, p in enumerate(params):
            p.copy_(torch.from_numpy(np.array(got[f"{prefix}param.{i}"].data)).view(p.shape))
            head = f"{prefix}state.{i}."
            st = {}
            for key, v in got.items():
                if key.startswith(head):
                    k = key[len(head) :]
                    st[k] = torch.from_numpy(np.array(v.data)).view(p.shape) if isinstance(v, Shard) else _unscalar(v)
            if st:
                optimizer.state[p] = st
    _install_groups(optimizer, got.get(f"{prefix}groups"), prefix)


# ----------------------------------------------------------------------------------------------------- adapters
def _budget(v: Any) -> int | None:
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
        raise ValueError(f"max_bytes_per_rank: expected an int >= 0 or None, got {v!r}")
    return v


class ZeroState:
    """``tl.resilience.run``'s view of a ZeroOptimizer: ``to_checkpoint()`` / ``from_checkpoint(path)``;
    ``bytes_needed(path)``: the bytes this rank's boxes take at its world size. ``max_bytes_per_rank``: a load that
    needs more raises ValueError naming it (None: no limit here; ``run`` checks its own default)."""

    def __init__(self, opt: ZeroOptimizer, prefix: str = "zero.", max_bytes_per_rank: int | None = None) -> None:
        if not isinstance(opt, ZeroOptimizer):
            raise TypeError(f"opt: expected a ZeroOptimizer, got {type(opt).__name__}")
        self.opt, self.prefix, self.max_bytes_per_rank = opt, prefix, _budget(max_bytes_per_rank)

    def to_checkpoint(self) -> dict[str, Any]:
        return zero_shards(self.opt, self.prefix)

    def bytes_needed(self, path: str | Path) -> int:
        names = [k for k in _tensor_keys(Path(path)) if k.startswith(self.prefix)]
        tpl = _zero_template(self.opt, names, self.prefix)
        return bytes_per_rank(path, world_size=self.opt.world_size, rank=self.opt.rank, template=tpl, keys=names)

    def from_checkpoint(self, path: str | Path) -> None:
        load_zero_state(self.opt, path, self.prefix, self.max_bytes_per_rank)


class DDPState:
    """A data-parallel model and its (replicated) torch optimizer for ``tl.resilience.run``; every rank holds the
    whole state, so ``bytes_needed`` does not shrink with the world size. ``max_bytes_per_rank`` as ZeroState's."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        group: Any = None,
        prefix: str = "ddp.",
        max_bytes_per_rank: int | None = None,
    ):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer: expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
        self.model, self.optimizer, self.group, self.prefix = model, optimizer, group, prefix
        self.max_bytes_per_rank = _budget(max_bytes_per_rank)

    def _world(self) -> tuple[int, int]:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size(self.group), dist.get_rank(self.group)
        return 1, 0

    def to_checkpoint(self) -> dict[str, Any]:
        n, r = self._world()
        return ddp_shards(self.model, self.optimizer, n, r, self.prefix)

    def bytes_needed(self, path: str | Path) -> int:
        return bytes_per_rank(path, keys=[k for k in _tensor_keys(Path(path)) if k.startswith(self.prefix)])

    def from_checkpoint(self, path: str | Path) -> None:
        load_ddp_state(self.model, self.optimizer, path, self.prefix, self.max_bytes_per_rank)


class MultiState:
    """Several states checkpointed together (their keys must not collide: give each its own prefix)."""

    def __init__(self, *states: Any) -> None:
        self.states = states

    def to_checkpoint(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for s in self.states:
            part = s.to_checkpoint()
            clash = out.keys() & part.keys()
            if clash:
                raise ValueError(f"states: key {sorted(clash)[0]!r} is produced twice (use distinct prefixes)")
            out.update(part)
        return out

    def bytes_needed(self, path: str | Path) -> int:
        """The states' needs together (a state without ``bytes_needed`` counts 0)."""
        return sum(int(s.bytes_needed(path)) for s in self.states if hasattr(s, "bytes_needed"))

    def from_checkpoint(self, path: str | Path) -> None:
        for s in self.states:
            s.from_checkpoint(path)
