"""Pooling modules, torch.nn names, one family per kind (``_MaxPoolNd`` / ``_AvgPoolNd`` / adaptive / unpool /
LP: the 1-d/2-d/3-d classes only set their number of spatial dims). Re-exported by ``tinylearn.nn`` and
``tinylearn.nn.layers_spatial``; the functionals are ``tinylearn.conv.functional_pool*``."""

from __future__ import annotations

from typing import Any

from ..autograd.tensor import Tensor
from ..conv import functional_nd as S
from ..conv.functional_pool import _avg_pool
from .module import Module


class _MaxPoolNd(Module):
    """torch's ``_MaxPoolNd``: MaxPool1d/2d/3d differ only in their functional (``_fn``). Arguments are stored as
    given (torch does the same)."""

    _fn: Any = None

    def __init__(
        self,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        dilation: Any = 1,
        return_indices: bool = False,
        ceil_mode: bool = False,
    ) -> None:
        super().__init__()
        self.kernel_size, self.stride, self.padding, self.dilation = kernel_size, stride, padding, dilation
        self.return_indices, self.ceil_mode = return_indices, ceil_mode

    def forward(self, input: Tensor) -> Any:  # noqa: A002
        return type(self)._fn(
            input, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode, self.return_indices
        )

    def extra_repr(self) -> str:
        return (
            f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
            f"dilation={self.dilation}, ceil_mode={self.ceil_mode}"
        )


class MaxPool1d(_MaxPoolNd):
    _fn = staticmethod(S.max_pool1d)


class MaxPool2d(_MaxPoolNd):
    """torch.nn.MaxPool2d: kernel_size, stride (default kernel_size), padding, dilation, return_indices, ceil_mode;
    floor mode runs op ``conv.max_pool2d`` (the direct C++ kernel where it applies)."""

    _fn = staticmethod(S.max_pool2d)


class MaxPool3d(_MaxPoolNd):
    _fn = staticmethod(S.max_pool3d)


class _AvgPoolNd(Module):
    """torch's ``_AvgPoolNd``: AvgPool1d/2d/3d differ only in ``_nd`` (AvgPool1d also takes divisor_override,
    which torch's lacks)."""

    _nd = 2

    def __init__(
        self,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: int | None = None,
    ) -> None:
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.ceil_mode, self.count_include_pad, self.divisor_override = ceil_mode, count_include_pad, divisor_override

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        nd = self._nd
        return _avg_pool(
            nd,
            f"avg_pool{nd}d",
            input,
            self.kernel_size,
            self.stride,
            self.padding,
            self.ceil_mode,
            self.count_include_pad,
            self.divisor_override,
        )

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool1d(_AvgPoolNd):
    _nd = 1


class AvgPool2d(_AvgPoolNd):
    """torch.nn.AvgPool2d, same argument order: kernel_size, stride, padding, ceil_mode, count_include_pad,
    divisor_override."""

    _nd = 2


class AvgPool3d(_AvgPoolNd):
    _nd = 3


class _AdaptiveAvgPoolNd(Module):
    _fn: Any = None

    def __init__(self, output_size: Any) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return type(self)._fn(input, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class AdaptiveAvgPool1d(_AdaptiveAvgPoolNd):
    _fn = staticmethod(S.adaptive_avg_pool1d)


class AdaptiveAvgPool2d(_AdaptiveAvgPoolNd):
    _fn = staticmethod(S.adaptive_avg_pool2d)


class AdaptiveAvgPool3d(_AdaptiveAvgPoolNd):
    _fn = staticmethod(S.adaptive_avg_pool3d)


class _AdaptiveMaxPoolNd(Module):
    _fn: Any = None

    def __init__(self, output_size: Any, return_indices: bool = False) -> None:
        super().__init__()
        self.output_size, self.return_indices = output_size, return_indices

    def forward(self, input: Tensor) -> Any:  # noqa: A002
        return type(self)._fn(input, self.output_size, self.return_indices)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class AdaptiveMaxPool1d(_AdaptiveMaxPoolNd):
    _fn = staticmethod(S.adaptive_max_pool1d)


class AdaptiveMaxPool2d(_AdaptiveMaxPoolNd):
    _fn = staticmethod(S.adaptive_max_pool2d)


class AdaptiveMaxPool3d(_AdaptiveMaxPoolNd):
    _fn = staticmethod(S.adaptive_max_pool3d)


class _MaxUnpoolNd(Module):
    _fn: Any = None

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0) -> None:
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding

    def forward(self, input: Tensor, indices: Any, output_size: Any = None) -> Tensor:  # noqa: A002
        return type(self)._fn(input, indices, self.kernel_size, self.stride, self.padding, output_size)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class MaxUnpool1d(_MaxUnpoolNd):
    _fn = staticmethod(S.max_unpool1d)


class MaxUnpool2d(_MaxUnpoolNd):
    _fn = staticmethod(S.max_unpool2d)


class MaxUnpool3d(_MaxUnpoolNd):
    _fn = staticmethod(S.max_unpool3d)


class _LPPoolNd(Module):
    _fn: Any = None

    def __init__(self, norm_type: float, kernel_size: Any, stride: Any = None, ceil_mode: bool = False) -> None:
        super().__init__()
        self.norm_type, self.kernel_size, self.stride, self.ceil_mode = norm_type, kernel_size, stride, ceil_mode

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return type(self)._fn(input, self.norm_type, self.kernel_size, self.stride, self.ceil_mode)

    def extra_repr(self) -> str:
        return f"norm_type={self.norm_type}, kernel_size={self.kernel_size}, stride={self.stride}"


class LPPool1d(_LPPoolNd):
    _fn = staticmethod(S.lp_pool1d)


class LPPool2d(_LPPoolNd):
    _fn = staticmethod(S.lp_pool2d)


class LPPool3d(_LPPoolNd):
    _fn = staticmethod(S.lp_pool3d)


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
