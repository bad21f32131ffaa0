"""A CUDA occupancy calculator: how many blocks of a kernel fit on one SM, and what stops more from fitting.

Per-SM limits (CUDA Programming Guide, "Compute capabilities" table; cuda_occupancy.h does the same arithmetic):

    arch   warps  blocks  threads  registers  max shared/SM     per-block opt-in   reserved/block
    sm_80  64     32      2048     65536      164 KB (167936)   163 KB (166912)    1 KB
    sm_90  64     32      2048     65536      228 KB (233472)   227 KB (232448)    1 KB
    (both: <= 1024 threads/block, <= 255 registers/thread, 48 KB per block without the opt-in attribute)

Rules, one limit each (blocks per SM = the minimum):
  threads    max_warps // ceil(threads/32)                      (warps are the unit: 33 threads occupy 2 warps)
  blocks     max_blocks_per_sm
  registers  a warp gets ceil(regs*32 / 256) * 256 registers; the register file is split over 4 sub-partitions
             (one per warp scheduler), so warps/SM = 4 * ((65536/4) // regs_per_warp);
             blocks = warps // warps_per_block.
             A block needing more than 65536 registers cannot launch (0 blocks).
  shared     a block takes ceil((shared + 1 KB reserved) / 128) * 128 bytes of the SM's shared memory, assumed set to
             the maximum carveout; blocks = smem_per_sm // that
occupancy = active warps / max warps. The limiter is the rule giving the minimum; on a tie the first of
threads, blocks, registers, shared (all tied names are in ``limiters``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .._inputs import as_int


@dataclass(frozen=True)
class Arch:
    name: str
    max_warps: int = 64
    max_blocks: int = 32
    max_threads_per_block: int = 1024
    registers: int = 65536
    max_regs_per_thread: int = 255
    reg_alloc_unit: int = 256  # registers, per warp
    sub_partitions: int = 4
    smem_per_sm: int = 167936  # bytes at the maximum carveout
    smem_per_block_optin: int = 166912
    smem_per_block_default: int = 49152
    smem_reserved_per_block: int = 1024
    smem_alloc_unit: int = 128


ARCHS: dict[str, Arch] = {
    "sm_80": Arch("sm_80"),
    "sm_90": Arch("sm_90", smem_per_sm=233472, smem_per_block_optin=232448),
}

_ORDER = ("threads", "blocks", "registers", "shared")


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def occupancy(
    threads_per_block: int, registers_per_thread: int, shared_bytes_per_block: int, arch: str = "sm_80"
) -> dict:
    """Blocks and warps of one kernel resident per SM; see the module docstring for the rules.

    Returns dict(blocks_per_sm, warps_per_sm, occupancy, limiter, limiters, limits={rule: blocks},
    regs_per_warp, smem_per_block_allocated, needs_optin (shared > 48 KB needs cudaFuncSetAttribute)).
    """
    t = as_int(threads_per_block, "threads_per_block")
    r = as_int(registers_per_thread, "registers_per_thread")
    s = as_int(shared_bytes_per_block, "shared_bytes_per_block")
    if not isinstance(arch, str) or arch not in ARCHS:
        raise ValueError(f"arch: unknown architecture {arch!r}; known: {sorted(ARCHS)}")
    a = ARCHS[arch]
    if not 1 <= t <= a.max_threads_per_block:
        raise ValueError(f"threads_per_block: must be in [1, {a.max_threads_per_block}] on {arch}, got {t}")
    if not 1 <= r <= a.max_regs_per_thread:
        raise ValueError(f"registers_per_thread: must be in [1, {a.max_regs_per_thread}] on {arch}, got {r}")
    if not 0 <= s <= a.smem_per_block_optin:
        raise ValueError(
            f"shared_bytes_per_block: must be in [0, {a.smem_per_block_optin}] (the opt-in per-block maximum) "
            f"on {arch}, got {s}"
        )
    warps_per_block = -(-t // 32)
    regs_per_warp = _round_up(r * 32, a.reg_alloc_unit)
    smem_alloc = _round_up(s + a.smem_reserved_per_block, a.smem_alloc_unit)
    if regs_per_warp * _round_up(warps_per_block, a.sub_partitions) > a.registers:
        reg_blocks = 0  # "too many resources requested for launch"
    else:
        warps_by_regs = a.sub_partitions * ((a.registers // a.sub_partitions) // regs_per_warp)
        reg_blocks = warps_by_regs // warps_per_block
    limits = {
        "threads": a.max_warps // warps_per_block,
        "blocks": a.max_blocks,
        "registers": reg_blocks,
        "shared": a.smem_per_sm // smem_alloc,
    }
    blocks = min(limits.values())
    tied = [k for k in _ORDER if limits[k] == blocks]
    warps = blocks * warps_per_block
    return {
        "blocks_per_sm": blocks,
        "warps_per_sm": warps,
        "occupancy": warps / a.max_warps,
        "limiter": tied[0],
        "limiters": tied,
        "limits": limits,
        "regs_per_warp": regs_per_warp,
        "smem_per_block_allocated": smem_alloc,
        "needs_optin": s > a.smem_per_block_default,
    }
