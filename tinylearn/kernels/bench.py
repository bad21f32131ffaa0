"""``tinylearn bench kernels``: fused ops vs unfused numpy vs torch eager / torch.compile / tinygrad, and flash
attention vs naive attention vs torch SDPA with peak memory.

Rows per op case (float32, [rows, cols]): ``numpy unfused`` (tinylearn.kernels backend='numpy'), ``tinylearn
cpu`` (fused C++/OpenMP), ``torch`` (eager), ``torch.compile`` (Inductor's fused C++ kernel), ``tinygrad``
(TinyJit, DEV=CPU). The ``roofline ms`` column is the traffic model's prediction (tinylearn.kernels.traffic) from
this machine's measured STREAM bandwidth and SGEMM peak: unfused bytes for the numpy row, fused bytes for the
others. Attention rows ([1, H, N, 64]) add ``peak MB`` and the model's extra memory (``scratch MB``: the N x N
score + probability matrices for naive attention, O(N) + per-thread tiles for flash). ``peak MB`` is the growth of
the peak resident set (VmHWM, reset through /proc/self/clear_refs) over one call, measured in a worker subprocess
with glibc's mmap threshold pinned at 64 KiB so that every large buffer is mapped and unmapped: it sees numpy's and
torch's allocators alike (tracemalloc sees only Python/numpy allocations, so torch read ~0 MB with it). tinygrad's
TinyJit keeps its buffers allocated between calls, so its row reports the bytes it holds (``held MB``) instead.

``threads=n`` runs a table with BLAS / OpenMP / torch limited to ``n`` threads (``limited_threads``), and its
roofline from STREAM and SGEMM peak measured with the same ``n`` threads: on a loaded 2-core box, one thread per
library gives the steadiest numbers.

Attention runs causal and non-causal at N = 512, 1024 (``full=True``: also 2048, 4096); the ``ratio`` column of the
``tinylearn flash`` row is the issue-17 figure (time / torch SDPA's time). The ``attention fwd+bwd`` tables time a
training step of the layer: forward + backward of the C++ kernel (tiled rung, and the default blocked SIMD rungs)
against torch naive and SDPA through autograd.

Default sizes finish in about 1-2 minutes on 2 cores (after torch.compile's cache is warm; the very first
compile in a fresh environment can take a minute more); ``full=True`` adds larger shapes and N up to 4096.

Why one file (> 500 lines): one benchmark table per op plus the attention memory rows share the case list, the
timing columns and the worker-subprocess peak-RSS probe; it is the one module ``tinylearn bench kernels`` runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import backends
from .._threads import limited_threads as _limited_threads
from ..bench import Comparison, Table, tinygrad_jit
from ..bench.roofline import machine_roofs, ridge_point  # noqa: F401  (ridge_point: re-exported for notebook 05)
from . import cpu, ops, traffic


def limited_threads(n: int | None) -> contextlib.AbstractContextManager[None]:
    """Limit BLAS and OpenMP (threadpoolctl: numpy's BLAS, tinylearn._C's OpenMP) and torch to ``n`` threads inside
    the block; ``None`` leaves everything as it is (``tinylearn._threads.limited_threads`` with torch)."""
    return _limited_threads(n, torch=True)


OPS = ("softmax", "layer_norm", "bias_gelu")


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


def _inputs(op: str, rows: int, cols: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    if op == "softmax":
        return (x,)
    w = rng.standard_normal(cols, dtype=np.float32)
    if op == "bias_gelu":
        return (x, w)
    return (x, w, rng.standard_normal(cols, dtype=np.float32))


def tinylearn_fn(op: str, backend: str, arrays: tuple[np.ndarray, ...]) -> Callable[[], Any]:
    if op == "softmax":
        return lambda: ops.softmax(arrays[0], backend=backend)
    if op == "layer_norm":
        return lambda: ops.layer_norm(*arrays, backend=backend)
    return lambda: ops.bias_gelu(*arrays, backend=backend)


def torch_fn(op: str) -> Callable[..., Any]:
    import torch.nn.functional as F

    if op == "softmax":
        return lambda x: F.softmax(x, -1)
    if op == "layer_norm":
        return lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b)
    return lambda x, b: F.gelu(x + b)


def _tinygrad_build(op: str, arrays: tuple[np.ndarray, ...]) -> Callable[[Any], Callable[[], Any]]:
    def build(tg: Any) -> Callable[[], Any]:
        ts = [tg.Tensor(a).realize() for a in arrays]
        if op == "softmax":
            fn = tinygrad_jit(lambda x: x.softmax(-1))
        elif op == "layer_norm":
            fn = tinygrad_jit(lambda x, w, b: x.layernorm(axis=-1, eps=1e-5) * w + b)
        else:
            fn = tinygrad_jit(lambda x, b: (x + b).gelu())
        return lambda: fn(*ts)

    return build


def model(op: str, rows: int, cols: int) -> traffic.Traffic:
    return {
        "softmax": traffic.softmax_traffic,
        "layer_norm": traffic.layer_norm_traffic,
        "bias_gelu": traffic.bias_gelu_traffic,
    }[op](rows, cols)


def op_table(
    op: str,
    shapes: list[tuple[int, int]],
    progress: Callable[[str], None] | None = None,
    compile: bool = True,
    tinygrad: bool = True,
    threads: int | None = None,
) -> Table:
    """One Comparison table for ``op``; ``compile``/``tinygrad`` False skip those (slow to build) columns;
    ``threads``: limit every library to that many threads (and measure the roofs with as many)."""
    import torch

    if op not in OPS:
        raise ValueError(f"op: unknown op {op!r}; known: {list(OPS)}")
    peak, bw = machine_roofs() if threads is None else machine_roofs(threads)
    cmp = Comparison(f"{op} fp32 (rows x cols)", baseline="torch", progress=progress)
    with limited_threads(threads):
        for rows, cols in shapes:
            arrays = _inputs(op, rows, cols)
            tm = model(op, rows, cols)
            pred = traffic.predict(tm, peak, bw)
            targs = [torch.from_numpy(a) for a in arrays]
            with cmp.case(f"{rows}x{cols}", nbytes=tm.bytes_fused) as c:
                r = c.add("numpy unfused", tinylearn_fn(op, "numpy", arrays))
                r.extra["roofline ms"] = _sig(pred["unfused_s"] * 1e3)
                r = c.add("tinylearn cpu", tinylearn_fn(op, "cpu", arrays))
                r.extra["roofline ms"] = _sig(pred["fused_s"] * 1e3)
                f = torch_fn(op)
                r = c.add("torch", lambda f=f, targs=targs: f(*targs))
                r.extra["roofline ms"] = _sig(pred["fused_s"] * 1e3)
                if compile:
                    r = c.add_torch_compile("torch.compile", f, *targs)
                    r.extra["roofline ms"] = _sig(pred["fused_s"] * 1e3)
                if tinygrad:
                    note = "TinyJit; tanh-form GELU (tinygrad has no erf GELU)" if op == "bias_gelu" else "TinyJit"
                    r = c.add_tinygrad("tinygrad", _tinygrad_build(op, arrays), note=note)
                    if r.median_ms is not None:
                        r.extra["roofline ms"] = _sig(pred["fused_s"] * 1e3)
    cmp.note(
        f"roofline ms: traffic model with measured {bw:.1f} GB/s STREAM and {peak:.0f} GFLOP/s SGEMM peak"
        f"{'' if threads is None else f' ({threads} thread(s), like every row)'}; "
        "GB/s column = fused bytes (1 read + 1 write) / time"
    )
    return cmp.table


ATTENTION_IMPLS = ("numpy naive", "tinylearn flash", "torch naive", "torch sdpa")


def _attention_inputs(n: int, heads: int, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(n)
    q, k, v = (rng.standard_normal((1, heads, n, d), dtype=np.float32) for _ in range(3))
    return q, k, v


def _attention_fns(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> dict[str, Callable[[], Any]]:
    """The four non-tinygrad implementations of ATTENTION_IMPLS, as no-argument callables."""
    import torch
    import torch.nn.functional as F

    n, d = q.shape[-2], q.shape[-1]
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    mask = torch.ones(n, n, dtype=torch.bool).triu(1)

    def torch_naive() -> Any:
        s = (tq @ tk.transpose(-1, -2)) / d**0.5
        if causal:
            s = s.masked_fill(mask, float("-inf"))
        return torch.softmax(s, -1) @ tv

    return {
        "numpy naive": lambda: ops.flash_attention(q, k, v, causal, backend="numpy"),
        "tinylearn flash": lambda: ops.flash_attention(q, k, v, causal, backend="cpu"),
        "torch naive": torch_naive,
        "torch sdpa": lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal),
    }


def flash_scratch_mb(heads: int, n: int, d: int, threads: int = 2, block: int = 64) -> float:
    """Model of the blocked flash rungs' extra memory (MB): lse (heads x N) + per thread QT (d x block), scores
    (64 x block), acc (block x d) and m, l, alpha (3 x block) — linear in N."""
    return (heads * n + threads * (d * block + 64 * block + block * d + 3 * block)) * 4 / 2**20


SWEEP_IMPLS = (
    "numpy naive",
    "tinylearn tiled",
    "tinylearn blocked_simd",
    "tinylearn blocked_simd_omp",
    "torch sdpa math",
    "torch sdpa flash",
)


def _sweep_fns(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> dict[str, Callable[[], Any]]:
    """SWEEP_IMPLS as no-argument callables: every rung of the C++ kernel and torch SDPA with its math and its
    (CPU) flash backend forced; a backend that cannot run here is left out."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))

    def sdpa(backend: Any) -> Callable[[], Any]:
        def f() -> Any:
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)

        return f

    fns: dict[str, Callable[[], Any]] = {"numpy naive": lambda: ops.flash_attention(q, k, v, causal, backend="numpy")}
    for ver in cpu.ATTENTION_VERSIONS:
        fns[f"tinylearn {ver}"] = lambda ver=ver: ops.flash_attention(q, k, v, causal, backend="cpu", version=ver)
    for name, b in (("torch sdpa math", SDPBackend.MATH), ("torch sdpa flash", SDPBackend.FLASH_ATTENTION)):
        try:
            sdpa(b)()
        except RuntimeError:  # no kernel of that backend for these inputs on this build
            continue
        fns[name] = sdpa(b)
    return fns


