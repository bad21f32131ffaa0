"""Measurements for asynchronous and incremental checkpoints, on real training loops (torch MLPs).

``bench_async`` times the training-loop stall per checkpoint: a cycle is a save, ``steps_between`` SGD steps, then
a wait for the rest of the write (the next save would wait for it: back-pressure). The modes -- no checkpoint, a
synchronous save (tinylearn ``save`` with ``synchronous=True``, ``torch.save``), an asynchronous one
(``AsyncCheckpointer`` with each writer: "tinylearn async" is the default writer, the process; "tinylearn async
(thread)"; torch DCP ``async_save``) -- are interleaved cycle by cycle, rotated each round, so load drift on a
shared box hits all of them alike. Stall = median time in the save call + the sum over step positions of the median
extra step time vs no checkpoint + the median wait for the rest of the write: the copy, any back-pressure, and the
slower steps while the writer competes for the CPU and the caches (crc32, the write, the fsyncs). Async hides the
fsync and disk latency, not CPU work: on a box whose cores are busy that competition is what is left.

Measured on the shared 2-core Zen 4 VM, 8 MiB state, 24 steps between saves, three runs at each load (median
stall in ms, and in ``save`` / slower steps / rest of the write for the async writers):

    load average (other jobs)     ~1.0                  1.3-1.7               2.7
    synchronous save              9.1                   21.5                  14.9
    writer process (default)      2.6 (0.62/1.7/0.20)   4.6 (0.65/3.5/0.37)   2.9 (0.62/2.1/0.12)
    writer thread                 1.8 (0.46/1.3/0.04)   3.4 (0.49/2.8/0.04)   10.1 (0.50/9.6/0.04)
    torch DCP async_save          4.2                   14.5                  11.9
    async/sync, process | thread  0.18-0.39 | 0.14-0.36 0.15-0.40 | 0.06-0.45 0.16-0.19 | 0.12-0.68

The bench's noise (+-2 ms) is as large as the 10 % goal (about 1-2 ms): the goal is met in some runs and not in
others; ``bench_async`` reports, never asserts. And the synchronous baseline itself is mostly this VM's page-cache
cost: a synchronous save written like the process writer's (copy to an aligned buffer, crc32, ``O_DIRECT``, the
same fsyncs) takes 5.4-5.6 ms, against which 10 % (0.55 ms) is about the copy alone. Where the
rest goes: the process writer's CPU per save is 2.7-4 ms (crc32 1.2 ms; the thread's 5-18 ms is mostly page-cache
first touch, see async_ckpt.py). Each part alone, run in a child process beside 24 training steps (24 x 10 rounds):
at load average ~1 they slowed the steps by -0.5..+0.5 ms in all (noise); at ~1.7, a 3 ms busy loop by 2.1 ms,
crc32 of 8 MiB by 0.9, an O_DIRECT write by 0.3, the write + fsync (ext4's journal commit) by 4.2, all by 5.1.
Even the synchronous save slows the steps after it by ~1 ms (its copies evict the weights from the caches), and
the copy in ``save`` is ~0.5 ms: the floor of any copy-then-write checkpoint here is ~1.5 ms.

``delta_bytes`` measures what a delta checkpoint writes for fine-tuning (a few layers train) vs Adam on every
layer; ``xor_activation_ratios`` the XOR-diff compression of real activations.
"""

from __future__ import annotations

import gc
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..bench.table import Row
from .async_ckpt import DEFAULT_WRITER, WRITERS, AsyncCheckpointer
from .incremental import DeltaCheckpointer, xor_ratio

# the row of each asynchronous writer: the default one (AsyncCheckpointer's ``writer``) is "tinylearn async"
ASYNC_ROWS = {w: "tinylearn async" if w == DEFAULT_WRITER else f"tinylearn async ({w})" for w in WRITERS}


