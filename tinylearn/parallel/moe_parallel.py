"""Expert parallelism for the mixture-of-experts layer (torch tensors, like the rest of tl.parallel).

``TorchMoE`` is the dense single-process layer in torch with exactly the routing of ``tl.nn.MoE`` (the numpy
``tinylearn.nn.moe.route`` picks the experts and capacity slots for both), so a tl layer and a torch layer holding
the same weights agree; ``TorchMoE.from_tl(moe)`` copies the weights.

``ExpertParallelMoE(moe, group)`` places E/P experts on each of the P ranks of ``group`` (rank r owns experts
r*E/P .. (r+1)*E/P - 1; the router is replicated). Each rank routes its own tokens (capacity, when not dropless,
is per rank's batch, GShard's "group"), then:

    1. counts exchange     every rank tells every other rank how many rows it will send (an int vector)
    2. dispatch all-to-all the kept tokens' rows, sorted by (destination rank, local expert slot), and their slots
    3. local experts       a grouped GEMM over the received rows, one matmul per local expert
    4. combine all-to-all  the expert outputs travel back along the reverse splits; the source rank weights them
                           by the gates and adds them into its tokens (so the gates' gradient reaches the router)

The all-to-all is differentiable (``_AllToAll``: backward is the all-to-all of the gradients along the reverse
splits). ``method="p2p"`` (default) runs it as P-1 isend/irecv pairs through ``tinylearn.dist.group._Group``, so a
dead or hung peer makes the survivors raise RuntimeError naming that rank (and the process-group timeout bounds
every wait). ``method="all_to_all_single"`` uses ``torch.distributed.all_to_all_single`` with uneven splits,
which gloo supports in torch 2.13 (ProcessGroupGloo::alltoall_base); its failure can only say which ranks were in
the exchange, not which one died.

Hot-expert replication (Q142b): ``replicate_expert(e, host)`` (collective) copies expert e's weights from its
owner to rank ``host``; every source rank then sends the first half (rounded up) of its tokens routed to e to the
owner and the rest to the replica, so the owner's load drops while every token still meets the same weights (the
outputs are unchanged). After backward, ``sync_replica_grads()`` (collective) sums the owner's and the replica's
gradients of e on both, so both hold the dense gradient and stay equal after an optimizer step.
``plan_replication(processed_per_expert, world_size)`` picks the most loaded expert of the busiest rank and the
least loaded other rank as its host.

``last_stats`` after forward (gathered over the group): tokens_per_expert (global routed counts), rank_load (rows
each rank's experts processed), rank_load_imbalance (max/mean of rank_load), instance_load (rows per expert
instance, ``"3"`` or ``"3@r1"`` for a replica on rank 1), processed_per_expert (rows per expert, replicas
included), dropped (global) and dropped_fraction.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..dist.collectives import check_same_across_ranks
from ..dist.group import _Group, peer_failure
from ..nn.moe import _check_config, capacity, route

__all__ = ["TorchMoE", "ExpertParallelMoE", "expert_parallel", "plan_replication", "all_to_all"]

METHODS = ("p2p", "all_to_all_single")
_TAG_COUNTS, _TAG_LABELS, _TAG_STATS, _TAG_ROWS, _TAG_REPLICA = 4101, 4102, 4103, 4104, 4110


# --------------------------------------------------------------------------------------------------- dense layer
def _grouped_experts(
    rows: torch.Tensor, slot: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor
) -> torch.Tensor:
    """expert_{slot[i]}(rows[i]) for every row: sort by slot (stable), one matmul pair per non-empty group."""
    n_exp = w1.shape[0]
    order = torch.argsort(slot, stable=True)
    xs = rows[order]
    counts = torch.bincount(slot, minlength=n_exp).tolist()
    outs, start = [], 0
    for e, c in enumerate(counts):
        if c:
            h = F.gelu(xs[start : start + c] @ w1[e] + b1[e])
            outs.append(h @ w2[e] + b2[e])
            start += c
    if not outs:  # no rows here: an empty output that still depends on the inputs and weights, so that this rank
        # runs the backward of the all-to-all that produced ``rows`` too (its peers wait for that message)
        return rows[:, :0] @ w2.new_zeros((0, w2.shape[2])) + 0 * (w1.sum() + b1.sum() + w2.sum() + b2.sum())
    out_sorted = torch.cat(outs)
    return torch.empty_like(out_sorted).index_copy(0, order, out_sorted)


def _tokens(x: Any, d_model: int) -> torch.Tensor:
    """``x`` [..., d_model] as a [tokens, d_model] view; TypeError / ValueError naming the input otherwise."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"input: expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 1 or x.shape[-1] != d_model:
        raise ValueError(f"input: last dimension must be d_model={d_model}, got shape {tuple(x.shape)}")
    return x.reshape(-1, d_model)


