"""The attention rows of ``tinylearn bench kernels``: flash attention (the C++ kernel) vs naive attention vs torch
SDPA, forward (``attention_table``, with ``peak MB`` measured in a worker subprocess by ``attention_peak_rss``
and the model's ``scratch MB``), the SDPA-backend sweep (``attention_sweep``) and forward + backward
(``attention_backward_table``). The op tables, the traffic points and ``run()`` are in
``tinylearn.kernels.bench``, which re-exports every name here; the shared probes in ``tinylearn.kernels.bench_probes``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import backends
from ..bench import Comparison, Table, tinygrad_jit
from . import cpu, ops, traffic
from .bench_probes import limited_threads, peak_rss_growth_mb

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
        "from tinylearn.kernels.bench_attention import _attention_rss_worker as w; "
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