def mlp(size_mb: float, width: int = 1024, seed: int = 0) -> Any:
    """A torch MLP of ``width``-wide Linear layers with about ``size_mb`` MiB of fp32 parameters."""
    import torch

    layers = max(2, round(size_mb * 2**20 / (4 * (width * width + width))))
    torch.manual_seed(seed)
    mods: list[torch.nn.Module] = []
    for i in range(layers):
        mods.append(torch.nn.Linear(width, width))
        if i < layers - 1:
            mods.append(torch.nn.ReLU())
    return torch.nn.Sequential(*mods)


def _trainer(model: Any, opt: Any, batch: int = 16, seed: int = 0) -> Callable[[], None]:
    import torch

    g = torch.Generator().manual_seed(seed)
    width = model[0].in_features
    x, y = torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()

    return step


def bench_async(
    size_mb: float = 16.0,
    *,
    steps_between: int = 12,
    repeat: int = 3,
    cycles: int = 3,
    root: str | os.PathLike[str] | None = None,
    fsync: bool = True,
    dcp: bool = True,
    writers: tuple[str, ...] = WRITERS,
) -> list[Row]:
    """Stall per checkpoint of a ~``size_mb`` MiB MLP's state: rows (case, impl, median_ms, note, extra).

    One untimed cycle per mode (the first save allocates: buffers, files, DCP's planner), then ``repeat * cycles``
    rounds, each running every mode's cycle once (the order rotated): a save, ``steps_between`` SGD steps and the
    wait for the rest of the write, each timed on its own. Stall of a mode = median time in the save call + the sum
    over step positions of (median step time in that mode - median step time with no checkpoint) + the median
    wait: the training loop's extra time per checkpoint, the writer's competition for the CPU included. Medians per
    step position keep a step hit by unrelated load on a busy box out of the estimate (a difference of whole-cycle
    times does not). ``writers``: the ``AsyncCheckpointer`` writers to measure (rows in ``ASYNC_ROWS``); extras of
    their rows: the median copy, back-pressure wait, write wall time and writer CPU time per save.
    """
    import torch

    if not writers or any(w not in WRITERS for w in writers) or len(set(writers)) != len(writers):
        raise ValueError(f"writers must be distinct names from {WRITERS}, got {writers!r}")
    for name, v in (("steps_between", steps_between), ("repeat", repeat), ("cycles", cycles)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tmp = tempfile.TemporaryDirectory(dir=root)
    base = Path(tmp.name)
    try:
        model = mlp(size_mb)
        opt = _SGD(list(model.parameters()), lr=1e-4)
        train = _trainer(model, opt)
        nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
        counter = iter(range(1, 1 << 30))

        def cycle(save: Callable[[int], None] | None) -> list[float]:
            """Times of [the save (0 without one), each step after it, the wait for the write to finish], in s."""
            t0 = time.perf_counter()
            if save is not None:
                save(next(counter))
            out = [time.perf_counter() - t0]
            for _ in range(steps_between):
                t0 = time.perf_counter()
                train()
                out.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            drain()  # the rest of the write: the next save would wait for it (back-pressure), so it counts
            out.append(time.perf_counter() - t0)
            return out

        def state() -> dict[str, Any]:
            return {k: v for k, v in model.state_dict().items()}

        sync_ck = AsyncCheckpointer(base / "sync", synchronous=True, full_every=1, fsync=fsync)
        async_cks = {  # the default writer is the "tinylearn async" row
            ASYNC_ROWS[w]: AsyncCheckpointer(base / f"async_{w}", max_pending=1, full_every=1, fsync=fsync, writer=w)
            for w in writers
        }

        def torch_save(step: int) -> None:
            f = base / f"torch_{step}.pt"
            with open(f, "wb") as fh:
                torch.save(state(), fh)
                fh.flush()
                if fsync:
                    os.fsync(fh.fileno())
            f.unlink()

        futures: list[Any] = []

        def dcp_save(step: int) -> None:
            import torch.distributed.checkpoint as tdcp

            while futures:
                futures.pop().result()  # back-pressure, as ours: one in flight
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                futures.append(tdcp.async_save(state(), checkpoint_id=str(base / f"dcp_{step}")))

        modes: list[tuple[str, Callable[[int], None] | None]] = [
            ("no checkpoint", None),
            ("torch", torch_save),
            ("tinylearn sync", lambda s: sync_ck.save(state(), s)),
        ]
        for name, ck in async_cks.items():
            modes.append((name, lambda s, ck=ck: ck.save(state(), s)))
        if dcp:
            modes.append(("torch DCP async_save", dcp_save))

        def drain() -> None:
            for ck in async_cks.values():
                ck.wait()
            while futures:
                futures.pop().result()

        samples: dict[str, list[list[float]]] = {name: [] for name, _ in modes}
        for _ in range(2):
            cycle(None)  # warm-up: allocator, autograd
        for _, save in modes:
            cycle(save)  # untimed: the first save of each mode allocates (buffers, files, DCP's planner)
        gc_was = gc.isenabled()
        gc.disable()
        try:
            for r in range(repeat * cycles):  # modes interleaved cycle by cycle, rotated: load drift hits all alike
                for name, save in modes[r % len(modes) :] + modes[: r % len(modes)]:
                    samples[name].append(cycle(save))
        finally:
            if gc_was:
                gc.enable()
        per_step = {name: np.median(np.array(v), axis=0) for name, v in samples.items()}  # [save, steps..., drain]
        base_steps = per_step["no checkpoint"][1 : steps_between + 1]
        med = {name: statistics.median(sum(c) for c in v) for name, v in samples.items()}
        note = f"save + {steps_between} SGD steps + the rest of the write"
        rows = [Row("train cycle", name, med[name] * 1e3, note=note) for name in med]
        observed = {name: statistics.median(s["stall_s"] for s in ck.stats) for name, ck in async_cks.items()}
        observed["tinylearn sync"] = statistics.median(s["stall_s"] for s in sync_ck.stats)
        for name in med:
            if name == "no checkpoint":
                continue
            in_save = float(per_step[name][0])
            after = float(np.sum(per_step[name][1 : steps_between + 1] - base_steps))
            tail = float(per_step[name][-1])
            stall = max(in_save + after + tail, 0.0)
            extra = {
                "state_mb": nbytes / 2**20,
                "observed_stall_ms": observed.get(name, float("nan")) * 1e3,
                "in_save_ms": in_save * 1e3,
                "steps_slowdown_ms": after * 1e3,
                "write_tail_ms": tail * 1e3,
            }
            if name in async_cks:
                st = async_cks[name].stats
                extra["write_ms"] = statistics.median(s["write_s"] for s in st) * 1e3
                extra["write_cpu_ms"] = statistics.median(s["write_cpu_s"] for s in st) * 1e3
                extra["copy_ms"] = statistics.median(s["copy_s"] for s in st) * 1e3
                extra["backpressure_wait_ms"] = statistics.median(s["wait_s"] for s in st) * 1e3
            rows.append(Row(f"stall per save ({nbytes / 2**20:.0f} MiB)", name, stall * 1e3, extra=extra))
        sync_ck.close()
        for ck in async_cks.values():
            ck.close()
        return rows
    finally:
        torch.set_num_threads(threads)
        tmp.cleanup()


def stall_ratio(rows: list[Row]) -> float:
    """async stall / sync stall (tinylearn's), from ``bench_async`` rows; the issue's goal is <= 0.10."""
    st = {r.impl: r.median_ms for r in rows if r.case.startswith("stall")}
    return st["tinylearn async"] / max(st["tinylearn sync"], 1e-9)


def delta_bytes(
    pattern: str, *, size_mb: float = 8.0, steps: int = 4, block_size: int = 256 * 1024, seed: int = 0
) -> dict[str, Any]:
    """Bytes a delta checkpoint writes per step on a real torch MLP.

    ``pattern``: "finetune" (SGD on the last layer only, the rest frozen), "adam" (Adam on every layer: parameters
    and both moments change everywhere). Returns full bytes, per-delta bytes and the fraction."""

    if pattern not in ("finetune", "adam"):
        raise ValueError(f"pattern must be 'finetune' or 'adam', got {pattern!r}")
    model = mlp(size_mb, width=512, seed=seed)
    if pattern == "finetune":
        for p in model[:-1].parameters():
            p.requires_grad_(False)
        opt: Any = _SGD(list(model[-1].parameters()), lr=1e-3)
    else:
        opt = _Adam(list(model.parameters()), lr=1e-4)
    train = _trainer(model, opt, seed=seed)
    train()  # the optimizer state exists from here on (Adam's moments)
    with tempfile.TemporaryDirectory() as d:
        ck = DeltaCheckpointer(d, block_size=block_size, full_every=1000, fsync=False)
        for step in range(steps + 1):
            sd = {"model": dict(model.state_dict()), "optim": _optim_tensors(opt)}
            ck.save(sd, step)
            train()
        full = ck.history[0]["bytes_written"]
        deltas = [h["bytes_written"] for h in ck.history[1:]]
    return {"pattern": pattern, "full_bytes": full, "delta_bytes": deltas, "fraction": float(np.mean(deltas)) / full}


class _SGD:
    """Plain SGD written out (in place, like torch.optim.SGD): torch.optim's optimizers import torch._dynamo on first
    use (zero_grad/step are wrapped to disable it) -- about 4 s of CPU on a box without a bytecode cache."""

    def __init__(self, params: list[Any], lr: float) -> None:
        self.params, self.lr = params, lr

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        import torch

        with torch.no_grad():
            for p in self.params:
                p.add_(p.grad, alpha=-self.lr)


class _Adam(_SGD):
    """Adam (Kingma & Ba, bias-corrected), written out for the same reason as ``_SGD``: the update and the state
    (two moments per weight, changing everywhere) are torch.optim.Adam's."""

    def __init__(
        self, params: list[Any], lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8
    ) -> None:
        import torch

        self.params, self.lr, self.betas, self.eps, self.t = params, lr, betas, eps, 0
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]

    def step(self) -> None:
        import torch

        self.t += 1
        b1, b2 = self.betas
        with torch.no_grad():
            for p, m, v in zip(self.params, self.m, self.v, strict=True):
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                denom = (v / (1 - b2**self.t)).sqrt_().add_(self.eps)
                p.addcdiv_(m, denom, value=-self.lr / (1 - b1**self.t))


