"""The process one job of the real cluster runs in: ``python -m tinylearn.sched.worker SPEC_JSON``.

Mechanism (the same protocol a cluster agent such as Slurm's slurmstepd or a Kubernetes kubelet speaks with its
workload, reduced to a pipe): the worker pins itself to the cores it was given (``os.sched_setaffinity``; the
parent also sets OMP/MKL/OpenBLAS threads = cores), runs ``steps`` steps of its workload, and at every step
boundary writes one JSON line on stdout (``{"ev": "step", "step": k, "dt": seconds}``) and reads the control
lines waiting on stdin (never blocking while it has work):

    pause            block at the boundary until "resume" (a suspended job holds no core; "resume" carries the
                     cores it runs on next, possibly other ones) -- suspend/resume preemption
    stop             write a checkpoint (step counter + RNG state + model/workload state) and exit 0 --
                     checkpoint-based preemption; a worker started with ``resume=True`` continues from it and ends
                     with bit-for-bit the same final state as an uninterrupted run (the step's randomness comes
                     from the saved generator state, the math is single-threaded and deterministic)

The checkpoint is an ``np.savez`` archive written with ``tinylearn.resilience.atomic_write`` (temp file + fsync +
``os.replace``: a crash mid-write leaves the previous checkpoint intact). At the end the worker writes its final
state to ``result`` and reports its SHA-256 (``{"ev": "done", "digest": ...}``); an exception is reported as
``{"ev": "error", "msg": ...}`` with exit code 1. Waits on stdin are bounded (1 s polls); EOF on stdin (the
parent is gone) ends the worker.

Workloads: "matmul" (a chain of fp32 ``size`` x ``size`` numpy matmuls, each clipped to [-1, 1], and seeded noise, ~5-20
ms a step), "cnn" (one SGD training step of ``tinylearn.nn.models.DigitsCNN`` on a seeded minibatch of the 8x8 digits;
the digits come from ``spec["data"]``, an .npz the cluster writes once, else ``tinylearn.data.datasets.load_digits``),
"gpt" (one SGD step of a 1-layer ``tinylearn.inference.model.TinyGPT``, d_model 32, on seeded next-token counting
sequences, ~2 ms), "sleep" (``sleep_s`` per step, holds its core idle), "crash" (raises at step 2), "hang" (blocks
forever at step 2: the cluster's step timeout kills it).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import select
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..resilience.atomic import atomic_write

GPT_VOCAB, GPT_SEQ = 64, 16  # the "gpt" workload's TinyGPT: vocabulary and context length
MATMUL_CHAIN = 160  # matmuls per "matmul" step (size 128: ~5-20 ms on one core)


class _Control:
    """Line-buffered non-blocking reader of the control pipe (stdin)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buf, self.eof = fd, b"", False

    def poll(self, timeout: float) -> list[str]:
        if self.eof:
            return ["stop-eof"]
        r, _, _ = select.select([self.fd], [], [], timeout)
        if r:
            chunk = os.read(self.fd, 65536)
            if not chunk:
                self.eof = True
            self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        out = [ln.decode().strip() for ln in lines if ln.strip()]
        return out + (["stop-eof"] if self.eof else [])


def send(msg: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def pin(cores: Sequence[int]) -> None:
    """Pin this process to ``cores`` (no-op where the OS has no affinity call)."""
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(int(c) for c in cores))


