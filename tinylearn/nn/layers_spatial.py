"""Spatial modules, torch.nn names, one family per kind (torch's ``_ConvNd`` / ``_MaxPoolNd`` / ``_AvgPoolNd``
pattern: the 1-d/2-d/3-d classes only set their number of spatial dims or functional). Re-exported by
``tinylearn.nn`` (Conv2d / MaxPool2d / AvgPool2d also through ``tinylearn.nn.layers``).

The pooling families are in ``layers_pool`` (re-exported here).

Parameter shapes and default init are torch's:

    Conv{1,3}d           weight [out, in/groups, *k]        fan_in = in/groups * prod(k)
    ConvTranspose{1,2,3}d weight [in, out/groups, *k]        fan_in = out/groups * prod(k)  (torch's
                         _calculate_fan_in_and_fan_out reads dim 1 of the weight, whatever it means)
    weight ~ kaiming_uniform_(a=sqrt(5)) = U(-1/sqrt(fan_in), 1/sqrt(fan_in)),  bias ~ U(-1/sqrt(fan_in), ...)

padding_mode 'reflect' / 'replicate' / 'circular' pads with F.pad first (then the conv runs with padding 0).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..autograd.tensor import Tensor
from ..conv import functional_nd as S
from ..conv._params import ntuple
from . import functional_extra as E
from . import init, layers_pool
from .layers_pool import (  # noqa: F401  (re-exported: the pooling families live in layers_pool)
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AdaptiveAvgPool3d,
    AdaptiveMaxPool1d,
    AdaptiveMaxPool2d,
    AdaptiveMaxPool3d,
    AvgPool1d,
    AvgPool2d,
    AvgPool3d,
    LPPool1d,
    LPPool2d,
    LPPool3d,
    MaxPool1d,
    MaxPool2d,
    MaxPool3d,
    MaxUnpool1d,
    MaxUnpool2d,
    MaxUnpool3d,
    _AvgPoolNd,
    _FunctionalModule,
    _MaxPoolNd,
)
from .module import Module
from .parameter import weight_and_bias

_PAD_MODES = ("zeros", "reflect", "replicate", "circular")


def _short(v: Any) -> Any:
    """A tuple with one repeated entry prints as that entry (``stride=1``), as the layers always printed."""
    return v[0] if isinstance(v, tuple) and v and all(e == v[0] for e in v) else v


class _ConvNd(Module):
    """torch's ``_ConvNd``: the parameters, init and repr of every conv layer (subclasses set ``_nd`` and
    ``_transposed``). Arguments are torch.nn.Conv{1,2,3}d's; kernel_size / stride / padding / dilation are stored as
    ``_nd``-tuples (padding may be 'same' / 'valid')."""

    _nd = 2
    _transposed = False

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Any,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        device: Any = None,
        dtype: Any = np.float32,
        *,
        output_padding: Any = 0,
    ) -> None:
        super().__init__()
        nd = self._nd
        name = type(self).__name__
        for arg, v in (("in_channels", in_channels), ("out_channels", out_channels), ("groups", groups)):
            if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
                raise ValueError(f"{arg}: {name} needs a positive int, got {v!r}")
        if in_channels % groups or out_channels % groups:
            raise ValueError(
                f"groups: {name} in_channels {in_channels} and out_channels {out_channels} must divide by groups "
                f"{groups}"
            )
        k = ntuple(kernel_size, nd, "kernel_size")
        if min(k) < 1:
            raise ValueError(f"kernel_size: must be positive, got {k}")
        if padding_mode not in _PAD_MODES:
            raise ValueError(f"padding_mode: expected one of {_PAD_MODES}, got {padding_mode!r}")
        if self._transposed and padding_mode != "zeros":
            raise ValueError(f"padding_mode: {name} only supports 'zeros', got {padding_mode!r}")
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(f"padding: expected an int, a tuple, 'same' or 'valid', got {padding!r}")
            if padding == "same" and ntuple(stride, nd, "stride") != (1,) * nd:
                raise ValueError(f"padding: padding='same' is not supported for strided convolutions (stride={stride})")
        self.in_channels, self.out_channels, self.kernel_size = int(in_channels), int(out_channels), k
        self.stride = ntuple(stride, nd, "stride")
        self.padding = padding if isinstance(padding, str) else ntuple(padding, nd, "padding")
        self.dilation = ntuple(dilation, nd, "dilation")
        self.output_padding = ntuple(output_padding, nd, "output_padding")
        self.groups, self.padding_mode = int(groups), padding_mode
        shape = (in_channels, out_channels // groups) if self._transposed else (out_channels, in_channels // groups)
        sizes = f"in_channels={in_channels}, out_channels={out_channels}, kernel_size={k}"
        weight_and_bias(self, shape + k, out_channels, bias, dtype, sizes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.reset_weight_and_bias_(self.weight, self.bias)

    def extra_repr(self) -> str:
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={_short(self.stride)}"
        s += f", padding={self.padding!r}" if isinstance(self.padding, str) else f", padding={_short(self.padding)}"
        if self.dilation != (1,) * self._nd:
            s += f", dilation={_short(self.dilation)}"
        if self._transposed and self.output_padding != (0,) * self._nd:
            s += f", output_padding={_short(self.output_padding)}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode}"
        return s


class _Conv(_ConvNd):
    _fns: Any = {1: S.conv1d, 2: S.conv2d, 3: S.conv3d}

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        padding = self.padding
        if self.padding_mode != "zeros":
            if isinstance(padding, str):
                if padding == "same":
                    tot = [self.dilation[i] * (self.kernel_size[i] - 1) for i in range(self._nd)]
                    lr = [(t // 2, t - t // 2) for t in tot]
                else:
                    lr = [(0, 0)] * self._nd
            else:
                lr = [(p, p) for p in padding]
            pads = [v for pair in reversed(lr) for v in pair]
            input = E.pad(input, pads, mode=self.padding_mode)  # noqa: A001
            padding = 0
        fn = self._fns[self._nd]
        return fn(input, self.weight, self.bias, self.stride, padding, self.dilation, self.groups)


class Conv1d(_Conv):
    """torch.nn.Conv1d: input [N, C_in, L] (or [C_in, L]), weight [out, in/groups, k]."""

    _nd = 1


class Conv2d(_Conv):
    """torch.nn.Conv2d: input [N, C_in, H, W] (or [C_in, H, W]), weight [out, in/groups, kh, kw]; the registered
    2-D kernels (op ``conv.conv2d``)."""

    _nd = 2


class Conv3d(_Conv):
    """torch.nn.Conv3d: input [N, C_in, D, H, W], weight [out, in/groups, kd, kh, kw]."""

    _nd = 3


class _ConvTranspose(_ConvNd):
    _transposed = True

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Any,
        stride: Any = 1,
        padding: Any = 0,
        output_padding: Any = 0,
        groups: int = 1,
        bias: bool = True,
        dilation: Any = 1,
        padding_mode: str = "zeros",
        device: Any = None,
        dtype: Any = np.float32,
    ) -> None:
        if isinstance(padding, str):
            raise ValueError(f"padding: {type(self).__name__} does not accept string padding, got {padding!r}")
        super().__init__(
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            dilation,
            groups,
            bias,
            padding_mode,
            device,
            dtype,
            output_padding=output_padding,
        )

    def _output_padding(self, input: Tensor, output_size: Any) -> tuple[int, ...]:  # noqa: A002
        """torch's rule: output_size (last nd entries) picks output_padding = size - the smallest output size."""
        nd = self._nd
        if output_size is None:
            return self.output_padding
        osz = [int(v) for v in output_size]
        if len(osz) > nd:
            osz = osz[-nd:]
        if len(osz) != nd:
            raise ValueError(f"output_size: expected {nd} (or {nd + 2}) values, got {output_size!r}")
        sp = tuple(input.shape[-nd:])
        op = []
        for i in range(nd):
            lo = (sp[i] - 1) * self.stride[i] - 2 * self.padding[i] + self.dilation[i] * (self.kernel_size[i] - 1) + 1
            hi = lo + self.stride[i] - 1
            if not lo <= osz[i] <= hi:
                raise ValueError(
                    f"output_size: {tuple(osz)} is not reachable: dim {i} must lie in [{lo}, {hi}] for input "
                    f"spatial size {sp}"
                )
            op.append(osz[i] - lo)
        return tuple(op)

    def forward(self, input: Tensor, output_size: Any = None) -> Tensor:  # noqa: A002
        fn = {1: S.conv_transpose1d, 2: S.conv_transpose2d, 3: S.conv_transpose3d}[self._nd]
        op = self._output_padding(input, output_size)
        return fn(input, self.weight, self.bias, self.stride, self.padding, op, self.groups, self.dilation)


