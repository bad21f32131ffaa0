"""Benchmark: tinylearn's all-reduce algorithms vs ``dist.all_reduce`` (gloo) on 2 and 4 local processes.

Per message size: median time (slowest rank, between barriers), algorithm bandwidth algbw = n / t, bus bandwidth
busbw = algbw * 2(p-1)/p, and the alpha-beta-gamma prediction with alpha and beta fitted to a ping-pong between
ranks 0 and 1 measured in the same job (gamma: local fp32 add). The baseline column is gloo's own all-reduce;
"p2p ring floor" is the ring's message pattern alone (no arithmetic), the transport limit of anything built on
isend/irecv.
tinygrad has no collectives (no multi-process all-reduce), and torch.compile does not apply, so neither appears.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ..bench.table import Row, Table
from . import cost_model
from .launch import launch
from .workers import bench_job

IMPLS = ["gloo", "ring", "tree", "recursive_doubling", "halving_doubling", "hierarchical", "p2p ring floor"]


def _label(nb: int) -> str:
    return f"{nb >> 20} MB" if nb >= 1 << 20 else f"{nb >> 10} KB"


def run(
    full: bool = False,
    progress: Callable[[str], None] | None = None,
    world_sizes: tuple[int, ...] = (2, 4),
    sizes: list[int] | None = None,
    repeats: int = 5,
) -> list[Table]:
    if sizes is None:
        sizes = (
            [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
            if full
            else [4 << 10, 256 << 10, 4 << 20, 64 << 20]
        )
    tables = []
    fit = None
    for p in world_sizes:
        if progress:
            progress(f"dist: launching {p} ranks")
        res = launch(bench_job, p, sizes, IMPLS, repeats, fit is None, timeout_s=900)[0]
        if fit is None:
            a, b = cost_model.fit_alpha_beta(res["pp_sizes"], res["pp_times"])
            fit = (a, b, res["gamma"])
        a, b, g = fit
        t = Table(f"all-reduce fp32, p={p} processes (gloo transport, 127.0.0.1)", baseline="gloo")
        for nb in sizes:
            for impl in IMPLS:
                sec = res["times"][(nb, impl)]
                model_alg = "ring" if impl in ("gloo", "p2p ring floor") else impl
                pred = cost_model.predict(model_alg, nb, p, a, b, 0.0 if impl == "p2p ring floor" else g)
                row = Row(
                    _label(nb),
                    impl,
                    sec * 1e3,
                    gbps=nb / sec / 1e9,
                    extra={
                        "busbw GB/s": round(cost_model.bus_bandwidth(nb, sec, p) / 1e9, 3),
                        "pred ms": round(pred * 1e3, 3),
                        "model err": f"{(sec - pred) / pred * 100:+.0f}%",
                    },
                )
                t.add(row)
                if progress:
                    progress(f"p={p} {_label(nb)} {impl}")
        t.compute_ratios()
        big = max(sizes)
        ring, gloo = t.get(_label(big), "ring"), t.get(_label(big), "gloo")
        if ring and gloo and ring.median_ms and gloo.median_ms:
            t.notes.append(
                f"ring / gloo bandwidth at {_label(big)}: {gloo.median_ms / ring.median_ms:.2f}x (goal >= 0.8x)"
            )
        t.notes.append(
            f"GB/s column = algbw = n/t; model: alpha={a * 1e6:.1f} us, beta={1 / b / 1e9 if b else 0:.2f} "
            f"GB/s (ping-pong fit, ranks 0-1), gamma={1 / g / 1e9 if g else 0:.2f} GB/s (fp32 add); "
            "gloo predicted with the ring formula; pred = cost_model.predict = simulate(topology=None)"
        )
        t.notes.append(
            "p2p ring floor = the ring's 2(p-1) isend/irecv exchanges with no reduction: what gloo's point-to-point "
            "path costs by itself (our algorithms are built on it; gloo's own all-reduce uses its internal path)"
        )
        t.notes.append("tinygrad: n/a — tinygrad has no multi-process collectives; torch.compile does not apply")
        t.notes.append(
            f"{os.cpu_count()} cores shared by {p} ranks (1 thread each); loopback TCP, so times include "
            "scheduler noise when the box is busy"
        )
        tables.append(t)
    return tables


if __name__ == "__main__":  # pragma: no cover
    for tab in run(full=bool(os.environ.get("TINYLEARN_FULL"))):
        print(tab)
