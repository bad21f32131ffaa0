"""Rank functions for ``tl.dist.launch`` used by the tests and notebook of ``elastic`` / ``zero_state``: a ZeRO state
saved at N ranks and loaded at N' ranks (N, N' in 1..4, stages 1-3) compared bitwise with ``state_dict()``'s
consolidation, and a peer that dies while ``run`` is in a collective."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..parallel.workers import tiny_mlp
from ..parallel.workers_elastic import _state_equal
from ..parallel.zero import ZeroOptimizer
from .elastic import global_batch, local_rows, run
from .sharded import save_sharded
from .zero_state import ZeroState, load_zero_state, zero_shards

DIMS = (8, 9, 7, 4)  # odd sizes: ceil(numel/N) padding on every N > 1


def _train(model: nn.Module, opt: ZeroOptimizer, steps: int, world: int, rank: int) -> None:
    for step in range(steps):
        dt = next(model.parameters()).dtype
        x, y = global_batch(step, 8, DIMS[0], DIMS[-1], dtype=dt)
        rows = local_rows(8, world, rank)
        opt.zero_grad()
        nn.functional.mse_loss(model(x[rows]).float(), y[rows].float()).backward()
        opt.step()


def _full_params(opt: ZeroOptimizer, model: nn.Module) -> list[torch.Tensor]:
    with opt.gather_parameters():
        return [p.detach().clone() for p in model.parameters()]


def zero_roundtrip_job(
    root: str,
    stages: tuple[int, ...] = (1, 2, 3),
    sizes: tuple[int, ...] = (1, 2, 3, 4),
    steps: int = 2,
    dtype: str = "float32",
) -> dict[Any, bool]:
    """Save a trained ZeroOptimizer at every N in ``sizes`` and load it at every N': {(stage, N, N'): bitwise equal
    (consolidated ``state_dict()`` and full parameters)} on rank 0. Needs max(sizes) ranks."""
    rank, world = dist.get_rank(), dist.get_world_size()
    dt = getattr(torch, dtype)
    groups = {n: (None if n == world else dist.new_group(list(range(n)))) for n in sorted(set(sizes))}
    refs: dict[tuple[int, int], Any] = {}
    out: dict[Any, bool] = {}
    for stage in stages:
        for n in sizes:
            if rank < n:
                model = tiny_mlp(0, DIMS, dt)
                opt = ZeroOptimizer(model, torch.optim.Adam, stage=stage, group=groups[n], lr=1e-2)
                _train(model, opt, steps, n, rank)
                sd = opt.state_dict()
                params = _full_params(opt, model)
                d = Path(root) / f"s{stage}_{dtype}_n{n}"
                save_sharded(zero_shards(opt), d, rank=rank, world_size=n, group=groups[n], step=steps - 1)
                refs[(stage, n)] = (sd, params)
                opt.remove_hooks()
            dist.barrier()
        for n in sizes:
            for n2 in sizes:
                if rank < n2:
                    model = tiny_mlp(1, DIMS, dt)  # another init: the load must overwrite everything
                    opt = ZeroOptimizer(model, torch.optim.Adam, stage=stage, group=groups[n2], lr=5.0)
                    load_zero_state(opt, Path(root) / f"s{stage}_{dtype}_n{n}")
                    sd2, params2 = opt.state_dict(), _full_params(opt, model)
                    if rank == 0:
                        sd, params = refs[(stage, n)]
                        same = _state_equal(sd, sd2) and all(torch.equal(a, b) for a, b in zip(params, params2))
                        out[(stage, n, n2)] = bool(same)
                    opt.remove_hooks()
                dist.barrier()
    return out


def peer_death_job(root: str, die_step: int) -> str:
    """2 ranks run ``run``; rank 1 exits hard at ``die_step``; rank 0 returns the error its next collective raised."""
    rank = dist.get_rank()
    model = tiny_mlp(0, DIMS)
    opt = ZeroOptimizer(model, torch.optim.Adam, stage=1, lr=1e-2)

    def step_fn(step: int, _st: Any) -> None:
        if rank == 1 and step == die_step:
            os._exit(3)
        x, y = global_batch(step, 8, DIMS[0], DIMS[-1])
        rows = local_rows(8, 2, rank)
        opt.zero_grad()
        nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
        opt.step()

    try:
        run(step_fn, ZeroState(opt), ckpt_dir=root, steps=die_step + 3, interval=1, timeout_s=10)
    except RuntimeError as e:
        (Path(root) / f"rank{rank}_error.txt").write_text(str(e))
        return str(e)
    return "no error"


def memory_check_job(root: str, steps: int, max_bytes_per_rank: int | str | None) -> dict[str, Any]:
    """ZeRO-3 under ``run`` at this world size with ``max_bytes_per_rank``: {"need": this rank's bytes of the newest
    checkpoint (or None), "error": the ValueError's message or None, "resumed_from": ...}."""
    from .elastic import check_fits
    from .sharded import latest_checkpoint

    rank, world = dist.get_rank(), dist.get_world_size()
    model = tiny_mlp(0, DIMS)
    opt = ZeroOptimizer(model, torch.optim.Adam, stage=3, lr=1e-2)
    state = ZeroState(opt)

    def step_fn(step: int, _st: Any) -> None:
        _train_step(model, opt, step, world, rank)

    latest = latest_checkpoint(root)
    need = None if latest is None else check_fits(state, latest, world, rank, None)
    try:
        rep = run(step_fn, state, ckpt_dir=root, steps=steps, interval=1, timeout_s=20,
                  max_bytes_per_rank=max_bytes_per_rank)  # fmt: skip
    except ValueError as e:
        opt.remove_hooks()
        return {"need": need, "error": str(e), "resumed_from": None}
    opt.remove_hooks()
    return {"need": need, "error": None, "resumed_from": rep.resumed_from}


def _train_step(model: nn.Module, opt: ZeroOptimizer, step: int, world: int, rank: int) -> None:
    x, y = global_batch(step, 8, DIMS[0], DIMS[-1])
    rows = local_rows(8, world, rank)
    opt.zero_grad()
    nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
    opt.step()


class _SlowOnRank:
    """A replicated model's state whose ``to_checkpoint`` sleeps ``delay_s`` on one rank: that rank's checkpoint
    cost C is larger, so the ranks only checkpoint together if they agree on C."""

    def __init__(self, model: nn.Module, slow_rank: int, delay_s: float) -> None:
        from .elastic import TensorState

        self.inner, self.slow_rank, self.delay_s = TensorState(model.state_dict()), slow_rank, delay_s

    def to_checkpoint(self) -> dict[str, Any]:
        import time

        if dist.get_rank() == self.slow_rank:
            time.sleep(self.delay_s)
        return self.inner.to_checkpoint()

    def from_checkpoint(self, path: Any) -> None:
        self.inner.from_checkpoint(path)


def auto_interval_job(root: str, steps: int, mtbf_s: float, delay_s: float) -> dict[str, Any]:
    """``run(interval="auto")`` on every rank; rank 1's checkpoint and steps are slower. Returns this rank's
    checkpoints, costs, step time and interval."""
    import time

    rank, world = dist.get_rank(), dist.get_world_size()
    model = tiny_mlp(0, DIMS)

    def step_fn(step: int, _st: Any) -> float:
        if rank == 1:
            time.sleep(delay_s / 10)
        x, y = global_batch(step, 8, DIMS[0], DIMS[-1])
        rows = local_rows(8, world, rank)
        model.zero_grad()
        loss = nn.functional.mse_loss(model(x[rows]), y[rows])
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                g = p.grad.clone()
                dist.all_reduce(g)
                p -= 0.05 * g / world
        return float(loss.detach())

    rep = run(step_fn, _SlowOnRank(model, 1, delay_s), ckpt_dir=root, steps=steps, interval="auto", mtbf_s=mtbf_s,
              timeout_s=20)  # fmt: skip
    return {
        "checkpoints": rep.checkpoints,
        "costs": rep.checkpoint_costs,
        "step_s": rep.step_s,
        "interval_s": rep.interval_s,
        "interval_steps": rep.interval_steps,
    }


# ------------------------------------------------------------------------------------------ tensor-parallel state
class DenseBlock(nn.Module):
    """A transformer-ish block of the dense reference modules (attention q/k/v/o + MLP fc1/fc2)."""

    def __init__(self, seed: int, embed: int = 8, heads: int = 2, ffn: int = 16) -> None:
        from ..parallel.tensor_parallel import DenseMLP, DenseSelfAttention

        super().__init__()
        torch.manual_seed(seed)
        self.attn, self.mlp = DenseSelfAttention(embed, heads), DenseMLP(embed, ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x)
        return x + self.mlp(x)


class ParallelBlock(nn.Module):
    """``DenseBlock`` split over the TP ranks (heads and the MLP's hidden units): the same parameter names."""

    def __init__(self, dense: DenseBlock) -> None:
        from ..parallel.tensor_parallel import ParallelMLP, ParallelSelfAttention

        super().__init__()
        self.attn, self.mlp = ParallelSelfAttention(dense.attn), ParallelMLP(dense.mlp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x)
        return x + self.mlp(x)


def block_input(seed: int = 7) -> torch.Tensor:
    return torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(seed))


def tp_save_job(root: str, seed: int) -> torch.Tensor:
    """Every TP rank saves its shards of ``ParallelBlock(DenseBlock(seed))``; returns the block's output."""
    from .parallel_state import tp_shards

    par = ParallelBlock(DenseBlock(seed))
    save_sharded(tp_shards(par), root, step=0)
    with torch.no_grad():
        return par(block_input())


def tp_load_job(root: str, seed: int) -> dict[str, Any]:
    """A TP block built from another seed loads ``root`` (any TP size or dense); its output and local parameters."""
    from .parallel_state import load_tp_state

    par = ParallelBlock(DenseBlock(seed))
    load_tp_state(par, root)
    with torch.no_grad():
        out = par(block_input())
    return {"out": out, "params": {k: v.detach().clone() for k, v in par.state_dict().items()}}
