"""``tinylearn bench gemm``: every rung of the C++ ladder vs numpy (OpenBLAS), torch and tinygrad, fp32 n x n x n.

Rows per size: ``cpp naive`` / ``cpp ikj`` / ``cpp blocked`` / ``numba blocked`` (skipped above the sizes where they
take seconds), ``cpp packed``, ``cpp simd`` (1 thread), ``cpp parallel`` (all cores), ``numpy 1 thread``
(threadpoolctl), ``numpy``, ``torch``, ``tinygrad`` (TinyJit, DEV=CPU). Extra columns: ``% peak`` of the measured
machine FMA peak (tl.gemm.machine_peak: the 1-thread peak for 1-thread rows). Ratios are to torch.
Default sizes (256, 512, 1024) finish in about a minute on 2 cores; ``full=True`` adds 2048.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .._threads import limited_threads
from ..bench import Comparison, Table, tinygrad_jit
from . import ops
from .roofline import machine_peak

LIMITS = {"naive": 256, "ikj": 512, "blocked": 1024, "numba": 512}  # largest n each slow rung runs at
ONE_THREAD = {"cpp naive", "cpp ikj", "cpp blocked", "cpp packed", "cpp simd", "numba blocked", "numpy 1 thread"}


def run(
    full: bool = False, progress: Callable[[str], None] | None = None, sizes: list[int] | None = None
) -> list[Table]:
    import torch

    from .. import backends

    sizes = sizes or ([256, 512, 1024, 2048] if full else [256, 512, 1024])
    peak = machine_peak()
    cmp = Comparison("gemm fp32 C = A @ B (n x n x n)", baseline="torch", repeat=5, progress=progress)
    rng = np.random.default_rng(0)
    have_c = backends.C_available("gemm")
    for n in sizes:
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        with cmp.case(f"n={n}", flops=2.0 * n**3) as c:
            rows: list[tuple[str, Any]] = []
            for v in ops.CPP_VERSIONS:
                name = f"cpp {v}"
                if not have_c:
                    c.unavailable(name, "tinylearn._C.gemm not built")
                elif n > LIMITS.get(v, 1 << 30):
                    c.unavailable(name, f"n/a: skipped above n={LIMITS[v]} (seconds per call)")
                else:
                    rows.append((name, c.add(name, lambda a=a, b=b, v=v: ops.matmul(a, b, backend="cpp", version=v))))
            if backends.numba_available() and n <= LIMITS["numba"]:
                rows.append(
                    ("numba blocked", c.add("numba blocked", lambda a=a, b=b: ops.matmul(a, b, backend="numba")))
                )
            with limited_threads(1):
                rows.append(("numpy 1 thread", c.add("numpy 1 thread", lambda a=a, b=b: a @ b)))
            rows.append(("numpy", c.add("numpy", lambda a=a, b=b: a @ b)))
            rows.append(("torch", c.add("torch", lambda ta=ta, tb=tb: ta @ tb)))

            def build(tg: Any, a: np.ndarray = a, b: np.ndarray = b) -> Callable[[], Any]:
                ga, gb = tg.Tensor(a).realize(), tg.Tensor(b).realize()
                f = tinygrad_jit(lambda x, y: x @ y)
                return lambda: f(ga, gb)

            rows.append(("tinygrad", c.add_tinygrad("tinygrad", build)))
            for name, row in rows:
                if row.gflops:
                    roof = peak["gflops_fp32_1t"] if name in ONE_THREAD else peak["gflops_fp32"]
                    row.extra["% peak"] = round(100 * row.gflops / roof, 1)
    cmp.note(
        f"machine peak (register FMA loop): {peak['gflops_fp32']:.0f} GFLOP/s on {peak['cores']} cores, "
        f"{peak['gflops_fp32_1t']:.0f} on 1 ({peak['isa']}); STREAM {peak['bandwidth_gbs']:.1f} GB/s; "
        f"torch threads {torch.get_num_threads()}"
    )
    return [cmp.table]