def _route_tokens(layer: Any, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int | None, Any, torch.Tensor]:
    """The router both torch layers run (dense TorchMoE and ExpertParallelMoE): logits, softmax probabilities, the
    capacity (None when dropless), the numpy routing of ``tl.nn.moe.route`` and each (token, choice)'s gate (top-2
    gates renormalised to sum to 1), differentiable through ``probs``."""
    e, k = layer.num_experts, layer.top_k
    logits = x2 @ layer.router_weight.T
    probs = torch.softmax(logits, -1)
    cap = None if layer.dropless else capacity(x2.shape[0], e, k, layer.capacity_factor)
    r = route(probs.detach().cpu().numpy(), k, cap)
    gates = probs.gather(1, torch.from_numpy(r.expert))
    if k == 2:
        gates = gates / gates.sum(-1, keepdim=True)
    return logits, probs, cap, r, gates


class TorchMoE(nn.Module):
    """Dense MoE layer in torch; same parameters, routing, capacity and stats as ``tl.nn.MoE`` (see its module)."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        num_experts: int,
        top_k: int = 1,
        capacity_factor: float = 1.25,
        dropless: bool = False,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        _check_config(num_experts, top_k, capacity_factor)
        self.d_model, self.d_ff, self.num_experts, self.top_k = d_model, d_ff, num_experts, top_k
        self.capacity_factor, self.dropless = float(capacity_factor), bool(dropless)
        e = num_experts

        def uni(*shape: int, fan_in: int) -> nn.Parameter:
            b = 1.0 / math.sqrt(fan_in)
            return nn.Parameter(torch.empty(shape, dtype=dtype).uniform_(-b, b))

        self.router_weight = uni(e, d_model, fan_in=d_model)
        self.w1, self.b1 = uni(e, d_model, d_ff, fan_in=d_model), uni(e, d_ff, fan_in=d_model)
        self.w2, self.b2 = uni(e, d_ff, d_model, fan_in=d_ff), uni(e, d_model, fan_in=d_ff)
        self.last_stats: dict[str, Any] = {}
        self.balance_loss: torch.Tensor | None = None
        self.z_loss: torch.Tensor | None = None

    @classmethod
    def from_tl(cls, moe: Any, dtype: torch.dtype | None = None) -> TorchMoE:
        """A TorchMoE holding copies of a ``tl.nn.MoE``'s weights (same config)."""
        m = cls(moe.d_model, moe.d_ff, moe.num_experts, moe.top_k, moe.capacity_factor, moe.dropless)
        with torch.no_grad():
            for name in ("router_weight", "w1", "b1", "w2", "b2"):
                t = torch.from_numpy(np.array(getattr(moe, name).data))
                setattr(m, name, nn.Parameter(t if dtype is None else t.to(dtype)))
        return m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d, e, k = self.d_model, self.num_experts, self.top_k
        x2 = _tokens(x, d)
        t = x2.shape[0]
        logits, probs, cap, r, gates = _route_tokens(self, x2)
        tok_np, ch_np = np.nonzero(r.keep)
        tok, ch = torch.from_numpy(tok_np), torch.from_numpy(ch_np)
        ex = torch.from_numpy(r.expert[tok_np, ch_np])
        if self.dropless:
            out_rows = _grouped_experts(x2[tok], ex, self.w1, self.b1, self.w2, self.b2)
        else:
            slot = ex * cap + torch.from_numpy(r.position[tok_np, ch_np])
            buf = x2.new_zeros((e * cap, d)).index_copy(0, slot, x2[tok]).reshape(e, cap, d)
            h = F.gelu(torch.bmm(buf, self.w1) + self.b1[:, None])
            out_rows = (torch.bmm(h, self.w2) + self.b2[:, None]).reshape(e * cap, d)[slot]
        y = x2.new_zeros((t, d)).index_add(0, tok, out_rows * gates[tok, ch].unsqueeze(-1))
        f = torch.from_numpy(r.first_counts).to(probs.dtype) / max(t, 1)
        self.balance_loss = e * (probs.mean(0) * f).sum()
        self.z_loss = (torch.logsumexp(logits, -1) ** 2).mean()
        n = t * k
        kept = int(r.keep.sum())
        self.last_stats = {
            "tokens": t,
            "capacity": cap,
            "tokens_per_expert": r.counts.tolist(),
            "dropped": n - kept,
            "dropped_fraction": (n - kept) / n if n else 0.0,
            "load_imbalance": float(r.counts.max() * e / n) if n else 1.0,
        }
        return y.reshape(x.shape)