def attention_sweep(
    ns: list[int],
    heads: int = 8,
    d: int = 64,
    causal: bool = False,
    threads: int | None = None,
    repeat: int = 3,
    tinygrad_max_n: int = 512,
    memory: bool = True,
) -> list[dict[str, Any]]:
    """Time (median ms) and peak RSS growth (MB) vs N for SWEEP_IMPLS plus tinygrad's SDPA (TinyJit; up to
    ``tinygrad_max_n``, with the MB its JIT holds instead of a peak), [1, heads, N, d] fp32: the notebook's
    flash-attention plot data. Rows: {"impl", "N", "ms", "peak_mb"} (peak_mb None when not measured)."""
    from ..bench import measure, tinygrad_status

    rss: dict[tuple[str, int], float] = {}
    if memory:
        try:
            rss = attention_peak_rss(ns, heads, d, causal, threads, sweep=True)
        except (RuntimeError, subprocess.TimeoutExpired):
            rss = {}
    rows: list[dict[str, Any]] = []
    with limited_threads(threads):
        for n in ns:
            q, k, v = _attention_inputs(n, heads, d)
            for name, fn in _sweep_fns(q, k, v, causal).items():
                t = measure(fn, warmup=1, repeat=repeat)
                rows.append({"impl": name, "N": n, "ms": t.median * 1e3, "peak_mb": rss.get((name, n))})
            if n <= tinygrad_max_n and tinygrad_status()[0]:
                from tinygrad.helpers import GlobalCounters

                from ..bench import import_tinygrad

                tg = import_tinygrad()
                a, b, c = (tg.Tensor(x).realize() for x in (q, k, v))
                before = GlobalCounters.mem_used
                fn = tinygrad_jit(lambda x, y, z: x.scaled_dot_product_attention(y, z, is_causal=causal))
                t = measure(lambda fn=fn, a=a, b=b, c=c: fn(a, b, c), warmup=2, repeat=repeat)
                held = (GlobalCounters.mem_used - before) / 2**20
                rows.append({"impl": "tinygrad", "N": n, "ms": t.median * 1e3, "peak_mb": held})
    return rows


