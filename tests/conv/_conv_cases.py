"""Shared conv2d test inputs for tests/test_conv*.py (imported by module name: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import numpy as np


def conv_case(c: tuple, dtype: str, seed: int = 0) -> tuple:
    """Random (x, w, b, stride, padding, dilation, groups) for a case (N, C, H, W, OC, kernel, stride, padding,
    dilation, groups); w is scaled by 1/sqrt(fan-in) so outputs stay O(1) for any reduction size."""
    N, C, H, W, OC, k, s, p, d, g = c
    kk = (k, k) if isinstance(k, int) else k
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, C, H, W)).astype(dtype)
    w = (rng.standard_normal((OC, C // g) + kk) / np.sqrt(C // g * kk[0] * kk[1])).astype(dtype)
    b = rng.standard_normal(OC).astype(dtype)
    return x, w, b, s, p, d, g
