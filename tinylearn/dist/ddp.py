"""Data-parallel training helpers: gradient bucketing, one all-reduce per bucket, optional overlap with backward.

Equivalence: with the global batch B split over p ranks and each rank's loss = (sum of its per-example losses)/B,
the sum over ranks of the local gradients is exactly the gradient of the global-batch mean loss, so p-rank
training with the same initial weights follows the single-process trajectory (up to fp32 summation order).

Buckets (like torch DDP): parameters are taken in *reverse* registration order (gradients of the last layers are
ready first in backward) and packed greedily into buckets of at most ``cap_bytes`` (a parameter larger than the
cap gets a bucket of its own). With ``overlap=True`` a post-accumulate-grad hook marks parameters ready; when a
bucket is complete (and all earlier buckets were launched — every rank launches in the same order) it is
flattened and handed to a communication thread, so its all-reduce runs while backward computes earlier layers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .collectives import ALGORITHMS, OPS, all_reduce, broadcast, check_params_across_ranks
from .compression import Int8, TopK, compressed_all_reduce, dense_ring_bytes


def assign_buckets(param_nbytes: Sequence[int], cap_bytes: int) -> list[list[int]]:
    """Bucket parameter indices in reverse order, each bucket <= ``cap_bytes`` unless one parameter exceeds it.

    >>> assign_buckets([10, 20, 30, 40], 50)
    [[3], [2, 1], [0]]
    """
    if cap_bytes <= 0:
        raise ValueError(f"cap_bytes: expected > 0, got {cap_bytes}")
    buckets: list[list[int]] = []
    cur: list[int] = []
    size = 0
    for i in reversed(range(len(param_nbytes))):
        nb = int(param_nbytes[i])
        if nb < 0:
            raise ValueError(f"param_nbytes: entry {i} is negative ({nb})")
        if cur and size + nb > cap_bytes:
            buckets.append(cur)
            cur, size = [], 0
        cur.append(i)
        size += nb
    if cur:
        buckets.append(cur)
    return buckets


class DataParallel:
    """Keep a model's gradients in sync across ranks: ``loss.backward(); dp.sync(); opt.step()``.

    algorithm: any ``all_reduce`` algorithm; compression: None | "topk" | "int8" (with error feedback,
    ``topk_ratio``); op: "sum" (loss already divided by the global batch) or "avg".
    """

    def __init__(
        self,
        model: torch.nn.Module,
        cap_bytes: int = 25 << 20,
        algorithm: str = "ring",
        overlap: bool = True,
        compression: str | None = None,
        topk_ratio: float = 0.05,
        op: str = "sum",
        group: Any = None,
    ) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.algorithm, self.overlap, self.op, self.group = algorithm, overlap, op, group
        self.world = dist.get_world_size(group) if dist.is_initialized() else 1
        self.buckets = assign_buckets([p.numel() * p.element_size() for p in self.params], cap_bytes)
        self.compressor: Any = None
        if compression == "topk":
            self.compressor = TopK(topk_ratio)
        elif compression == "int8":
            self.compressor = Int8(seed=dist.get_rank() if dist.is_initialized() else 0)
        elif compression is not None:
            raise ValueError(f"compression: expected None, 'topk' or 'int8', got {compression!r}")
        sizes = [sum(self.params[i].numel() for i in b) for b in self.buckets]
        self.residuals = [torch.zeros(n) for n in sizes] if self.compressor else None
        self.bytes_sent = 0.0
        self.comm_s = 0.0
        if self.world > 1:  # same parameters and bucket layout everywhere, else the broadcasts below hang or abort
            codes = {None: 0, "topk": 1, "int8": 2}
            setup = [
                ("cap_bytes", int(cap_bytes)),
                ("algorithm", ALGORITHMS.index(algorithm) if algorithm in ALGORITHMS else -1),
                ("overlap", int(bool(overlap))),
                ("compression", codes[compression]),
                ("op", OPS.index(op) if op in OPS else -1),
            ]
            check_params_across_ranks("DataParallel", self.params, group, setup)
        if self.world > 1:  # identical starting point on every rank
            for p in self.params:
                broadcast(p.data, src=0, group=group)
        self._bucket_of = {id(p): bi for bi, b in enumerate(self.buckets) for i in b for p in [self.params[i]]}
        self._ready: list[int] = [0] * len(self.buckets)
        self._next = 0
        self._futures: list[Future] = []
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tl-dp-comm") if overlap else None
        if overlap:
            for p in self.params:
                p.register_post_accumulate_grad_hook(self._hook)

    # -------------------------------------------------------------------------------------------- internals
    def _hook(self, p: torch.Tensor) -> None:
        bi = self._bucket_of[id(p)]
        self._ready[bi] += 1
        while self._next < len(self.buckets) and self._ready[self._next] == len(self.buckets[self._next]):
            flat = self._flatten(self._next)
            self._futures.append(self._pool.submit(self._reduce, self._next, flat))
            self._next += 1

    def _flatten(self, bi: int) -> torch.Tensor:
        return torch.cat([self.params[i].grad.reshape(-1) for i in self.buckets[bi]])

    def _reduce(self, bi: int, flat: torch.Tensor) -> tuple[int, torch.Tensor]:
        t0 = time.perf_counter()
        if self.world > 1:
            if self.compressor is None:
                all_reduce(flat, op=self.op, algorithm=self.algorithm, group=self.group)
                self.bytes_sent += dense_ring_bytes(flat.numel(), self.world, flat.element_size())
            else:
                self.bytes_sent += compressed_all_reduce(
                    flat,
                    self.compressor,
                    self.residuals[bi],
                    op=self.op,
                    group=self.group,
                )
        self.comm_s += time.perf_counter() - t0
        return bi, flat

    def _unflatten(self, bi: int, flat: torch.Tensor) -> None:
        off = 0
        for i in self.buckets[bi]:
            g = self.params[i].grad
            g.copy_(flat[off : off + g.numel()].view_as(g))
            off += g.numel()

    # ----------------------------------------------------------------------------------------------- public
    def sync(self) -> None:
        """Finish the all-reduce of every bucket and write the reduced gradients back (call after backward)."""
        if self.overlap:
            if self._next != len(self.buckets):
                raise RuntimeError(
                    f"sync: only {self._next}/{len(self.buckets)} buckets became ready; every "
                    "parameter must receive a gradient in each backward"
                )
            for f in self._futures:
                self._unflatten(*f.result())
            self._futures, self._ready, self._next = [], [0] * len(self.buckets), 0
        else:
            for bi in range(len(self.buckets)):
                self._unflatten(*self._reduce(bi, self._flatten(bi)))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)


# ------------------------------------------------------------------------------------- the digits experiment
def digits_data() -> tuple[torch.Tensor, torch.Tensor]:
    """sklearn's 8x8 digits as (X float32 [1797, 64] in [0, 1], y int64)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return torch.tensor(d.data / 16.0, dtype=torch.float32), torch.tensor(d.target, dtype=torch.int64)


