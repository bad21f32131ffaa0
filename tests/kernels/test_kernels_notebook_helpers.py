"""Helpers the 05 notebook relies on: peak-RSS measurement that sees torch's allocator, thread limiting, ridge point."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tinylearn.kernels import bench


def _clear_refs_ok() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


_RSS_PROBE = """
import numpy as np, torch
from tinylearn.kernels import bench
print(bench.peak_rss_growth_mb(lambda: torch.ones(4 * 2**20) * 2.0, tries=2))  # two 16 MiB tensors live at once
print(bench.peak_rss_growth_mb(lambda: np.ones(4 * 2**20, np.float32), tries=2))  # one 16 MiB array
print(bench.peak_rss_growth_mb(lambda: 1 + 1))
"""


@pytest.mark.skipif(not _clear_refs_ok(), reason="needs a writable /proc/self/clear_refs (Linux >= 4.0)")
def test_peak_rss_sees_torch_and_numpy_allocations() -> None:
    pytest.importorskip("torch")
    # the same environment as attention_peak_rss: a fixed 64 KiB mmap threshold, so freed buffers are unmapped
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    r = subprocess.run([sys.executable, "-c", _RSS_PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    torch_mb, numpy_mb, nothing_mb = map(float, r.stdout.split())
    assert 24 <= torch_mb <= 80, torch_mb
    assert 12 <= numpy_mb <= 40, numpy_mb
    assert nothing_mb < 4, nothing_mb


def test_attention_peak_rss_worker() -> None:
    if not _clear_refs_ok():
        with pytest.raises(RuntimeError, match="clear_refs"):
            bench.attention_peak_rss([64], heads=2, d=8)
        return
    rss = bench.attention_peak_rss([512], heads=4, d=16, threads=1)
    scores_mb = 4 * 512 * 512 * 4 / 2**20  # one [4, 512, 512] fp32 matrix: 4 MiB
    assert set(rss) == {(name, 512) for name in bench.ATTENTION_IMPLS}
    assert rss[("torch naive", 512)] >= scores_mb  # S and P are materialised (torch's allocator, seen by RSS)
    assert rss[("numpy naive", 512)] >= scores_mb
    assert rss[("tinylearn flash", 512)] < scores_mb / 2  # no N x N matrix


def test_limited_threads_restores_torch_and_rejects_bad_values() -> None:
    torch = pytest.importorskip("torch")
    old = torch.get_num_threads()
    with bench.limited_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == old
    with bench.limited_threads(None):
        assert torch.get_num_threads() == old
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="threads"), bench.limited_threads(bad):  # type: ignore[arg-type]
            pass


def test_ridge_point() -> None:
    assert bench.ridge_point(19500.0, 1555.0) == pytest.approx(12.54, abs=0.01)  # A100 fp32 / HBM2
    with pytest.raises(ValueError, match="bandwidth_gbs"):
        bench.ridge_point(10.0, 0.0)
