"""Communicating sparse, uneven expert gradients: skip idle experts, bucket, truncate or low-rank compress with error
feedback, one packed buffer per bucket. [Q112, Q121]

In a mixture of experts replicated over P data-parallel ranks (DP x EP: every expert's replicas must agree), an
expert that received no token on any rank in a step has an all-zero gradient, and the others have gradients of very
different sizes. A dense all-reduce of the [E, n] expert-gradient block ships the zeros anyway. ``ExpertGradSync``
works on the per-expert flat rows ``R [E, n]`` (``expert_grad_rows``: w1[e], b1[e], w2[e], b2[e] concatenated) and
runs one of four modes (all over ``tinylearn.dist``, bytes are what this rank sends):

    dense     ring all-reduce of all of R                                           2(P-1)/P * E n * 4
    active    1. activity exchange: all-reduce of a [E] float vector (1 if v_e != 0 here)     2(P-1)/P * E * 4
              2. the union-active rows, greedily packed into buckets of <= bucket_numel elements, one ring
                 all-reduce per bucket buffer, unpacked: EXACT (equal to dense), bytes ~ active fraction of dense
    topk      1. as above; 2. per bucket, error feedback v = g + e, keep the k = ceil(ratio * bucket numel) largest
                 |v| of the bucket, pack (int32 index, fp32 value bit-cast to int32) into ONE int32 buffer [2k];
                 the indices differ per rank so the buffers are all-gathered (the correct sparse "all-reduce",
                 ``tinylearn.dist.compression``), every rank scatters every rank's pairs into the sum; e <- v - sent
                                                                                       (P-1) * 2k * 4 per bucket
    powersgd  1. as above; 2. per union-active expert, each weight matrix M = G + e [O, I] goes through one PowerSGD
                 round (``tinylearn.compress.grad_compress``): P = M Q, all-reduce(mean) of every P of the bucket
                 packed in one buffer, orthonormalise, Q = M^T P, all-reduce(mean) of the Q's (one buffer), G^ = P Q^T,
                 e <- M - P (M^T P)^T; Q is warm-started per (expert, matrix); biases ride dense in the P buffer
                                                                     2(P-1)/P * sum (O + I) r * 4 (+ biases)

Error feedback (Seide 2014, Karimireddy 2019) keeps the truncated / low-rank remainder locally and adds it to the
next step's gradient, so nothing is dropped for good; an expert stays "active" while its residual is non-zero.
Non-expert parameters (the router) are all-reduced dense in every mode (``dense_allreduce_``).

``train_worker`` (run with ``tl.dist.launch``) trains a small TorchMoE student towards a TorchMoE teacher on a
skewed token stream with each mode and returns its loss curve and measured bytes (``traffic_meter``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..compress.grad_compress import orthonormalise
from ..dist import all_gather, all_reduce

__all__ = [
    "EXPERT_PARAMS",
    "ExpertGradSync",
    "MODES",
    "active_experts",
    "compare_worker",
    "dense_allreduce_",
    "expert_grad_rows",
    "make_buckets",
    "set_expert_grads",
    "sync_check_worker",
    "train_worker",
]

EXPERT_PARAMS = ("w1", "b1", "w2", "b2")
MODES = ("dense", "active", "topk", "powersgd")


def _ring_bytes(numel: int, p: int, itemsize: int = 4) -> int:
    return int(2 * (p - 1) * numel * itemsize // p) if p > 1 else 0


def expert_grad_rows(moe: Any) -> torch.Tensor:
    """[E, n] float32: row e = concat(w1[e], b1[e], w2[e], b2[e]) gradients (zeros where .grad is None)."""
    parts = []
    for name in EXPERT_PARAMS:
        p = getattr(moe, name)
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        parts.append(g.detach().reshape(g.shape[0], -1).float())
    return torch.cat(parts, dim=1)


def set_expert_grads(moe: Any, rows: torch.Tensor) -> None:
    """Inverse of ``expert_grad_rows``: write rows [E, n] back into the expert parameters' .grad."""
    off = 0
    for name in EXPERT_PARAMS:
        p = getattr(moe, name)
        w = p[0].numel()
        g = rows[:, off : off + w].reshape(p.shape).to(p.dtype)
        p.grad = g.clone()
        off += w
    if off != rows.shape[1]:
        raise ValueError(f"rows: expected {off} columns for this MoE's experts, got {rows.shape[1]}")


def active_experts(rows: torch.Tensor) -> torch.Tensor:
    """bool [E]: experts whose row has any non-zero entry."""
    return rows.ne(0).any(dim=1)


