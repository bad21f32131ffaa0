"""tl.gemm.occupancy against hand-derived CUDA occupancy cases (rules: tinylearn/gemm/occupancy.py docstring).

Each row: (threads, regs/thread, shared bytes, arch) -> (blocks/SM, warps/SM, limiter), with the derivation.
sm_80: 64 warps, 32 blocks, 65536 regs in 4 sub-partitions of 16384, 256-register warp granularity, 164 KB shared
(167936 B) at the max carveout, 1 KB reserved per block, 128 B shared granularity. sm_90: 228 KB (233472 B).
"""

from __future__ import annotations

import pytest

import tinylearn as tl

CASES = [
    # 8 warps/block; 32*32 = 1024 regs/warp -> 16 warps per sub-partition -> 64 warps -> 8 blocks; 64/8 = 8 (tie)
    ((256, 32, 0, "sm_80"), (8, 64, "threads")),
    # 64*32 = 2048 regs/warp -> 16384/2048 = 8 per sub-partition -> 32 warps -> 4 blocks of 8 warps: 50%
    ((256, 64, 0, "sm_80"), (4, 32, "registers")),
    # 33 regs: 1056 rounds up to 1280 regs/warp -> 12 per sub-partition -> 48 warps -> 12 blocks of 4 warps
    # (without the 256 granularity it would be 65536 / (33*128) = 15 blocks)
    ((128, 33, 0, "sm_80"), (12, 48, "registers")),
    # sub-partitions: 80*32 = 2560 regs/warp -> 16384/2560 = 6 per sub-partition -> 24 warps -> 24 one-warp blocks
    # (a unified 65536-register file would fit 25)
    ((32, 80, 0, "sm_80"), (24, 24, "registers")),
    # 255 regs -> 8160 -> 8192 regs/warp -> 2 per sub-partition -> 8 warps -> 4 blocks of 2 warps: 12.5%
    ((64, 255, 0, "sm_80"), (4, 8, "registers")),
    # 1024 threads x 64 regs = exactly 65536 registers: one block, 32 warps: 50%
    ((1024, 64, 0, "sm_80"), (1, 32, "registers")),
    # 1024 threads x 65 regs: 2080 -> 2304 regs/warp x 32 warps = 73728 > 65536: cannot launch
    ((1024, 65, 0, "sm_80"), (0, 0, "registers")),
    # shared: 48 KB + 1 KB reserved = 50176 B/block -> 167936 // 50176 = 3 blocks of 4 warps: 18.75%
    ((128, 32, 48 * 1024, "sm_80"), (3, 12, "shared")),
    # reserved KB matters: 32 KB + 1 KB = 33792 -> 4 blocks (32768 alone would give 5)
    ((256, 16, 32 * 1024, "sm_80"), (4, 32, "shared")),
    # one-warp blocks hit the 32 blocks/SM cap: 32 warps, 50%
    ((32, 16, 0, "sm_80"), (32, 32, "blocks")),
    # 100 KB + 1 KB = 103424: sm_80 fits 1 block (167936), sm_90 fits 2 (233472)
    ((256, 32, 100 * 1024, "sm_80"), (1, 8, "shared")),
    ((256, 32, 100 * 1024, "sm_90"), (2, 16, "shared")),
    # 227 KB opt-in on sm_90: 232448 + 1024 = 233472 = the whole SM: 1 block
    ((128, 32, 227 * 1024, "sm_90"), (1, 4, "shared")),
    # 33 threads still occupy 2 warps: 64 // 2 = 32 blocks (tie threads/blocks -> threads)
    ((33, 32, 0, "sm_90"), (32, 64, "threads")),
]


@pytest.mark.parametrize("args,expected", CASES, ids=[f"{a[3]}-{a[0]}t-{a[1]}r-{a[2]}B" for a, _ in CASES])
def test_known_cases(args: tuple, expected: tuple) -> None:
    r = tl.gemm.occupancy(*args[:3], arch=args[3])
    blocks, warps, limiter = expected
    assert (r["blocks_per_sm"], r["warps_per_sm"], r["limiter"]) == (blocks, warps, limiter)
    assert r["occupancy"] == warps / 64
    assert limiter in r["limiters"]
    assert r["blocks_per_sm"] == min(r["limits"].values())


def test_details() -> None:
    r = tl.gemm.occupancy(128, 33, 100)
    assert r["regs_per_warp"] == 1280 and r["smem_per_block_allocated"] == 1152  # 100 + 1024 -> 9 * 128
    assert not r["needs_optin"] and tl.gemm.occupancy(128, 32, 48 * 1024 + 1)["needs_optin"]
    assert tl.gemm.occupancy(256, 32, 0)["limiters"] == ["threads", "registers"]


def test_errors_name_the_argument() -> None:
    with pytest.raises(ValueError, match="threads_per_block"):
        tl.gemm.occupancy(1025, 32, 0)
    with pytest.raises(ValueError, match="registers_per_thread"):
        tl.gemm.occupancy(128, 256, 0)
    with pytest.raises(ValueError, match="shared_bytes_per_block.*166912"):
        tl.gemm.occupancy(128, 32, 164 * 1024)
    with pytest.raises(ValueError, match="arch"):
        tl.gemm.occupancy(128, 32, 0, arch="sm_75")
    with pytest.raises(TypeError, match="threads_per_block"):
        tl.gemm.occupancy(128.0, 32, 0)
