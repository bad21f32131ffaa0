"""Tests for exercises/08_gemm (run on stubs by default, on tinylearn with --impl=reference)."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from tinylearn.testing import assert_close


def _pair(m: int, k: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, k)), rng.standard_normal((k, n))


@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 33, 5), (70, 300, 130)])
def test_blocked_matmul(impl: ModuleType, shape: tuple[int, int, int]) -> None:
    a, b = _pair(*shape)
    assert_close(impl.blocked_matmul(a, b, mc=16, kc=32, nc=24), a @ b)
    assert_close(impl.blocked_matmul(a, b), a @ b)


def test_pack_a(impl: ModuleType) -> None:
    a = np.arange(7 * 3, dtype=np.float32).reshape(7, 3)
    p = impl.pack_a(a, 4)
    assert p.shape == (2, 3, 4)
    assert p[0, 1].tolist() == [1.0, 4.0, 7.0, 10.0]  # column k=1 of rows 0..3
    assert p[1, 2].tolist() == [14.0, 17.0, 20.0, 0.0]  # rows 4..6 then zero padding


def test_pack_b(impl: ModuleType) -> None:
    b = np.arange(3 * 5, dtype=np.float32).reshape(3, 5)
    p = impl.pack_b(b, 2)
    assert p.shape == (3, 3, 2)
    assert p[1, 2].tolist() == [12.0, 13.0]  # row k=2, columns 2..3
    assert p[2, 0].tolist() == [4.0, 0.0]  # last column then padding
    # packing is a permutation: a packed product equals the plain one
    a, bb = _pair(5, 3, 2)
    pa, pb = impl.pack_a(a, 5)[0], impl.pack_b(bb, 2)[0]  # (K, mr), (K, nr)
    assert_close(pa.T @ pb, a @ bb)


def test_roofline(impl: ModuleType) -> None:
    r = impl.roofline(1e9, 1e9, 100.0, 10.0)
    assert r["intensity"] == pytest.approx(1.0) and r["attainable_gflops"] == pytest.approx(10.0)
    assert r["bound"] == "memory"
    n = 1024
    r = impl.roofline(2 * n**3, 16 * n**2, 100.0, 10.0)  # compulsory traffic with the write-allocate read of C
    assert r["bound"] == "compute" and r["attainable_gflops"] == pytest.approx(100.0)
    with pytest.raises(ValueError):
        impl.roofline(1.0, 0.0, 1.0, 1.0)


@pytest.mark.parametrize(
    "args,expected",
    [
        ((256, 32, 0), (8, 64, "threads")),
        ((256, 64, 0), (4, 32, "registers")),
        ((128, 33, 0), (12, 48, "registers")),
        ((32, 80, 0), (24, 24, "registers")),
        ((128, 32, 48 * 1024), (3, 12, "shared")),
        ((256, 16, 32 * 1024), (4, 32, "shared")),
        ((32, 16, 0), (32, 32, "blocks")),
    ],
)
def test_occupancy(impl: ModuleType, args: tuple[int, int, int], expected: tuple[int, int, str]) -> None:
    r = impl.occupancy(*args)
    assert (r["blocks_per_sm"], r["warps_per_sm"], r["limiter"]) == expected
    assert r["occupancy"] == pytest.approx(expected[1] / 64)
