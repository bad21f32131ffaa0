"""The search space of ``quant.int8_gemm`` (topic 17): which exact int8 kernel of the C++ ladder runs a shape.

One knob, ``version``: ``auto`` (what ``backend=None`` runs: the best path this CPU has) and the code paths
``avx512vnni``, ``avx2_madd16``, ``avx2``, ``scalar`` (``valid`` keeps those this CPU runs:
``gemm.int8_gemm_versions()``). Every version is exact (int32 accumulation), so the reference (the op's numpy
backend, an int32 matmul) must match bit for bit; only the time differs: per-call B packing costs more at few
rows, VNNI's dpbusd quads win once the packing is amortised.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import backends, tunable
from .gemm import GEMM_OP, VERSIONS, int8_gemm_versions


def shape_of(a: np.ndarray, b: np.ndarray, *_: Any, **__: Any) -> tunable.Shape:
    return {"M": int(a.shape[0]), "K": int(a.shape[1]), "N": int(b.shape[1])}


def make_args(shape: tunable.Shape, rng: Any) -> tuple[tuple, dict]:
    m, k, n = int(shape["M"]), int(shape["K"]), int(shape["N"])
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    return (a, rng.integers(-128, 128, (k, n), dtype=np.int8)), {}


def valid(cfg: Mapping[str, Any], shape: tunable.Shape) -> bool:
    return cfg["version"] == "auto" or (backends.C_available("quant") and cfg["version"] in int8_gemm_versions())


SPACE = tunable.declare(
    tunable.Space(
        op=GEMM_OP,
        params=(tunable.Param("version", VERSIONS),),
        build=lambda cfg: backends.resolve(GEMM_OP, "cpp", cfg["version"])[2],
        shape_of=shape_of,
        make_args=make_args,
        default=lambda shape: {"version": "auto"},
        valid=valid,
        description="exact int8 GEMM: the C++ path (auto, avx512vnni, avx2_madd16, avx2, scalar) this CPU runs",
    )
)