# ------------------------------------------------------------------------------------------------- all-to-all
def _exchange(
    g: _Group, send: torch.Tensor, send_counts: list[int], recv_counts: list[int], tag: int, method: str
) -> torch.Tensor:
    """Rows send[offset_p : offset_p + send_counts[p]] go to group member p; returns the rows received, ordered by
    source member (recv_counts[p] from p). Every wait is bounded by the process-group timeout."""
    tail = tuple(send.shape[1:])
    recv = send.new_empty((sum(recv_counts), *tail))
    if method == "all_to_all_single":
        try:
            dist.all_to_all_single(recv, send.contiguous(), recv_counts, send_counts, group=g.group)
        except RuntimeError as e:
            others = ", ".join(g.name(p) for p in range(g.size) if p != g.me)
            raise peer_failure(f"all_to_all_single with {others}", g.name(g.me), e) from e
        return recv
    s_off = np.concatenate([[0], np.cumsum(send_counts)]).astype(int)
    r_off = np.concatenate([[0], np.cumsum(recv_counts)]).astype(int)
    send = send.contiguous()
    me = g.me
    recv[r_off[me] : r_off[me + 1]] = send[s_off[me] : s_off[me + 1]]
    works = []
    for step in range(1, g.size):  # pairwise schedule: send to me+step, receive from me-step
        dst, src = (me + step) % g.size, (me - step) % g.size
        if send_counts[dst]:
            works.append(g.isend(send[s_off[dst] : s_off[dst + 1]], dst, tag))
        if recv_counts[src]:
            buf = recv[r_off[src] : r_off[src + 1]]
            works.append((g.irecv(buf, src, tag), buf))
    for w in works:
        if isinstance(w, tuple):
            w[0].wait()
        else:
            w.wait()
    return recv


