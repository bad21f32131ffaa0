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

Layout: this module holds the op tables, the traffic points and ``run()``; the attention rows are in
``tinylearn.kernels.bench_attention``, the thread-limit and peak-RSS probes in ``tinylearn.kernels.bench_probes``
(every name of before the split is re-exported here).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..bench import Comparison, Table, tinygrad_jit
from ..bench.roofline import machine_roofs, ridge_point  # noqa: F401  (ridge_point: re-exported for notebook 05)
from . import ops, traffic
from .bench_attention import (  # noqa: F401  (re-exported: the names this module held before the split)
    ATTENTION_BWD_IMPLS,
    ATTENTION_IMPLS,
    SWEEP_IMPLS,
    _attention_bwd_fns,
    _attention_case,
    _attention_fns,
    _attention_inputs,
    _attention_rss_worker,
    _k_bwd_path,
    _sweep_fns,
    attention_backward_table,
    attention_peak_rss,
    attention_sweep,
    attention_table,
    flash_scratch_mb,
)
from .bench_probes import _status_kb, limited_threads, peak_rss_growth_mb  # noqa: F401  (re-exported)

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
