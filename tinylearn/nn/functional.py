"""``tinylearn.nn.functional`` (import as F): stateless ops used by the layers.

Activations are Tensor methods (VJPs in tinylearn/autograd/ops_*.py); softmax, gelu, layer_norm and
scaled_dot_product_attention run the registered fused kernels (functional_fused.py); linear, losses, norms,
dropout and embedding are fused Functions here and in functional_loss.py / functional_norm.py.
conv2d / max_pool2d / avg_pool2d are the im2col autograd Functions of tinylearn.conv (tinylearn/conv/functional.py);
nn.MaxPool2d runs max pooling through a direct C++ kernel in the common case (functional_pool.py).

    dropout (training)   y = x * m / (1 - p),  m ~ Bernoulli(1 - p)       dx = g * m / (1 - p)
    embedding            y = W[idx]                                       dW = scatter-add of g into rows idx
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from ..autograd.function import Function
from ..autograd.linalg import Linear as _LinearFn
from ..autograd.ops_index import index_add_rows
from ..autograd.tensor import Tensor
from ..conv.functional import avg_pool2d, conv2d, max_pool2d  # noqa: F401  (im2col implementation)
from . import functional_fused as _fused
from .functional_act import *  # noqa: F403  (activations, one_hot)
from .functional_attention import scaled_dot_product_attention  # noqa: F401
from .functional_dropout import DropoutFn, dropout  # noqa: F401  (DropoutFn: kept importable from here)
from .functional_extra import *  # noqa: F403  (more losses, group_norm, pad)
from .functional_loss import cross_entropy, mse_loss
from .functional_norm import batch_norm, layer_norm
from .functional_spatial import *  # noqa: F403  (conv1d/3d, conv_transpose, 1d/3d/adaptive pools, interpolate)


def relu(x: Tensor) -> Tensor:
    return x.relu()


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """torch's gelu on the registered ``kernels.bias_gelu`` kernel (functional_fused.py), with autograd."""
    return _fused.GELU.apply(x, approximate=approximate)


def sigmoid(x: Tensor) -> Tensor:
    return x.sigmoid()


def tanh(x: Tensor) -> Tensor:
    return x.tanh()


def _implicit_dim(name: str, x: Any, dim: Any) -> Any:
    """torch's legacy ``dim=None`` for F.softmax / F.log_softmax: a deprecation warning and dim 0 for 0-, 1- and 3-d
    input, else 1 (torch.nn.functional._get_softmax_dim)."""
    if dim is not None:
        return dim
    warnings.warn(
        f"Implicit dimension choice for {name} has been deprecated. Change the call to include dim=X as an argument.",
        UserWarning,
        stacklevel=3,
    )
    return 0 if np.ndim(x.data if isinstance(x, Tensor) else x) in (0, 1, 3) else 1


def softmax(x: Tensor, dim: int | None = -1) -> Tensor:
    """torch's softmax on the registered ``kernels.softmax`` kernel (functional_fused.py), with autograd."""
    return _fused.Softmax.apply(x, dim=_implicit_dim("softmax", x, dim))


def log_softmax(x: Tensor, dim: int | None = -1) -> Tensor:
    return x.log_softmax(_implicit_dim("log_softmax", x, dim))


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """y = x @ weight.T + bias (weight [out, in], like torch)."""
    return _LinearFn.apply(x, weight, bias)


class EmbeddingFn(Function):
    @staticmethod
    def forward(ctx, weight, idx):
        idx = np.asarray(idx)
        if idx.dtype.kind not in "iu":
            raise TypeError(f"embedding: indices must be integers, got dtype {idx.dtype}")
        n = weight.shape[0]
        bad = (idx < 0) | (idx >= n)
        if bad.any():
            raise ValueError(
                f"embedding: index {int(idx[bad][0])} is out of range [0, {n}) (weight shape {weight.shape})"
            )
        ctx.save_for_backward(idx)
        ctx.wshape = weight.shape
        return weight[idx]

    @staticmethod
    def backward(ctx, g):
        (idx,) = ctx.saved_tensors
        gw = np.zeros(ctx.wshape, dtype=g.dtype)
        index_add_rows(gw, idx.reshape(-1), g.reshape(-1, ctx.wshape[1]))
        return gw, None


def embedding(idx: Any, weight: Tensor) -> Tensor:
    """Rows of ``weight`` [num_embeddings, dim] selected by integer ``idx`` (any shape)."""
    if isinstance(idx, Tensor):
        idx = idx.data
    return EmbeddingFn.apply(weight, idx)


__all__ = [
    "relu",
    "gelu",
    "sigmoid",
    "tanh",
    "softmax",
    "log_softmax",
    "linear",
    "conv2d",
    "max_pool2d",
    "avg_pool2d",
    "batch_norm",
    "layer_norm",
    "dropout",
    "embedding",
    "cross_entropy",
    "mse_loss",
]