ATTENTION_BWD_IMPLS = ("tinylearn tiled", "tinylearn flash", "torch naive", "torch sdpa")


def _attention_bwd_fns(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray, causal: bool
) -> dict[str, Callable[[], Any]]:
    """Forward + backward of ATTENTION_BWD_IMPLS as no-argument callables: the C++ kernel's tiled rung (forward and
    backward), its default blocked SIMD rungs (through tinylearn.kernels), torch naive and torch SDPA through
    autograd (gradients of q, k, v; each call recomputes the forward as training does)."""
    import torch
    import torch.nn.functional as F

    ck = backends.load_C("kernels")

    n, d = q.shape[-2], q.shape[-1]
    q3, k3, v3, do3 = (a.reshape((-1,) + a.shape[-2:]) for a in (q, k, v, do))
    tq, tk, tv = (torch.from_numpy(a).clone().requires_grad_() for a in (q, k, v))
    tdo = torch.from_numpy(do)
    mask = torch.ones(n, n, dtype=torch.bool).triu(1)

    def tiled() -> Any:
        o, lse = ck.flash_attention_forward(q3, k3, v3, causal, 64, "tiled")
        return ck.flash_attention_backward(q3, k3, v3, o, lse, do3, causal, 64, "tiled")

    def flash() -> Any:
        o, lse = ops.flash_attention(q, k, v, causal, backend="cpu", return_lse=True)
        return ops.flash_attention_backward(q, k, v, o, lse, do, causal, backend="cpu")

    def torch_autograd(f: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            for t in (tq, tk, tv):
                t.grad = None
            f().backward(tdo)
            return tq.grad, tk.grad, tv.grad

        return run

    def naive() -> Any:
        s = (tq @ tk.transpose(-1, -2)) / d**0.5
        if causal:
            s = s.masked_fill(mask, float("-inf"))
        return torch.softmax(s, -1) @ tv

    return {
        "tinylearn tiled": tiled,
        "tinylearn flash": flash,
        "torch naive": torch_autograd(naive),
        "torch sdpa": torch_autograd(lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)),
    }


