"""``Parameter``: a Tensor that a Module registers automatically when assigned as an attribute."""

from __future__ import annotations

from typing import Any

from ..autograd.tensor import Tensor


class Parameter(Tensor):
    """A leaf Tensor with requires_grad=True by default; ``Module.__setattr__`` registers it in ``_parameters``."""

    def __init__(self, data: Any, requires_grad: bool = True, dtype: Any = None) -> None:
        super().__init__(data, requires_grad=requires_grad, dtype=dtype)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()
