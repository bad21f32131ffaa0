"""ZeRO (Rajbhandari et al., 2020): shard the optimizer state (stage 1), also the gradients (stage 2), also the
parameters (stage 3) over the N ranks of a data-parallel group.

Memory per rank for Ψ parameters, mixed-precision Adam (fp16/bf16 params and grads = 2 bytes each, optimizer
state K = 12 bytes/param: fp32 master copy + momentum + variance), paper §5 / Figure 1:

    baseline DDP   (2 + 2 + K) Ψ
    stage 1        2Ψ + 2Ψ + KΨ/N          optimizer state sharded
    stage 2        2Ψ + (2 + K)Ψ/N         + gradients sharded (reduce-scatter instead of all-reduce)
    stage 3        (2 + 2 + K)Ψ/N          + parameters sharded (all-gather before use, free after)

With fp32 parameters (dtype_bytes=4) there is no separate master copy: K = 8 for Adam (m, v), 4 for SGD momentum.

Sharding: every parameter is flattened and padded to a multiple of N; rank r owns elements [r·s, (r+1)·s) with
s = ceil(numel/N) (padding < N elements per tensor, which is why measured bytes may exceed the formula by at
most N-1 elements per tensor; tests use sizes divisible by N, where measurement and formula agree exactly).

Data flow of ``step()`` (gradients are averaged over the group here: DDP semantics, no DDP wrapper needed):

* stage 1: one all-reduce (avg, ring) of the flat concatenated gradients — the same collective a plain DDP
  built on ``tl.dist.all_reduce`` uses, so parameters are **bitwise** equal to that DDP; every rank updates its
  shards; one all-gather per parameter re-assembles the parameters.
* stage 2: gradients are reduce-scattered (avg) from post-accumulate-grad hooks as soon as backward has produced
  a whole bucket (``bucket_cap_bytes``, 25 MB like DDP, parameters in reverse order), and the full ``.grad`` is
  dropped: only the 1/N shard survives backward. Step + all-gather as stage 1.
  The ring reduce-scatter sums in a different order than the all-reduce, so results equal DDP bitwise for N=2
  (a+b = b+a) and within fp32 rounding for N>2.
* stage 3: parameters live as shards; a module's parameters are all-gathered in a forward pre-hook (and again in
  a backward pre-hook), and freed after its forward / after their gradient was reduce-scattered. Freeing resizes
  the parameter's storage to 0 bytes (like FSDP), so the views autograd saved stay valid and see the re-gathered
  values in backward. Pass the ``nn.Module`` as ``params`` to get the hooks; with a plain parameter list use
  ``with opt.gather_parameters(): ...`` around forward and backward.

Cross-rank safety: the collectives above run without a size check (a mismatch inside gloo aborts the rank), so the
constructor handshakes once (``tl.dist.collectives.check_params_across_ranks``: stage, bucket cap, parameter count,
dims, dtypes, requires_grad flags, shapes) and every rank raises ValueError naming the first difference and each
rank's value; each gradient bucket and each stage-3 gather also agrees on its index (one 2-int all-reduce), so
ranks that skip a parameter raise instead of aborting. A parameter listed twice is refused (ValueError naming its
index). A peer that dies or hangs mid-step surfaces as a RuntimeError naming the rank waited for and the cause.

Layout: the optimizer is here (one class: the three stages share the per-parameter slot bookkeeping, the bucket
and gather hooks and the cross-rank handshake); the single-process arithmetic it is tested against (memory formula,
shard bounds, state sharding) is in ``tinylearn.parallel.zero_sharding`` and re-exported here.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from ..dist import all_gather, all_reduce, reduce_scatter
from ..dist.collectives import check_params_across_ranks, check_same_across_ranks
from .zero_sharding import (  # noqa: F401  (re-exported: the names this module held before the split)
    _STATE_BYTES,
    consolidate_state,
    shard_bounds,
    shard_state,
    zero_memory_per_rank,
)

# stage 3 gathers parameters in a full backward pre-hook; on the first layer (input without grad) torch warns that
# the hook fires for the outputs only — which is exactly when the gather is needed.
warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed with respect to")


def _group_info(group: Any) -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "ZeroOptimizer: torch.distributed is not initialized; run inside tl.dist.launch(...) or torchrun"
        )
    return dist.get_world_size(group), dist.get_rank(group)


class _Slot:
    """Book-keeping of one parameter: its shape, shard range and the tensors this rank keeps for it."""

    def __init__(self, p: torch.Tensor, n: int, r: int) -> None:
        self.p = p
        self.shape = p.shape
        self.numel = p.numel()
        self.s = math.ceil(self.numel / n) if self.numel else 0  # padded shard length
        self.lo = min(r * self.s, self.numel)
        self.hi = min((r + 1) * self.s, self.numel)
        self.master: torch.Tensor = torch.empty(0)  # what the inner optimizer updates
        self.p_shard: torch.Tensor | None = None  # stage 3: this rank's slice of the parameter (param dtype)
        self.grad_shard: torch.Tensor | None = None  # stage 2/3: reduced gradient shard


class ZeroOptimizer:
    """Wrap ``optimizer_cls`` so that each rank of ``group`` keeps only its shard (see module docstring).

    ``params``: an iterable of parameters, or an ``nn.Module`` (needed for stage 3's automatic gather hooks).
    ``bucket_cap_bytes`` (stages 2/3): gradient bytes per reduce-scatter; smaller buckets free memory sooner and
    overlap better on real networks, larger ones send fewer messages.
    ``check_order`` (stages 2/3): before each bucket's reduce-scatter and each stage-3 gather, one tiny all-reduce
    checks that every rank is at the same bucket / parameters, so a rank that skipped or froze a parameter raises a
    ValueError naming it instead of aborting inside gloo. That is one extra small message per bucket per step;
    ``check_order=False`` drops it once a setup is known to be consistent (the results are identical).
    Every rank must construct it with identical parameters (same initial values, same order).
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | torch.nn.Module,
        optimizer_cls: type = torch.optim.Adam,
        stage: int = 1,
        group: Any = None,
        *,
        bucket_cap_bytes: int = 25 << 20,
        check_order: bool = True,
        **optimizer_kwargs: Any,
    ) -> None:
        if stage not in (1, 2, 3):
            raise ValueError(f"stage: expected 1, 2 or 3, got {stage!r}")
        if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, torch.optim.Optimizer)):
            raise TypeError(f"optimizer_cls: expected a torch.optim.Optimizer subclass, got {optimizer_cls!r}")
        module = params if isinstance(params, torch.nn.Module) else None
        plist = list(module.parameters() if module is not None else params)
        if not plist:
            raise ValueError("params: got an empty parameter list")
        seen: dict[int, int] = {}
        for i, p in enumerate(plist):
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"params[{i}]: expected a torch.Tensor, got {type(p).__name__}")
            if not p.dtype.is_floating_point:
                raise TypeError(f"params[{i}]: expected a floating-point tensor, got {p.dtype}")
            if id(p) in seen:  # stages 1/2 would update it twice, stage 3 free it under its own feet
                raise ValueError(
                    f"params[{i}]: the same tensor as params[{seen[id(p)]}] (shape {tuple(p.shape)}); "
                    "list every parameter once"
                )
            seen[id(p)] = i
        if isinstance(bucket_cap_bytes, bool) or not isinstance(bucket_cap_bytes, int) or bucket_cap_bytes < 1:
            raise ValueError(f"bucket_cap_bytes: expected an int >= 1, got {bucket_cap_bytes!r}")
        if not isinstance(check_order, bool):
            raise TypeError(f"check_order: expected a bool, got {type(check_order).__name__} {check_order!r}")
        self.stage, self.group, self.module, self.check_order = stage, group, module, check_order
        self.world_size, self.rank = _group_info(group)
        # step() runs its collectives unchecked (a size mismatch inside gloo aborts the rank): agree once here
        setup = [("stage", stage), ("bucket_cap_bytes", bucket_cap_bytes if stage >= 2 else 0)]
        setup.append(("check_order", int(check_order)))  # ranks that disagree would run different collectives
        check_params_across_ranks("ZeroOptimizer", plist, group, setup)
        self.params = plist
        self.slots = [_Slot(p, self.world_size, self.rank) for p in plist]
        self._index = {id(sl): i for i, sl in enumerate(self.slots)}
        self._handles: list[Any] = []
        self._grads_reduced = False
        for sl in self.slots:
            full = sl.p.detach().reshape(-1)
            mixed = sl.p.dtype in (torch.float16, torch.bfloat16)
            if stage == 3:
                sl.p_shard = self._padded(full, sl)[self.rank * sl.s : (self.rank + 1) * sl.s].clone()
                sl.master = sl.p_shard.float() if mixed else sl.p_shard
            elif mixed:
                sl.master = self._padded(full, sl)[self.rank * sl.s : (self.rank + 1) * sl.s].float()
            else:
                sl.master = sl.p.data.view(-1)[sl.lo : sl.hi]  # a view: the update lands in the parameter
        self.optimizer = optimizer_cls([sl.master for sl in self.slots], **optimizer_kwargs)
        self.param_groups = self.optimizer.param_groups
        if stage >= 2:
            self._make_buckets(bucket_cap_bytes)
            for sl in self.slots:
                if sl.p.requires_grad:
                    self._handles.append(sl.p.register_post_accumulate_grad_hook(self._make_grad_hook(sl)))
        if stage == 3:
            for sl in self.slots:
                self._free(sl)
            if module is not None:
                self._install_module_hooks(module)

    # ------------------------------------------------------------------------------------------- helpers
    def _padded(self, flat: torch.Tensor, sl: _Slot) -> torch.Tensor:
        out = torch.zeros(sl.s * self.world_size, dtype=flat.dtype)
        out[: flat.numel()] = flat.reshape(-1)
        return out

    def _gather_many(self, shards: list[torch.Tensor], slots: list[_Slot]) -> list[torch.Tensor]:
        """All-gather the shards of several tensors in ONE collective (same dtype): rank r contributes the
        concatenation of its padded shards; returns each tensor flat and unpadded."""
        if not slots:
            return []
        dtype = shards[0].dtype
        if any(t.dtype != dtype for t in shards):
            return [self._gather_many([t], [sl])[0] for t, sl in zip(shards, slots, strict=True)]
        total = sum(sl.s for sl in slots)
        buf = torch.zeros(total, dtype=dtype)
        off = 0
        for t, sl in zip(shards, slots, strict=True):
            buf[off : off + t.numel()] = t.reshape(-1)
            off += sl.s
        out = torch.empty(total * self.world_size, dtype=dtype).view(self.world_size, total)
        all_gather(out.view(-1), buf, group=self.group, check=False)
        res, off = [], 0
        for sl in slots:
            res.append(out[:, off : off + sl.s].reshape(-1)[: sl.numel])
            off += sl.s
        return res

    def _free(self, sl: _Slot) -> None:
        sl.p.data.untyped_storage().resize_(0)

    def _materialise(self, slots: list[_Slot]) -> None:
        """Re-allocate and fill the full parameters of ``slots`` (one all-gather for all of them)."""
        todo = [sl for sl in slots if sl.p.data.untyped_storage().nbytes() != sl.numel * sl.p.element_size()]
        if not todo:
            return  # already gathered (the same on every rank: all ranks run the same hooks)
        # every rank must gather the same parameters (ranks that run different modules would abort inside gloo)
        if self.check_order:
            check_same_across_ranks(
                "ZeroOptimizer stage-3 parameter gather",
                [("first parameter gathered", self._index[id(todo[0])]), ("parameters gathered", len(todo))],
                self.group,
                count_first=False,
            )
        fulls = self._gather_many([sl.p_shard for sl in todo], todo)
        for sl, full in zip(todo, fulls, strict=True):
            sl.p.data.untyped_storage().resize_(sl.numel * sl.p.element_size())
            sl.p.data.copy_(full.view(sl.shape))

    def _make_buckets(self, cap_bytes: int) -> None:
        """Group the trainable parameters, in reverse order (backward produces the last layers' gradients first),
        into buckets of at most ``cap_bytes`` of gradient (a larger parameter gets its own bucket), like DDP."""
        self._buckets: list[list[_Slot]] = []
        cur: list[_Slot] = []
        size = 0
        for sl in reversed([sl for sl in self.slots if sl.p.requires_grad]):
            nb = sl.numel * sl.p.element_size()
            if cur and size + nb > cap_bytes:
                self._buckets.append(cur)
                cur, size = [], 0
            cur.append(sl)
            size += nb
        if cur:
            self._buckets.append(cur)
        self._bucket_of = {id(sl): b for b, bucket in enumerate(self._buckets) for sl in bucket}
        self._ready: list[set[int]] = [set() for _ in self._buckets]

    def _reduce_bucket(self, b: int) -> None:
        """One reduce-scatter (avg) for a whole bucket: rank-major layout, chunk r = every slot's padded slice r,
        so rank r receives exactly its shards. Full gradients are dropped; stage 3 also frees the parameters."""
        bucket = self._buckets[b]
        dtype = next((sl.p.grad.dtype for sl in bucket if sl.p.grad is not None), bucket[0].p.dtype)
        total = sum(sl.s for sl in bucket)
        # ranks must reduce the buckets in the same order (a parameter frozen or skipped on one rank only changes
        # it): one tiny all-reduce per bucket turns a gloo abort into a ValueError naming the buckets
        if self.check_order:
            check_same_across_ranks(
                "ZeroOptimizer gradient bucket order",
                [("gradient bucket", b), ("bucket elements", total)],
                self.group,
                count_first=False,
            )
        flat = torch.zeros(self.world_size, total, dtype=dtype)
        off = 0
        for sl in bucket:
            if sl.p.grad is not None:
                flat[:, off : off + sl.s] = self._padded(sl.p.grad.detach(), sl).view(self.world_size, sl.s)
            off += sl.s
        out = torch.empty(total, dtype=dtype)
        reduce_scatter(out, flat.view(-1), op="avg", group=self.group, check=False)
        off = 0
        for sl in bucket:
            piece = out[off : off + sl.s]
            sl.grad_shard = piece.clone() if sl.grad_shard is None else sl.grad_shard.add_(piece)
            sl.p.grad = None  # only the 1/N shard survives
            if self.stage == 3:
                self._free(sl)
            off += sl.s
        self._ready[b].clear()

    def _make_grad_hook(self, sl: _Slot) -> Any:
        def hook(p: torch.Tensor) -> None:
            b = self._bucket_of[id(sl)]
            self._ready[b].add(id(sl))
            if len(self._ready[b]) == len(self._buckets[b]):
                self._reduce_bucket(b)

        return hook

    def _flush_buckets(self) -> None:
        """Reduce buckets that backward left incomplete (parameters without a gradient count as zeros)."""
        for b, ready in enumerate(self._ready):
            if ready:
                self._reduce_bucket(b)

    def _install_module_hooks(self, module: torch.nn.Module) -> None:
        by_param = {id(sl.p): sl for sl in self.slots}
        for m in module.modules():
            own = [by_param[id(p)] for p in m.parameters(recurse=False) if id(p) in by_param]
            if not own:
                continue

            def gather(*_: Any, own: list[_Slot] = own) -> None:
                self._materialise(own)

            def free(*_: Any, own: list[_Slot] = own) -> None:
                for sl in own:
                    self._free(sl)

            self._handles.append(m.register_forward_pre_hook(gather))
            self._handles.append(m.register_forward_hook(free))
            self._handles.append(m.register_full_backward_pre_hook(gather))

    # ------------------------------------------------------------------------------------------- public API
    @contextlib.contextmanager
    def gather_parameters(self) -> Iterator[list[torch.Tensor]]:
        """Stage 3: materialise every full parameter inside the block (collective: all ranks must enter), free
        them at exit unless backward still needs them. Stages 1/2 hold full parameters anyway: a no-op."""
        if self.stage == 3:
            self._materialise(self.slots)
        try:
            yield self.params
        finally:
            if self.stage == 3:
                for sl in self.slots:
                    if sl.p.grad is None:
                        self._free(sl)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for ready in getattr(self, "_ready", []):
            ready.clear()
        for sl in self.slots:
            sl.grad_shard = None
            sl.master.grad = None
            if sl.p.grad is not None:
                if set_to_none:
                    sl.p.grad = None
                else:
                    sl.p.grad.zero_()

    def _reduce_stage1(self) -> None:
        grads = [sl.p.grad if sl.p.grad is not None else torch.zeros(sl.shape, dtype=sl.p.dtype) for sl in self.slots]
        flat = torch.cat([g.detach().reshape(-1) for g in grads])
        all_reduce(flat, op="avg", algorithm="ring", group=self.group, check=False)
        off = 0
        for sl, g in zip(self.slots, grads, strict=True):
            g.copy_(flat[off : off + sl.numel].view(sl.shape))
            if sl.p.grad is None:
                sl.p.grad = g
            off += sl.numel

    @torch.no_grad()
    def step(self) -> None:
        """Average gradients over the group, update this rank's shards, re-assemble (stages 1/2) the parameters."""
        if self.stage == 1:
            self._reduce_stage1()
        else:
            self._flush_buckets()
        for sl in self.slots:
            if self.stage == 1:
                g = sl.p.grad.reshape(-1)
                g = self._padded(g, sl)[self.rank * sl.s : self.rank * sl.s + sl.master.numel()]
            else:
                g = sl.grad_shard if sl.grad_shard is not None else torch.zeros(sl.s, dtype=sl.p.dtype)
                g = g[: sl.master.numel()]
            sl.master.grad = g.to(sl.master.dtype) if g.dtype != sl.master.dtype else g
        self.optimizer.step()
        if self.stage == 3:
            for sl in self.slots:
                if sl.p_shard is not sl.master:
                    assert sl.p_shard is not None
                    sl.p_shard.copy_(sl.master)
            return
        slots = [sl for sl in self.slots if sl.s]
        shards = [sl.master if sl.master.dtype == sl.p.dtype else sl.master.to(sl.p.dtype) for sl in slots]
        for sl, full in zip(slots, self._gather_many(shards, slots), strict=True):  # one all-gather
            sl.p.data.copy_(full.view(sl.shape))

    # ------------------------------------------------------------------------------------------- memory
    def memory_bytes(self) -> dict[str, int]:
        """Bytes this rank holds right now: parameters (storage actually allocated), gradients (full .grad plus
        reduced shards) and optimizer state (inner optimizer's state tensors plus a separate fp32 master copy).
        Call after ``step()`` and before ``zero_grad()`` to see the steady state of every stage."""
        params = grads = state = 0
        for sl in self.slots:
            params += sl.p.data.untyped_storage().nbytes() if self.stage == 3 else sl.numel * sl.p.element_size()
            if sl.p_shard is not None:
                params += sl.p_shard.numel() * sl.p_shard.element_size()
            if sl.p.grad is not None:
                grads += sl.p.grad.numel() * sl.p.grad.element_size()
            if sl.grad_shard is not None:
                grads += sl.grad_shard.numel() * sl.grad_shard.element_size()
            if sl.master.dtype != sl.p.dtype:  # fp32 master copy of a 16-bit parameter: part of K
                state += sl.master.numel() * sl.master.element_size()
            for v in self.optimizer.state.get(sl.master, {}).values():
                if isinstance(v, torch.Tensor) and v.dim() > 0:
                    state += v.numel() * v.element_size()
        return {"params": params, "grads": grads, "optimizer_state": state, "total": params + grads + state}

    # ------------------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Consolidated state in the plain optimizer's format (collective: every rank gets the full dict), so
        ``optimizer_cls(params).load_state_dict(sd)`` continues exactly where this one stopped. With 16-bit
        parameters it also holds ``master_params`` ({index: full fp32 master copy}; torch's optimizers ignore the
        extra key), so that a resume through ``load_state_dict`` is bitwise instead of rounded to 16 bits."""
        inner = self.optimizer.state_dict()
        has = torch.tensor([1 if inner["state"].get(i) else 0 for i in range(len(self.slots))])
        dist.all_reduce(has, op=dist.ReduceOp.MIN, group=self.group)  # state exists on every rank or is dropped
        idx = [i for i in range(len(self.slots)) if int(has[i])]
        state: dict[int, dict[str, Any]] = {i: {} for i in idx}
        keys = sorted({k for i in idx for k in inner["state"][i]})
        for k in keys:
            sharded = [
                i
                for i in idx
                if isinstance(inner["state"][i].get(k), torch.Tensor)
                and inner["state"][i][k].dim() > 0
                and inner["state"][i][k].numel() == self.slots[i].master.numel()
            ]
            fulls = self._gather_many([inner["state"][i][k] for i in sharded], [self.slots[i] for i in sharded])
            for i, full in zip(sharded, fulls, strict=True):
                state[i][k] = full.clone().view(self.slots[i].shape)
            for i in idx:
                if i not in sharded and k in inner["state"][i]:
                    v = inner["state"][i][k]
                    state[i][k] = v.clone() if isinstance(v, torch.Tensor) else v
        out: dict[str, Any] = {"state": state, "param_groups": inner["param_groups"]}
        mixed = [i for i, sl in enumerate(self.slots) if sl.master.dtype != sl.p.dtype]
        if mixed:  # the fp32 master copies of 16-bit parameters: without them a resume would round to 16 bits
            fulls = self._gather_many([self.slots[i].master for i in mixed], [self.slots[i] for i in mixed])
            out["master_params"] = {i: f.clone().view(self.slots[i].shape) for i, f in zip(mixed, fulls, strict=True)}
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a consolidated state (from ``state_dict()`` of any world size, or from the plain optimizer)."""
        if not isinstance(state_dict, dict) or "state" not in state_dict or "param_groups" not in state_dict:
            raise TypeError("state_dict: expected a dict with 'state' and 'param_groups' (an optimizer state_dict)")
        n_sd = sum(len(g["params"]) for g in state_dict["param_groups"])
        if n_sd != len(self.slots):
            raise ValueError(f"state_dict: holds {n_sd} parameters, this optimizer has {len(self.slots)}")
        order = [i for g in state_dict["param_groups"] for i in g["params"]]
        state: dict[int, dict[str, Any]] = {}
        for j, key in enumerate(order):
            st = state_dict["state"].get(key)
            if st is None:
                continue
            sl = self.slots[j]
            mine: dict[str, Any] = {}
            for k, v in st.items():
                if isinstance(v, torch.Tensor) and v.dim() > 0 and v.numel() == sl.numel:
                    flat = self._padded(v.detach().reshape(-1), sl)[self.rank * sl.s :]
                    mine[k] = flat[: sl.master.numel()].clone()
                else:
                    mine[k] = v.clone() if isinstance(v, torch.Tensor) else v  # never share a step counter
            state[j] = mine
        groups = [dict(g) for g in state_dict["param_groups"]]
        flat_ids = iter(range(len(self.slots)))
        for g in groups:
            g["params"] = [next(flat_ids) for _ in g["params"]]
        self.optimizer.load_state_dict({"state": state, "param_groups": groups})
        self.param_groups = self.optimizer.param_groups
        self._load_masters(order, state_dict.get("master_params") or {})

    def _load_masters(self, order: list[Any], masters: dict[Any, torch.Tensor]) -> None:
        """fp32 master copies of 16-bit parameters: from ``master_params`` when the state_dict has them (one saved by
        ``state_dict()``), else from the 16-bit parameters as they are now (a plain optimizer's state_dict has no
        masters: the model's loaded weights are the best value there is)."""
        for j, key in enumerate(order):
            sl = self.slots[j]
            if sl.master.dtype == sl.p.dtype:
                continue
            m = masters.get(key)
            if m is not None and (not isinstance(m, torch.Tensor) or m.numel() != sl.numel):
                got = tuple(m.shape) if isinstance(m, torch.Tensor) else type(m).__name__
                raise ValueError(f"state_dict['master_params'][{key!r}]: expected {sl.numel} elements, got {got}")
            with torch.no_grad():
                if m is not None:
                    src = self._padded(m.detach().reshape(-1).float(), sl)[self.rank * sl.s :]
                elif sl.p_shard is not None:  # stage 3: the parameter lives in this rank's shard
                    src = sl.p_shard.float()
                else:
                    src = self._padded(sl.p.detach().reshape(-1).float(), sl)[self.rank * sl.s :]
                sl.master.copy_(src[: sl.master.numel()])

    def remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __repr__(self) -> str:
        return (
            f"ZeroOptimizer(stage={self.stage}, world_size={self.world_size}, rank={self.rank}, "
            f"optimizer={type(self.optimizer).__name__}, n_params={sum(sl.numel for sl in self.slots)})"
        )