def make_buckets(expert_ids: list[int], numel_per_expert: int, bucket_numel: int) -> list[list[int]]:
    """Greedy consecutive packing of whole experts into buckets of <= bucket_numel elements (an expert larger than
    the cap gets a bucket of its own)."""
    if numel_per_expert < 1:
        raise ValueError(f"numel_per_expert: expected >= 1, got {numel_per_expert}")
    if bucket_numel < 1:
        raise ValueError(f"bucket_numel: expected >= 1, got {bucket_numel}")
    buckets: list[list[int]] = []
    cur: list[int] = []
    for e in expert_ids:
        if cur and (len(cur) + 1) * numel_per_expert > bucket_numel:
            buckets.append(cur)
            cur = []
        cur.append(int(e))
    if cur:
        buckets.append(cur)
    return buckets


def dense_allreduce_(t: torch.Tensor) -> int:
    """Mean over ranks in place (ring); returns the bytes this rank sent."""
    p = dist.get_world_size() if dist.is_initialized() else 1
    if p > 1:
        all_reduce(t, op="sum")
        t /= p
    return _ring_bytes(t.numel(), p, t.element_size())


class ExpertGradSync:
    """Averages expert-gradient rows [E, n] over the ranks with one of ``MODES`` (see the module docstring).

    ``matrix_shapes``: the per-expert layout of a row as a list of shapes (e.g. [(d, f), (f,), (f, d), (d,)]);
    2-D entries are PowerSGD-compressed in mode "powersgd", 1-D ones are sent dense. State (residuals, Q's) is
    per instance: keep one per model across steps."""

    def __init__(
        self,
        matrix_shapes: list[tuple[int, ...]],
        num_experts: int,
        mode: str = "topk",
        ratio: float = 0.1,
        rank: int = 2,
        bucket_numel: int = 1 << 14,
        error_feedback: bool = True,
        seed: int = 0,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
        if not (isinstance(ratio, int | float) and 0 < ratio <= 1):
            raise ValueError(f"ratio: expected 0 < ratio <= 1, got {ratio!r}")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"rank: expected a positive int, got {rank!r}")
        if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
            raise ValueError(f"num_experts: expected a positive int, got {num_experts!r}")
        if not matrix_shapes or any(len(s) not in (1, 2) or min(s) < 1 for s in matrix_shapes):
            raise ValueError(f"matrix_shapes: expected a non-empty list of 1-D / 2-D shapes, got {matrix_shapes!r}")
        self.shapes = [tuple(int(v) for v in s) for s in matrix_shapes]
        self.numel = int(sum(math.prod(s) for s in self.shapes))
        self.E, self.mode, self.ratio, self.rank = num_experts, mode, float(ratio), rank
        self.bucket_numel, self.error_feedback = int(bucket_numel), bool(error_feedback)
        self.residual = torch.zeros(num_experts, self.numel)
        self.Q: dict[tuple[int, int], np.ndarray] = {}
        self.seed = seed
        self.last: dict[str, Any] = {}

    # ---------------------------------------------------------------------------------------------- helpers
    def _p(self) -> int:
        return dist.get_world_size() if dist.is_initialized() else 1

    def _union_active(self, v: torch.Tensor) -> tuple[list[int], int]:
        flags = active_experts(v).float()
        sent = dense_allreduce_(flags)  # mean > 0 <=> active on some rank
        return [int(e) for e in torch.nonzero(flags > 0).flatten()], sent

    # ---------------------------------------------------------------------------------------------- sync
    def sync(self, rows: torch.Tensor) -> torch.Tensor:
        """Mean over ranks of ``rows`` [E, n] (approximate in modes topk / powersgd); info in ``self.last``."""
        if rows.shape != (self.E, self.numel):
            raise ValueError(f"rows: expected shape {(self.E, self.numel)}, got {tuple(rows.shape)}")
        rows = rows.detach().float()
        if self.mode == "dense":
            out = rows.clone()
            sent = dense_allreduce_(out)
            self.last = {"bytes": sent, "active": self.E, "buckets": 1, "dense_bytes": sent}
            return out
        v = rows + self.residual if self.error_feedback else rows.clone()
        ids, sent = self._union_active(v)
        buckets = make_buckets(ids, self.numel, self.bucket_numel)
        out = torch.zeros_like(rows)
        for b in buckets:
            fn = {"active": self._bucket_exact, "topk": self._bucket_topk, "powersgd": self._bucket_powersgd}
            sent += fn[self.mode](b, v, out)
        if self.mode == "active":
            self.residual.zero_()
        self.last = {
            "bytes": sent,
            "active": len(ids),
            "buckets": len(buckets),
            "dense_bytes": _ring_bytes(self.E * self.numel, self._p()),
        }
        return out

    def _bucket_exact(self, b: list[int], v: torch.Tensor, out: torch.Tensor) -> int:
        buf = v[b].reshape(-1).clone()  # one packed buffer per bucket
        sent = dense_allreduce_(buf)
        out[b] = buf.view(len(b), self.numel)
        return sent

    def _bucket_topk(self, b: list[int], v: torch.Tensor, out: torch.Tensor) -> int:
        p = self._p()
        flat = v[b].reshape(-1)
        k = min(flat.numel(), max(1, math.ceil(self.ratio * flat.numel())))
        idx = torch.topk(flat.abs(), k, sorted=False).indices
        vals = flat[idx].contiguous()
        packed = torch.cat([idx.to(torch.int32), vals.view(torch.int32)])  # one int32 buffer [2k]
        if self.error_feedback:
            res = flat.clone()
            res[idx] = 0
            self.residual[b] = res.view(len(b), self.numel)
        gathered = torch.empty(p * 2 * k, dtype=torch.int32)
        if p > 1:
            all_gather(gathered, packed)
        else:
            gathered.copy_(packed)
        total = torch.zeros(flat.numel())
        for r in range(p):
            chunk = gathered[r * 2 * k : (r + 1) * 2 * k]
            total.index_add_(0, chunk[:k].long(), chunk[k:].view(torch.float32))
        out[b] = (total / p).view(len(b), self.numel)
        return (p - 1) * packed.numel() * 4

    def _slices(self) -> list[tuple[int, int, tuple[int, ...]]]:
        off, res = 0, []
        for s in self.shapes:
            res.append((off, off + math.prod(s), s))
            off += math.prod(s)
        return res

    def _bucket_powersgd(self, b: list[int], v: torch.Tensor, out: torch.Tensor) -> int:
        sl = self._slices()
        Ms: dict[tuple[int, int], np.ndarray] = {}
        p_parts, dense_parts = [], []
        for e in b:
            for j, (lo, hi, s) in enumerate(sl):
                if len(s) == 1:
                    dense_parts.append(v[e, lo:hi])
                    continue
                M = v[e, lo:hi].reshape(s).double().numpy()
                r = min(self.rank, *s)
                if (e, j) not in self.Q:  # same seed on every rank -> the same initial Q everywhere
                    self.Q[(e, j)] = np.random.default_rng([self.seed, e, j]).standard_normal((s[1], r))
                Ms[(e, j)] = M
                p_parts.append(torch.from_numpy((M @ self.Q[(e, j)]).reshape(-1)).float())
        buf1 = torch.cat(p_parts + dense_parts)  # all P's and the biases of the bucket in one buffer
        sent = dense_allreduce_(buf1)
        off, Ps = 0, {}
        for key, M in Ms.items():
            n = M.shape[0] * self.Q[key].shape[1]
            Ps[key] = orthonormalise(buf1[off : off + n].double().numpy().reshape(M.shape[0], -1))
            off += n
        dense_mean = buf1[off:]
        buf2 = torch.cat([torch.from_numpy((M.T @ Ps[key]).reshape(-1)).float() for key, M in Ms.items()])
        sent += dense_allreduce_(buf2)
        off2 = 0
        for key, M in Ms.items():
            e, j = key
            n = M.shape[1] * Ps[key].shape[1]
            self.Q[key] = buf2[off2 : off2 + n].double().numpy().reshape(M.shape[1], -1)
            off2 += n
            lo, hi, s = sl[j]
            out[e, lo:hi] = torch.from_numpy((Ps[key] @ self.Q[key].T).reshape(-1)).float()
            if self.error_feedback:
                self.residual[e, lo:hi] = torch.from_numpy((M - Ps[key] @ (M.T @ Ps[key]).T).reshape(-1)).float()
        off3 = 0
        for e in b:
            for lo, hi, s in sl:
                if len(s) == 1:
                    out[e, lo:hi] = dense_mean[off3 : off3 + hi - lo]
                    if self.error_feedback:
                        self.residual[e, lo:hi] = 0
                    off3 += hi - lo
        return sent


