"""XOR parity over the blocks of a gradient payload: detect and repair one lost or corrupted block (notebook 06 §8b).

The payload's bytes are cut into ``n_blocks`` equal blocks (zero-padded); the sender adds

* a parity block P = B_0 xor B_1 xor ... xor B_{n-1} (RAID-5 style: one extra block for n), and
* a CRC-32 per block, to *locate* a corrupted block (parity alone detects any single-block corruption, since
  B_0 xor ... xor P = 0 fails, but does not say which block is wrong).

The receiver marks a block bad if it is missing (None) or its CRC mismatches; with one bad block it rebuilds it as
the XOR of P and all the good blocks (bit-exact), with two or more it cannot and the payload must be re-sent.

    frame = encode_parity(payload_bytes, n_blocks=8)
    bad = check_parity(frame)              # indices of missing / corrupted blocks; [] if intact
    data = recover_parity(frame)           # the original bytes, with <= 1 bad block repaired
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

__all__ = ["ParityFrame", "check_parity", "encode_parity", "recover_parity", "to_bytes"]


@dataclass
class ParityFrame:
    """What travels: data blocks (None = lost), their CRC-32s, the parity block and the unpadded length.
    The parity block and the CRCs are assumed intact (in practice they carry their own CRC)."""

    blocks: list[np.ndarray | None]
    crcs: list[int]
    parity: np.ndarray
    nbytes: int
    overhead_bytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.overhead_bytes = self.parity.nbytes + 4 * len(self.crcs)


def to_bytes(*arrays: np.ndarray) -> np.ndarray:
    """Concatenate the raw bytes of arrays (e.g. a top-k payload's indices and values) into one uint8 array."""
    if not arrays:
        raise ValueError("arrays: expected at least one array, got none")
    return np.concatenate([np.ascontiguousarray(a).view(np.uint8).reshape(-1) for a in arrays])


def encode_parity(data: np.ndarray, n_blocks: int) -> ParityFrame:
    """Split ``data`` (any array, taken as its raw bytes) into ``n_blocks`` equal zero-padded blocks, with one CRC-32
    per block and the XOR parity block."""
    if not isinstance(n_blocks, int) or n_blocks < 1:
        raise ValueError(f"n_blocks: expected an int >= 1, got {n_blocks!r}")
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    if raw.size == 0:
        raise ValueError("data: expected a non-empty payload, got 0 bytes")
    size = -(-raw.size // n_blocks)
    padded = np.zeros(n_blocks * size, dtype=np.uint8)
    padded[: raw.size] = raw
    blocks = [padded[i * size : (i + 1) * size].copy() for i in range(n_blocks)]
    parity = np.bitwise_xor.reduce(np.stack(blocks), axis=0)
    return ParityFrame(blocks, [zlib.crc32(b.tobytes()) for b in blocks], parity, raw.size)


def check_parity(frame: ParityFrame) -> list[int]:
    """Indices of the blocks that are missing or whose CRC-32 does not match; [] when the payload is intact."""
    if len(frame.blocks) != len(frame.crcs):
        raise ValueError(f"frame: {len(frame.blocks)} blocks but {len(frame.crcs)} CRCs")
    bad = []
    for i, (b, crc) in enumerate(zip(frame.blocks, frame.crcs, strict=True)):
        if b is None or b.shape != frame.parity.shape or zlib.crc32(b.tobytes()) != crc:
            bad.append(i)
    return bad


def recover_parity(frame: ParityFrame) -> np.ndarray:
    """The payload's original bytes (uint8, unpadded), rebuilding at most one bad block from the parity.
    Raises ValueError when two or more blocks are bad (XOR parity cannot repair them: re-send)."""
    bad = check_parity(frame)
    if len(bad) > 1:
        raise ValueError(f"frame: {len(bad)} bad blocks {bad}; single XOR parity repairs at most one, re-send")
    blocks = list(frame.blocks)
    if bad:
        good = [b for i, b in enumerate(blocks) if i != bad[0]]
        rebuilt = np.bitwise_xor.reduce(np.stack([frame.parity, *good]), axis=0)
        if zlib.crc32(rebuilt.tobytes()) != frame.crcs[bad[0]]:
            raise ValueError(f"frame: rebuilt block {bad[0]} fails its CRC (the parity block is corrupted too)")
        blocks[bad[0]] = rebuilt
    return np.concatenate(blocks)[: frame.nbytes]  # type: ignore[arg-type]
