"""``tinylearn bench kernels``: fused ops vs unfused numpy vs torch eager / torch.compile / tinygrad, and flash
attention vs naive attention vs torch SDPA with peak memory.

Rows per op case (float32, [rows, cols]): ``numpy unfused`` (tinylearn.kernels backend='numpy'), ``tinylearn
cpu`` (fused C++/OpenMP), ``torch`` (eager), ``torch.compile`` (Inductor's fused C++ kernel), ``tinygrad``
(TinyJit, DEV=CPU). The ``roofline ms`` column is the traffic model's prediction (tinylearn.kernels.traffic) from
this machine's measured STREAM bandwidth and SGEMM peak: unfused bytes for the numpy row, fused bytes for the
others. Attention rows ([1, H, N, 64]) add ``peak MB`` (tracemalloc: numpy-visible allocations only — torch's
allocator is invisible to it, so torch rows show ``-``) and the model's extra memory (``scratch MB``: the N x N
score + probability matrices for naive attention, O(N) + per-thread tiles for flash).

Default sizes finish in about 1-2 minutes on 2 cores (after torch.compile's cache is warm; the very first
compile in a fresh environment can take a minute more); ``full=True`` adds larger shapes and N up to 4096.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ..bench import Comparison, Table, tinygrad_jit
from . import ops, traffic


@functools.cache
def machine_roofs() -> tuple[float, float]:
    """(peak GFLOP/s, STREAM GB/s) of this machine, measured once per process."""
    from ..bench.roofline import peak_gflops, stream_bandwidth

    return peak_gflops(n=1024, repeat=3).gflops, stream_bandwidth(n=10_000_000, repeat=3)


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
) -> Table:
    """One Comparison table for ``op``; ``compile``/``tinygrad`` False skip those (slow to build) columns."""
    import torch

    peak, bw = machine_roofs()
    cmp = Comparison(f"{op} fp32 (rows x cols)", baseline="torch", progress=progress)
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
                c.add_tinygrad("tinygrad", _tinygrad_build(op, arrays), note=note)
    cmp.note(
        f"roofline ms: traffic model with measured {bw:.1f} GB/s STREAM and {peak:.0f} GFLOP/s SGEMM peak; "
        "GB/s column = fused bytes (1 read + 1 write) / time"
    )
    return cmp.table


def _attention_case(cmp: Comparison, n: int, heads: int, d: int, causal: bool, tinygrad: bool) -> None:
    import torch
    import torch.nn.functional as F

    rng = np.random.default_rng(n)
    q, k, v = (rng.standard_normal((1, heads, n, d), dtype=np.float32) for _ in range(3))
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    tm = traffic.attention_traffic(heads, n, d, causal=causal)
    naive_mb = 2 * heads * n * n * 4 / 2**20
    flash_mb = (heads * n * 4 + 2 * 64 * 64 * 4 * 2) / 2**20
    mask = torch.ones(n, n, dtype=torch.bool).triu(1)

    def torch_naive() -> Any:
        s = (tq @ tk.transpose(-1, -2)) / d**0.5
        if causal:
            s = s.masked_fill(mask, float("-inf"))
        return torch.softmax(s, -1) @ tv

    def tg_build(tg: Any) -> Callable[[], Any]:
        a, b, cc = (tg.Tensor(x).realize() for x in (q, k, v))
        fn = tinygrad_jit(lambda x, y, z: x.scaled_dot_product_attention(y, z, is_causal=causal))
        return lambda: fn(a, b, cc)

    with cmp.case(f"N={n}", flops=tm.flops) as c:
        r = c.add("numpy naive", lambda: ops.flash_attention(q, k, v, causal, backend="numpy"))
        r.extra["scratch MB"] = round(naive_mb, 2)
        r = c.add("tinylearn flash", lambda: ops.flash_attention(q, k, v, causal, backend="cpu"))
        r.extra["scratch MB"] = round(flash_mb, 3)
        r = c.add("torch naive", torch_naive)
        r.extra["scratch MB"] = round(naive_mb, 2)
        r = c.add("torch sdpa", lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal))
        r.extra["scratch MB"] = "flash/math kernel"
        if tinygrad:
            c.add_tinygrad("tinygrad", tg_build)


def attention_table(
    ns: list[int],
    heads: int = 8,
    d: int = 64,
    causal: bool = False,
    progress: Callable[[str], None] | None = None,
    tinygrad: bool = True,
) -> Table:
    """Naive vs flash vs torch attention at each sequence length in ``ns`` ([1, heads, N, d], float32)."""
    cmp = Comparison(
        f"attention fp32 [1, {heads}, N, {d}]{' causal' if causal else ''}",
        baseline="torch sdpa",
        memory=True,
        repeat=5,
        progress=progress,
    )
    for n in ns:
        _attention_case(cmp, n, heads, d, causal, tinygrad)
    cmp.note(
        "peak MB: tracemalloc of one call (numpy-visible allocations; '-' = invisible to tracemalloc). "
        "GFLOP/s counts 4 N^2 D + 6 N^2 (halved when causal)."
    )
    return cmp.table


def traffic_points(shapes: list[tuple[int, int]], repeat: int = 5) -> list[dict[str, Any]]:
    """Predicted vs measured ms for numpy-unfused and cpu-fused versions of each op (the notebook's plot data)."""
    from ..bench import measure

    peak, bw = machine_roofs()
    out = []
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
    if full:
        tables.append(attention_table(ns, causal=True, progress=progress))
    return tables


if __name__ == "__main__":  # pragma: no cover
    import time

    t0 = time.time()
    for t in run():
        print(t.to_text() if hasattr(t, "to_text") else t)
    print(f"total {time.time() - t0:.0f} s")
