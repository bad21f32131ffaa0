"""bench_sparse: block-sparse attention (C++) against dense attention, side by side in one process (issue 44).

Columns per (N, target density): the block-sparse C++ kernel on a Longformer-style layout (local window + one global
block, the window chosen so the layout's block density is closest to the target; ``dense()`` at 100%), torch's
scaled_dot_product_attention dense (no mask) and with the layout's boolean mask, and tinylearn's dense flash
attention (tl.kernels.flash_attention, C++). Timings: tinylearn.bench.measure, median of ``repeat`` after warm-up,
all in the same thread setting (``threads``: tinylearn._threads.limited_threads caps OpenMP / BLAS and torch).
The goal the issue sets: block-sparse faster than dense SDPA below 25% density; the rows report it (speedup =
SDPA dense time / block-sparse time), nothing here asserts it.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np

from .._inputs import as_int
from ..bench.timing import measure
from .sparse_attention import BlockPattern, block_sparse_attention, causal, dense, global_tokens, local


def pattern_for_density(n: int, target: float, block_size: int = 64, is_causal: bool = False) -> BlockPattern:
    """local(w) | global_tokens(block_size) (| causal()) with the window w whose block density is closest to
    ``target`` (dense() / causal() for target >= 1)."""
    if not 0 < target <= 1:
        raise ValueError(f"target: density must be in (0, 1], got {target!r}")
    if target >= 1:
        return causal() if is_causal else dense()
    nb = -(-n // block_size)
    full = (causal() if is_causal else dense()).layout(n, n, block_size).nnz
    best, best_err = None, None
    for w in range(nb):
        for glob in (False, True):
            p: BlockPattern = local(w) | global_tokens(block_size) if glob else local(w)
            if is_causal:
                p = p | causal()
            err = abs(p.layout(n, n, block_size).nnz / full - target)  # relative to dense (causal) blocks
            if best_err is None or err < best_err:
                best, best_err = p, err
    assert best is not None
    return best


def bench_sparse(
    ns: Sequence[int] = (1024, 2048),
    densities: Sequence[float] = (0.05, 0.1, 0.25, 0.5, 1.0),
    *,
    batch: int = 1,
    heads: int = 4,
    head_dim: int = 64,
    block_size: int = 64,
    is_causal: bool = False,
    repeat: int = 5,
    threads: int | None = None,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One row per (N, target density): achieved block density, milliseconds (median and min of ``repeat``) for
    block-sparse C++, torch SDPA dense, torch SDPA masked, tinylearn dense flash attention, and speedups vs SDPA
    dense / masked (min: the least disturbed sample, the better estimate on a loaded machine)."""
    import torch

    from .. import kernels
    from .._threads import limited_threads

    rows: list[dict[str, Any]] = []
    repeat = as_int(repeat, "repeat", min=1)
    rng = np.random.default_rng(seed)
    with limited_threads(threads, torch=True):
        for n in ns:
            n = as_int(n, "n", min=1)
            shape = (batch, heads, n, head_dim)
            q, k, v = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
            tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
            sdpa = torch.nn.functional.scaled_dot_product_attention
            with torch.no_grad():
                m_sdpa = measure(partial(sdpa, tq, tk, tv, is_causal=is_causal), repeat=repeat)
            m_tl = measure(partial(kernels.flash_attention, q, k, v, causal=is_causal), repeat=repeat)
            t_sdpa, t_tl = m_sdpa.median, m_tl.median
            for target in densities:
                p = pattern_for_density(n, float(target), block_size, is_causal)
                lay = p.layout(n, n, block_size)
                tm = torch.from_numpy(lay.dense_mask())
                m_bsa = measure(partial(block_sparse_attention, q, k, v, lay, backend="cpp"), repeat=repeat)
                with torch.no_grad():
                    m_mask = measure(partial(sdpa, tq, tk, tv, attn_mask=tm), repeat=repeat)
                t_bsa, t_mask = m_bsa.median, m_mask.median
                full = (causal() if is_causal else dense()).layout(n, n, block_size).nnz
                rows.append(
                    {
                        "n": n,
                        "target_density": float(target),
                        "density": lay.nnz / full,
                        "pattern": repr(p),
                        "block_sparse_cpp_ms": t_bsa * 1e3,
                        "sdpa_dense_ms": t_sdpa * 1e3,
                        "sdpa_masked_ms": t_mask * 1e3,
                        "tl_flash_dense_ms": t_tl * 1e3,
                        "block_sparse_cpp_min_ms": m_bsa.min * 1e3,
                        "sdpa_dense_min_ms": m_sdpa.min * 1e3,
                        "sdpa_masked_min_ms": m_mask.min * 1e3,
                        "tl_flash_dense_min_ms": m_tl.min * 1e3,
                        "speedup_vs_sdpa_dense": t_sdpa / t_bsa,
                        "speedup_vs_sdpa_dense_min": m_sdpa.min / m_bsa.min,
                        "speedup_vs_sdpa_masked": t_mask / t_bsa,
                        "torch_threads": torch.get_num_threads(),
                    }
                )
    return rows


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    """A fixed-width text table of bench_sparse rows."""
    head = (
        f"{'N':>5} {'dens':>5} {'bsa ms':>8} {'sdpa ms':>8} {'sdpa+m':>8} {'tl ms':>8} {'x sdpa':>7} "
        f"{'bsa min':>8} {'sdpa min':>8} {'x min':>6}  pattern"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['n']:>5} {r['density']:>5.2f} {r['block_sparse_cpp_ms']:>8.2f} {r['sdpa_dense_ms']:>8.2f} "
            f"{r['sdpa_masked_ms']:>8.2f} {r['tl_flash_dense_ms']:>8.2f} {r['speedup_vs_sdpa_dense']:>7.2f} "
            f"{r['block_sparse_cpp_min_ms']:>8.2f} {r['sdpa_dense_min_ms']:>8.2f} "
            f"{r['speedup_vs_sdpa_dense_min']:>6.2f}  "
            f"{r['pattern']}"
        )
    return "\n".join(lines)
