"""Argument parsing and validation shared by every conv/pool entry point.

Output size of a windowed op along one axis (torch's formula, floor mode):

    out = floor((in + 2*pad - dil*(k - 1) - 1) / stride) + 1

It must be >= 1, i.e. the dilated kernel ``dil*(k-1)+1`` must fit in the padded input ``in + 2*pad``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from .. import backends
from .._inputs import as_array

Pair = tuple[int, int]
BACKENDS = ("numpy", "numba", "cpp")
_INDEX_LIMIT = 2**62  # every size/offset a backend computes stays below this, so int64 arithmetic cannot overflow


_F = TypeVar("_F", bound=Callable[..., Any])
_PLAIN = (int, bool, str, type(None))  # argument types a memoised validation may key on (bool: ceil_mode)
_MEMO_MAX = 4096  # entries per memoised function: distinct layer geometries of a process, not calls


def _plain(v: Any) -> bool:
    return type(v) in _PLAIN or (type(v) is tuple and all(type(e) is int for e in v))


def memo_geometry(fn: _F) -> _F:
    """Memoise a validation that is a pure function of plain arguments (ints, bools, strs, None, tuples of ints):
    a training step asks the same conv/pool geometry every call (~10 us of checks each, 6 per step of a small CNN).
    The key holds each argument's type, so ``True`` never hits an entry made for ``1`` (bools are refused where a
    size is expected); anything else (lists, numpy ints, floats) runs the checks every time, and errors are never
    cached."""
    cache: dict[Any, Any] = {}

    @functools.wraps(fn)
    def wrapped(*args: Any, **kw: Any) -> Any:
        vals = args + tuple(kw.values())
        if not all(_plain(v) for v in vals):
            return fn(*args, **kw)
        key = (args, tuple(kw.items()), tuple(map(type, vals)))
        hit = cache.get(key)
        if hit is None:
            hit = fn(*args, **kw)
            if len(cache) < _MEMO_MAX:
                cache[key] = hit
        return hit

    return wrapped  # type: ignore[return-value]


def pair(value: Any, name: str) -> Pair:
    """``ntuple(value, 2, name)``: int or length-2 sequence of ints -> (a, b) (the 2-D spelling)."""
    return ntuple(value, 2, name)  # type: ignore[return-value]


def conv_out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    """floor((size + 2p - d(k-1) - 1)/s) + 1 (may be <= 0 when the kernel does not fit; callers validate)."""
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def conv_output_size(size: int, kernel: int, stride: int = 1, padding: int = 0, dilation: int = 1) -> int:
    """Validated output length along one axis: ValueError (naming the argument) when the kernel does not fit."""
    window_params_nd((size,), kernel, stride, padding, dilation, "size")
    return conv_out_size(size, kernel, stride, padding, dilation)


def window_params(
    shape: tuple[int, ...], kernel_size: Any, stride: Any, padding: Any, dilation: Any, what: str = "x"
) -> tuple[Pair, Pair, Pair, Pair, Pair]:
    """``window_params_nd`` for an NCHW ``shape``: validated (k, s, p, d, (OH, OW)) pairs."""
    if len(shape) != 4:
        raise ValueError(f"{what}: expected a 4-D [N, C, H, W] array, got shape {tuple(shape)}")
    return window_params_nd(tuple(shape[2:]), kernel_size, stride, padding, dilation, what, lead=tuple(shape[:2]))


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


def as_pool_array(x: Any, name: str) -> np.ndarray:
    """numpy array for a max pool: integer dtypes are kept (torch's max pools keep them), bools -> float32, floats
    kept; TypeError for non-numeric input."""
    a = as_array(x, name, dtypes=("f", "i", "u", "b"))
    return a if a.dtype.kind in "iu" else as_float_array(a, name)


def as_float_array(x: Any, name: str) -> np.ndarray:
    """numpy float array (float16/32/64 kept, ints and bools -> float32); TypeError for non-numeric input."""
    a = as_array(x, name, dtypes=("f", "i", "u", "b"))
    if a.dtype.kind in "iub":
        return a.astype(np.float32)
    if a.dtype.kind != "f":
        raise TypeError(f"{name}: expected a real floating array, got dtype {a.dtype}")
    return a


def as_vector(x: Any, name: str, n: int, what: str) -> np.ndarray:
    """``x`` as a float array of shape ``(n,)`` (``as_float_array``); ValueError naming ``name`` and the ``what`` it
    must match otherwise (a per-channel vector of a weight: bias, BatchNorm statistics, scale / shift)."""
    a = as_float_array(x, name)
    if a.shape != (n,):
        raise ValueError(f"{name}: expected shape ({n},) to match {what}, got {a.shape}")
    return a


def ntuple(value: Any, n: int, name: str) -> tuple[int, ...]:
    """``int`` or length-``n`` sequence of ints -> n-tuple; TypeError naming ``name`` otherwise (the one normaliser
    of kernel_size / stride / padding / dilation for every conv and pool, 1-d to 3-d)."""
    what = "pair" if n == 2 else f"{n}-tuple"
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected int or {what} of ints, got bool {value!r}")
    if isinstance(value, int | np.integer):
        return (int(value),) * n
    if (
        isinstance(value, tuple | list)
        and len(value) == n
        and all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in value)
    ):
        return tuple(int(v) for v in value)
    raise TypeError(f"{name}: expected int or {what} of ints, got {value!r}")


@memo_geometry
def window_params_nd(
    spatial: tuple[int, ...],
    kernel_size: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    what: str = "input",
    lead: tuple[int, ...] = (),
) -> tuple[tuple[int, ...], ...]:
    """Validated (k, s, p, d, out) n-tuples of a windowed op over the spatial sizes ``spatial`` (n = 1, 2, 3).

    ``lead`` (the [N, C] of the input, when known) also bounds the unfolded output [N, C*prod(k), prod(out)] so that
    int64 byte offsets cannot overflow. A stride beyond the padded size gives the same single output position and is
    clamped; a single kernel tap never uses its dilation (set to 1), so no backend multiplies by a huge value."""
    n = len(spatial)
    k = ntuple(kernel_size, n, "kernel_size")
    s = ntuple(stride, n, "stride")
    p = ntuple(padding, n, "padding")
    d = ntuple(dilation, n, "dilation")
    full = tuple(lead) + tuple(spatial)
    for v in full:
        if isinstance(v, bool | np.bool_) or not isinstance(v, int | np.integer):
            raise TypeError(f"{what}: sizes must be ints, got {type(v).__name__} {v!r} in shape {full}")
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
            f"{padded} ({what} shape {full}, padding={p})"
        )
    for name, v in (("padding", padded), ("dilation", eff)):
        if max(v) > _INDEX_LIMIT:
            raise ValueError(f"{name}: padded/dilated size {v} exceeds 2**62 ({what} shape {full})")
    out = tuple(conv_out_size(spatial[i], k[i], s[i], p[i], d[i]) for i in range(n))
    n_out = int(np.prod([int(v) for v in lead], dtype=object)) * int(np.prod(k + out, dtype=object))
    if n_out * 8 > _INDEX_LIMIT:
        raise ValueError(
            f"padding/stride: the unfolded output [N, C*prod(kernel), prod(out)] with out={out} has {n_out} "
            f"elements, beyond what int64 byte offsets can index ({what} shape {full}, padding={p}, stride={s})"
        )
    s = tuple(min(s[i], padded[i]) for i in range(n))
    d = tuple(d[i] if k[i] > 1 else 1 for i in range(n))
    return k, s, p, d, out


@memo_geometry
def pool_params_nd(
    spatial: tuple[int, ...],
    kernel_size: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    ceil_mode: bool = False,
    what: str = "input",
    lead: tuple[int, ...] = (),
) -> tuple[tuple[int, ...], ...]:
    """``window_params_nd`` for a pool: (k, s, p, d, out, extra) n-tuples. stride None (or ``()``) means
    kernel_size; padding is at most half the kernel (torch's rule); ``ceil_mode`` rounds the output size up
    unless the last window would start at or past ``L + p`` (torch's pooling_output_shape), and ``extra`` is the
    right-end padding that last window needs beyond ``p``."""
    n = len(spatial)
    k = ntuple(kernel_size, n, "kernel_size")
    no_stride = stride is None or (isinstance(stride, tuple | list) and len(stride) == 0)
    p = ntuple(padding, n, "padding")
    if min(k) >= 1 and any(p[i] > k[i] // 2 for i in range(n)):
        raise ValueError(
            f"padding: must be at most half of kernel_size {k}, got {p} ({what} shape {tuple(lead) + tuple(spatial)})"
        )
    k, s, p, d, out = window_params_nd(spatial, k, k if no_stride else stride, p, dilation, what, lead)
    if not ceil_mode:
        return k, s, p, d, out, (0,) * n
    ceil, extra = [], []
    for i in range(n):
        o = (spatial[i] + 2 * p[i] - d[i] * (k[i] - 1) - 1 + s[i] - 1) // s[i] + 1
        if (o - 1) * s[i] >= spatial[i] + p[i]:
            o -= 1
        ceil.append(o)
        extra.append(max(0, (o - 1) * s[i] + d[i] * (k[i] - 1) + 1 - (spatial[i] + 2 * p[i])))
    return k, s, p, d, tuple(ceil), tuple(extra)