# ------------------------------------------------------------------------------------------------- training run
def _skewed_tokens(gen: torch.Generator, n: int, d: int, hot: torch.Tensor, skew: float) -> torch.Tensor:
    x = torch.randn(n, d, generator=gen)
    return x + skew * hot / hot.norm()


def train_worker(
    mode: str,
    steps: int = 40,
    seed: int = 0,
    tokens_per_rank: int = 16,
    d_model: int = 8,
    d_ff: int = 16,
    num_experts: int = 8,
    lr: float = 0.05,
    ratio: float = 0.1,
    rank: int = 2,
    skew: float = 2.0,
) -> dict[str, Any]:
    """Data-parallel training (inside ``tl.dist.launch``) of a top-1 dropless TorchMoE student towards a teacher
    TorchMoE (MSE), tokens pushed towards the student's router rows of experts 0-1 (``skew``) so most experts are
    idle in most steps. Expert grads go through ``ExpertGradSync(mode)``, the router dense. Returns per-step loss on
    a fixed eval batch, per-step bytes (computed) and measured bytes (``traffic_meter``), active experts per step."""
    from ..parallel.bench_longctx import traffic_meter
    from ..parallel.moe_parallel import TorchMoE

    me = dist.get_rank()
    torch.manual_seed(seed + 1)
    teacher = TorchMoE(d_model, d_ff, num_experts, top_k=1, dropless=True)
    torch.manual_seed(seed)
    student = TorchMoE(d_model, d_ff, num_experts, top_k=1, dropless=True)
    hot = student.router_weight.detach()[0] + student.router_weight.detach()[1]
    shapes = [(d_model, d_ff), (d_ff,), (d_ff, d_model), (d_model,)]
    sync = ExpertGradSync(shapes, num_experts, mode=mode, ratio=ratio, rank=rank, seed=seed)
    gen = torch.Generator().manual_seed(seed + 100 + me)
    egen = torch.Generator().manual_seed(seed + 7)
    x_eval = _skewed_tokens(egen, 256, d_model, hot, skew)
    with torch.no_grad():
        y_eval = teacher(x_eval)
    out: dict[str, Any] = {"loss": [], "bytes": [], "measured": [], "active": [], "router_bytes": 0}
    for _ in range(steps):
        x = _skewed_tokens(gen, tokens_per_rank, d_model, hot, skew)
        with torch.no_grad():
            y = teacher(x)
        student.zero_grad()
        torch.nn.functional.mse_loss(student(x), y).backward()
        with traffic_meter() as tm:
            avg = sync.sync(expert_grad_rows(student))
        rg = student.router_weight.grad
        out["router_bytes"] += dense_allreduce_(rg)
        set_expert_grads(student, avg)
        with torch.no_grad():
            for prm in student.parameters():
                prm -= lr * prm.grad
            out["loss"].append(float(torch.nn.functional.mse_loss(student(x_eval), y_eval)))
        out["bytes"].append(sync.last["bytes"])
        out["measured"].append(tm["p2p_bytes"])
        out["active"].append(sync.last["active"])
    out["dense_bytes_per_step"] = sync.last["dense_bytes"]
    out["param_digest"] = float(sum(float(p.detach().double().sum()) for p in student.parameters()))
    return out


