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

Column shards of a parameter matrix with r = 1 or 2 parity fragments (notebook 06 §8g): ``shard_columns`` cuts a
2-D matrix into k column blocks; ``encode_shards`` stores each shard's raw bytes (zero-padded to one length L) and
adds P = d_0 xor ... xor d_{k-1} and, for r = 2, Q = g^0 d_0 + g^1 d_1 + ... + g^{k-1} d_{k-1}, a weighted sum with
distinct weights g^i computed byte-wise in GF(2^8) (addition = xor, g = 2, polynomial 0x11d: RAID-6). Any r lost
fragments (data or parity, marked None) are rebuilt bit-exactly by ``recover_shards``:

* one lost data shard a: d_a = P xor (good shards), or, if P is lost too, d_a = (Q + sum_good g^i d_i) / g^a;
* two lost data shards a, b: with S = d_a + d_b and T = g^a d_a + g^b d_b (P, Q minus the good shards),
  d_a = (T + g^b S) / (g^a + g^b), d_b = S + d_a; g^a != g^b for a != b < 255, so the 2x2 system is solvable.

Two *plain* XOR parities (0/1 weights) cannot do this for k > 3: a lost pair {a, b} is solvable only when the
weight columns (c1_a, c2_a), (c1_b, c2_b) are distinct and non-zero, and GF(2)^2 has only 3 non-zero vectors.

    code = encode_shards(weight, k=8, r=2)  # code.fragments: 8 data + 2 parity uint8 arrays
    code.fragments[3] = code.fragments[8] = None
    w = recover_shards(code)                # bit-exact weight matrix
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

from .._inputs import is_int

__all__ = [
    "ParityFrame",
    "ShardCode",
    "check_parity",
    "encode_parity",
    "encode_shards",
    "gf256_mul",
    "recover_parity",
    "recover_shards",
    "shard_columns",
    "to_bytes",
]


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
    if not is_int(n_blocks) or n_blocks < 1:
        raise ValueError(f"n_blocks: expected an int >= 1, got {n_blocks!r}")
    n_blocks = int(n_blocks)
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


# ---------------------------------------------------------------------------------------------------------------
# Column shards with r <= 2 parity fragments (XOR + GF(2^8) weighted sum, RAID-6 style) [Q157]

_GF_EXP = np.zeros(512, dtype=np.int64)
_GF_LOG = np.zeros(256, dtype=np.int64)
_x = 1
for _i in range(255):
    _GF_EXP[_i] = _x
    _GF_LOG[_x] = _i
    _x <<= 1
    if _x & 0x100:
        _x ^= 0x11D
_GF_EXP[255:510] = _GF_EXP[:255]
del _x, _i


def gf256_mul(data: np.ndarray, c: int) -> np.ndarray:
    """Multiply every byte of ``data`` (uint8) by the constant ``c`` (0..255) in GF(2^8) (polynomial 0x11d)."""
    if not is_int(c) or not 0 <= int(c) <= 255:
        raise ValueError(f"c: expected an int in 0..255, got {c!r}")
    c = int(c)
    data = np.asarray(data)
    if data.dtype != np.uint8:
        raise ValueError(f"data: expected a uint8 array, got dtype {data.dtype}")
    table = np.zeros(256, dtype=np.uint8)
    if c:
        table[1:] = _GF_EXP[_GF_LOG[1:] + _GF_LOG[c]]
    return table[data]


def _gf_inv(x: int) -> int:
    return int(_GF_EXP[255 - _GF_LOG[x]])


def shard_columns(w: np.ndarray, k: int) -> list[np.ndarray]:
    """Cut a 2-D matrix into ``k`` contiguous column blocks (widths differ by at most one, as np.array_split)."""
    if not is_int(k) or k < 1:
        raise ValueError(f"k: expected an int >= 1, got {k!r}")
    k = int(k)
    w = np.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"w: expected a 2-D matrix, got shape {w.shape}")
    if k > w.shape[1]:
        raise ValueError(f"k: expected at most {w.shape[1]} (the number of columns), got {k}")
    return [np.ascontiguousarray(s) for s in np.array_split(w, k, axis=1)]


