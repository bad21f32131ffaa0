"""Pooling modules, torch.nn names, one family per kind (``_MaxPoolNd`` / ``_AvgPoolNd`` / adaptive / unpool /
LP), all on one base, ``_FunctionalModule``: a family names its functional and the attributes it passes, and its
1-d/2-d/3-d classes only set their number of spatial dims (torch's ``_MaxPoolNd`` pattern). Re-exported by
``tinylearn.nn`` and ``tinylearn.nn.layers_spatial``; the functionals are ``tinylearn.conv.functional_pool*``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..autograd.tensor import Tensor
from ..conv import functional_nd as S
from ..conv.functional_pool import _avg_pool
from .module import Module


class _FunctionalModule(Module):
    """A module that calls one functional of ``tinylearn.conv.functional_nd``: ``_functional`` names it (``{nd}``
    stands for the number of spatial dims, set per class with ``class X(Base, nd=3)``), ``__init__`` stores its
    arguments under the names in ``_args`` (arguments are stored as given, as torch does), ``forward`` passes the
    input then those attributes, and ``extra_repr`` shows the ones named in ``_shown``."""

    _nd = 2
    _functional = ""
    _args: tuple[str, ...] = ()
    _shown: tuple[str, ...] = ()

    def __init_subclass__(cls, nd: int | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if nd is not None:
            cls._nd = nd

    def __init__(self, *values: Any) -> None:
        super().__init__()
        for name, value in zip(self._args, values, strict=True):
            setattr(self, name, value)

    def _fn(self) -> Callable[..., Any]:
        return getattr(S, self._functional.format(nd=self._nd))

    def forward(self, input: Tensor) -> Any:  # noqa: A002
        return self._fn()(input, *(getattr(self, name) for name in self._args))

    def extra_repr(self) -> str:
        return ", ".join(f"{name}={getattr(self, name)}" for name in self._shown)


class _MaxPoolNd(_FunctionalModule):
    """torch's ``_MaxPoolNd``: MaxPool1d/2d/3d differ only in their number of spatial dims."""

    _functional = "max_pool{nd}d"
    _args = ("kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")
    _shown = _args[:5]

    def __init__(
        self,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        dilation: Any = 1,
        return_indices: bool = False,
        ceil_mode: bool = False,
    ) -> None:
        super().__init__(kernel_size, stride, padding, dilation, ceil_mode, return_indices)


class MaxPool1d(_MaxPoolNd, nd=1): ...


class MaxPool2d(_MaxPoolNd, nd=2):
    """torch.nn.MaxPool2d: kernel_size, stride (default kernel_size), padding, dilation, return_indices, ceil_mode;
    floor mode runs op ``conv.max_pool2d`` (the direct C++ kernel where it applies)."""


class MaxPool3d(_MaxPoolNd, nd=3): ...


class _AvgPoolNd(_FunctionalModule):
    """torch's ``_AvgPoolNd``: AvgPool1d/2d/3d differ only in ``_nd`` (AvgPool1d also takes divisor_override,
    which torch's lacks, so the modules call ``_avg_pool`` rather than ``avg_pool1d``)."""

    _args = ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override")
    _shown = _args[:3]

    def __init__(
        self,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: int | None = None,
    ) -> None:
        super().__init__(kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)

    def _fn(self) -> Callable[..., Any]:
        return functools.partial(_avg_pool, self._nd, f"avg_pool{self._nd}d")


class AvgPool1d(_AvgPoolNd, nd=1): ...


class AvgPool2d(_AvgPoolNd, nd=2):
    """torch.nn.AvgPool2d, same argument order: kernel_size, stride, padding, ceil_mode, count_include_pad,
    divisor_override."""


class AvgPool3d(_AvgPoolNd, nd=3): ...


class _AdaptiveAvgPoolNd(_FunctionalModule):
    _functional = "adaptive_avg_pool{nd}d"
    _args = _shown = ("output_size",)

    def __init__(self, output_size: Any) -> None:
        super().__init__(output_size)


class AdaptiveAvgPool1d(_AdaptiveAvgPoolNd, nd=1): ...


class AdaptiveAvgPool2d(_AdaptiveAvgPoolNd, nd=2): ...


class AdaptiveAvgPool3d(_AdaptiveAvgPoolNd, nd=3): ...


class _AdaptiveMaxPoolNd(_FunctionalModule):
    _functional = "adaptive_max_pool{nd}d"
    _args = ("output_size", "return_indices")
    _shown = _args[:1]

    def __init__(self, output_size: Any, return_indices: bool = False) -> None:
        super().__init__(output_size, return_indices)


class AdaptiveMaxPool1d(_AdaptiveMaxPoolNd, nd=1): ...


class AdaptiveMaxPool2d(_AdaptiveMaxPoolNd, nd=2): ...


class AdaptiveMaxPool3d(_AdaptiveMaxPoolNd, nd=3): ...


class _MaxUnpoolNd(_FunctionalModule):
    """The functional takes ``indices`` after the input and ``output_size`` last: ``forward`` passes both."""

    _functional = "max_unpool{nd}d"
    _args = _shown = ("kernel_size", "stride", "padding")

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0) -> None:
        super().__init__(kernel_size, stride, padding)

    def forward(self, input: Tensor, indices: Any, output_size: Any = None) -> Tensor:  # noqa: A002
        return self._fn()(input, indices, self.kernel_size, self.stride, self.padding, output_size)


class MaxUnpool1d(_MaxUnpoolNd, nd=1): ...


class MaxUnpool2d(_MaxUnpoolNd, nd=2): ...


class MaxUnpool3d(_MaxUnpoolNd, nd=3): ...


class _LPPoolNd(_FunctionalModule):
    _functional = "lp_pool{nd}d"
    _args = ("norm_type", "kernel_size", "stride", "ceil_mode")
    _shown = _args[:3]

    def __init__(self, norm_type: float, kernel_size: Any, stride: Any = None, ceil_mode: bool = False) -> None:
        super().__init__(norm_type, kernel_size, stride, ceil_mode)


class LPPool1d(_LPPoolNd, nd=1): ...


class LPPool2d(_LPPoolNd, nd=2): ...


class LPPool3d(_LPPoolNd, nd=3): ...


__all__: list[str] = [
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AdaptiveAvgPool3d",
    "AdaptiveMaxPool1d",
    "AdaptiveMaxPool2d",
    "AdaptiveMaxPool3d",
    "MaxUnpool1d",
    "MaxUnpool2d",
    "MaxUnpool3d",
    "LPPool1d",
    "LPPool2d",
    "LPPool3d",
]