def attention_backward_table(
    ns: list[int],
    heads: int = 8,
    d: int = 64,
    causal: bool = False,
    progress: Callable[[str], None] | None = None,
    threads: int | None = None,
) -> Table:
    """Forward + backward (training step of one attention layer) at each N, [1, heads, N, d] float32; ratio to torch
    SDPA's forward + autograd backward. The ``tinylearn flash`` row is the blocked SIMD forward + backward."""
    cmp = Comparison(
        f"attention fwd+bwd fp32 [1, {heads}, N, {d}]{' causal' if causal else ''}",
        baseline="torch sdpa",
        repeat=5,
        progress=progress,
    )
    with limited_threads(threads):
        for n in ns:
            q, k, v = _attention_inputs(n, heads, d)
            do = np.random.default_rng(n + 1).standard_normal(q.shape, dtype=np.float32)
            tm = traffic.attention_traffic(heads, n, d, causal=causal)
            with cmp.case(f"N={n}", flops=3.5 * tm.flops) as c:  # 2 forward + 5 backward GEMMs vs the forward's 2
                for name, fn in _attention_bwd_fns(q, k, v, do, causal).items():
                    c.add(name, fn)
    cmp.note("GFLOP/s counts 3.5x the forward's flops (7 N x N x D GEMMs: 2 forward, 5 backward, vs the forward's 2).")
    cmp.note(
        f"tinylearn flash: cpu rung {cpu.ATTENTION_VERSION} forward + blocked_simd_omp backward "
        f"({_k_bwd_path(d)} path); tinylearn tiled: the scalar-tiled rung both ways"
    )
    return cmp.table


