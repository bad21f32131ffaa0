"""Reverse-mode automatic differentiation on numpy: ``Tensor``, ``Function`` (custom ops), the engine,
gradcheck, forward-mode ``jvp`` on dual numbers, ``no_grad`` and ``detect_anomaly``.

Chain rule, reverse mode: for L = f_k(...f_1(x)), dL/dx = J_1^T (J_2^T (... J_k^T 1)): each op supplies its
vector-Jacobian product (``Function.backward``) and the engine applies them in reverse topological order.
"""

from . import dual
from .checkpoint import CheckpointError, checkpoint, checkpoint_sequential, recompute_count, reset_recompute_count
from .dual import Dual, jvp
from .engine import topo_sort
from .errors import DimError, ShapeError
from .factory import (
    arange,
    cat,
    full,
    get_rng,
    manual_seed,
    ones,
    ones_like,
    rand,
    randn,
    stack,
    where,
    zeros,
    zeros_like,
)
from .function import Function, unbroadcast
from .grad_mode import detect_anomaly, enable_grad, is_grad_enabled, no_grad
from .gradcheck import gradcheck, numerical_jacobian
from .storage import get_storage_hook, set_storage_hook
from .tensor import Tensor

__all__ = [
    "Tensor",
    "CheckpointError",
    "ShapeError",
    "DimError",
    "checkpoint",
    "checkpoint_sequential",
    "recompute_count",
    "reset_recompute_count",
    "Function",
    "Dual",
    "dual",
    "unbroadcast",
    "cat",
    "stack",
    "where",
    "zeros",
    "ones",
    "full",
    "zeros_like",
    "ones_like",
    "randn",
    "rand",
    "arange",
    "manual_seed",
    "get_rng",
    "no_grad",
    "enable_grad",
    "is_grad_enabled",
    "detect_anomaly",
    "gradcheck",
    "numerical_jacobian",
    "topo_sort",
    "jvp",
    "set_storage_hook",
    "get_storage_hook",
]
