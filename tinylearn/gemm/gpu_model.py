"""Deterministic models of three GPU memory rules, for the notebook and tests (no GPU needed).

warp      32 threads issue each load/store together. A global access is served in 32-byte sectors of 128-byte
          lines: ``transactions(addresses)`` counts the distinct 128-byte segments (and 32-byte sectors) the warp's
          byte addresses touch. Coalesced (thread t reads word t): 1 segment, 4 sectors. Stride-N column walk: 32.
banks     shared memory has 32 banks of 4-byte words; word w lives in bank w % 32. A warp's request takes as many
          passes (wavefronts) as the largest number of *distinct* words any one bank must deliver (the same word
          to many threads is a broadcast). ``bank_conflicts(word_indices)`` returns that degree.
Example patterns for a TILE x TILE float tile in shared memory (row-major, ``pad`` extra columns):
  row read  tile[r][t]   -> words r*(TILE+pad)+t: 32 banks, degree 1
  column    tile[t][c]   -> words t*(TILE+pad)+c: with TILE=32, pad=0 every word in bank c: degree 32;
                            pad=1 shifts each row by one bank: degree 1 (the classic +1 padding)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

WARP = 32
BANKS = 32


def _as_int_array(name: str, x: Sequence[int] | np.ndarray) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer) or a.size == 0:
        raise ValueError(f"{name}: must be a non-empty 1-D integer sequence, got shape {a.shape} dtype {a.dtype}")
    return a.astype(np.int64)


def transactions(byte_addresses: Sequence[int] | np.ndarray, itemsize: int = 4) -> dict:
    """Distinct 128-byte segments and 32-byte sectors touched by one warp access of ``itemsize`` bytes/thread."""
    a = _as_int_array("byte_addresses", byte_addresses)
    ends = a + itemsize - 1
    segs = set((a // 128).tolist()) | set((ends // 128).tolist())
    sectors = set()
    for s, e in zip((a // 32).tolist(), (ends // 32).tolist(), strict=True):
        sectors.update(range(s, e + 1))
    useful = len(set(a.tolist())) * itemsize
    return {
        "segments": len(segs),
        "sectors": len(sectors),
        "bytes_moved": 32 * len(sectors),
        "efficiency": useful / (32 * len(sectors)),
    }


def bank_conflicts(word_indices: Sequence[int] | np.ndarray, banks: int = BANKS) -> dict:
    """Conflict degree of one warp's shared-memory access to 4-byte words (1 = conflict-free)."""
    w = _as_int_array("word_indices", word_indices)
    per_bank: dict[int, set[int]] = {}
    for word in w.tolist():
        per_bank.setdefault(word % banks, set()).add(word)
    degree = max(len(v) for v in per_bank.values())
    return {"degree": degree, "banks_used": len(per_bank), "wavefronts": degree}


def row_words(tile: int = 32, pad: int = 0, row: int = 0) -> np.ndarray:
    """Word indices when thread t reads tile[row][t] of a (tile x (tile+pad)) float array."""
    return row * (tile + pad) + np.arange(WARP)


def column_words(tile: int = 32, pad: int = 0, col: int = 0) -> np.ndarray:
    """Word indices when thread t reads tile[t][col]."""
    return np.arange(WARP) * (tile + pad) + col


def wavefronts(first_words: Sequence[int] | np.ndarray, width: int = 1, banks: int = BANKS) -> dict:
    """Shared-memory passes of one warp access where thread t touches words first_words[t] .. + width - 1.

    32-bit accesses (width 1) are served for the whole warp at once; 64-bit (2) in 2 phases of 16 threads, 128-bit
    (4) in 4 phases of 8 threads. Returns degree (worst phase's conflict degree: 1 = conflict-free), wavefronts
    (passes summed over phases) and ideal (the phase count: the wavefronts of a conflict-free access)."""
    w = _as_int_array("first_words", first_words)
    if width not in (1, 2, 4):
        raise ValueError(f"width: must be 1, 2 or 4 words per thread, got {width!r}")
    per_phase = WARP // width
    degree, total = 1, 0
    for p in range(0, w.size, per_phase):
        words = (w[p : p + per_phase, None] + np.arange(width)).ravel()
        d = bank_conflicts(words, banks)["degree"]
        degree, total = max(degree, d), total + d
    return {"degree": degree, "wavefronts": total, "ideal": -(-w.size // per_phase)}