class Workload:
    """State + one step; ``state()``/``load()`` are what a checkpoint holds besides the step counter and RNG."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.rng = np.random.default_rng(int(spec.get("seed", 0)))
        self.kind = spec["workload"]
        n = int(spec.get("size", 128))
        if self.kind == "matmul":
            init = np.random.default_rng(int(spec.get("seed", 0)) + 1)
            self.w = (init.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)
            self.x = init.standard_normal((n, n)).astype(np.float32)
        elif self.kind == "cnn":
            from ..autograd import manual_seed
            from ..autograd.tensor import Tensor
            from ..data.datasets import load_digits
            from ..nn.functional_loss import cross_entropy
            from ..nn.models import DigitsCNN
            from ..optim.sgd import SGD

            manual_seed(int(spec.get("seed", 0)))
            if spec.get("data"):  # the cluster's copy of the digits (spares each worker sklearn's import)
                with np.load(spec["data"]) as z:
                    self.X, self.y = z["X"], z["y"]
            else:
                self.X, self.y = load_digits()
            self.model = DigitsCNN(c1=8, c2=16)
            self.opt = SGD(self.model.parameters(), lr=0.05)
            self.tensor, self.loss = Tensor, cross_entropy
            self.batch = max(1, min(n, len(self.X)))
        elif self.kind == "gpt":
            from ..autograd import manual_seed
            from ..autograd.tensor import Tensor
            from ..inference.model import TinyGPT
            from ..nn.functional_loss import cross_entropy
            from ..optim.sgd import SGD

            manual_seed(int(spec.get("seed", 0)))
            self.model = TinyGPT(vocab_size=GPT_VOCAB, d_model=32, n_heads=2, n_layers=1, max_seq_len=GPT_SEQ)
            self.opt = SGD(self.model.parameters(), lr=0.1)
            self.tensor, self.loss = Tensor, cross_entropy
            self.batch = max(1, min(n, 64))

    def step(self, i: int) -> None:
        if self.kind == "matmul":
            x = self.x
            # clip bounds the chain at the same cost on every numpy SIMD path: tanh's fallback without AVX2 is ~50x
            # slower (151 vs 2.9 us for 128x128), which made a step 12x longer on the forced scalar path
            for _ in range(MATMUL_CHAIN):
                x = np.clip(x @ self.w, -1.0, 1.0)
            self.x = (x + np.float32(1e-3) * self.rng.standard_normal(x.shape, dtype=np.float32)).astype(np.float32)
        elif self.kind == "cnn":
            idx = self.rng.choice(len(self.X), size=self.batch, replace=False)
            out = self.model(self.tensor(self.X[idx]))
            loss = self.loss(out, self.tensor(self.y[idx]))
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
        elif self.kind == "gpt":  # next-token prediction on seeded counting sequences (a learnable toy task)
            ids = (self.rng.integers(0, GPT_VOCAB, (self.batch, 1)) + np.arange(GPT_SEQ + 1)) % GPT_VOCAB
            logits = self.model(ids[:, :-1])
            loss = self.loss(logits.reshape(-1, GPT_VOCAB), self.tensor(ids[:, 1:].reshape(-1)))
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
        elif self.kind == "sleep":
            time.sleep(float(self.spec.get("sleep_s", 0.02)))
        elif self.kind == "crash":
            if i + 1 == 2:
                raise RuntimeError(f"workload 'crash' raised at step {i + 1} (on purpose)")
            time.sleep(0.005)
        elif self.kind == "hang":
            if i + 1 == 2:
                while True:  # blocks forever; the cluster's step timeout SIGKILLs it
                    time.sleep(3600)
            time.sleep(0.005)
        else:
            raise ValueError(f"workload: the real cluster does not run {self.kind!r}")

    def state(self) -> dict[str, np.ndarray]:
        if self.kind == "matmul":
            return {"x": self.x}
        if self.kind in ("cnn", "gpt"):
            return {f"m.{k}": np.asarray(v.data) for k, v in self.model.state_dict().items()}
        return {}

    def load(self, arrays: dict[str, np.ndarray]) -> None:
        if self.kind == "matmul":
            self.x = arrays["x"]
        elif self.kind in ("cnn", "gpt"):
            self.model.load_state_dict({k[2:]: v for k, v in arrays.items() if k.startswith("m.")})


def _pack(step: int, wl: Workload) -> bytes:
    buf = io.BytesIO()
    st = wl.state()
    np.savez(buf, __step=np.int64(step), __rng=np.array(json.dumps(wl.rng.bit_generator.state)), **st)
    return buf.getvalue()


def digest(arrays: dict[str, np.ndarray]) -> str:
    """SHA-256 over the names, dtypes, shapes and bytes of ``arrays`` (sorted by name): the bitwise identity."""
    h = hashlib.sha256()
    for k in sorted(arrays):
        a = np.ascontiguousarray(arrays[k])
        h.update(f"{k}|{a.dtype}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def load_checkpoint(path: str | os.PathLike[str]) -> tuple[int, dict[str, Any], dict[str, np.ndarray]]:
    """(step, RNG state, workload arrays) from a checkpoint written by a stopped worker."""
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    step = int(arrays.pop("__step"))
    rng = json.loads(str(arrays.pop("__rng")))
    return step, rng, arrays


def run(spec: dict[str, Any]) -> int:
    """The worker's main loop (see the module docstring); returns the exit code."""
    ctl = _Control(sys.stdin.fileno())
    pin(spec.get("cores", []))
    wl = Workload(spec)
    step = 0
    ckpt = spec.get("ckpt")
    if spec.get("resume") and ckpt and Path(ckpt).exists():
        step, rng_state, arrays = load_checkpoint(ckpt)
        wl.rng.bit_generator.state = rng_state
        wl.load(arrays)
    send({"ev": "ready", "step": step, "pid": os.getpid()})
    steps = int(spec["steps"])
    while step < steps:
        pending, paused = ctl.poll(0.0), False
        while pending or paused:  # control messages, in order; while paused: bounded polls until resume / stop
            if not pending:
                pending = ctl.poll(1.0)
                continue
            cmd = pending.pop(0)
            if cmd == "pause" and not paused:
                paused = True
                send({"ev": "paused", "step": step})
            elif cmd.startswith("resume") and paused:
                cores = json.loads(cmd.split(" ", 1)[1]) if " " in cmd else []
                pin(cores)
                paused = False
                send({"ev": "resumed", "step": step, "cores": cores})
            elif cmd.startswith("stop"):
                if ckpt:
                    atomic_write(ckpt, _pack(step, wl))
                send({"ev": "stopped", "step": step, "ckpt": ckpt})
                return 0
        t0 = time.perf_counter()
        wl.step(step)
        step += 1
        send({"ev": "step", "step": step, "dt": time.perf_counter() - t0})
    final = wl.state()
    if spec.get("result"):
        atomic_write(spec["result"], _pack(step, wl), fsync=False)
    send({"ev": "done", "step": step, "digest": digest(final)})
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m tinylearn.sched.worker SPEC_JSON", file=sys.stderr)
        return 2
    spec = json.loads(args[0])
    try:
        return run(spec)
    except Exception as e:  # reported to the cluster as the job's error text
        send({"ev": "error", "msg": f"{type(e).__name__}: {e}"})
        return 1


if __name__ == "__main__":
    sys.exit(main())
