"""``tinylearn bench longctx``: context-parallel attention, mixture of experts and block-sparse attention.

Three tables, every timing through the shared harness (warm-up, median of repeats):

    context parallel   ring attention vs Ulysses vs single-process SDPA, forward + backward on 2 processes (and 4
                       with ``full=True``): the slowest rank's median, bytes sent per rank, peak activation bytes per
                       rank (``bench_ring`` below, with the meters of parallel/bench_longctx.py). Goal of issue 44:
                       ring's peak per rank <= 1/P of the single-process peak + one block (reported in the notes;
                       notebook 16 asserts it against the naive single-process peak).
    mixture of experts tl.nn.MoE vs the same MoE in torch (TorchMoE) by top-k and capacity factor (None = dropless):
                       tokens/s, dropped-token fraction, max/mean expert load (longctx/moe_bench.py).
    block-sparse       the C++ block-sparse kernel (skips empty tiles) vs torch SDPA dense and with the boolean mask,
                       tinylearn's dense flash attention and tinygrad's dense SDPA, by block density
                       (nn/sparse_attention_bench.py). Goal of issue 44: faster than dense SDPA below 25% density.

tinygrad has dense scaled_dot_product_attention (its row is in the block-sparse table) but no process-parallel
attention and no mixture-of-experts layer: those tables say so in a note.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from .._inputs import as_int
from ..bench import Table
from ..bench.table import Row

TINYGRAD_NO_CP = "tinygrad: n/a (no multi-process ring / Ulysses attention)"
TINYGRAD_NO_MOE = "tinygrad: n/a (no mixture-of-experts layer in the library)"


def sizes(full: bool = False) -> dict[str, Any]:
    """Default (or full) sizes; every key can be overridden in the table functions."""
    if full:
        return dict(ring_seq=4096, ring_worlds=(2, 4), ring_repeat=5, moe_tokens=8192, moe_repeat=5,
                    sparse_ns=(1024, 2048, 4096), sparse_repeat=5)  # fmt: skip
    return dict(ring_seq=1024, ring_worlds=(2,), ring_repeat=3, moe_tokens=2048, moe_repeat=3,
                sparse_ns=(1024,), sparse_repeat=3)  # fmt: skip


def _say(progress: Callable[[str], None] | None, msg: str) -> None:
    if progress is not None:
        progress(msg)


def bench_ring(
    batch: int = 1,
    heads: int = 4,
    seq: int = 2048,
    head_dim: int = 64,
    world_size: int = 2,
    causal: bool = True,
    repeat: int = 5,
    warmup: int = 2,
    timeout_s: float = 300,
) -> list[dict[str, Any]]:
    """Ring attention vs Ulysses vs single-process SDPA, forward + backward, at ``world_size`` ranks.

    Rows: {"method", "world_size", "seq", "causal", "median_ms" (slowest rank's median), "bytes_sent_per_rank",
    "peak_bytes_per_rank" (TensorMeter, one extra call), "largest_tensor_bytes"}. Single-process runs on rank 0
    while the others wait (one core, the whole sequence).
    """
    from ..dist import launch
    from ..parallel import longctx_workers

    batch, heads, seq, head_dim = (
        as_int(v, n, min=1) for v, n in ((batch, "batch"), (heads, "heads"), (seq, "seq"), (head_dim, "head_dim"))
    )
    world_size, repeat, warmup = (
        as_int(world_size, "world_size", min=1),
        as_int(repeat, "repeat", min=1),
        as_int(warmup, "warmup", min=0),
    )
    if seq % (2 * world_size):
        raise ValueError(f"seq: length {seq} is not divisible by 2 * world size = {2 * world_size}")
    if heads % world_size:
        raise ValueError(f"heads: {heads} heads are not divisible by world size {world_size} (Ulysses)")
    per_rank = launch(
        longctx_workers.bench_rank,
        world_size,
        dict(batch=batch, heads=heads, seq=seq, head_dim=head_dim, causal=causal, repeat=repeat, warmup=warmup),
        timeout_s=timeout_s,
    )
    rows = []
    for method in ("single", "ring", "ulysses"):
        recs = [r[method] for r in per_rank if method in r]
        rows.append(
            {
                "method": method,
                "world_size": 1 if method == "single" else world_size,
                "seq": seq,
                "causal": causal,
                "median_ms": max(x["median_ms"] for x in recs),
                "bytes_sent_per_rank": max(x["bytes_sent"] for x in recs),
                "peak_bytes_per_rank": max(x["peak_bytes"] for x in recs),
                "largest_tensor_bytes": max(x["largest_bytes"] for x in recs),
            }
        )
    return rows


def ring_table(full: bool = False, progress: Callable[[str], None] | None = None, **kw: Any) -> Table:
    s = {**sizes(full), **kw}
    t = Table(f"causal attention fwd+bwd, seq {s['ring_seq']}, 4 heads x 64", baseline="single")
    for p in s["ring_worlds"]:
        _say(progress, f"longctx: ring / Ulysses on {p} processes")
        rows = bench_ring(seq=s["ring_seq"], world_size=p, repeat=s["ring_repeat"])
        single = next(r for r in rows if r["method"] == "single")
        for r in rows:
            impl = "single (torch SDPA)" if r["method"] == "single" else f"{r['method']} (tl, {p} ranks)"
            t.add(Row(f"P={p}", impl, r["median_ms"], ratio=r["median_ms"] / single["median_ms"],
                      peak_mb=r["peak_bytes_per_rank"] / 2**20,
                      extra={"sent_MB_per_rank": r["bytes_sent_per_rank"] / 2**20}))  # fmt: skip
        peaks = {r["method"]: r["peak_bytes_per_rank"] for r in rows}
        ring_peak, single_peak = peaks["ring"], peaks["single"]
        t.notes.append(
            f"P={p}: ring peak per rank {ring_peak / 2**20:.1f} MiB vs single {single_peak / 2**20:.1f} MiB "
            f"({ring_peak / single_peak:.2f}x)"
        )
    t.baseline = "single (torch SDPA)"
    t.notes.append(TINYGRAD_NO_CP)
    return t


def moe_table(full: bool = False, progress: Callable[[str], None] | None = None, **kw: Any) -> Table:
    from .moe_bench import bench_moe

    s = {**sizes(full), **kw}
    _say(progress, "longctx: mixture of experts")
    t = Table(f"MoE fwd+bwd, {s['moe_tokens']} tokens, d 64, ffn 128, 8 experts", baseline="torch")
    for r in bench_moe(tokens=s["moe_tokens"], repeat=s["moe_repeat"]):
        cf = "dropless" if r["capacity_factor"] is None else f"cf {r['capacity_factor']:g}"
        t.add(Row(f"top-{r['top_k']} {cf}", r["impl"], r["median_ms"],
                  extra={"dropped": round(r["dropped_fraction"], 3), "max/mean load": round(r["load_imbalance"], 2),
                         "Mtok/s": round(r["tokens_per_s"] / 1e6, 3)}))  # fmt: skip
    t.compute_ratios()
    t.notes.append(TINYGRAD_NO_MOE)
    return t


def sparse_table(full: bool = False, progress: Callable[[str], None] | None = None, **kw: Any) -> Table:
    import numpy as np

    from ..bench.comparators import import_tinygrad, tinygrad_jit, tinygrad_status
    from ..bench.timing import measure
    from ..nn.sparse_attention_bench import bench_sparse

    s = {**sizes(full), **kw}
    _say(progress, "longctx: block-sparse attention")
    t = Table("attention forward by block density (4 heads x 64, block 64)", baseline="torch SDPA dense")
    for r in bench_sparse(ns=s["sparse_ns"], repeat=s["sparse_repeat"]):
        case = f"N={r['n']} density {r['target_density']:.2f} (got {r['density']:.2f})"
        t.add(Row(case, "tl block-sparse (C++)", r["block_sparse_cpp_ms"], r["block_sparse_cpp_min_ms"]))
        t.add(Row(case, "torch SDPA dense", r["sdpa_dense_ms"], r["sdpa_dense_min_ms"]))
        t.add(Row(case, "torch SDPA + mask", r["sdpa_masked_ms"], r["sdpa_masked_min_ms"]))
        t.add(Row(case, "tl flash dense", r["tl_flash_dense_ms"], r["tl_flash_dense_min_ms"]))
    ok, reason = tinygrad_status()
    for n in s["sparse_ns"]:
        case = f"N={n} density 1.00 (got 1.00)"
        if not ok:
            t.add(Row(case, "tinygrad SDPA dense", None, note=reason))
            continue
        tg = import_tinygrad()
        q, k, v = (tg.Tensor(np.random.default_rng(i).standard_normal((1, 4, n, 64)).astype(np.float32)).realize()
                   for i in range(3))  # fmt: skip
        fn = tinygrad_jit(lambda x, y, z: x.scaled_dot_product_attention(y, z))
        m = measure(partial(fn, q, k, v), warmup=2, repeat=s["sparse_repeat"])
        t.add(Row(case, "tinygrad SDPA dense", m.median * 1e3, m.min * 1e3, note="TinyJit, dense only"))
    t.compute_ratios()
    t.notes.append("tinygrad has no block-sparse attention: its dense SDPA is the row at density 1.00")
    return t


def run(full: bool = False, progress: Callable[[str], None] | None = None) -> list[Table]:
    return [ring_table(full, progress), moe_table(full, progress), sparse_table(full, progress)]