@dataclass
class ShardCode:
    """k data fragments (the column shards' raw bytes, zero-padded to one length) followed by r parity fragments;
    a lost fragment is None. ``shapes`` / ``dtype`` rebuild the matrix."""

    fragments: list[np.ndarray | None]
    k: int
    r: int
    shapes: list[tuple[int, ...]]
    dtype: np.dtype

    @property
    def overhead(self) -> float:
        """Parity bytes per data byte (r / k up to the padding)."""
        return self.r / self.k


def _weighted(frags: list[tuple[int, np.ndarray]], size: int) -> np.ndarray:
    out = np.zeros(size, dtype=np.uint8)
    for i, d in frags:
        out ^= gf256_mul(d, int(_GF_EXP[i]))
    return out


def encode_shards(w: np.ndarray, k: int, r: int = 1) -> ShardCode:
    """Column-shard ``w`` (2-D, any dtype, taken as raw bytes) into ``k`` data fragments and add ``r`` parity
    fragments: P = xor of the shards (r >= 1) and Q = sum_i g^i d_i in GF(2^8) (r = 2). Any r losses are
    recoverable with ``recover_shards``."""
    if not is_int(r) or r not in (1, 2):
        raise ValueError(f"r: expected 1 or 2, got {r!r}")
    r = int(r)
    if is_int(k) and k > 255:
        raise ValueError(f"k: expected at most 255 (distinct GF(2^8) weights), got {k}")
    shards = shard_columns(w, k)
    raw = [s.view(np.uint8).reshape(-1) for s in shards]
    size = max(b.size for b in raw)
    data = []
    for b in raw:
        d = np.zeros(size, dtype=np.uint8)
        d[: b.size] = b
        data.append(d)
    parity = [np.bitwise_xor.reduce(np.stack(data), axis=0)]
    if r == 2:
        parity.append(_weighted(list(enumerate(data)), size))
    return ShardCode([*data, *parity], len(shards), r, [s.shape for s in shards], np.asarray(w).dtype)


def recover_shards(code: ShardCode) -> np.ndarray:
    """The original matrix, bit-exact, rebuilding up to ``code.r`` lost fragments (None). Raises ValueError when more
    than r fragments are lost."""
    k, r = code.k, code.r
    if len(code.fragments) != k + r:
        raise ValueError(f"code: expected {k + r} fragments (k={k}, r={r}), got {len(code.fragments)}")
    lost = [i for i, f in enumerate(code.fragments) if f is None]
    if len(lost) > r:
        raise ValueError(f"code: {len(lost)} lost fragments {lost}; {r} parity fragment(s) recover at most {r}")
    present = [f for f in code.fragments if f is not None]
    size = present[0].size
    frags = list(code.fragments)
    missing = [i for i in lost if i < k]
    good = [(i, f) for i, f in enumerate(frags[:k]) if f is not None]
    p, q = frags[k], frags[k + 1] if r == 2 else None
    if len(missing) == 1:
        a = missing[0]
        if p is not None:
            frags[a] = np.bitwise_xor.reduce(np.stack([p, *(f for _, f in good)]), axis=0)
        else:  # P lost as well: use Q
            t = q ^ _weighted(good, size)
            frags[a] = gf256_mul(t, _gf_inv(int(_GF_EXP[a])))
    elif len(missing) == 2:
        a, b = missing
        s = np.bitwise_xor.reduce(np.stack([p, *(f for _, f in good)]), axis=0)  # d_a + d_b
        t = q ^ _weighted(good, size)  # g^a d_a + g^b d_b
        ga, gb = int(_GF_EXP[a]), int(_GF_EXP[b])
        frags[a] = gf256_mul(t ^ gf256_mul(s, gb), _gf_inv(ga ^ gb))
        frags[b] = s ^ frags[a]
    cols = []
    for f, shape in zip(frags[:k], code.shapes, strict=True):
        n = int(np.prod(shape)) * code.dtype.itemsize
        cols.append(f[:n].view(code.dtype).reshape(shape))
    return np.concatenate(cols, axis=1)
