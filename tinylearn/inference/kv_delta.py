"""Threshold delta compression of a K (or V) sequence along the token axis, with periodic full keyframes.

Row t of ``x`` [T, D] (one head's K or V, one row per token) is stored either as a keyframe (every
``keyframe_every`` tokens, and whenever the delta would take more bytes than the row: the full row) or as a sparse
delta against the *reconstructed* previous row: only the
entries with |x_t - r_{t-1}| > threshold are kept (index + value). The reconstruction r_t takes x_t exactly on the
kept entries and r_{t-1} elsewhere; because the delta is taken against the reconstruction (closed loop), the error
never accumulates: |x - r| <= threshold on every entry. Keyframes bound how far back a reader has to go
(random access to token t decodes at most ``keyframe_every`` rows).

Bytes: a keyframe costs D * value_bytes; a delta row costs (value_bytes + index_bytes) per kept entry plus a
2-byte count.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .checks import int_arg, real_arg


def delta_compress(x: np.ndarray, threshold: float, keyframe_every: int = 16) -> dict[str, Any]:
    """Compress ``x`` [T, D]; returns dict(shape, keyframe_every, rows) where rows[t] is ("key", row) or
    ("delta", indices, values)."""
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1 or not np.issubdtype(x.dtype, np.floating):
        raise ValueError(f"x: expected a float array [T, D] with T, D >= 1, got {x.dtype} {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError("x: delta compression needs finite values (a NaN row would never be sent as a delta)")
    if not (math.isfinite(real_arg(threshold, "threshold")) and threshold >= 0):
        raise ValueError(f"threshold: must be a finite number >= 0, got {threshold!r}")
    if int_arg(keyframe_every, "keyframe_every") < 1:
        raise ValueError(f"keyframe_every: must be an int >= 1, got {keyframe_every!r}")
    rows: list[tuple[Any, ...]] = []
    recon = None
    for t in range(x.shape[0]):
        if t % keyframe_every == 0:
            recon = x[t].copy()
            rows.append(("key", recon.copy()))
            continue
        idx = np.flatnonzero(np.abs(x[t] - recon) > threshold).astype(np.uint16 if x.shape[1] < 65536 else np.uint32)
        if 2 + len(idx) * (x.itemsize + idx.itemsize) >= x.shape[1] * x.itemsize:  # a delta dearer than the row
            recon = x[t].copy()
            rows.append(("key", recon.copy()))
            continue
        vals = x[t, idx].copy()
        recon[idx] = vals
        rows.append(("delta", idx, vals))
    return dict(shape=x.shape, dtype=x.dtype, keyframe_every=keyframe_every, rows=rows)


def delta_decompress(c: dict[str, Any], upto: int | None = None) -> np.ndarray:
    """Reconstruct rows [0, upto) (all by default) of a ``delta_compress`` result."""
    try:
        (T, D), rows = c["shape"], c["rows"]
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError("c: expected the dict returned by delta_compress") from e
    n = T if upto is None else upto
    if not isinstance(n, int) or not 0 <= n <= T:
        raise ValueError(f"upto: must be an int in [0, {T}], got {upto!r}")
    out = np.empty((n, D), c["dtype"])
    for t in range(n):
        if rows[t][0] == "key":
            out[t] = rows[t][1]
        else:
            out[t] = out[t - 1]
            out[t, rows[t][1]] = rows[t][2]
    return out


def delta_stats(c: dict[str, Any]) -> dict[str, float]:
    """Stored bytes, dense bytes, compression ratio, the fraction of entries kept in the non-keyframe rows (a row
    that fell back to a full row counts as all kept) and the number of such fallback rows."""
    try:
        (T, D), rows, _ = c["shape"], c["rows"], c["keyframe_every"]
        vb = np.dtype(c["dtype"]).itemsize
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError("c: expected the dict returned by delta_compress") from e
    stored, kept, fallback = 0, 0, 0
    for t, r in enumerate(rows):
        if r[0] == "key":
            stored += D * vb
            if t % c["keyframe_every"]:  # a delta row that fell back to a full row: every entry kept
                kept += D
                fallback += 1
        else:
            stored += 2 + len(r[1]) * (vb + r[1].itemsize)
            kept += len(r[1])
    dense = T * D * vb
    n_delta = T - len(range(0, T, c["keyframe_every"]))
    return dict(
        stored_bytes=stored,
        dense_bytes=dense,
        ratio=dense / stored,
        kept_fraction=kept / (n_delta * D) if n_delta else 0.0,
        fallback_rows=fallback,
    )
