"""``tinylearn.nn``: Module system, Parameter, layers, functional ops (``tinylearn.nn.functional`` as F), init,
plus the shared digits models (``models``) and training loop (``training``) the other topics reuse."""

from . import functional, init, models, training, utils  # noqa: F401  (utils: torch.nn.utils)
from .layers import (
    GELU,
    AvgPool2d,
    BatchNorm1d,
    BatchNorm2d,
    Conv2d,
    Dropout,
    Embedding,
    Flatten,
    Identity,
    LayerNorm,
    Linear,
    MaxPool2d,
    ModuleList,
    ReLU,
    Sequential,
    Sigmoid,
    Tanh,
)
from .layers_attention import *  # noqa: F403  (MultiheadAttention, TransformerEncoderLayer)
from .layers_extra import ELU, GroupNorm, LeakyReLU, LogSoftmax, Mish, ModuleDict, SiLU, Softmax, Softplus  # noqa: F401
from .layers_spatial import *  # noqa: F403  (Conv1d/3d, ConvTranspose*, 1d/3d/adaptive pools, Upsample)
from .module import Module, RemovableHandle
from .moe import MoE
from .parameter import Parameter

__all__ = [
    "MoE",
    "functional",
    "models",
    "training",
    "init",
    "Module",
    "RemovableHandle",
    "Parameter",
    "Sequential",
    "ModuleList",
    "Identity",
    "Linear",
    "Conv2d",
    "BatchNorm1d",
    "BatchNorm2d",
    "LayerNorm",
    "ReLU",
    "GELU",
    "Sigmoid",
    "Tanh",
    "Flatten",
    "MaxPool2d",
    "AvgPool2d",
    "Dropout",
    "Embedding",
]

from . import layers_attention as _layers_attention  # noqa: E402
from . import layers_spatial as _layers_spatial

__all__ += [*_layers_spatial.__all__, *_layers_attention.__all__]
