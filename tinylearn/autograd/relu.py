"""ReLU on arrays, two registered ops (``tinylearn.backends``) with a numpy and a C++ implementation each.

    autograd.relu            numpy: np.where select       cpp: cpp_src/kernels_relu.cpp, one pass, keeps the layout
                                                          (C-contiguous bfloat16: cpp_src/amp_bf16.cpp on the bits)
    autograd.relu_backward   numpy "select" (default): torch's exact threshold_backward (np.where)
                             numpy "mul": g * (y > 0), the A/B baseline (torch's values wherever g and y are finite;
                             NaN/inf g where y <= 0 gives NaN, and -0.0 for negative g)
                             cpp: the one-pass select with no temporary (~9 us vs ~20 us for "mul" at [128, 512])

``backend=None`` takes cpp for float32/float64 numpy arrays when ``_C.kernels`` has the ReLU kernels, else numpy
"select". Pin another with ``backends.use("autograd.relu_backward", backend="numpy", version="mul")`` (this
replaces the old module switch ``RELU_BACKWARD_KERNEL``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import backends

RELU = "autograd.relu"
RELU_BACKWARD = "autograd.relu_backward"


def _has_kernels() -> bool:
    """_C.kernels is built and has the ReLU kernels (cpp_src/kernels_relu.cpp)."""
    return backends.C_available("kernels") and hasattr(backends.load_C("kernels"), "relu_backward")


def _fits(a: Any) -> bool:
    return type(a) is np.ndarray and a.dtype.char in "fd"  # float32 / float64


def _fits_backward(g: Any, y: Any) -> bool:
    return _fits(g) and _fits(y) and g.dtype == y.dtype and g.shape == y.shape


def _bf16(a: Any) -> bool:
    """A C-contiguous bfloat16 array (autocast's activations): _C.amp's kernels work on its uint16 bit patterns."""
    return type(a) is np.ndarray and a.dtype.kind == "V" and a.dtype.name == "bfloat16" and a.flags.c_contiguous


def _has_bf16_kernels() -> bool:
    return backends.C_available("amp") and hasattr(backends.load_C("amp"), "relu_backward")


def _fits_any(a: Any) -> bool:
    return _fits(a) or (_bf16(a) and _has_bf16_kernels())


def _fits_backward_any(g: Any, y: Any) -> bool:
    if _bf16(g) and _bf16(y):
        return g.shape == y.shape and _has_bf16_kernels()
    return _fits_backward(g, y)


def _relu_numpy(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "f":
        return np.where(a < 0, np.zeros((), a.dtype), a)
    return np.maximum(a, a.dtype.type(0))


def _relu_cpp(a: np.ndarray) -> np.ndarray:
    if _bf16(a) and _has_bf16_kernels():
        out = np.empty(a.shape, np.uint16)
        backends.load_C("amp").relu(a.view(np.uint16), out)
        return out.view(a.dtype)
    if not _fits(a):
        return _relu_numpy(a)
    k = backends.load_C("kernels")
    out = np.empty_like(a)
    if not k.relu_forward(a, out):  # a layout the kernel declines: copy into out's layout, then in place
        out[...] = a
        if not k.relu_forward(out, out):
            return _relu_numpy(a)
    return out


def _select_numpy(g: np.ndarray, y: np.ndarray) -> np.ndarray:
    g = np.asarray(g)
    return np.where(y <= 0, np.zeros((), g.dtype), g)  # exact select (slow: ~175 us at [128, 512])


def _mul_numpy(g: np.ndarray, y: np.ndarray) -> np.ndarray:
    if np.asarray(g).dtype.kind != "f":
        return _select_numpy(g, y)
    return g * (y > 0)


def _select_cpp(g: np.ndarray, y: np.ndarray) -> np.ndarray:
    if _bf16(g) and _bf16(y) and g.shape == y.shape and _has_bf16_kernels():
        out = np.empty(y.shape, np.uint16)
        backends.load_C("amp").relu_backward(g.view(np.uint16), y.view(np.uint16), out)
        return out.view(y.dtype)
    if not _fits_backward(g, y):
        return _select_numpy(g, y)
    k = backends.load_C("kernels")
    out = np.empty_like(y)
    if not k.relu_backward(g, y, out):  # e.g. the broadcast g of sum(): copy into y's layout, then in place
        out[...] = g
        if not k.relu_backward(out, y, out):
            return _select_numpy(g, y)
    return out


def _example_forward(rng: Any) -> tuple[tuple, dict]:
    return (rng.standard_normal((5, 37)).astype(np.float32),), {}


def _example_backward(rng: Any) -> tuple[tuple, dict]:
    y = np.maximum(rng.standard_normal((5, 37)), 0).astype(np.float32)
    return (rng.standard_normal((5, 37)).astype(np.float32), y), {}


backends.register(RELU, "numpy", _relu_numpy, example=_example_forward)
backends.register(RELU, "cpp", _relu_cpp, when=_fits_any, available=_has_kernels)
backends.register(RELU_BACKWARD, "numpy", _select_numpy, version="select", example=_example_backward)
backends.register(RELU_BACKWARD, "numpy", _mul_numpy, version="mul")
backends.register(RELU_BACKWARD, "cpp", _select_cpp, version="select", when=_fits_backward_any, available=_has_kernels)


def relu_array(a: np.ndarray) -> np.ndarray:
    """torch.relu on an array: 0 where a < 0, else a (NaN and -0.0 pass through). On the C++ path the result keeps
    a's memory layout (np.empty_like, order K; a layout the kernel declines is first copied into the output)."""
    return backends.dispatch(RELU, a)


def relu_backward_array(g: np.ndarray, y: np.ndarray) -> np.ndarray:
    """torch's threshold_backward(g, y, 0) from the saved ReLU output y: 0 where y <= 0, else g (g = NaN/inf where
    y <= 0 gives 0; y = NaN passes g). The C++ select writes an array of y's layout (a g the kernel cannot read row
    by row, e.g. sum()'s broadcast gradient, is copied into it first)."""
    return backends.dispatch(RELU_BACKWARD, g, y)
