"""Random test inputs, including the memory layouts that break naive kernels.

``make_layouts(shape)`` yields arrays with the *same logical shape and values* in different layouts:
contiguous, Fortran order (transposed storage), strided (every other element of a larger buffer), a
negative-stride view, and a broadcast (stride-0) view when the shape allows it. An op must give the same result
for all of them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from .._inputs import as_int

LAYOUTS = ("contiguous", "fortran", "strided", "reversed", "broadcast")
_DTYPES = ("float16", "float32", "float64", "int8", "uint8", "int32", "int64")


def make_array(
    shape: Sequence[int],
    dtype: str = "float32",
    seed: int = 0,
    low: float = -1.0,
    high: float = 1.0,
    layout: str = "contiguous",
) -> np.ndarray:
    """Uniform random array in [low, high) (integers: randint) with the given logical ``shape`` and ``layout``."""
    if isinstance(shape, str | bytes) or not isinstance(shape, Sequence | np.ndarray):
        raise TypeError(f"shape: expected a sequence of ints, got {type(shape).__name__} {shape!r}")
    shape = tuple(as_int(s, "shape", min=0) for s in shape)
    if dtype not in _DTYPES:
        raise ValueError(f"dtype: unknown dtype {dtype!r}; known: {list(_DTYPES)}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout: unknown layout {layout!r}; known: {list(LAYOUTS)}")
    rng = np.random.default_rng(seed)

    def draw(shp: tuple[int, ...]) -> np.ndarray:
        if np.issubdtype(np.dtype(dtype), np.integer):
            info = np.iinfo(dtype)
            lo, hi = max(int(low), info.min), min(int(high), info.max)
            if hi <= lo:
                lo, hi = info.min, info.max
            return rng.integers(lo, hi, size=shp, endpoint=True).astype(dtype)
        return rng.uniform(low, high, size=shp).astype(dtype)

    if layout == "contiguous":
        return draw(shape)
    if layout == "fortran":
        return np.asfortranarray(draw(shape))
    if layout == "strided":
        big = draw(tuple(2 * s for s in shape))
        return big[tuple(slice(None, None, 2) for _ in shape)]
    if layout == "reversed":
        return draw(shape)[tuple(slice(None, None, -1) for _ in shape)]
    # broadcast: values along the first axis of size > 1 are repeated with stride 0
    axis = next((i for i, s in enumerate(shape) if s > 1), None)
    if axis is None:
        return draw(shape)
    small = list(shape)
    small[axis] = 1
    return np.broadcast_to(draw(tuple(small)), shape)


def make_layouts(
    shape: Sequence[int], dtype: str = "float32", seed: int = 0, low: float = -1.0, high: float = 1.0
) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (layout name, array) for every layout in LAYOUTS, all with the same logical ``shape``.

    Values differ between layouts (each is drawn independently): compare an op on each against the oracle on
    ``np.ascontiguousarray`` of the same array.
    """
    for i, layout in enumerate(LAYOUTS):
        yield layout, make_array(shape, dtype, seed=seed + i, low=low, high=high, layout=layout)


def broadcast_shape_pairs(
    seed: int = 0, n: int = 20, max_ndim: int = 4, max_dim: int = 5
) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Random pairs of shapes that broadcast together (numpy/torch rules), including rank mismatch and 1-dims."""
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(n):
        ndim = int(rng.integers(1, max_ndim + 1))
        full = [int(rng.integers(1, max_dim + 1)) for _ in range(ndim)]
        a = [d if rng.random() < 0.7 else 1 for d in full]
        b = [d if rng.random() < 0.7 else 1 for d in full]
        a = a[int(rng.integers(0, ndim)) :] if rng.random() < 0.3 else a
        b = b[int(rng.integers(0, ndim)) :] if rng.random() < 0.3 else b
        pairs.append((tuple(a), tuple(b)))
    return pairs
