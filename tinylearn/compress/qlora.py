"""QLoRA (Dettmers et al. 2023): a frozen NF4 base weight with a trainable fp32 LoRA branch on top.

    y = x dequant(W_nf4)^T + b + dropout(x) A^T B^T * (alpha / r)      A [r, in], B [out, r] = 0, scaling alpha / r

``QLoRALinear(base, r, alpha, block_size=64, double_quant=True)`` quantizes ``base.weight`` to NF4 once
(tinylearn.compress.nf4: block-wise absmax, double-quantized scales) and keeps no fp32 copy of it: the layer holds
the packed codes, the scales, a frozen bias and the adapter. Forward runs op ``compress.nf4_matmul`` (the C++
dequantize-on-the-fly kernel when _C is built, else numpy) through an autograd Function whose backward gives
dL/dx = dL/dy dequant(W) (dequantized for the backward product, then dropped) and nothing to W; the LoRA branch is
ordinary tinylearn autograd, so gradients reach A, B and x. The LoRA names (lora_A, lora_B, scaling, A's
kaiming-uniform(a=sqrt(5)) init) are those of ``LoRALinear`` (lora.py), whose rank / alpha checks are reused.

LoRA dtype ("LoRA in fp32/bf16 on top"): the adapter Parameters are fp32 master weights either way (as tl.amp
keeps them: a bf16 weight would lose Adam updates below 2^-8 of its size). ``lora_dtype="bfloat16"`` runs the LoRA
branch in bf16 -- its two matmuls through ``tl.autocast("bfloat16")``: inputs rounded to bf16, products
accumulated in fp32, results stored in bf16 -- and adds it to the base output in fp32; gradients reach A and B in
fp32 through autocast's differentiable casts. Wrapping the forward in ``tl.autocast("bfloat16")`` yourself does the
same to the LoRA branch of an fp32 layer. The NF4 base matmul stays on its fp32 kernel in both cases (bitsandbytes
dequantizes to its compute dtype instead; fp32 here is the more accurate of the two). Merging into an NF4 base:
``merge()`` raises (see lora.py); ``to_lora_linear()`` is the dequantized fp32 LoRALinear.

``apply_qlora(model, target_modules, r, alpha)`` replaces matching Linear submodules in place (same name matching
as apply_lora) and freezes every other parameter. ``memory_report(model)`` counts the bytes of the arrays the model
actually holds (NF4 codes + scales, LoRA params, the rest) against the fp32 model it replaced.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ..autograd.function import Function
from ..autograd.tensor import Tensor
from ..nn.layers import Linear
from ..nn.module import Module
from ..nn.parameter import Parameter
from .lora import AdapterLayerMixin, LoRALinear, _check_rank, _linear_names, _matches, check_targets, init_adapter
from .nf4 import NF4Tensor, nf4_dequantize, nf4_matmul, nf4_quantize


class NF4LinearFunction(Function):
    """y = x dequant(W)^T for x [..., K]; backward: dL/dx = g dequant(W); W (an NF4Tensor) gets no gradient."""

    @staticmethod
    def forward(ctx: Any, x: np.ndarray, q: NF4Tensor) -> np.ndarray:
        ctx.q = q
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        x2 = x.reshape(-1, x.shape[-1])
        if x2.dtype != np.float32 and x2.dtype != np.float64:  # bf16 / fp16 input (under autocast): fp32 kernel
            x2 = x2.astype(np.float32)
        y = nf4_matmul(x2, q)
        return y.reshape(*x.shape[:-1], q.shape[0]).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx: Any, grad: np.ndarray) -> tuple[Any, None]:
        if not ctx.needs_input_grad[0]:
            return None, None
        w = nf4_dequantize(ctx.q)
        g2 = grad.reshape(-1, grad.shape[-1])
        if g2.dtype != np.float32 and g2.dtype != np.float64:
            g2 = g2.astype(np.float32)
        gx = (g2 @ w.astype(g2.dtype, copy=False)).reshape(ctx.x_shape)
        return gx.astype(ctx.x_dtype, copy=False), None


LORA_DTYPES = {"float32": None, "fp32": None, "bfloat16": "bfloat16", "bf16": "bfloat16"}


def _check_lora_dtype(lora_dtype: Any) -> str:
    """'float32' or 'bfloat16' from a name ('fp32', 'bf16', 'torch.bfloat16') or a numpy / ml_dtypes dtype."""
    name = lora_dtype if isinstance(lora_dtype, str) else str(lora_dtype)
    if not isinstance(lora_dtype, str):
        try:
            name = str(np.dtype(lora_dtype))
        except TypeError:
            pass
    name = name.removeprefix("torch.")
    if name not in LORA_DTYPES:
        raise ValueError(f"lora_dtype: expected 'float32' or 'bfloat16', got {lora_dtype!r}")
    return "bfloat16" if LORA_DTYPES[name] else "float32"


class QLoRALinear(AdapterLayerMixin, Module):
    """A Linear whose weight is frozen NF4 and whose update is a trainable LoRA pair (fp32 masters; the branch runs
    in ``lora_dtype``)."""

    def __init__(
        self,
        base: Linear,
        r: int,
        alpha: float,
        block_size: int = 64,
        double_quant: bool = True,
        dropout: float = 0.0,
        lora_dtype: Any = "float32",
    ) -> None:
        super().__init__()
        if not isinstance(base, Linear):
            raise TypeError(f"base: expected a tinylearn.nn.Linear, got {type(base).__name__}")
        _check_rank(r, base.in_features, base.out_features)  # validate before quantizing
        self.lora_dtype = _check_lora_dtype(lora_dtype)
        self.block_size = block_size
        self.weight_nf4 = nf4_quantize(base.weight.data, block_size=block_size, double_quant=double_quant)
        self.bias = None if base.bias is None else Parameter(base.bias.data.astype(np.float32), requires_grad=False)
        init_adapter(self, base, r, alpha, dropout, np.float32)
        self.merged = False
        self._init_selection()

    def _branch(self, h: Tensor, ad: Module) -> Tensor:
        if self.lora_dtype == "float32":
            return super()._branch(h, ad)
        from ..amp import autocast

        with autocast("bfloat16"):
            d = (h @ ad.lora_A.T) @ ad.lora_B.T
        return d.to(np.float32) * ad.scaling

    def merge(self, adapter: str = "default") -> None:
        raise RuntimeError(
            "merge: a QLoRALinear's base weight is NF4; W + scaling B A is not on the NF4 grid, so merging would "
            "re-quantize it (lossy, and unmerge could not restore the codes). Use merge_lora(model, dequantize=True) "
            "or to_lora_linear().merge() to merge into the dequantized fp32 weight"
        )

    def unmerge(self) -> None:
        raise RuntimeError("unmerge: a QLoRALinear is never merged (see merge)")

    def to_lora_linear(self) -> LoRALinear:
        """A LoRALinear on an fp32 Linear holding the dequantized weight and this layer's bias, sharing this
        layer's adapter Parameters (every named adapter included) and selection; its output equals this layer's
        (the LoRA branch in fp32)."""
        base = Linear(self.in_features, self.out_features, bias=self.bias is not None)
        base.weight.data = self.dequantized_weight()
        base.weight.requires_grad = False
        if self.bias is not None:
            base.bias.data = self.bias.data.copy()
            base.bias.requires_grad = False
        out = LoRALinear(base, self.r, self.alpha, self.dropout_p)
        out.lora_A, out.lora_B = self.lora_A, self.lora_B
        if "adapters" in self._modules:
            out.adapters = self.adapters
        out.active, out.row_ids = self.active, self.row_ids
        out.training = self.training
        return out

    def dequantized_weight(self) -> np.ndarray:
        """The fp32 weight the NF4 codes stand for (a fresh array; the layer does not keep it)."""
        return nf4_dequantize(self.weight_nf4)

    def forward(self, x: Tensor) -> Tensor:
        if not isinstance(x, Tensor):
            x = Tensor(np.asarray(x, np.float32))
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x: last dimension must be in_features={self.in_features}, got shape {x.shape}")
        y = NF4LinearFunction.apply(x, self.weight_nf4)
        if self.bias is not None:
            y = y + self.bias
        d = self._lora_delta(x)
        return y if d is None else y + d

    def extra_repr(self) -> str:
        q = self.weight_nf4
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, r={self.r}, alpha={self.alpha}, "
            f"block_size={q.block_size}, double_quant={q.double_quant}, lora_dtype={self.lora_dtype}"
        )


def qlora_layers(model: Module) -> list[tuple[str, QLoRALinear]]:
    """(dotted name, layer) for every QLoRALinear in ``model``."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, QLoRALinear)]


