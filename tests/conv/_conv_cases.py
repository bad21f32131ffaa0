"""Shared conv2d test inputs for tests/test_conv*.py (imported by module name: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np

from tinylearn import backends

# the conv ops the autograd Functions dispatch, pinned together by ``pinned`` (conv2d's backward runs what its
# forward resolved; conv.max_pool2d's numpy / numba versions are the im2col windows with that backend's col2im)
CONV_OPS = ("conv.im2col", "conv.col2im", "conv.conv2d", "conv.max_pool2d")


@contextlib.contextmanager
def pinned(backend: str | None, version: str | None = None, ops: tuple[str, ...] = CONV_OPS) -> Iterator[str | None]:
    """``backends.use`` on every conv op at once (what the autograd Functions run); None = the registry's choice.
    ``version`` applies to the ops that have it (conv.conv2d's cpp ladder)."""
    with contextlib.ExitStack() as stack:
        for op in ops:
            v = version if version is not None and version in backends.versions(op, backend or "numpy") else None
            stack.enter_context(backends.use(op, backend=backend, version=v))
        yield backend


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
