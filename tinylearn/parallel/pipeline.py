"""PipelineParallel: one model stage per rank, microbatches driven by a schedule from ``pipeline_schedule``.

Rank i of ``group`` runs ``stage_module`` (its own layers). ``train_step(inputs, targets, loss_fn)`` splits the
batch into ``n_microbatches`` along dim 0 (stage 0 needs ``inputs``, the last stage ``targets`` and ``loss_fn``),
and executes this rank's op list: a forward receives the activation from the previous rank (blocking recv), runs
the stage and sends its output on (isend); a backward receives the output gradient from the next rank, back-
propagates ``loss_mb / m`` (last stage) or the received gradient, and sends the input gradient back. Gradients
accumulate in ``stage_module``'s parameters, exactly those of the single-process model on the full batch with a
mean loss (up to fp32 summation order over microbatches). Messages carry a small header (dtype, shape) so stages
may change the activation shape. ``events`` keeps (kind, mb, start_s, end_s) per op for a Gantt chart, times from
a barrier at the start of the step.

The constructor handshakes (schedule, n_microbatches, n_stages) over the group: ranks that disagree raise
ValueError naming each rank's schedule instead of deadlocking until the process-group timeout. A peer that dies
or hangs surfaces as a RuntimeError naming this stage, the peer rank, the message (activation/gradient of which
microbatch) and the cause (connection closed / timed out).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ..dist.collectives import check_same_across_ranks, peer_failure
from .schedules import pipeline_schedule

_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
_HDR = 10
_SCHEDULES = ("gpipe", "1f1b")


class PipelineParallel:
    def __init__(
        self, stage_module: torch.nn.Module, schedule: str = "1f1b", n_microbatches: int = 4, group: Any = None
    ) -> None:
        if not isinstance(stage_module, torch.nn.Module):
            raise TypeError(f"stage_module: expected a torch.nn.Module, got {type(stage_module).__name__}")
        if schedule not in ("gpipe", "1f1b"):
            raise ValueError(
                f"schedule: PipelineParallel runs one model chunk per rank, so 'gpipe' or '1f1b'; got {schedule!r} "
                "(interleaved_1f1b is available as data and in the simulator)"
            )
        if isinstance(n_microbatches, bool) or not isinstance(n_microbatches, int) or n_microbatches < 1:
            raise ValueError(f"n_microbatches: expected an int >= 1, got {n_microbatches!r}")
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("PipelineParallel needs torch.distributed: run inside tl.dist.launch(...) or torchrun")
        self.module, self.schedule_name, self.m, self.group = stage_module, schedule, n_microbatches, group
        self.n_stages, self.stage = dist.get_world_size(group), dist.get_rank(group)
        ranks = list(range(self.n_stages)) if group is None else dist.get_process_group_ranks(group)
        self.ranks = ranks
        # ranks running different schedules or microbatch counts would wait on each other's messages until the
        # process-group timeout: agree first (one small all-reduce), naming every rank's schedule on a mismatch
        check_same_across_ranks(
            "PipelineParallel",
            [("schedule", _SCHEDULES.index(schedule)), ("n_microbatches", n_microbatches), ("n_stages", self.n_stages)],
            group,
            lambda i, v: repr(_SCHEDULES[v]) if i == 0 and 0 <= v < len(_SCHEDULES) else str(v),
            count_first=False,
        )
        self.ops = pipeline_schedule(schedule, self.n_stages, n_microbatches)[self.stage]
        self.events: list[tuple[str, int, float, float]] = []
        self.peak_held = 0

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.n_stages - 1

    def _failed(self, what: str, e: BaseException) -> RuntimeError:
        return peer_failure(what, f"PipelineParallel stage {self.stage} (rank {self.ranks[self.stage]})", e)

    def _what(self, peer: int, tag: int, verb: str) -> str:
        kind = "activation" if tag < self.m else "gradient"
        return f"{verb} rank {self.ranks[peer]} (stage {peer}) of the {kind} of microbatch {tag % self.m}"

    def _send(self, t: torch.Tensor, peer: int, tag: int, works: list[Any]) -> None:
        t = t.detach().contiguous()
        hdr = torch.zeros(_HDR, dtype=torch.int64)
        hdr[0], hdr[1] = _DTYPES.index(t.dtype), t.dim()
        hdr[2 : 2 + t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
        what = self._what(peer, tag, "send to")
        try:
            # the tensors ride along in ``works``: alive until the sends completed
            works.append((dist.isend(hdr, self.ranks[peer], group=self.group, tag=2 * tag), what, hdr))
            works.append((dist.isend(t, self.ranks[peer], group=self.group, tag=2 * tag + 1), what, t))
        except RuntimeError as e:
            raise self._failed(what, e) from e

    def _recv(self, peer: int, tag: int) -> torch.Tensor:
        hdr = torch.empty(_HDR, dtype=torch.int64)
        try:
            dist.recv(hdr, self.ranks[peer], group=self.group, tag=2 * tag)
            shape = [int(x) for x in hdr[2 : 2 + int(hdr[1])]]
            out = torch.empty(shape, dtype=_DTYPES[int(hdr[0])])
            dist.recv(out, self.ranks[peer], group=self.group, tag=2 * tag + 1)
        except RuntimeError as e:
            raise self._failed(self._what(peer, tag, "receive from"), e) from e
        return out

    def train_step(
        self,
        inputs: torch.Tensor | None = None,
        targets: torch.Tensor | None = None,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """One forward+backward over all microbatches; returns the mean loss (same value on every rank)."""
        m = self.m
        if self.is_first:
            if not isinstance(inputs, torch.Tensor):
                raise TypeError(f"inputs: stage 0 needs a tensor batch, got {type(inputs).__name__}")
            if inputs.shape[0] % m:
                raise ValueError(f"inputs: batch of shape {tuple(inputs.shape)} not divisible into m={m} microbatches")
            xs = inputs.chunk(m)
        if self.is_last:
            if not isinstance(targets, torch.Tensor) or loss_fn is None:
                raise TypeError("targets/loss_fn: the last stage needs a target tensor and a loss function")
            if targets.shape[0] % m:
                raise ValueError(f"targets: batch {targets.shape[0]} not divisible by n_microbatches={m}")
            ys = targets.chunk(m)
        works: list[Any] = []
        held: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        loss_sum = torch.zeros(())
        self.events, self.peak_held = [], 0
        try:
            dist.barrier(group=self.group)
        except RuntimeError as e:
            others = ", ".join(f"rank {r}" for i, r in enumerate(self.ranks) if i != self.stage)
            raise self._failed(f"barrier at the start of train_step with {others}", e) from e
        t0 = time.perf_counter()
        for kind, mb in self.ops:
            start = time.perf_counter() - t0
            if kind == "F":
                if self.is_first:
                    x = xs[mb]
                else:
                    x = self._recv(self.stage - 1, mb)
                    start = time.perf_counter() - t0  # compute starts once the activation arrived
                    x.requires_grad_(x.dtype.is_floating_point)
                out = self.module(x)
                if self.is_last:
                    loss = loss_fn(out, ys[mb]) / m
                    loss_sum += loss.detach()
                    out = loss
                else:
                    self._send(out, self.stage + 1, mb, works)
                held[mb] = (x, out)
                self.peak_held = max(self.peak_held, len(held))
            else:
                x, out = held.pop(mb)
                if self.is_last:
                    out.backward()
                else:
                    g = self._recv(self.stage + 1, m + mb)
                    start = time.perf_counter() - t0
                    out.backward(g)
                if not self.is_first:
                    self._send(x.grad, self.stage - 1, m + mb, works)
            self.events.append((kind, mb, start, time.perf_counter() - t0))
        for w, what, _ in works:
            try:
                w.wait()
            except RuntimeError as e:
                raise self._failed(what, e) from e
        try:
            dist.broadcast(loss_sum, self.ranks[-1], group=self.group)
        except RuntimeError as e:
            raise self._failed(f"broadcast of the loss from rank {self.ranks[-1]} (last stage)", e) from e
        return loss_sum