def apply_qlora(
    model: Module,
    target_modules: Iterable[str],
    r: int = 8,
    alpha: float = 16.0,
    block_size: int = 64,
    double_quant: bool = True,
    dropout: float = 0.0,
    lora_dtype: Any = "float32",
) -> Module:
    """Replace every Linear whose dotted name equals or ends with ``"." + target`` by a QLoRALinear (its fp32
    weight released); freeze every other parameter. ValueError listing the Linear names when nothing matches.
    ``lora_dtype``: "float32" (default) or "bfloat16", the dtype the LoRA branch computes in (masters stay fp32)."""
    targets = check_targets(model, target_modules, alpha, dropout)
    _check_lora_dtype(lora_dtype)
    hits = [(n, m) for n, m in model.named_modules() if isinstance(m, Linear) and n and _matches(n, targets)]
    if not hits:
        raise ValueError(
            f"target_modules: {targets} match no Linear module; Linear modules in the model: {_linear_names(model)}"
        )
    for n, m in hits:  # validate everything before modifying anything
        _check_rank(r, m.in_features, m.out_features, f" for {n!r} ({m.out_features}x{m.in_features})")
        numel = m.in_features * m.out_features
        if isinstance(block_size, int) and block_size >= 2 and numel % block_size:
            raise ValueError(f"block_size: {block_size} does not divide {n!r}'s {numel} weight elements")
    for p in model.parameters():
        p.requires_grad = False
    for n, m in hits:
        parent_name, _, child = n.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, QLoRALinear(m, r, alpha, block_size, double_quant, dropout, lora_dtype))
    return model


