"""The search space of ``conv.conv2d`` (topic 17): which rung of the C++ forward ladder runs a layer.

One knob, ``version``: ``auto`` (what ``backend=None`` runs: the per-layer rule of ``conv2d.py``), ``v0``/``v1``
(im2col + OpenBLAS), ``v2`` (implicit GEMM, packed micro-kernels) and ``v3`` (direct convolution over a
channel-blocked layout where it applies, else v2). The rule in ``auto`` was written from a few measured layers; a
search measures the rungs on *this* layer and machine. The space tunes the registered op on its validated
arguments ``(x, w, b, groups, k, s, p, d, out)``; the shape names the sizes a layer is keyed by (N, C, H, W, OC,
KH: square kernel, S: stride, G: groups; padding KH // 2). Every rung computes the same convolution (reference:
the op's numpy backend, im2col + numpy matmul).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import backends, tunable
from .conv2d import CPP_VERSIONS, _prepare

OP = "conv.conv2d"


def shape_of(x: np.ndarray, w: np.ndarray, b: Any, g: int, k: Any, s: Any, *_: Any, **__: Any) -> tunable.Shape:
    n, c, h, wd = (int(v) for v in x.shape)
    return {"N": n, "C": c, "H": h, "W": wd, "OC": int(w.shape[0]), "KH": int(k[0]), "S": int(s[0]), "G": int(g)}


def make_args(shape: tunable.Shape, rng: Any) -> tuple[tuple, dict]:
    n, c, h, w = (int(shape[k]) for k in ("N", "C", "H", "W"))
    oc, kh, s, g = (int(shape.get(k, d)) for k, d in (("OC", 0), ("KH", 3), ("S", 1), ("G", 1)))
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = (rng.standard_normal((oc, c // g, kh, kh)) / np.sqrt(c // g * kh * kh)).astype(np.float32)
    b = rng.standard_normal(oc).astype(np.float32)
    return _prepare(x, wt, b, s, kh // 2, 1, g, None), {}


def build(cfg: Mapping[str, Any]) -> Any:
    return backends.resolve(OP, "cpp", cfg["version"])[2]


SPACE = tunable.declare(
    tunable.Space(
        op=OP,
        params=(tunable.Param("version", CPP_VERSIONS),),
        build=build,
        shape_of=shape_of,
        make_args=make_args,
        default=lambda shape: {"version": "auto"},
        description="conv2d forward: the C++ rung (auto rule, v0/v1 im2col+BLAS, v2 implicit GEMM, v3 direct)",
    )
)
