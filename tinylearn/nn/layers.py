"""Layers: thin Modules holding parameters/buffers and calling ``tinylearn.nn.functional``.

Linear: y = x W^T + b with W [out, in] and torch's default init (U(+-1/sqrt(in)) for W and b).
Conv2d / MaxPool2d / AvgPool2d: the 2-D members of the N-d families in ``layers_spatial`` (re-exported here).
BatchNorm2d: normalise per channel with batch stats (training) or running stats (eval); see functional_norm.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from ..autograd.tensor import Tensor
from . import functional as F
from . import init
from .layers_spatial import AvgPool2d, Conv2d, MaxPool2d  # noqa: F401  (re-exported: the N-d families)
from .module import Module
from .parameter import Parameter, empty_parameter, weight_and_bias


def _size(name: str, v: Any, minimum: int) -> int:
    """A layer size: an int (numpy integers ok; bool and float are errors, never truncated) >= ``minimum``."""
    if isinstance(v, bool | np.bool_) or not isinstance(v, int | np.integer):
        raise TypeError(f"{name}: expected an int, got {type(v).__name__} {v!r}")
    if v < minimum:
        raise ValueError(f"{name}: must be >= {minimum}, got {v}")
    return int(v)


class Identity(Module):
    def forward(self, x: Tensor) -> Tensor:
        return x


class Linear(Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype: Any = np.float32) -> None:
        super().__init__()
        in_features, out_features = _size("in_features", in_features, 1), _size("out_features", out_features, 1)
        self.in_features, self.out_features = in_features, out_features
        sizes = f"in_features={in_features}, out_features={out_features}"
        weight_and_bias(self, (out_features, in_features), out_features, bias, dtype, sizes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.reset_weight_and_bias_(self.weight, self.bias)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class _BatchNorm(Module):
    _ndim: tuple[int, ...] = ()

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
    ) -> None:
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        if affine:
            self.weight = Parameter(np.ones(num_features, dtype=np.float32))
            self.bias = Parameter(np.zeros(num_features, dtype=np.float32))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", Tensor(np.zeros(num_features, dtype=np.float32)))
            self.register_buffer("running_var", Tensor(np.ones(num_features, dtype=np.float32)))
            self.register_buffer("num_batches_tracked", Tensor(np.array(0, dtype=np.int64)))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim not in self._ndim:
            raise ValueError(f"{type(self).__name__}: expected input with {self._ndim} dims, got shape {x.shape}")
        if x.shape[1] != self.num_features:
            raise ValueError(f"{type(self).__name__}: input has {x.shape[1]} channels, expected {self.num_features}")
        use_batch = self.training or not self.track_running_stats
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.data = self.num_batches_tracked.data + 1
            if self.momentum is None:  # cumulative moving average, like torch
                momentum = 1.0 / float(self.num_batches_tracked.data)
        return F.batch_norm(
            x,
            self.running_mean if self.track_running_stats else None,
            self.running_var if self.track_running_stats else None,
            self.weight,
            self.bias,
            training=use_batch,
            momentum=momentum,
            eps=self.eps,
        )

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"


class BatchNorm2d(_BatchNorm):
    _ndim = (4,)


class BatchNorm1d(_BatchNorm):
    _ndim = (2, 3)


class LayerNorm(Module):
    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
    ) -> None:
        super().__init__()
        ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.normalized_shape, self.eps = ns, eps
        if elementwise_affine:
            self.weight = Parameter(np.ones(ns, dtype=np.float32))
        else:
            self.register_parameter("weight", None)
        if elementwise_affine and bias:
            self.bias = Parameter(np.zeros(ns, dtype=np.float32))
        else:
            self.register_parameter("bias", None)

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class ReLU(Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.relu()


class GELU(Module):
    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"approximate: must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        # F.gelu: the registered fused kernel (C++ where built) for float32/64; Tensor.gelu is the numpy/scipy op
        return F.gelu(x, approximate=self.approximate)


class Sigmoid(Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.sigmoid()


class Tanh(Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.tanh()


class Flatten(Module):
    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: Tensor) -> Tensor:
        return x.flatten(self.start_dim, self.end_dim)


class Dropout(Module):
    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p: dropout probability must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Embedding(Module):
    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        num_embeddings = _size("num_embeddings", num_embeddings, 0)
        embedding_dim = _size("embedding_dim", embedding_dim, 0)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        sizes = f"num_embeddings={num_embeddings}, embedding_dim={embedding_dim}"
        self.weight = empty_parameter((num_embeddings, embedding_dim), np.float32, sizes)
        init.normal_(self.weight)

    def forward(self, idx: Any) -> Tensor:
        return F.embedding(idx, self.weight)


class Sequential(Module):
    """Modules applied in order; indexable (int or slice), len() and iterable like torch's."""

    def __init__(self, *modules: Module | OrderedDict) -> None:
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], OrderedDict):
            for name, m in modules[0].items():
                self.add_module(name, m)
        else:
            for i, m in enumerate(modules):
                if not isinstance(m, Module):
                    raise TypeError(f"Sequential: argument {i} is {type(m).__name__}, not a Module")
                self.add_module(str(i), m)

    def forward(self, x: Any) -> Any:
        for m in self._modules.values():
            x = m(x)
        return x

    def __getitem__(self, idx: int | slice) -> Any:
        items = list(self._modules.items())
        if isinstance(idx, slice):
            return Sequential(OrderedDict(items[idx]))
        n = len(items)
        if not -n <= idx < n:
            raise IndexError(f"idx: index {idx} is out of range for Sequential of length {n}")
        return items[idx][1]

    def __setitem__(self, idx: int, module: Module) -> None:
        key = list(self._modules)[idx]
        self.add_module(key, module)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def append(self, module: Module) -> Sequential:
        self.add_module(str(len(self._modules)), module)
        return self


class ModuleList(Module):
    def __init__(self, modules: Iterable[Module] = ()) -> None:
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, module: Module) -> ModuleList:
        self.add_module(str(len(self._modules)), module)
        return self

    def __getitem__(self, idx: int) -> Module:
        return list(self._modules.values())[idx]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())
