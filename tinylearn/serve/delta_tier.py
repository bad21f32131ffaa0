"""A delta-compressed host tier for swapped-out KV blocks: keyframe + thresholded deltas along the token axis.

    store = DeltaKVStore(threshold=0.0, keyframe_every=16)       # threshold 0: lossless (bit-exact round trip)
    eng = Engine(model, preemption="swap", host_store=store)     # the engine swaps fp32 blocks into it
    eng.generate(prompts, params); store.stats()                 # raw vs stored bytes, ratio, measured error

The premise (Q137): during incremental generation the K/V rows of adjacent tokens often differ sparsely or by
small amounts, so storing a row as the few entries that changed since the previous row saves bytes. A host block
of the engine is [layers, K/V, block_size, kv heads, head_dim] (``BlockManager.host_block_shape``); for every
(layer, K/V) it is cut into one slice [block_size tokens, kv heads * head_dim] and the slice is compressed by
``tinylearn.inference.kv_delta.delta_compress``: row 0 (and every ``keyframe_every``-th row, and any row whose delta
would cost more than the row) is a full keyframe, the others keep only the entries with |x_t - r_{t-1}| > threshold
(index + value) against the *reconstructed* previous row r_{t-1}. Every block starts with a keyframe because blocks
are put, restored and discarded independently (the engine pops them one by one on swap-in), so the effective
keyframe interval is min(keyframe_every, block_size). ``get``/``pop`` reconstruct with ``delta_decompress``.

Error bound: |x - r| <= threshold on every entry (kv_delta's closed loop; the comparison runs in the block's dtype,
so the bound is ``threshold`` rounded to it, e.g. float32(0.1)); checked at ``put``, RuntimeError if not.
threshold = 0 is lossless *bit for bit*: the entries kept are copied exactly, and ``put`` also compares the
reconstruction's bits with the block's and stores the entries that differ as an exact patch (index + value: a -0.0
after a +0.0 has a zero delta, so the delta rule alone would return +0.0); a slice holding a NaN/inf is stored raw
(kv_delta needs finite values). Raw slices, patched entries and fallback rows are counted in ``stats()``.

Bytes: ``delta_stats``'s accounting (a keyframe row D * itemsize; a delta row 2 + kept * (itemsize + index bytes));
a patched entry itemsize + 4 (uint32 index); a raw slice its nbytes. ``stats()`` reports the blocks held now and,
cumulatively over every ``put``, the raw and stored bytes, their ratio, the fraction of delta-row entries kept, and
the largest reconstruction error measured.
Only float blocks (the fp32 engine) are accepted: int8/fp8 engines swap raw slot bytes, which have no token axis.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._inputs import as_int, is_real
from ..inference.kv_delta import delta_compress, delta_decompress, delta_stats


def _slices(block: np.ndarray, token_axis: int) -> np.ndarray:
    """[n_slices, T, D] view of a C-contiguous ``block``: the axes before the token axis flattened into slices, the
    token axis as rows, the axes after it flattened into a row (for the engine: [L * 2, block_size, Hkv * hd])."""
    lead = int(np.prod(block.shape[:token_axis], dtype=np.int64))
    return block.reshape(lead, block.shape[token_axis], -1)


def _restore(c: dict[str, Any], patch: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
    r = delta_decompress(c)
    if patch is not None:
        r.reshape(-1)[patch[0]] = patch[1]
    return r


class DeltaKVStore:
    """A host store (put/get/pop/discard/prefetch/__contains__/stats) keeping float KV blocks delta-compressed along
    their token axis; see the module docstring. ``token_axis=2`` is the engine's [L, 2, block_size, Hkv, hd]."""

    def __init__(self, threshold: float = 0.0, keyframe_every: int = 16, *, token_axis: int = 2) -> None:
        if not is_real(threshold) or not math.isfinite(threshold) or threshold < 0:
            raise ValueError(f"threshold: must be a finite number >= 0, got {threshold!r}")
        self.threshold = float(threshold)
        self.keyframe_every = as_int(keyframe_every, "keyframe_every", min=1)
        self.token_axis = as_int(token_axis, "token_axis", min=0)
        self._d: dict[Any, tuple[tuple[int, ...], np.dtype, list[Any], int]] = {}  # key -> shape, dtype, slices, bytes
        self.puts = self.gets = 0
        names = ("raw_bytes", "stored_bytes", "delta_entries", "kept_entries", "fallback_rows", "raw_slices")
        self._n = dict.fromkeys((*names, "patched_entries"), 0)
        self.max_abs_error = 0.0

    def _compress(self, block: np.ndarray) -> tuple[list[Any], int]:
        out: list[Any] = []
        stored = 0
        for s in _slices(block, self.token_axis):
            if not np.isfinite(s).all():
                out.append(s.copy())
                stored += s.nbytes
                self._n["raw_slices"] += 1
                continue
            c = delta_compress(s, self.threshold, self.keyframe_every)
            r = delta_decompress(c)
            err = float(np.max(np.abs(r - s)))
            if err > float(s.dtype.type(self.threshold)):  # kv_delta compares in the block's dtype
                raise RuntimeError(f"DeltaKVStore: reconstruction error {err} exceeds threshold {self.threshold}")
            patch = None
            if self.threshold == 0:  # signed zeros: equal values, other bits -> patch those entries exactly
                bits = r.view(np.uint8).reshape(*r.shape, -1) != s.view(np.uint8).reshape(*s.shape, -1)
                idx = np.flatnonzero(bits.any(-1)).astype(np.uint32)
                if len(idx):
                    patch = (idx, s.reshape(-1)[idx].copy())
                    stored += len(idx) * (s.itemsize + idx.itemsize)
                    self._n["patched_entries"] += len(idx)
            st = delta_stats(c)
            for t, row in enumerate(c["rows"]):
                if t % self.keyframe_every:  # a delta row, or one that fell back to a full row (all entries kept)
                    self._n["delta_entries"] += s.shape[1]
                    self._n["kept_entries"] += s.shape[1] if row[0] == "key" else len(row[1])
            self._n["fallback_rows"] += st["fallback_rows"]
            self.max_abs_error = max(self.max_abs_error, err)
            out.append((c, patch))
            stored += st["stored_bytes"]
        return out, stored

    def put(self, key: Any, block: np.ndarray) -> str:
        """Store ``block`` (a float array with a token axis) compressed under ``key``; returns the tier name "delta"."""
        if not isinstance(block, np.ndarray):
            raise TypeError(f"block: expected a numpy array, got {type(block).__name__}")
        if not np.issubdtype(block.dtype, np.floating):
            raise TypeError(
                f"block: delta compression needs float K/V blocks (an fp32 engine), got dtype {block.dtype} "
                "(int8/fp8 engines swap raw slot bytes: use HostStore or TieredKVStore)"
            )
        if block.ndim <= self.token_axis or block.ndim < 2:
            raise ValueError(f"block: token_axis={self.token_axis} needs at least 2 dims after it, got {block.shape}")
        hash(key)
        block = np.ascontiguousarray(block)
        slices, stored = self._compress(block)
        self.discard(key)
        self._d[key] = (block.shape, block.dtype, slices, stored)
        self._n["raw_bytes"] += block.nbytes
        self._n["stored_bytes"] += stored
        self.puts += 1
        return "delta"

    def get(self, key: Any) -> np.ndarray:
        """The reconstructed block (a new array): exact bits at threshold 0, within ``threshold`` otherwise."""
        if key not in self._d:
            raise KeyError(f"key: {key!r} is not in the delta store")
        shape, dtype, slices, _ = self._d[key]
        rows = [s if isinstance(s, np.ndarray) else _restore(*s) for s in slices]
        self.gets += 1
        return np.stack(rows).astype(dtype, copy=False).reshape(shape)

    def pop(self, key: Any) -> np.ndarray:
        out = self.get(key)
        del self._d[key]
        return out

    def discard(self, key: Any) -> None:
        """Drop ``key``'s block if present (as ``HostStore.discard``)."""
        self._d.pop(key, None)

    def prefetch(self, keys: Any) -> None:
        """Nothing to prefetch: every block is in RAM (decompression happens in ``get``)."""

    def __contains__(self, key: Any) -> bool:
        try:
            return key in self._d
        except TypeError:
            return False

    def __len__(self) -> int:
        return len(self._d)

    def stats(self) -> dict[str, Any]:
        """Held now: blocks, held_raw_bytes, held_stored_bytes. Over every put: raw_bytes, stored_bytes, ratio
        (raw / stored), kept_fraction (of the delta rows' entries), fallback_rows, raw_slices, patched_entries,
        max_abs_error."""
        n = self._n
        held_raw = sum(int(np.prod(v[0])) * v[1].itemsize for v in self._d.values())
        return dict(
            blocks=len(self._d),
            held_raw_bytes=held_raw,
            held_stored_bytes=sum(v[3] for v in self._d.values()),
            puts=self.puts,
            gets=self.gets,
            raw_bytes=n["raw_bytes"],
            stored_bytes=n["stored_bytes"],
            ratio=n["raw_bytes"] / n["stored_bytes"] if n["stored_bytes"] else float("nan"),
            kept_fraction=n["kept_entries"] / n["delta_entries"] if n["delta_entries"] else float("nan"),
            fallback_rows=n["fallback_rows"],
            raw_slices=n["raw_slices"],
            patched_entries=n["patched_entries"],
            max_abs_error=self.max_abs_error,
            threshold=self.threshold,
            keyframe_every=self.keyframe_every,
        )

    def __repr__(self) -> str:
        return f"DeltaKVStore(threshold={self.threshold}, keyframe_every={self.keyframe_every}, blocks={len(self._d)})"