def _k_bwd_path(d: int) -> str:
    ck = backends.load_C("kernels")

    return str(ck.flash_attention_backward_path(d, d))


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field} line")


def peak_rss_growth_mb(fn: Callable[[], Any], tries: int = 3) -> float:
    """MB by which one ``fn()`` call raises the peak resident set above the resident set before it (min of
    ``tries``). Resets the peak with ``5 > /proc/self/clear_refs`` (Linux >= 4.0); raises RuntimeError elsewhere.
    Freed memory that the allocator keeps resident is reused without growth: run it in a process with a small,
    fixed mmap threshold (``attention_peak_rss`` does)."""
    import gc

    best = float("inf")
    for _ in range(tries):
        gc.collect()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError as e:
            raise RuntimeError(f"cannot reset the peak RSS (/proc/self/clear_refs: {e})") from e
        base = _status_kb("VmRSS")
        out = fn()
        best = min(best, (_status_kb("VmHWM") - base) / 1024)
        del out
    return max(best, 0.0)


def _attention_rss_worker(
    ns: list[int], heads: int, d: int, causal: bool, threads: int | None, sweep: bool = False
) -> None:
    """Subprocess body of attention_peak_rss: prints {"impl|N": MB} as JSON."""
    out: dict[str, float] = {}
    with limited_threads(threads):
        for n in ns:
            fns = (_sweep_fns if sweep else _attention_fns)(*_attention_inputs(n, heads, d), causal)
            for name, fn in fns.items():
                fn()  # warm-up: lazy initialisation (thread pools, kernel caches) is not the op's working set
                out[f"{name}|{n}"] = peak_rss_growth_mb(fn)
    print(json.dumps(out))


def attention_peak_rss(
    ns: list[int],
    heads: int = 8,
    d: int = 64,
    causal: bool = False,
    threads: int | None = None,
    timeout: float = 300,
    sweep: bool = False,
) -> dict[tuple[str, int], float]:
    """Peak RSS growth (MB) of one call of each ATTENTION_IMPLS row (``sweep=True``: each SWEEP_IMPLS row) at each
    N, measured in a fresh subprocess with glibc's mmap threshold fixed at 64 KiB (large buffers are unmapped on
    free, never silently reused). Raises RuntimeError with the worker's error when it cannot run (no
    /proc/self/clear_refs, ...)."""
    code = (
        "from tinylearn.kernels.bench import _attention_rss_worker as w; "
        f"w({list(map(int, ns))!r}, {int(heads)}, {int(d)}, {bool(causal)}, {threads!r}, {bool(sweep)})"
    )
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0", MALLOC_TOP_PAD_="0")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        raise RuntimeError(f"attention_peak_rss: worker failed (rc {r.returncode}): {tail}")
    raw = json.loads(r.stdout.strip().splitlines()[-1])
    return {(k.split("|")[0], int(k.split("|")[1])): float(v) for k, v in raw.items()}


def _attention_case(
    cmp: Comparison, n: int, heads: int, d: int, causal: bool, tinygrad: bool, rss: dict[tuple[str, int], float] | None
) -> None:
    q, k, v = _attention_inputs(n, heads, d)
    tm = traffic.attention_traffic(heads, n, d, causal=causal)
    naive_mb = 2 * heads * n * n * 4 / 2**20
    flash_mb = flash_scratch_mb(heads, n, d)
    scratch: dict[str, Any] = {"numpy naive": round(naive_mb, 2), "tinylearn flash": round(flash_mb, 3)}
    scratch |= {"torch naive": round(naive_mb, 2), "torch sdpa": "flash/math kernel"}

    def tg_build(tg: Any) -> Callable[[], Any]:
        from tinygrad.helpers import GlobalCounters

        a, b, cc = (tg.Tensor(x).realize() for x in (q, k, v))
        before = GlobalCounters.mem_used
        fn = tinygrad_jit(lambda x, y, z: x.scaled_dot_product_attention(y, z, is_causal=causal))
        for _ in range(3):  # TinyJit captures on the 2nd call: its buffers are allocated after the 3rd
            fn(a, b, cc)
        held["MB"] = (GlobalCounters.mem_used - before) / 2**20
        return lambda: fn(a, b, cc)

    held: dict[str, float] = {}
    with cmp.case(f"N={n}", flops=tm.flops) as c:
        for name, fn in _attention_fns(q, k, v, causal).items():
            r = c.add(name, fn)
            r.extra["scratch MB"] = scratch[name]
            if rss is not None and r.median_ms is not None:
                r.peak_mb = rss.get((name, n))
        if tinygrad:
            r = c.add_tinygrad("tinygrad", tg_build)
            if "MB" in held:
                r.extra["held MB"] = round(held["MB"], 2)