def memory_report(model: Module) -> dict[str, Any]:
    """Bytes the model's arrays hold, measured (``.nbytes``), against the fp32 model it stands for.

    Keys: nf4_weight_bytes (codes + scales of every QLoRALinear), fp32_weight_bytes (those weights in fp32),
    weight_ratio, weight_bits_per_param, lora_bytes, lora_params, other_bytes (every other parameter), total_bytes,
    fp32_total_bytes (the same model with fp32 weights and no adapter), total_ratio.
    """
    if not isinstance(model, Module):
        raise TypeError(f"model: expected a tinylearn.nn.Module, got {type(model).__name__}")
    nf4_b = fp32_w = n_w = lora_b = lora_n = 0
    lora_ids: set[int] = set()
    for _, m in qlora_layers(model):
        q = m.weight_nf4
        nf4_b += q.nbytes
        n_w += q.numel
        fp32_w += 4 * q.numel
    for _, m in model.named_modules():
        for name in ("lora_A", "lora_B"):
            p = getattr(m, name, None)
            if isinstance(p, Parameter) and id(p) not in lora_ids:
                lora_ids.add(id(p))
                lora_b += p.data.nbytes
                lora_n += p.data.size
    other = sum(p.data.nbytes for p in model.parameters() if id(p) not in lora_ids)
    other_fp32 = sum(4 * p.data.size for p in model.parameters() if id(p) not in lora_ids)
    total = nf4_b + lora_b + other
    fp32_total = fp32_w + other_fp32
    return {
        "nf4_weight_bytes": nf4_b,
        "fp32_weight_bytes": fp32_w,
        "weight_ratio": nf4_b / fp32_w if fp32_w else float("nan"),
        "weight_bits_per_param": 8.0 * nf4_b / n_w if n_w else float("nan"),
        "lora_bytes": lora_b,
        "lora_params": lora_n,
        "other_bytes": other,
        "total_bytes": total,
        "fp32_total_bytes": fp32_total,
        "total_ratio": total / fp32_total if fp32_total else float("nan"),
    }
