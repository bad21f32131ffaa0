"""``tinylearn bench amp``: one training step in fp32 vs autocast bfloat16, tinylearn vs torch vs tinygrad.

Rows per model (digits-shaped input [B, 1, 8, 8]; SGD step included for tinylearn and torch):

    tinylearn fp32 / tinylearn autocast bf16   tl.autocast; peak MB = tl.memory.measure_peak of the whole step
                                               (every numpy allocation through a pooled C++ caching allocator)
    torch fp32 / torch autocast bf16           torch.autocast("cpu", dtype=torch.bfloat16); torch's CPU
                                               allocator has no peak counter, so its memory column is the bytes
                                               saved for backward (torch.autograd.graph.saved_tensors_hooks)
    tinygrad float32 / half / bfloat16         forward + backward with the model cast to that dtype (tinygrad
                                               has no autocast), DEV=CPU, TinyJit; n/a rows name the error where
                                               a dtype does not run on its CPU backend

``saved MB`` (tinylearn) is tl.memory.estimate's activation count for the same step. tinylearn's bf16 GEMM is the
C++ packed kernel widening bf16 to fp32 in its packing (``amp.bf16_matmul``; ``gemm_table`` climbs its ladder), so a
bf16 step costs about what an fp32 one does on a CPU without AVX512-BF16/AMX (torch's bf16 is much slower there):
the win of bf16 on such CPUs is memory, not time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np

from ..bench import Comparison, Table, tinygrad_jit


def _tl_model(kind: str, width: int) -> Any:
    from ..nn.models import DigitsCNN, DigitsMLP

    return DigitsMLP((width, width)) if kind == "mlp" else DigitsCNN(width // 16, width // 8)


def _tl_step(kind: str, width: int, batch: int, amp: str | None) -> Callable[[], Any]:
    from .. import autograd, nn, optim
    from .autocast_mode import autocast

    autograd.manual_seed(0)
    model = _tl_model(kind, width)
    opt = optim.SGD(model.parameters(), lr=0.01)
    X = autograd.randn(batch, 1, 8, 8)
    y = autograd.Tensor(np.arange(batch) % 10)

    def step() -> Any:
        opt.zero_grad()
        with autocast(amp) if amp else contextlib.nullcontext():
            loss = nn.functional.cross_entropy(model(X), y)
        loss.backward()
        opt.step()
        return loss

    return step


def _torch_model(kind: str, width: int) -> Any:
    import torch

    nn = torch.nn
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                             nn.Linear(width, 10))  # fmt: skip
    c1, c2 = width // 16, width // 8
    return nn.Sequential(
        nn.Conv2d(1, c1, 3, padding=1), nn.BatchNorm2d(c1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 3, padding=1), nn.BatchNorm2d(c2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(c2 * 4, 10),
    )  # fmt: skip


def _torch_step(kind: str, width: int, batch: int, amp: bool) -> tuple[Callable[[], Any], Callable[[], int]]:
    import torch

    torch.manual_seed(0)
    model = _torch_model(kind, width)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    X = torch.randn(batch, 1, 8, 8)
    y = torch.arange(batch) % 10

    def loss_fn() -> Any:
        with torch.autocast("cpu", dtype=torch.bfloat16) if amp else contextlib.nullcontext():
            return torch.nn.functional.cross_entropy(model(X), y)

    def step() -> Any:
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        opt.step()
        return loss

    def saved_bytes() -> int:
        seen: dict[int, int] = {}

        def pack(t: Any) -> Any:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss_fn()
        return sum(seen.values())

    return step, saved_bytes


@contextlib.contextmanager
def _quiet_stderr() -> Any:
    """Silence file descriptor 2 (compiler subprocesses write there) for the block."""
    import os
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _tinygrad_build(kind: str, width: int, batch: int, dtype: str) -> Callable[[Any], Callable[[], Any]]:
    def build(tg: Any) -> Callable[[], Any]:
        try:
            with _quiet_stderr():  # clang prints every rejected line of a kernel it cannot compile
                return _tinygrad_step(tg, kind, width, batch, dtype)
        except Exception as e:
            first = str(e).splitlines()[0][:80] if str(e) else type(e).__name__
            if "clang" in str(e) or "bf16" in str(e).lower():
                first = "clang rejects __bf16 for this CPU target"
            raise RuntimeError(f"tinygrad {dtype} on CPU: {first}") from None

    return build


def _tinygrad_step(tg: Any, kind: str, width: int, batch: int, dtype: str) -> Callable[[], Any]:
    dt = getattr(tg.dtypes, dtype)
    rng = np.random.default_rng(0)
    if kind == "mlp":
        shapes = [(64, width), (width, width), (width, 10)]
        ws = [tg.Tensor(rng.standard_normal(s).astype(np.float32) * 0.05).cast(dt).realize() for s in shapes]
        for w in ws:
            w.requires_grad = True
        x = tg.Tensor(rng.standard_normal((batch, 64)).astype(np.float32)).cast(dt).realize()
        y = tg.Tensor(np.arange(batch) % 10)

        def f(x: Any) -> Any:
            h = x
            for i, w in enumerate(ws):
                h = h @ w
                if i < len(ws) - 1:
                    h = h.relu()
            loss = h.float().sparse_categorical_crossentropy(y)
            loss.backward()
            return loss.realize(), *[w.grad.realize() for w in ws]

    else:
        c1, c2 = width // 16, width // 8
        w1 = tg.Tensor(rng.standard_normal((c1, 1, 3, 3)).astype(np.float32) * 0.1).cast(dt).realize()
        w2 = tg.Tensor(rng.standard_normal((c2, c1, 3, 3)).astype(np.float32) * 0.1).cast(dt).realize()
        wf = tg.Tensor(rng.standard_normal((c2 * 4, 10)).astype(np.float32) * 0.1).cast(dt).realize()
        ws = [w1, w2, wf]
        for w in ws:
            w.requires_grad = True
        x = tg.Tensor(rng.standard_normal((batch, 1, 8, 8)).astype(np.float32)).cast(dt).realize()
        y = tg.Tensor(np.arange(batch) % 10)

        def f(x: Any) -> Any:
            h = x.conv2d(w1, padding=1).relu().max_pool2d(2)
            h = h.conv2d(w2, padding=1).relu().max_pool2d(2)
            loss = (h.flatten(1) @ wf).float().sparse_categorical_crossentropy(y)
            loss.backward()
            return loss.realize(), *[w.grad.realize() for w in ws]

    f(x)  # compile once outside the JIT: a dtype the CPU backend cannot compile fails here
    jf = tinygrad_jit(f)
    return lambda: jf(x)


def step_ratio(kind: str, width: int, batch: int, rounds: int = 15) -> float:
    """tinylearn's autocast-bf16 step time / its fp32 step time, the two steps timed **interleaved** (fp32, bf16,
    fp32, ... after two warm-up calls each) and compared on their fastest calls: load on a shared machine then hits
    both alike, where a table that times one step after the other can catch a burst on one of them only (a loaded
    CI box put notebook 11's bf16 row 1.5x over its fp32 row that way, and a quiet rerun at 1.2x)."""
    import time

    if kind not in ("mlp", "cnn"):
        raise ValueError(f"kind: expected 'mlp' or 'cnn', got {kind!r}")
    for name, v in (("width", width), ("batch", batch), ("rounds", rounds)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: expected a positive int, got {v!r}")
    steps = {"fp32": _tl_step(kind, width, batch, None), "bf16": _tl_step(kind, width, batch, "bfloat16")}
    best = {k: float("inf") for k in steps}
    for r in range(rounds + 2):
        for k in ("fp32", "bf16") if r % 2 else ("bf16", "fp32"):
            t0 = time.perf_counter()
            steps[k]()
            if r >= 2:  # two warm-up rounds
                best[k] = min(best[k], time.perf_counter() - t0)
    return best["bf16"] / best["fp32"]


def step_table(kind: str, width: int, batch: int, progress: Callable[[str], None] | None = None) -> Table:
    from ..memory import estimate, measure_peak

    cmp = Comparison(
        f"amp: {kind} training step (width {width}, batch {batch}), fp32 vs bf16 autocast", baseline="torch fp32",
        repeat=5, progress=progress,
    )  # fmt: skip
    name = f"{kind} w{width} b{batch}"
    with cmp.case(name) as case:
        for amp in (None, "bfloat16"):
            label = "tinylearn autocast bf16" if amp else "tinylearn fp32"
            step = _tl_step(kind, width, batch, amp)
            peak = measure_peak(lambda a=amp: _tl_step(kind, width, batch, a)())
            est = estimate(_tl_model(kind, width), (batch, 1, 8, 8), optimizer="sgd", amp=amp)
            row = case.add(label, step, saved_mb=round(est["activations"] / 2**20, 3))
            row.peak_mb = peak / 2**20
        for amp in (False, True):
            step, saved = _torch_step(kind, width, batch, amp)
            case.add("torch autocast bf16" if amp else "torch fp32", step, saved_mb=round(saved() / 2**20, 3))
        for dt in ("float32", "half", "bfloat16"):
            case.add_tinygrad(f"tinygrad {dt}", _tinygrad_build(kind, width, batch, dt), note="TinyJit, no optimizer")
    cmp.note("peak MB: tinylearn rows measured with tl.memory.measure_peak (model + step); saved MB: activations "
             "kept for backward (tinylearn: tl.memory.estimate graph walk; torch: saved_tensors_hooks)")  # fmt: skip
    return cmp.table


def checkpoint_table(
    n_layers: int = 32, width: int = 128, batch: int = 1024, segments: int = 8, repeat: int = 3
) -> Table:
    """One training step (forward + backward) of ``n_layers`` Linear/ReLU layers with and without activation
    checkpointing: ``tl.autograd.checkpoint_sequential`` vs ``torch.utils.checkpoint.checkpoint_sequential``
    (use_reentrant=True, so the segment inputs it keeps pass through saved_tensors_hooks). tinygrad has no
    activation-checkpointing API: its row says so."""
    import torch
    from torch.utils.checkpoint import checkpoint_sequential as torch_ckpt

    from .. import autograd, nn
    from ..memory import estimate, measure_peak

    def tl_net() -> Any:
        autograd.manual_seed(0)
        return nn.Sequential(*[m for _ in range(n_layers // 2) for m in (nn.Linear(width, width), nn.ReLU())])

    def tl_step(k: int) -> Callable[[], Any]:
        net, x = tl_net(), autograd.randn(batch, width)

        def step() -> Any:
            net.zero_grad()
            out = autograd.checkpoint_sequential(net, k, x) if k > 1 else net(x)
            out.sum().backward()

        return step

    def tl_fresh(k: int) -> Callable[[], Any]:
        return lambda: tl_step(k)()  # model creation inside: measure_peak sees the whole step

    torch.manual_seed(0)
    tnet = torch.nn.Sequential(
        *[m for _ in range(n_layers // 2) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())]
    )
    tx = torch.randn(batch, width, requires_grad=True)

    def torch_fwd(k: int) -> Any:
        return torch_ckpt(tnet, k, tx, use_reentrant=True) if k > 1 else tnet(tx)

    def torch_step(k: int) -> Callable[[], Any]:
        def step() -> Any:
            tnet.zero_grad()
            torch_fwd(k).sum().backward()

        return step

    def torch_saved(k: int) -> int:
        seen: dict[int, int] = {}

        def pack(t: Any) -> Any:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            torch_fwd(k)
        return sum(seen.values())

    cmp = Comparison(
        f"checkpoint: {n_layers} x Linear({width})/ReLU, batch {batch}, forward + backward", baseline="torch k=1",
        repeat=repeat,
    )  # fmt: skip
    with cmp.case(f"L{n_layers} w{width} b{batch}") as case:
        for k in (1, segments):
            est = estimate(tl_net(), (batch, width), optimizer="sgd", checkpoint_segments=k if k > 1 else None,
                           loss=lambda o: o.sum())  # fmt: skip
            row = case.add(f"tinylearn k={k}", tl_step(k), saved_mb=round(est["activations"] / 2**20, 3))
            row.peak_mb = measure_peak(tl_fresh(k)) / 2**20
        for k in (1, segments):
            case.add(f"torch k={k}", torch_step(k), saved_mb=round(torch_saved(k) / 2**20, 3))
        case.unavailable("tinygrad", "n/a: tinygrad has no activation checkpointing (no torch.utils.checkpoint)")
    cmp.note("k = segments (k=1: no checkpointing); peak MB: tl.memory.measure_peak (tinylearn only: torch's CPU "
             "allocator keeps no peak statistics); saved MB: activations kept for backward after the forward "
             "(tinylearn: tl.memory.estimate, incl. the rebuilt segment; torch: saved_tensors_hooks)")  # fmt: skip
    return cmp.table


def gemm_table(
    shapes: tuple[tuple[int, int, int], ...] = ((256, 512, 512),), progress: Callable[[str], None] | None = None
) -> Table:
    """The bf16 GEMM ladder (``amp.bf16_matmul``) at [M, K] @ [K, N]: numpy's ml_dtypes matmul, the registered numpy
    reference (widen to fp32, sgemm, round), C++ scalar (one thread, auto-vectorisation off), C++ SIMD (one thread,
    fp32 FMA on bf16 widened in the packing), C++ dpbf16 (one thread, AVX512_BF16 ``vdpbf16ps`` on bf16 pairs, where
    the CPU has it) and C++ parallel (every core, the registered default: dpbf16 where it runs, else widening),
    beside numpy fp32 sgemm, torch bf16 / fp32 mm and tinygrad bf16 (TinyJit). Each
    shape twice: B contiguous, and B the transposed view of a [N, K] weight (what ``Linear`` multiplies by).
    GFLOP/s = 2MNK / time; GB/s counts the bf16 operands read once and the bf16 result written once."""
    import torch

    from .. import backends
    from .bf16_ops import bf16_matmul
    from .dtypes import bfloat16

    title = "bf16 GEMM: C = A @ B, bf16 in and out, fp32 accumulation"
    cmp = Comparison(title, baseline="torch fp32", repeat=9, progress=progress)
    rng = np.random.default_rng(0)
    g = backends.load_C("gemm") if backends.C_available("gemm") else None
    for (m, k, n), transposed in ((sh, t) for sh in shapes for t in (False, True)):
        a = rng.standard_normal((m, k)).astype(bfloat16)
        b = rng.standard_normal((n, k) if transposed else (k, n)).astype(bfloat16)
        b = b.T if transposed else b
        a32, b32 = a.astype(np.float32), b.astype(np.float32)
        ta, tb = torch.from_numpy(a32).to(torch.bfloat16), torch.from_numpy(b32).to(torch.bfloat16)
        ta32, tb32 = torch.from_numpy(a32), torch.from_numpy(b32)

        def tg_build(tg: Any, a32: np.ndarray = a32, b32: np.ndarray = b32) -> Callable[[], Any]:
            try:
                with _quiet_stderr():  # clang prints every rejected line of a kernel it cannot compile
                    xa = tg.Tensor(a32).cast(tg.dtypes.bfloat16).realize()
                    xb = tg.Tensor(b32).cast(tg.dtypes.bfloat16).realize()
                    (xa @ xb).realize()  # compile once here: a dtype the CPU backend cannot compile fails now
            except Exception as e:
                bad = "bf16" in str(e).lower() or "clang" in str(e)
                why = "clang rejects __bf16 for this CPU target" if bad else type(e).__name__
                raise RuntimeError(f"tinygrad bfloat16 on CPU: {why}") from None
            run = tinygrad_jit(lambda x, y: x @ y)
            return lambda: run(xa, xb)

        case = f"{m}x{k}x{n}" + (", B = W.T (Linear)" if transposed else "")
        with cmp.case(case, flops=2.0 * m * n * k, nbytes=2.0 * (m * k + k * n + m * n)) as c:
            c.add("torch fp32", lambda ta32=ta32, tb32=tb32: ta32 @ tb32)
            c.add("torch bf16", lambda ta=ta, tb=tb: ta @ tb)
            c.add_tinygrad("tinygrad bf16", tg_build)
            c.add("numpy fp32 sgemm", lambda a32=a32, b32=b32: a32 @ b32, note="OpenBLAS")
            c.add("numpy ml_dtypes bf16", lambda a=a, b=b: a @ b, note="what autocast ran before the C++ GEMM")
            c.add("tinylearn numpy reference", lambda a=a, b=b: bf16_matmul(a, b, backend="numpy"),
                  note="widen, sgemm, round")  # fmt: skip
            if g is None:
                c.unavailable("tinylearn C++", "n/a: tinylearn._C is not built")
                continue
            ua, ub = a.view(np.uint16), b.view(np.uint16)
            c.add("tinylearn C++ scalar", lambda ua=ua, ub=ub: g.bf16_matmul(ua, ub, "bfloat16", "scalar", 1),
                  note="1 thread, no SIMD")  # fmt: skip
            c.add("tinylearn C++ SIMD", lambda ua=ua, ub=ub: g.bf16_matmul(ua, ub, "bfloat16", "auto", 1,
                  dot="widen"), note=f"1 thread, {g.isa()} fp32 FMA on widened bf16")  # fmt: skip
            if g.bf16_dot_path() == "dpbf16":
                c.add("tinylearn C++ dpbf16", lambda ua=ua, ub=ub: g.bf16_matmul(ua, ub, "bfloat16", "auto", 1,
                      dot="dpbf16"), note="1 thread, AVX512_BF16 vdpbf16ps")  # fmt: skip
            else:
                c.unavailable("tinylearn C++ dpbf16", "n/a: this CPU has no AVX512_BF16 (or it is masked)")
            c.add("tinylearn C++ parallel", lambda a=a, b=b: bf16_matmul(a, b, backend="cpp", version="parallel"),
                  note=f"the default: every core, {g.bf16_dot_path()}")  # fmt: skip
    cmp.note(f"torch threads: {torch.get_num_threads()}; torch's CPU bf16 GEMM is fast only with AVX512_BF16 / AMX")
    return cmp.table


def run(full: bool = False, progress: Callable[[str], None] | None = None) -> list[Table]:
    cases = [("mlp", 512, 256), ("cnn", 256, 128)]
    if full:
        cases += [("mlp", 2048, 1024), ("cnn", 512, 512)]
    return [gemm_table(progress=progress)] + [step_table(k, w, b, progress) for k, w, b in cases]


if __name__ == "__main__":  # pragma: no cover
    for t in run():
        print(t.to_text())
