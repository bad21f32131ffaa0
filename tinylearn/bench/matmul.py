"""The first side-by-side benchmark: fp32 matmul C = A @ B (2 n^3 FLOPs).

numpy (BLAS), torch, tinygrad (TinyJit, DEV=CPU) and two textbook C++ loops from tinylearn._C (i-j-k and the
cache-friendlier i-k-j) — the gap between the loops and BLAS is the tour notebook's first lesson. The naive loops
are only run up to n=256 (i-j-k) and n=512 (i-k-j): they take seconds beyond that.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .. import backends
from .comparators import Comparison, tinygrad_jit
from .table import Table


def run(
    full: bool = False, progress: Callable[[str], None] | None = None, sizes: list[int] | None = None
) -> list[Table]:
    import torch

    machine = backends.load_C("machine")

    sizes = sizes or ([128, 256, 512, 1024, 2048] if full else [128, 256, 512, 1024])
    cmp = Comparison("matmul fp32 (C = A @ B)", baseline="torch", progress=progress, repeat=7)
    rng = np.random.default_rng(0)
    for n in sizes:
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        with cmp.case(f"n={n}", flops=2.0 * n**3) as c:
            c.add("numpy", lambda a=a, b=b: a @ b)
            c.add("torch", lambda ta=ta, tb=tb: ta @ tb)

            def build(tg, a=a, b=b):
                ga, gb = tg.Tensor(a).realize(), tg.Tensor(b).realize()
                f = tinygrad_jit(lambda x, y: x @ y)
                return lambda: f(ga, gb)

            c.add_tinygrad("tinygrad", build)
            if n <= 512:
                c.add("C++ ikj loop", lambda a=a, b=b: machine.matmul_ikj(a, b))
            else:
                c.unavailable("C++ ikj loop", "n/a: skipped above n=512 (seconds per call)")
            if n <= 256:
                c.add("C++ naive ijk", lambda a=a, b=b: machine.matmul_naive(a, b))
            else:
                c.unavailable("C++ naive ijk", "n/a: skipped above n=256 (seconds per call)")
    cmp.note(f"torch threads: {torch.get_num_threads()}; single-threaded C++ loops")
    return [cmp.table]