def digits_model(seed: int = 0, hidden: int = 128) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(64, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, 10),
    )


def train_digits(
    steps: int = 60,
    global_batch: int = 96,
    lr: float = 0.05,
    algorithm: str = "ring",
    cap_bytes: int = 16 << 10,
    overlap: bool = True,
    compression: str | None = None,
    topk_ratio: float = 0.05,
    seed: int = 0,
    hidden: int = 128,
    data: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> dict[str, Any]:
    """Train the digits MLP (SGD, momentum 0.9) with the global batch split over the ranks of the current group;
    without an initialised process group it is the single-process reference. Returns per-step global losses,
    bytes sent by this rank, time in communication and in total, bucket layout and final train accuracy.
    ``data`` = (X, y) avoids importing sklearn in every rank (pass ``digits_data()`` from the parent)."""
    X, y = data if data is not None else digits_data()
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    model = digits_model(seed, hidden)
    dp = DataParallel(
        model, cap_bytes=cap_bytes, algorithm=algorithm, overlap=overlap, compression=compression, topk_ratio=topk_ratio
    )
    params = list(model.parameters())
    for p in params:  # gradients exist from the start, so zeroing keeps the same tensors (hooks stay valid)
        p.grad = torch.zeros_like(p)
    momentum = [torch.zeros_like(p) for p in params]
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(X))
    lo, hi = (global_batch * rank) // world, (global_batch * (rank + 1)) // world
    losses = []
    t0 = time.perf_counter()
    pos = 0
    for _ in range(steps):
        if pos + global_batch > len(order):
            order, pos = rng.permutation(len(X)), 0
        idx = torch.from_numpy(order[pos + lo : pos + hi])
        pos += global_batch
        for p in params:
            p.grad.zero_()
        loss_sum = torch.nn.functional.cross_entropy(model(X[idx]), y[idx], reduction="sum")
        (loss_sum / global_batch).backward()
        dp.sync()
        with torch.no_grad():  # SGD with momentum 0.9 (torch.optim.SGD's update; avoids importing torch._dynamo)
            for p, buf in zip(params, momentum):
                buf.mul_(0.9).add_(p.grad)
                p.sub_(lr * buf)
        total = loss_sum.detach().reshape(1).double()
        if world > 1:
            dist.all_reduce(total)
        losses.append(float(total) / global_batch)
    elapsed = time.perf_counter() - t0
    dp.close()
    with torch.no_grad():
        acc = float((model(X).argmax(1) == y).float().mean())
    return {
        "losses": losses,
        "bytes_sent": dp.bytes_sent,
        "comm_s": dp.comm_s,
        "total_s": elapsed,
        "buckets": dp.buckets,
        "accuracy": acc,
        "rank": rank,
    }