def sync_check_worker(
    mode: str, steps: int = 3, seed: int = 0, num_experts: int = 6, ratio: float = 0.1, rank: int = 2
) -> dict[str, Any]:
    """Inside ``tl.dist.launch``: ``steps`` syncs of seeded per-rank rows for a d=4, f=6 expert layout in which
    experts 1 and 4 are idle on every rank and expert 2 on rank 0 only. Returns the inputs, outputs, final residual
    and bytes (computed and measured) so the caller can check them against the dense mean."""
    from ..parallel.bench_longctx import traffic_meter

    me = dist.get_rank()
    shapes = [(4, 6), (6,), (6, 4), (4,)]
    sync = ExpertGradSync(shapes, num_experts, mode=mode, ratio=ratio, rank=rank, seed=seed)
    gen = torch.Generator().manual_seed(seed + 31 * me)
    out: dict[str, Any] = {"rows": [], "out": [], "bytes": [], "measured": [], "active": []}
    for _ in range(steps):
        rows = torch.randn(num_experts, sync.numel, generator=gen)
        rows[[1, 4]] = 0
        if me == 0:
            rows[2] = 0
        with traffic_meter() as tm:
            avg = sync.sync(rows)
        out["rows"].append(rows.numpy())
        out["out"].append(avg.numpy())
        out["bytes"].append(sync.last["bytes"])
        out["measured"].append(tm["p2p_bytes"])
        out["active"].append(sync.last["active"])
    out["residual"] = sync.residual.numpy()
    out["dense_bytes"] = _ring_bytes(num_experts * sync.numel, dist.get_world_size())
    return out


def compare_worker(modes: list[str], kwargs: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Inside ``tl.dist.launch``: ``train_worker(mode, **kwargs)`` for every mode, in one launch."""
    return {m: train_worker(m, **(kwargs or {})) for m in modes}
