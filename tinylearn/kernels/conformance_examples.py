"""Conformance inputs of the fused kernels' registered ops (tests/common/test_conformance.py runs every backend and
version of ``kernels.<op>`` on them against the numpy reference): rng -> (args, kwargs) per op, in the kernels'
canonical shapes (2-D rows, [N, C, L] for group_norm, 3-D [BH, N, D] for attention)."""

from __future__ import annotations

from typing import Any

import numpy as np


def conformance_examples() -> dict[str, Any]:
    """rng -> (args, kwargs) per op (see the module docstring)."""

    def rows(rng: Any, r: int = 5, c: int = 37) -> np.ndarray:
        return rng.standard_normal((r, c)).astype(np.float32)

    def ln_bwd(rng: Any) -> tuple[tuple, dict]:
        from . import reference

        x, w, b = rows(rng), rows(rng, 1)[0], rows(rng, 1)[0]
        _, mean, rstd = reference.layer_norm(x, w, b, 1e-5)
        return (rows(rng), x, w, mean, rstd), {}

    def gn(rng: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return rng.standard_normal((3, 6, 35)).astype(np.float32), rows(rng, 1, 6)[0], rows(rng, 1, 6)[0]

    def gn_bwd(rng: Any) -> tuple[tuple, dict]:
        from . import reference

        x, w, b = gn(rng)
        _, mean, rstd = reference.group_norm(x, w, b, 3, 1e-5)
        return (rng.standard_normal(x.shape).astype(np.float32), x, w, mean, rstd, 3), {}

    def attn(rng: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return tuple(rng.standard_normal((2, n, 16)).astype(np.float32) for n in (9, 11, 11))

    def attn_bwd(rng: Any) -> tuple[tuple, dict]:
        from . import reference

        q, k, v = attn(rng)
        o, lse = reference.attention(q, k, v, True, 64)
        return (q, k, v, o, lse, rng.standard_normal(o.shape).astype(np.float32), True, 64), {}

    def ce(rng: Any) -> tuple[np.ndarray, np.ndarray]:  # ignored rows (-100) and a label in the last column
        t = rng.integers(0, 37, 5)
        t[1], t[3] = -100, 36
        return rows(rng) * 3, t

    def ce_bwd(rng: Any) -> tuple[tuple, dict]:
        from . import reference

        x, t = ce(rng)
        _, stats, _ = reference.cross_entropy(x, t, -100, 0.1)
        return (x, stats, t, rng.standard_normal(5).astype(np.float32), -100, 0.1), {}

    def bn(rng: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return rng.standard_normal((4, 6, 9)).astype(np.float32) * 2 + 1, rows(rng, 1, 6)[0], rows(rng, 1, 6)[0]

    def bn_bwd(rng: Any) -> tuple[tuple, dict]:
        from . import reference

        x, w, b = bn(rng)
        _, mean, invstd, _ = reference.batch_norm(x, w, b, None, None, 1e-5)
        return (rng.standard_normal(x.shape).astype(np.float32), x, w, mean, invstd, True), {}

    return {
        "softmax": lambda rng: ((rows(rng),), {}),
        "softmax_backward": lambda rng: ((np.abs(rows(rng)) / 37, rows(rng)), {}),
        "log_softmax": lambda rng: ((rows(rng) * 4,), {}),
        "log_softmax_backward": lambda rng: ((np.log(np.abs(rows(rng)) / 37), rows(rng)), {}),
        "layer_norm": lambda rng: ((rows(rng), rows(rng, 1)[0], rows(rng, 1)[0], 1e-5), {}),
        "layer_norm_backward": ln_bwd,
        "group_norm": lambda rng: ((*gn(rng), 3, 1e-5), {}),
        "group_norm_backward": gn_bwd,
        "bias_gelu": lambda rng: ((rows(rng), rows(rng, 1)[0], "none"), {}),
        "bias_gelu_backward": lambda rng: ((rows(rng), rows(rng), rows(rng, 1)[0], "tanh"), {}),
        "attention": lambda rng: ((*attn(rng), True, 64), {}),
        "attention_backward": attn_bwd,
        "cross_entropy": lambda rng: ((*ce(rng), -100, 0.1), {}),
        "cross_entropy_backward": ce_bwd,
        "batch_norm": lambda rng: ((*bn(rng), None, None, 1e-5), {}),
        "batch_norm_backward": bn_bwd,
    }
