"""The compiled extension's machine probes (tinylearn._C.machine) and the roofline measurements built on them.

Kept apart from test_foundation (layout, docs, packaging: path independent) because these results come from C++
kernels and run again under make test-portable's forced CPU paths."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tinylearn.backends import load_C
from tinylearn.testing import assert_close


def test_extension_builds_and_machine_kernels_match_numpy():
    _C = load_C()

    assert "machine" in _C.submodules
    rng = np.random.default_rng(1)
    a = rng.standard_normal((33, 17), dtype=np.float32)
    b = rng.standard_normal((17, 29), dtype=np.float32)
    assert_close(_C.machine.matmul_naive(a, b), a @ b, reduction_size=17)
    assert_close(_C.machine.matmul_ikj(a.T.copy().T, b), a @ b)  # non-contiguous input is copied
    x, y, z = np.zeros(1001), rng.standard_normal(1001), rng.standard_normal(1001)
    _C.machine.triad(x, y, z, 2.5)
    assert_close(x, y + 2.5 * z)
    with pytest.raises(ValueError, match="inner dimensions"):
        _C.machine.matmul_naive(a, a)
    with pytest.raises(ValueError, match="unknown feature"):
        _C.cpu_supports("sse9")


def test_roofline_measurements_are_plausible():
    from tinylearn.bench import roofline

    p = roofline.peak_gflops(n=256, repeat=2)
    assert p.gflops > 0.1
    assert roofline.stream_bandwidth(n=2_000_000, repeat=2) > 0.1
    th = roofline.theoretical_peak_gflops()
    assert th.gflops > 0
    assert roofline.attainable_gflops(1e6, 100.0, 10.0) == 100.0
    assert roofline.attainable_gflops(1.0, 100.0, 10.0) == 10.0
    with pytest.raises(ValueError, match="n"):
        roofline.peak_gflops(n=4)


_THREADS_CHILD = """
import numpy as np
from tinylearn.backends import load_C
g = load_C("gemm")
rng = np.random.default_rng(0)
a, b = rng.standard_normal((70, 33)).astype(np.float32), rng.standard_normal((33, 45)).astype(np.float32)
for t in (100000, 10**30, np.int64(3), 0):
    assert np.allclose(g.matmul(a, b, threads=t), a @ b, rtol=1e-4, atol=1e-4), t
print(g.fma_peak(iters=1000, threads=100000, repeat=1)["threads"])
for fn in (lambda t: g.matmul(a, b, threads=t), lambda t: g.fma_peak(iters=1000, threads=t, repeat=1)):
    for t in (-1, -10**30, 2.0, True, "4", None):
        try:
            fn(t)
        except (TypeError, ValueError) as e:
            print(type(e).__name__, "|", e)
"""


def test_gemm_threads_argument_is_checked_and_clamped():
    """threads=100000 used to segfault gemm.matmul: clamped to 1024 in C++; negative is a ValueError and a non-int
    (bool, float, str, None) a TypeError naming threads. In a subprocess so that a regression fails, not crashes."""
    p = subprocess.run([sys.executable, "-c", _THREADS_CHILD], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.splitlines()
    assert lines[0] == "1024"
    kinds = [ln.split(" |")[0] for ln in lines[1:]]
    assert kinds == ["ValueError", "ValueError", "TypeError", "TypeError", "TypeError", "TypeError"] * 2, p.stdout
    assert all("threads" in ln for ln in lines[1:]), p.stdout