class ConvTranspose1d(_ConvTranspose):
    """torch.nn.ConvTranspose1d: weight [in, out/groups, k]."""

    _nd = 1


class ConvTranspose2d(_ConvTranspose):
    """torch.nn.ConvTranspose2d: weight [in, out/groups, kh, kw]."""

    _nd = 2


class ConvTranspose3d(_ConvTranspose):
    """torch.nn.ConvTranspose3d: weight [in, out/groups, kd, kh, kw]."""

    _nd = 3


# ------------------------------------------------------------------------ resampling, unfold / fold, pixel shuffle
class Upsample(Module):
    """torch.nn.Upsample: F.interpolate with fixed size / scale_factor / mode / align_corners."""

    def __init__(
        self,
        size: Any = None,
        scale_factor: Any = None,
        mode: str = "nearest",
        align_corners: bool | None = None,
        recompute_scale_factor: bool | None = None,
    ) -> None:
        super().__init__()
        self.size, self.scale_factor, self.mode = size, scale_factor, mode
        self.align_corners, self.recompute_scale_factor = align_corners, recompute_scale_factor

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return S.interpolate(
            input, self.size, self.scale_factor, self.mode, self.align_corners, self.recompute_scale_factor
        )

    def extra_repr(self) -> str:
        what = f"size={self.size}" if self.size is not None else f"scale_factor={self.scale_factor}"
        return f"{what}, mode={self.mode!r}"