def attention_table(
    ns: list[int],
    heads: int = 8,
    d: int = 64,
    causal: bool = False,
    progress: Callable[[str], None] | None = None,
    tinygrad: bool = True,
    threads: int | None = None,
    memory: bool = True,
) -> Table:
    """Naive vs flash vs torch attention at each sequence length in ``ns`` ([1, heads, N, d], float32).

    ``memory``: add the peak-RSS column (attention_peak_rss, one worker subprocess); when the worker cannot run
    the column is left out and a table note says why."""
    cmp = Comparison(
        f"attention fp32 [1, {heads}, N, {d}]{' causal' if causal else ''}",
        baseline="torch sdpa",
        repeat=5,
        progress=progress,
    )
    rss = None
    if memory:
        try:
            rss = attention_peak_rss(ns, heads, d, causal, threads)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            cmp.note(f"peak MB not measured: {e}")
    with limited_threads(threads):
        for n in ns:
            _attention_case(cmp, n, heads, d, causal, tinygrad, rss)
    if rss is not None:
        cmp.note(
            "peak MB: growth of the peak RSS over one call (worker subprocess, mmap threshold 64 KiB; sees numpy's "
            "and torch's allocators). held MB: buffers TinyJit keeps allocated between calls (GlobalCounters)."
        )
    cmp.note("GFLOP/s counts 4 N^2 D + 6 N^2 (halved when causal).")
    cmp.note(
        f"tinylearn flash: cpu rung {cpu.ATTENTION_VERSION} ({cpu.attention_path(d)} path, "
        f"{'causal: key tiles past each query block skipped; ' if causal else ''}ratio = time / torch sdpa's)"
    )
    return cmp.table


def traffic_points(shapes: list[tuple[int, int]], repeat: int = 5, threads: int | None = None) -> list[dict[str, Any]]:
    """Predicted vs measured ms for numpy-unfused and cpu-fused versions of each op (the notebook's plot data)."""
    from ..bench import measure

    peak, bw = machine_roofs() if threads is None else machine_roofs(threads)
    out = []
    with limited_threads(threads):
        for op in OPS:
            for rows, cols in shapes:
                arrays = _inputs(op, rows, cols)
                pred = traffic.predict(model(op, rows, cols), peak, bw)
                for backend, key in (("numpy", "unfused_s"), ("cpu", "fused_s")):
                    t = measure(tinylearn_fn(op, backend, arrays), warmup=2, repeat=repeat)
                    out.append(
                        {
                            "op": op,
                            "shape": f"{rows}x{cols}",
                            "backend": backend,
                            "predicted_ms": pred[key] * 1e3,
                            "measured_ms": t.median * 1e3,
                        }
                    )
    return out


def run(full: bool = False, progress: Callable[[str], None] | None = None) -> list[Table]:
    shapes = [(4096, 768), (1024, 4096)] + ([(16384, 768), (4096, 4096)] if full else [])
    tables = [op_table(op, shapes, progress) for op in OPS]
    ns = [512, 1024] + ([2048, 4096] if full else [])
    tables.append(attention_table(ns, progress=progress))
    tables.append(attention_table(ns, causal=True, progress=progress))
    tables.append(attention_backward_table(ns, progress=progress))
    tables.append(attention_backward_table(ns, causal=True, progress=progress))
    return tables


if __name__ == "__main__":  # pragma: no cover
    import time

    t0 = time.time()
    for t in run():
        print(t.to_text() if hasattr(t, "to_text") else t)
    print(f"total {time.time() - t0:.0f} s")