class _AllToAll(torch.autograd.Function):
    """Differentiable all-to-all of rows: backward sends the gradients back along the reverse splits."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, g: _Group, send: list[int], recv: list[int], method: str) -> torch.Tensor:
        ctx.g, ctx.send, ctx.recv, ctx.method = g, send, recv, method
        return _exchange(g, x, send, recv, _TAG_ROWS, method)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return _exchange(ctx.g, grad, ctx.recv, ctx.send, _TAG_ROWS + 1, ctx.method), None, None, None, None


def all_to_all(x: torch.Tensor, send_counts: list[int], group: Any = None, method: str = "p2p") -> torch.Tensor:
    """Differentiable all-to-all with uneven splits: rows of ``x`` split by ``send_counts`` (one per group member)
    go to the members; the receive splits are exchanged first. Returns the received rows, ordered by source."""
    if method not in METHODS:
        raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
    g = _Group(group)
    if len(send_counts) != g.size or sum(send_counts) != x.shape[0] or min(send_counts, default=0) < 0:
        raise ValueError(f"send_counts: expected {g.size} counts >= 0 summing to {x.shape[0]}, got {send_counts}")
    recv = _exchange(
        g, torch.tensor(send_counts, dtype=torch.int64).reshape(-1, 1), [1] * g.size, [1] * g.size, _TAG_COUNTS, method
    )
    return _AllToAll.apply(x, g, list(send_counts), recv.reshape(-1).tolist(), method)


# ------------------------------------------------------------------------------------------------- the EP layer
def plan_replication(load_per_expert: list[int] | np.ndarray, world_size: int) -> tuple[int, int]:
    """(hot expert, host rank) for hot-expert replication: the most loaded expert of the busiest rank, to be
    replicated on the least loaded other rank (rank load = the rows its experts process, experts placed E/P per rank
    in order). Pass the rows each expert processes (``last_stats["processed_per_expert"]``: after the capacity cut;
    with capacity the most-routed expert need not be the busiest rank's, and replicating it could make things
    worse)."""
    counts = np.asarray(load_per_expert, dtype=np.int64)
    e = counts.size
    if not isinstance(world_size, int) or world_size < 2 or e % world_size:
        raise ValueError(f"world_size: need >= 2 ranks dividing num_experts={e}, got {world_size!r}")
    per = e // world_size
    load = counts.reshape(world_size, per).sum(1)
    busiest = int(np.argmax(load))
    hot = busiest * per + int(np.argmax(counts[busiest * per : (busiest + 1) * per]))
    load[busiest] = np.iinfo(np.int64).max
    return hot, int(np.argmin(load))


class ExpertParallelMoE(nn.Module):
    """The experts of a dense ``TorchMoE`` spread over the ranks of ``group`` (see the module docstring). Every rank
    must build it from the same dense layer (same seed); construction checks the config across ranks."""

    def __init__(self, moe: TorchMoE, group: Any = None, method: str = "p2p") -> None:
        super().__init__()
        if not isinstance(moe, TorchMoE):
            raise TypeError(f"moe: expected a TorchMoE, got {type(moe).__name__}")
        if method not in METHODS:
            raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
        self.g = _Group(group)
        p, e = self.g.size, moe.num_experts
        if e % p:
            raise ValueError(f"num_experts: {e} is not divisible by the expert-parallel size {p}")
        check_same_across_ranks(
            "ExpertParallelMoE setup",
            [
                ("num_experts", e),
                ("d_model", moe.d_model),
                ("d_ff", moe.d_ff),
                ("top_k", moe.top_k),
                ("dropless", int(moe.dropless)),
                ("capacity_factor * 1e6", round(moe.capacity_factor * 1e6)),
                ("method", METHODS.index(method)),
            ],
            group,
        )
        self.method = method
        self.d_model, self.d_ff, self.num_experts, self.top_k = moe.d_model, moe.d_ff, e, moe.top_k
        self.capacity_factor, self.dropless = moe.capacity_factor, moe.dropless
        self.per_rank = e // p
        lo, hi = self.g.me * self.per_rank, (self.g.me + 1) * self.per_rank
        self.expert_ids = list(range(lo, hi))
        self.router_weight = nn.Parameter(moe.router_weight.detach().clone())
        for name in ("w1", "b1", "w2", "b2"):
            setattr(self, name, nn.Parameter(getattr(moe, name).detach()[lo:hi].clone()))
        self.replica: tuple[int, int, int] | None = None  # (expert, owner rank, host rank)
        self.replica_params: nn.ParameterList | None = None
        self.last_stats: dict[str, Any] = {}

    # -- replication ------------------------------------------------------------------------------------------
    def _expert_tensors(self, expert: int, grads: bool = False) -> list[torch.Tensor]:
        """Owner's slices (or grads) of ``expert``'s w1, b1, w2, b2."""
        i = expert - self.expert_ids[0]
        ps = [self.w1, self.b1, self.w2, self.b2]
        if grads:
            return [p.grad[i] if p.grad is not None else torch.zeros_like(p[i]) for p in ps]
        return [p.detach()[i] for p in ps]

    def replicate_expert(self, expert: int, host: int) -> None:
        """Collective: copy ``expert``'s weights from its owner to rank ``host`` (group rank), which then serves half
        of every rank's tokens routed to it. Replaces any earlier replica."""
        if not (0 <= expert < self.num_experts):
            raise ValueError(f"expert: expected 0 <= expert < {self.num_experts}, got {expert}")
        owner = expert // self.per_rank
        if not (0 <= host < self.g.size) or host == owner:
            raise ValueError(f"host: expected a rank in [0, {self.g.size}) other than the owner {owner}, got {host}")
        check_same_across_ranks("replicate_expert", [("expert", expert), ("host", host)], self.g.group)
        self.replica, self.replica_params = (expert, owner, host), None
        shapes = [(self.d_model, self.d_ff), (self.d_ff,), (self.d_ff, self.d_model), (self.d_model,)]
        sizes = [math.prod(s) for s in shapes]
        if self.g.me == owner:
            flat = torch.cat([t.reshape(-1) for t in self._expert_tensors(expert)])
            self.g.isend(flat.contiguous(), host, _TAG_REPLICA).wait()
        elif self.g.me == host:
            flat = self.w1.new_empty(sum(sizes))
            self.g.irecv(flat, owner, _TAG_REPLICA).wait()
            parts = torch.split(flat, sizes)
            self.replica_params = nn.ParameterList([nn.Parameter(t.reshape(s).clone()) for t, s in zip(parts, shapes)])

    def sync_replica_grads(self) -> None:
        """Collective (after backward): owner and host of the replicated expert sum their gradients of it, so both
        hold the dense gradient. A no-op on the other ranks and without a replica."""
        if self.replica is None:
            return
        expert, owner, host = self.replica
        if self.g.me not in (owner, host):
            return
        if self.g.me == owner:
            mine = self._expert_tensors(expert, grads=True)
            peer = host
        else:
            mine = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.replica_params]
            peer = owner
        flat = torch.cat([t.reshape(-1) for t in mine]).contiguous()
        other = torch.empty_like(flat)
        works = [self.g.isend(flat, peer, _TAG_REPLICA + 1), self.g.irecv(other, peer, _TAG_REPLICA + 1)]
        for w in works:
            w.wait()
        total = flat + other
        parts = torch.split(total, [t.numel() for t in mine])
        if self.g.me == owner:
            i = expert - self.expert_ids[0]
            for prm, part in zip([self.w1, self.b1, self.w2, self.b2], parts):
                if prm.grad is None:
                    prm.grad = torch.zeros_like(prm)
                prm.grad[i] = part.reshape(prm.grad[i].shape)
        else:
            for prm, part in zip(self.replica_params, parts):
                prm.grad = part.reshape(prm.shape).clone()

    # -- forward ------------------------------------------------------------------------------------------------
    def _local_weights(self) -> list[torch.Tensor]:
        ws = [self.w1, self.b1, self.w2, self.b2]
        if self.replica_params is not None:
            ws = [torch.cat([w, r.unsqueeze(0)]) for w, r in zip(ws, self.replica_params)]
        return ws

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, d, k, per = self.g, self.d_model, self.top_k, self.per_rank
        x2 = _tokens(x, d)
        t = x2.shape[0]
        _, _, _, r, gates = _route_tokens(self, x2)
        tok, ch = np.nonzero(r.keep)
        ex = r.expert[tok, ch]
        dest, slot = ex // per, ex % per
        if self.replica is not None:
            hot, _, host = self.replica
            idx = np.flatnonzero(ex == hot)
            moved = idx[(idx.size + 1) // 2 :]  # first half (rounded up) stays with the owner
            dest[moved], slot[moved] = host, per  # the replica is the host's extra local slot
        order = np.lexsort((slot, dest))
        tok, ch, dest, slot = tok[order], ch[order], dest[order], slot[order]
        send_counts = np.bincount(dest, minlength=g.size).tolist()
        ones = [1] * g.size
        recv_counts = (
            _exchange(
                g, torch.tensor(send_counts, dtype=torch.int64).reshape(-1, 1), ones, ones, _TAG_COUNTS, self.method
            )
            .reshape(-1)
            .tolist()
        )
        recv_slot = _exchange(g, torch.from_numpy(slot.copy()), send_counts, recv_counts, _TAG_LABELS, self.method)
        tok_t = torch.from_numpy(tok)
        rows = _AllToAll.apply(x2[tok_t], g, send_counts, recv_counts, self.method)
        out = _grouped_experts(rows, recv_slot, *self._local_weights())
        back = _AllToAll.apply(out, g, recv_counts, send_counts, self.method)
        w = gates[tok_t, torch.from_numpy(ch)].unsqueeze(-1)
        y = x2.new_zeros((t, d)).index_add(0, tok_t, back * w)
        self._gather_stats(r.counts, int(r.keep.sum()), t * k, recv_slot)
        return y.reshape(x.shape)

    def _gather_stats(self, counts: np.ndarray, kept: int, n: int, recv_slot: torch.Tensor) -> None:
        g, per = self.g, self.per_rank
        inst = np.bincount(recv_slot.numpy(), minlength=per + 1)[: per + 1]
        mine = np.concatenate([counts, [kept, n], inst]).astype(np.int64)
        ones = [1] * g.size
        send = torch.from_numpy(np.tile(mine, (g.size, 1)))
        allv = _exchange(g, send, ones, ones, _TAG_STATS, self.method).numpy()  # [P, E + 2 + per + 1]
        e = self.num_experts
        tokens = allv[:, :e].sum(0)
        kept_all, n_all = int(allv[:, e].sum()), int(allv[:, e + 1].sum())
        inst_all = allv[:, e + 2 :]
        rank_load = inst_all.sum(1)
        instance_load = {}
        for rk in range(g.size):
            for s in range(per):
                instance_load[str(rk * per + s)] = int(inst_all[rk, s])
        if self.replica is not None:
            hot, _, host = self.replica
            instance_load[f"{hot}@r{host}"] = int(inst_all[host, per])
        processed = inst_all[:, :per].reshape(-1).copy()
        if self.replica is not None:
            processed[hot] += int(inst_all[host, per])
        mean = rank_load.mean() if rank_load.size else 0.0
        self.last_stats = {
            "tokens_per_expert": tokens.tolist(),
            "processed_per_expert": processed.tolist(),
            "rank_load": rank_load.tolist(),
            "rank_load_imbalance": float(rank_load.max() / mean) if mean else 1.0,
            "instance_load": instance_load,
            "instance_load_max": max(instance_load.values()),
            "dropped": n_all - kept_all,
            "dropped_fraction": (n_all - kept_all) / n_all if n_all else 0.0,
        }


def expert_parallel(moe: TorchMoE, group: Any = None, method: str = "p2p") -> ExpertParallelMoE:
    """``ExpertParallelMoE(moe, group, method)``: this rank's share of ``moe``'s experts."""
    return ExpertParallelMoE(moe, group, method)