class UpsamplingNearest2d(Upsample):
    def __init__(self, size: Any = None, scale_factor: Any = None) -> None:
        super().__init__(size, scale_factor, mode="nearest")


class UpsamplingBilinear2d(Upsample):
    def __init__(self, size: Any = None, scale_factor: Any = None) -> None:
        super().__init__(size, scale_factor, mode="bilinear", align_corners=True)


class Unfold(_FunctionalModule):
    """torch.nn.Unfold (im2col): [N, C, H, W] -> [N, C*kh*kw, L]."""

    _functional = "unfold"
    _args = _shown = ("kernel_size", "dilation", "padding", "stride")

    def __init__(self, kernel_size: Any, dilation: Any = 1, padding: Any = 0, stride: Any = 1) -> None:
        super().__init__(kernel_size, dilation, padding, stride)


class Fold(_FunctionalModule):
    """torch.nn.Fold (col2im, overlaps summed): [N, C*kh*kw, L] -> [N, C, *output_size]."""

    _functional = "fold"
    _args = ("output_size", "kernel_size", "dilation", "padding", "stride")
    _shown = _args[:2]

    def __init__(
        self, output_size: Any, kernel_size: Any, dilation: Any = 1, padding: Any = 0, stride: Any = 1
    ) -> None:
        super().__init__(output_size, kernel_size, dilation, padding, stride)


class PixelShuffle(_FunctionalModule):
    """torch.nn.PixelShuffle: [N, C*r*r, H, W] -> [N, C, H*r, W*r] (r = upscale_factor)."""

    _functional, _args, _shown = "pixel_shuffle", ("upscale_factor",), ("upscale_factor",)

    def __init__(self, upscale_factor: int) -> None:
        super().__init__(upscale_factor)


class PixelUnshuffle(_FunctionalModule):
    """torch.nn.PixelUnshuffle, the inverse of PixelShuffle: [N, C, H*r, W*r] -> [N, C*r*r, H, W]."""

    _functional, _args, _shown = "pixel_unshuffle", ("downscale_factor",), ("downscale_factor",)

    def __init__(self, downscale_factor: int) -> None:
        super().__init__(downscale_factor)


__all__: list[str] = [
    "Conv2d",
    "Unfold",
    "PixelUnshuffle",
    "PixelShuffle",
    "Fold",
    "Conv1d",
    "Conv3d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
    "Upsample",
    "UpsamplingBilinear2d",
    "UpsamplingNearest2d",
] + layers_pool.__all__  # the pooling families are re-exported
