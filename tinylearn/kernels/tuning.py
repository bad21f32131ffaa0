"""Search spaces of the fused kernels (topic 17): the C++ ladders of ``kernels.softmax`` and ``kernels.layer_norm``
(x the row-chunking grain of the threaded rungs) and ``kernels.attention`` (x the flash-attention query block),
declared with ``tunable.declare``.

Every space tunes the registered op in its canonical form (rows [R, C] for softmax and LayerNorm, [BH, N, D] for
attention), so ``space.build(cfg)`` has the op's registered signature and the tuned provider can hand it to
``backends.resolve``. A configuration only changes *how* the op runs: every version computes the same values
(the reference is the op's numpy backend). The default is the version ``backend=None`` runs (the ladder's
registered default) and, for attention, the caller's block size of 64.

Softmax's and LayerNorm's ``grain`` is the number of elements each thread gets at least (rows are split into
chunks of at least grain / C rows): the threaded rungs run on min(threads, R*C / grain) threads, so a large grain
keeps a medium input on one thread (no team wake-up) and a small one splits it sooner. Only the threaded rungs
(``simd_omp``, ``online_simd``) read it; the others accept only the default grain, so no configuration is a
duplicate of another.

Attention's ``block_size`` is the query rows per work item (the blocked rungs stream 64-key tiles): small blocks
give OpenMP more items, large ones reuse each key tile over more queries. Blocks larger than the smallest power of
two covering N are the same single block (``valid`` rejects them, like ``ops._block`` caps them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import backends, tunable
from . import cpu

BLOCK_SIZES = (16, 32, 64, 128, 256)
GRAINS = (1 << 12, 1 << 14, cpu.DEFAULT_GRAIN, 1 << 17, 1 << 20)
THREADED = {"kernels.softmax": ("simd_omp", "online_simd"), "kernels.layer_norm": ("simd_omp",)}


def _default_version(op: str) -> str:
    return backends.versions(op, "cpp")[0]  # the ladder's first rung is its registered default (ops.py)


def _rows_shape(x: np.ndarray, *_: Any, **__: Any) -> tunable.Shape:
    return {"R": int(x.shape[0]), "C": int(x.shape[1])}


def _rows(shape: tunable.Shape, rng: Any) -> np.ndarray:
    return rng.standard_normal((int(shape["R"]), int(shape["C"]))).astype(np.float32)


def _grain_valid(op: str) -> Any:
    def valid(cfg: Mapping[str, Any], shape: tunable.Shape) -> bool:
        return cfg["version"] in THREADED[op] or cfg["grain"] == cpu.DEFAULT_GRAIN

    return valid


def _rows_default(op: str) -> Any:
    return lambda shape: {"version": _default_version(op), "grain": cpu.DEFAULT_GRAIN}


# ---------------------------------------------------------------------------------------------------- softmax
def _softmax_build(cfg: Mapping[str, Any]) -> Any:
    version, grain = cfg["version"], int(cfg["grain"])

    def fn(x: np.ndarray) -> np.ndarray:
        return cpu.softmax(x, version, grain)

    fn.__name__ = f"softmax_cpp_{version}_g{grain}"
    return fn


SOFTMAX = tunable.declare(
    tunable.Space(
        op="kernels.softmax",
        params=(tunable.Param("version", cpu.SOFTMAX_VERSIONS), tunable.Param("grain", GRAINS)),
        build=_softmax_build,
        shape_of=_rows_shape,
        make_args=lambda shape, rng: ((_rows(shape, rng),), {}),
        default=_rows_default("kernels.softmax"),
        valid=_grain_valid("kernels.softmax"),
        description="row softmax: the C++ ladder (three_pass, online, simd, simd_omp, online_simd) x row grain",
    )
)


# ------------------------------------------------------------------------------------------------- layer_norm
def _ln_args(shape: tunable.Shape, rng: Any) -> tuple[tuple, dict]:
    c = int(shape["C"])
    w = rng.standard_normal(c).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    return (_rows(shape, rng), w, b, 1e-5), {}


def _ln_build(cfg: Mapping[str, Any]) -> Any:
    version, grain = cfg["version"], int(cfg["grain"])

    def fn(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return cpu.layer_norm(x, w, b, eps, version, grain)

    fn.__name__ = f"layer_norm_cpp_{version}_g{grain}"
    return fn


LAYER_NORM = tunable.declare(
    tunable.Space(
        op="kernels.layer_norm",
        params=(tunable.Param("version", cpu.LAYER_NORM_VERSIONS), tunable.Param("grain", GRAINS)),
        build=_ln_build,
        shape_of=_rows_shape,
        make_args=_ln_args,
        default=_rows_default("kernels.layer_norm"),
        valid=_grain_valid("kernels.layer_norm"),
        description="LayerNorm over rows: the C++ ladder (two_pass, welford, simd, simd_omp) x row grain",
    )
)


# -------------------------------------------------------------------------------------------------- attention
def _attn_shape(q: np.ndarray, k: np.ndarray, v: np.ndarray, *_: Any, **__: Any) -> tunable.Shape:
    return {"BH": int(q.shape[0]), "N": int(q.shape[1]), "D": int(q.shape[2])}


def _attn_args(shape: tunable.Shape, rng: Any) -> tuple[tuple, dict]:
    bh, n, d = int(shape["BH"]), int(shape["N"]), int(shape["D"])
    q, k, v = (rng.standard_normal((bh, n, d)).astype(np.float32) for _ in range(3))
    return (q, k, v, False, 64), {}


def _attn_valid(cfg: Mapping[str, Any], shape: tunable.Shape) -> bool:
    n = max(int(shape["N"]), 1)
    cover = max(BLOCK_SIZES[0], 1 << (n - 1).bit_length())
    return cfg["block_size"] <= cover


def _attn_build(cfg: Mapping[str, Any]) -> Any:
    version, block = cfg["version"], int(cfg["block_size"])

    def fn(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, block_size: int = 64) -> Any:
        return cpu.attention(q, k, v, causal, block, version)  # the tuned block replaces the caller's

    fn.__name__ = f"attention_cpp_{version}_b{block}"
    return fn


def _attn_default(shape: tunable.Shape) -> tunable.Config:
    n = max(int(shape["N"]), 1)
    cover = max(BLOCK_SIZES[0], 1 << (n - 1).bit_length())
    return {"version": _default_version("kernels.attention"), "block_size": min(64, cover)}


ATTENTION = tunable.declare(
    tunable.Space(
        op="kernels.attention",
        params=(tunable.Param("version", cpu.ATTENTION_VERSIONS), tunable.Param("block_size", BLOCK_SIZES)),
        build=_attn_build,
        shape_of=_attn_shape,
        make_args=_attn_args,
        default=_attn_default,
        valid=_attn_valid,
        description="flash attention forward: C++ rung (tiled, blocked_simd, blocked_simd_omp) x query block",
    )
)
