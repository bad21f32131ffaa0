"""The search space of ``gemm.matmul`` (topic 17): the C++ ladder's packed rungs and their cache blocks.

Knobs (``tunable.Param``): ``version`` (``simd``: one thread; ``parallel``: OpenMP over the N x M blocks), ``isa``
(the micro-kernel instruction set, ``_C.gemm.isa_paths()``), the GotoBLAS cache blocks ``mc`` (rows of the packed A
block, L2), ``kc`` (the shared K slice: A block and B panel depth, L1/L2), ``nc`` (columns of the packed B panel,
L3) and ``threads`` (``parallel`` only). The values bracket ``kernel_shape``'s defaults (which are included, so the
untuned configuration is a point of the grid).

Constraints (``valid``): threads > 1 only with ``parallel``; an ISA this CPU runs; a block no larger than the
smallest value that covers its dimension (every larger one is the same single block: measuring it again would
only add noise). The default is what ``backend=None`` runs: cpp ``parallel``, ``isa="auto"``'s choice, the
kernel's own blocks (clamped the same way: a block larger than the matrix is one block) and OpenMP's thread count.

Extra cost-model features: arithmetic intensity 2MNK / (4 (MK + KN + MN)) flops per byte, the bytes of the packed
A block (mc kc 4) and B panel (kc nc 4) against the caches, and the blocks each thread gets.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import _threads, backends, tunable
from .ops import OP

MC_VALUES = (24, 48, 96, 144, 192, 384)
KC_VALUES = (64, 128, 256, 512, 1024)
NC_VALUES = (256, 512, 1024, 2048, 4096, 8192)
ISAS = ("avx512", "avx2", "scalar")
VERSIONS = ("simd", "parallel")


def _gemm() -> Any:
    return backends.load_C("gemm")


def _isas_here() -> tuple[str, ...]:
    return tuple(_gemm().isa_paths()) if backends.C_available("gemm") else ()


def _kernel_defaults() -> dict[str, dict[str, int]]:
    """isa -> the parallel rung's (MC, KC, NC) from ``kernel_shape`` (empty without the C++ extension)."""
    out: dict[str, dict[str, int]] = {}
    for isa in _isas_here():
        ks = _gemm().kernel_shape("parallel", isa, "float32")
        out[isa] = {"mc": int(ks["MC"]), "kc": int(ks["KC"]), "nc": int(ks["NC"])}
    return out


_DEFAULTS = _kernel_defaults()


def _values(base: tuple[int, ...], knob: str) -> tuple[int, ...]:
    return tuple(sorted(set(base) | {d[knob] for d in _DEFAULTS.values()}))


def _thread_values() -> tuple[int, ...]:
    return tuple(range(1, max(_threads.cores(), 1) + 1))


PARAMS = (
    tunable.Param("version", VERSIONS),
    tunable.Param("isa", ISAS),
    tunable.Param("mc", _values(MC_VALUES, "mc")),
    tunable.Param("kc", _values(KC_VALUES, "kc")),
    tunable.Param("nc", _values(NC_VALUES, "nc")),
    tunable.Param("threads", _thread_values()),
)
_DIM = {"mc": "M", "kc": "K", "nc": "N"}


def _cover(knob: str, n: int) -> int:
    """The smallest value of ``knob`` that covers a dimension of ``n`` (the largest value if none does)."""
    vals = next(p.values for p in PARAMS if p.name == knob)
    return next((v for v in vals if v >= n), vals[-1])


def shape_of(a: np.ndarray, b: np.ndarray) -> tunable.Shape:
    return {"M": int(a.shape[0]), "K": int(a.shape[1]), "N": int(b.shape[1])}


def make_args(shape: tunable.Shape, rng: Any) -> tuple[tuple, dict]:
    m, k, n = int(shape["M"]), int(shape["K"]), int(shape["N"])
    return (rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)), {}


def valid(cfg: Mapping[str, Any], shape: tunable.Shape) -> bool:
    if cfg["threads"] > 1 and cfg["version"] != "parallel":
        return False
    if cfg["isa"] not in _isas_here():
        return False
    return all(cfg[knob] <= _cover(knob, int(shape[dim])) for knob, dim in _DIM.items())


def default(shape: tunable.Shape) -> tunable.Config:
    isa = str(_gemm().isa()) if backends.C_available("gemm") else "scalar"
    blocks = _DEFAULTS.get(isa, {"mc": 144, "kc": 256, "nc": 4096})
    threads = min(max(_threads.max_threads(), 1), PARAMS[-1].values[-1])
    cfg: dict[str, Any] = {"version": "parallel", "isa": isa, "threads": threads}
    for knob, dim in _DIM.items():
        cfg[knob] = min(blocks[knob], _cover(knob, int(shape[dim])))
    return cfg


def build(cfg: Mapping[str, Any]) -> Any:
    version, isa, threads = cfg["version"], cfg["isa"], int(cfg["threads"])
    mc, kc, nc = int(cfg["mc"]), int(cfg["kc"]), int(cfg["nc"])

    def fn(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return _gemm().matmul(a, b, version, isa, threads, mc=mc, kc=kc, nc=nc)

    fn.__name__ = f"matmul_{version}_{isa}_t{threads}_mc{mc}_kc{kc}_nc{nc}"
    return fn


def extra_features(cfg: Mapping[str, Any], shape: tunable.Shape) -> dict[str, float]:
    m, k, n = int(shape["M"]), int(shape["K"]), int(shape["N"])
    mc, kc, nc = min(cfg["mc"], m), min(cfg["kc"], k), min(cfg["nc"], n)
    blocks = math.ceil(m / mc) * math.ceil(n / nc)
    return {
        "intensity": 2.0 * m * n * k / (4.0 * (m * k + k * n + m * n)),
        "log2_a_block_bytes": math.log2(mc * kc * 4),
        "log2_b_panel_bytes": math.log2(kc * nc * 4),
        "blocks_per_thread": blocks / int(cfg["threads"]),
    }


SPACE = tunable.declare(
    tunable.Space(
        op=OP,
        params=PARAMS,
        build=build,
        shape_of=shape_of,
        make_args=make_args,
        default=default,
        valid=valid,
        backend="cpp",
        extra_features=extra_features,
        description="C++ packed GEMM (simd / parallel rungs): micro-kernel ISA, cache blocks mc/kc/nc, threads",
    )
)
