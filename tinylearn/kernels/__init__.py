"""Fused kernels: softmax, LayerNorm, bias+GELU and flash attention behind one dispatcher with four backends.

The lesson: fusion wins by moving fewer bytes. ``numpy`` is the unfused reference (each step a full trip through
memory), ``cpu`` the fused C++/OpenMP kernels, ``triton`` the same kernels as ``@triton.jit`` programs (run by
Triton's interpreter on a CPU box), ``cuda`` hand-written CUDA in cuda_src/ (GPU only). ``traffic`` models bytes
moved and roofline time; ``torch_ops`` wraps the cpu kernels as torch.autograd.Functions; ``numba_sim`` holds the
numba.cuda lessons for the CUDA simulator.

    import tinylearn as tl
    y = tl.kernels.softmax(x, dim=-1, backend="cpu")
    o = tl.kernels.flash_attention(q, k, v, causal=True)       # q, k, v: [B, H, N, D]
"""

from . import fusion_split  # the split-point model of a register-heavy fused kernel
from .ops import (
    available_backends,
    bias_gelu,
    bias_gelu_backward,
    default_backend,
    flash_attention,
    flash_attention_backward,
    layer_norm,
    layer_norm_backward,
    softmax,
    softmax_backward,
)
from .reduce import reduce_sum

__all__ = [
    "available_backends",
    "default_backend",
    "softmax",
    "softmax_backward",
    "layer_norm",
    "layer_norm_backward",
    "bias_gelu",
    "bias_gelu_backward",
    "flash_attention",
    "flash_attention_backward",
    "reduce_sum",
    "fusion_split",
]
