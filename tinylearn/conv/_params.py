"""Argument parsing and validation shared by every conv/pool entry point.

Output size of a windowed op along one axis (torch's formula, floor mode):

    out = floor((in + 2*pad - dil*(k - 1) - 1) / stride) + 1

It must be >= 1, i.e. the dilated kernel ``dil*(k-1)+1`` must fit in the padded input ``in + 2*pad``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import backends
from .._inputs import as_array

Pair = tuple[int, int]
BACKENDS = ("numpy", "numba", "cpp")
_INDEX_LIMIT = 2**62  # every size/offset a backend computes stays below this, so int64 arithmetic cannot overflow


def pair(value: Any, name: str) -> Pair:
    """``int`` or length-2 sequence of ints -> (a, b); anything else raises TypeError/ValueError naming ``name``."""
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected int or pair of ints, got bool {value!r}")
    if isinstance(value, int | np.integer):
        return int(value), int(value)
    if (
        isinstance(value, tuple | list)
        and len(value) == 2
        and all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in value)
    ):
        return int(value[0]), int(value[1])
    raise TypeError(f"{name}: expected int or pair of ints, got {value!r}")


def conv_out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    """floor((size + 2p - d(k-1) - 1)/s) + 1 (may be <= 0 when the kernel does not fit; callers validate)."""
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def conv_output_size(size: int, kernel: int, stride: int = 1, padding: int = 0, dilation: int = 1) -> int:
    """Validated output length along one axis: ValueError (naming the argument) when the kernel does not fit."""
    window_params((1, 1, size, 1), (kernel, 1), (stride, 1), (padding, 0), (dilation, 1), "size")
    return conv_out_size(size, kernel, stride, padding, dilation)


def window_params(
    shape: tuple[int, ...], kernel_size: Any, stride: Any, padding: Any, dilation: Any, what: str = "x"
) -> tuple[Pair, Pair, Pair, Pair, Pair]:
    """Validate (kernel, stride, padding, dilation) against an NCHW ``shape``; returns them and (OH, OW)."""
    k = pair(kernel_size, "kernel_size")
    s = pair(stride, "stride")
    p = pair(padding, "padding")
    d = pair(dilation, "dilation")
    if len(shape) != 4:
        raise ValueError(f"{what}: expected a 4-D [N, C, H, W] array, got shape {tuple(shape)}")
    for v in shape:
        if isinstance(v, bool | np.bool_) or not isinstance(v, int | np.integer):
            raise TypeError(f"{what}: sizes must be ints, got {type(v).__name__} {v!r} in shape {tuple(shape)}")
    if min(k) < 1:
        raise ValueError(f"kernel_size: must be positive, got {k}")
    if min(s) < 1:
        raise ValueError(f"stride: must be positive, got {s}")
    if min(d) < 1:
        raise ValueError(f"dilation: must be positive, got {d}")
    if min(p) < 0:
        raise ValueError(f"padding: must be non-negative, got {p}")
    H, W = shape[2], shape[3]
    eff = (d[0] * (k[0] - 1) + 1, d[1] * (k[1] - 1) + 1)
    if eff[0] > H + 2 * p[0] or eff[1] > W + 2 * p[1]:
        raise ValueError(
            f"kernel_size: dilated kernel {eff} (kernel_size={k}, dilation={d}) is larger than the padded input "
            f"{(H + 2 * p[0], W + 2 * p[1])} ({what} shape {tuple(shape)}, padding={p})"
        )
    for name, v in (("padding", (H + 2 * p[0], W + 2 * p[1])), ("dilation", eff)):
        if max(v) > _INDEX_LIMIT:
            raise ValueError(f"{name}: padded/dilated size {v} exceeds 2**62 ({what} shape {tuple(shape)})")
    out = (conv_out_size(H, k[0], s[0], p[0], d[0]), conv_out_size(W, k[1], s[1], p[1], d[1]))
    n_out = int(np.prod([int(v) for v in shape[:2]], dtype=object)) * k[0] * k[1] * out[0] * out[1]
    if n_out * 8 > _INDEX_LIMIT:
        raise ValueError(
            f"padding/stride: the unfolded output [N, C*kh*kw, OH*OW] with (OH, OW)={out} has {n_out} elements, "
            f"beyond what int64 byte offsets can index ({what} shape {tuple(shape)}, padding={p}, stride={s})"
        )
    # a stride beyond the padded size gives the same single output position: clamp it, and a single kernel tap
    # never uses its dilation, so no backend multiplies by a huge value (stride=2**62 is valid, torch accepts it)
    s = (min(s[0], H + 2 * p[0]), min(s[1], W + 2 * p[1]))
    d = (d[0] if k[0] > 1 else 1, d[1] if k[1] > 1 else 1)
    return k, s, p, d, out


def cpp_available() -> bool:
    """Whether the compiled conv kernels (tinylearn._C.conv) are built."""
    return backends.C_available("conv")


def check_backend(backend: str | None) -> str | None:
    """Early check of a conv ``backend=`` (None = the registry picks per input); ValueError for unknown names."""
    if backend is None:
        return None
    name = backends.canonical(backend)
    if name not in BACKENDS:
        raise ValueError(f"backend: unknown backend {backend!r} for conv; known: {list(BACKENDS)}")
    return name


def as_float_array(x: Any, name: str) -> np.ndarray:
    """numpy float array (float16/32/64 kept, ints and bools -> float32); TypeError for non-numeric input."""
    a = as_array(x, name, dtypes=("f", "i", "u", "b"))
    if a.dtype.kind in "iub":
        return a.astype(np.float32)
    if a.dtype.kind != "f":
        raise TypeError(f"{name}: expected a real floating array, got dtype {a.dtype}")
    return a


def ntuple(value: Any, n: int, name: str) -> tuple[int, ...]:
    """``int`` or length-``n`` sequence of ints -> n-tuple; TypeError naming ``name`` otherwise (``pair`` for n-d)."""
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected int or {n}-tuple of ints, got bool {value!r}")
    if isinstance(value, int | np.integer):
        return (int(value),) * n
    if (
        isinstance(value, tuple | list)
        and len(value) == n
        and all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in value)
    ):
        return tuple(int(v) for v in value)
    raise TypeError(f"{name}: expected int or {n}-tuple of ints, got {value!r}")


def window_params_nd(
    spatial: tuple[int, ...], kernel_size: Any, stride: Any, padding: Any, dilation: Any, what: str = "input"
) -> tuple[tuple[int, ...], ...]:
    """n-d version of ``window_params`` on the spatial sizes only: validated (k, s, p, d, out) n-tuples."""
    n = len(spatial)
    k = ntuple(kernel_size, n, "kernel_size")
    s = ntuple(stride, n, "stride")
    p = ntuple(padding, n, "padding")
    d = ntuple(dilation, n, "dilation")
    if min(k) < 1:
        raise ValueError(f"kernel_size: must be positive, got {k}")
    if min(s) < 1:
        raise ValueError(f"stride: must be positive, got {s}")
    if min(d) < 1:
        raise ValueError(f"dilation: must be positive, got {d}")
    if min(p) < 0:
        raise ValueError(f"padding: must be non-negative, got {p}")
    eff = tuple(d[i] * (k[i] - 1) + 1 for i in range(n))
    padded = tuple(spatial[i] + 2 * p[i] for i in range(n))
    if any(eff[i] > padded[i] for i in range(n)):
        raise ValueError(
            f"kernel_size: dilated kernel {eff} (kernel_size={k}, dilation={d}) is larger than the padded input "
            f"{padded} ({what} spatial size {tuple(spatial)}, padding={p})"
        )
    if max(padded + eff) > _INDEX_LIMIT:
        raise ValueError(f"padding/dilation: padded/dilated size exceeds 2**62 ({what} spatial size {spatial})")
    out = tuple(conv_out_size(spatial[i], k[i], s[i], p[i], d[i]) for i in range(n))
    s = tuple(min(s[i], padded[i]) for i in range(n))
    d = tuple(d[i] if k[i] > 1 else 1 for i in range(n))
    return k, s, p, d, out
