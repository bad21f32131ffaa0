"""``Parameter``: a Tensor that a Module registers automatically when assigned as an attribute."""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from ..autograd.errors import OutOfMemoryError
from ..autograd.tensor import Tensor


class Parameter(Tensor):
    """A leaf Tensor with requires_grad=True by default; ``Module.__setattr__`` registers it in ``_parameters``."""

    def __init__(self, data: Any, requires_grad: bool = True, dtype: Any = None) -> None:
        super().__init__(data, requires_grad=requires_grad, dtype=dtype)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()


def _memory_bytes() -> int:
    """This machine's physical memory in bytes (0 where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def empty_parameter(shape: tuple[int, ...], dtype: Any, args: str) -> Parameter:
    """An uninitialised Parameter of ``shape``, after checking that it fits in memory: a layer built with a huge size
    (``Linear(2**40, 2)``) raises MemoryError naming ``args`` (the layer's size arguments, ``"in_features=..."``) and
    the bytes, before numpy is asked (which says "array is too big" or may overcommit and be killed at init). The
    error is an OutOfMemoryError: a RuntimeError like torch's allocator error, and a MemoryError."""
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    ram = _memory_bytes()
    if nbytes > np.iinfo(np.intp).max or (ram and nbytes > ram):
        raise OutOfMemoryError(
            f"{args}: the weight of shape {shape} needs {nbytes} bytes of {np.dtype(dtype)}, more than this machine's "
            f"{ram} bytes of memory"
        )
    try:
        arr = np.empty(shape, dtype=dtype)
    except (MemoryError, ValueError) as e:
        raise OutOfMemoryError(f"{args}: cannot allocate the weight of shape {shape} ({nbytes} bytes): {e}") from e
    return Parameter(arr)


def weight_and_bias(module: Any, shape: tuple[int, ...], bias_size: int, bias: bool, dtype: Any, args: str) -> None:
    """Linear's and the conv layers' parameters: ``module.weight`` (uninitialised, checked by ``empty_parameter``)
    and ``module.bias`` of ``bias_size`` (or a registered None when ``bias`` is False)."""
    module.weight = empty_parameter(shape, dtype, args)
    if bias:
        module.bias = Parameter(np.empty(bias_size, dtype=dtype))
    else:
        module.register_parameter("bias", None)