def _optim_tensors(opt: Any) -> dict[str, Any]:
    """The optimizer's tensors as torch names them (plain SGD has none)."""
    if isinstance(opt, _Adam):
        return {
            **{f"{i}.exp_avg": m for i, m in enumerate(opt.m)},
            **{f"{i}.exp_avg_sq": v for i, v in enumerate(opt.v)},
        }
    return {}


def xor_activation_ratios(seed: int = 0, lr: float = 1e-3) -> dict[str, float]:
    """XOR-diff compression ratio (raw / stored) of a small MLP's hidden activations for one micro-batch: between
    two nearby optimizer steps (one SGD step of ``lr``), and against unrelated data (another micro-batch)."""
    import torch

    model = mlp(1.0, width=256, seed=seed)
    opt = _SGD(list(model.parameters()), lr=lr)
    g = torch.Generator().manual_seed(seed)
    xa, xb = torch.randn(64, 256, generator=g), torch.randn(64, 256, generator=g)

    def act(x: Any) -> np.ndarray:
        with torch.no_grad():
            return model[:2](x).numpy().copy()  # first Linear + ReLU: a pipeline stage's output

    a0 = act(xa)
    _trainer(model, opt, batch=64, seed=seed)()
    a1, other = act(xa), act(xb)
    return {
        "nearby": xor_ratio(a0, a1),
        "nearby_no_shuffle": xor_ratio(a0, a1, shuffle=False),
        "unrelated": xor_ratio(a0, other),
        "identical": xor_ratio(a0, a0),
    }


__all__ = ["bench_async", "delta_bytes", "mlp", "stall_ratio", "xor_activation_ratios"]
