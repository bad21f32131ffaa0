"""Attention modules (torch.nn names): MultiheadAttention, TransformerEncoderLayer, TransformerEncoder.
Re-exported by ``tinylearn.nn``.

Multi-head attention (Vaswani et al. 2017, torch.nn.MultiheadAttention's parameter layout):

    [q; k; v] = [x_q W_q^T + b_q ; x_k W_k^T + b_k ; x_v W_v^T + b_v]     W_q, W_k, W_v = rows of in_proj_weight [3E, E]
    head h:   A_h = softmax(q_h k_h^T / sqrt(E / H) + M)                 q_h = columns h*D .. (h+1)*D of q, D = E / H
    out      = concat_h(A_h v_h) W_o^T + b_o                             W_o, b_o = out_proj

M combines ``attn_mask`` ([L, S] or [N*H, L, S]) and ``key_padding_mask`` ([N, S]); in both a bool True means
"do not attend" (torch.nn.MultiheadAttention's convention, the opposite of scaled_dot_product_attention's) and a float
mask is added to the scores. ``need_weights`` returns the attention probabilities, averaged over heads unless
``average_attn_weights=False``. A query whose keys are all masked (a fully padded sequence) gets output 0 and
attention weights 0, as torch's scaled_dot_product_attention path (``need_weights=False``, TransformerEncoderLayer
in training); torch's ``need_weights=True`` path gives NaN there. Names, shapes, defaults and the init
(xavier_uniform_ in_proj, zero biases) follow torch, so ``module.load_state_dict(torch_module.state_dict())``
reproduces torch's outputs.

TransformerEncoderLayer (post-norm, torch's default): x = LN1(x + SA(x)); x = LN2(x + FF(x)), FF = W2 act(W1 x);
``norm_first=True`` (pre-norm): x = x + SA(LN1(x)); x = x + FF(LN2(x)).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..autograd.tensor import Tensor
from . import functional as F
from . import init
from .functional_attention import masked_softmax
from .layers import Dropout, LayerNorm, Linear, ModuleList
from .module import Module
from .parameter import Parameter

__all__: list[str] = ["MultiheadAttention", "TransformerEncoderLayer", "TransformerEncoder"]


def _float_mask(mask: Any, name: str, dtype: np.dtype) -> Any:
    """A bool mask (True = masked out) -> additive array of 0 / -inf; a float mask passes through (Tensor kept)."""
    if mask is None:
        return None
    arr = mask.data if isinstance(mask, Tensor) else np.asarray(mask)
    if arr.dtype == np.bool_:
        return np.where(arr, -np.inf, 0.0).astype(dtype)
    if arr.dtype.kind != "f":
        raise TypeError(f"{name}: expected a bool or floating mask, got dtype {arr.dtype}")
    return mask if isinstance(mask, Tensor) else arr.astype(dtype)


def _shape(m: Any) -> tuple[int, ...]:
    return tuple(m.shape)


class MultiheadAttention(Module):
    """torch.nn.MultiheadAttention: ``forward(query, key, value, key_padding_mask=None, need_weights=True,
    attn_mask=None, average_attn_weights=True, is_causal=False) -> (attn_output, attn_weights | None)``.

    Shapes: query [L, N, E] (``batch_first=True``: [N, L, E]; unbatched: [L, E]), key [S, N, kdim], value
    [S, N, vdim]. ``add_bias_kv`` / ``add_zero_attn`` are not supported (raise).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        dtype: Any = np.float32,
    ) -> None:
        super().__init__()
        if embed_dim < 1 or num_heads < 1:
            raise ValueError(f"embed_dim {embed_dim} and num_heads {num_heads} must be >= 1")
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim: {embed_dim} must be divisible by num_heads ({num_heads})")
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"dropout: probability must be in [0, 1], got {dropout}")
        if add_bias_kv or add_zero_attn:
            raise ValueError("add_bias_kv / add_zero_attn: must be False (not supported by this MultiheadAttention)")
        self.embed_dim, self.num_heads, self.dropout, self.batch_first = embed_dim, num_heads, dropout, batch_first
        self.head_dim = embed_dim // num_heads
        self.kdim = embed_dim if kdim is None else kdim
        self.vdim = embed_dim if vdim is None else vdim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        if self._qkv_same_embed_dim:
            self.in_proj_weight = Parameter(np.empty((3 * embed_dim, embed_dim), dtype=dtype))
            for n in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
                self.register_parameter(n, None)
        else:
            self.q_proj_weight = Parameter(np.empty((embed_dim, embed_dim), dtype=dtype))
            self.k_proj_weight = Parameter(np.empty((embed_dim, self.kdim), dtype=dtype))
            self.v_proj_weight = Parameter(np.empty((embed_dim, self.vdim), dtype=dtype))
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = Parameter(np.zeros(3 * embed_dim, dtype=dtype))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, dtype=dtype)
        self._reset_parameters()

    def _reset_parameters(self) -> None:  # torch: xavier_uniform_ in-projections, zero biases
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            for w in (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
                init.xavier_uniform_(w)
        if self.in_proj_bias is not None:
            init.zeros_(self.in_proj_bias)
            init.zeros_(self.out_proj.bias)

    def _proj(self, x: Tensor, i: int) -> Tensor:
        e = self.embed_dim
        if self._qkv_same_embed_dim:
            w = self.in_proj_weight[i * e : (i + 1) * e]
        else:
            w = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)[i]
        b = None if self.in_proj_bias is None else self.in_proj_bias[i * e : (i + 1) * e]
        return F.linear(x, w, b)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Any = None,
        need_weights: bool = True,
        attn_mask: Any = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        for name, t in (("query", query), ("key", key), ("value", value)):
            if not isinstance(t, Tensor):
                raise TypeError(f"{name}: expected a tinylearn Tensor, got {type(t).__name__}")
        nd = query.ndim
        if nd not in (2, 3) or key.ndim != nd or value.ndim != nd:
            raise ValueError(
                f"query/key/value: expected all 2-D (unbatched) or all 3-D, got shapes {query.shape}, {key.shape}, "
                f"{value.shape}"
            )
        if nd == 2:  # unbatched [L, E]: add a batch dim of 1 in the batch-first layout
            q, k, v = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
            if key_padding_mask is not None:
                key_padding_mask = (
                    key_padding_mask.reshape(1, -1)
                    if isinstance(key_padding_mask, Tensor)
                    else (np.asarray(key_padding_mask).reshape(1, -1))
                )
        elif self.batch_first:
            q, k, v = query, key, value
        else:
            q, k, v = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        n, lq, e = q.shape
        s = k.shape[1]
        if e != self.embed_dim:
            raise ValueError(f"query: last dim {e} (shape {query.shape}) != embed_dim {self.embed_dim}")
        if k.shape[-1] != self.kdim or v.shape[-1] != self.vdim:
            raise ValueError(
                f"key/value: last dims {k.shape[-1]}/{v.shape[-1]} (shapes {key.shape}, {value.shape}) must equal "
                f"kdim {self.kdim} / vdim {self.vdim}"
            )
        if k.shape[:2] != v.shape[:2] or k.shape[0] != n:
            raise ValueError(f"key/value: shapes {key.shape} and {value.shape} do not match query {query.shape}")
        h, d = self.num_heads, self.head_dim
        dt = q.data.dtype

        mask = None
        am = _float_mask(attn_mask, "attn_mask", dt)
        if am is None and is_causal:
            am = np.where(np.triu(np.ones((lq, s), bool), 1), -np.inf, 0.0).astype(dt)
        if am is not None:
            if _shape(am) == (lq, s):
                mask = am
            elif _shape(am) == (n * h, lq, s):
                mask = am.reshape(n, h, lq, s)
            else:
                raise ValueError(
                    f"attn_mask: shape {_shape(am)} should be ({lq}, {s}) or ({n * h}, {lq}, {s}) (L, S / N*H, L, S)"
                )
        kpm = _float_mask(key_padding_mask, "key_padding_mask", dt)
        if kpm is not None:
            if _shape(kpm) != (n, s):
                raise ValueError(f"key_padding_mask: shape {_shape(kpm)} should be ({n}, {s}) (batch, source length)")
            kpm = kpm.reshape(n, 1, 1, s)
            mask = kpm if mask is None else mask + kpm

        # [N, L, E] -> [N, H, L, D]
        qh = self._proj(q, 0).reshape(n, lq, h, d).transpose(1, 2)
        kh = self._proj(k, 1).reshape(n, s, h, d).transpose(1, 2)
        vh = self._proj(v, 2).reshape(n, s, h, d).transpose(1, 2)
        p = self.dropout if self.training else 0.0
        attn = None
        if need_weights:  # the probabilities are an output: compute them explicitly
            scores = (qh @ kh.transpose(-2, -1)) * (1.0 / math.sqrt(d))
            if mask is not None:
                scores = scores + mask
            attn = masked_softmax(scores)  # a fully masked row: probabilities 0, not NaN (see functional_attention)
            if p > 0:  # torch returns the dropped-out probabilities as attn_weights too
                attn = F.dropout(attn, p)
            ctx = attn @ vh
        else:  # the additive float mask (0 / -inf) is what sdpa adds to the scores
            ctx = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, dropout_p=p)
        out = self.out_proj(ctx.transpose(1, 2).reshape(n, lq, e))
        if nd == 2:
            out = out.reshape(lq, e)
        elif not self.batch_first:
            out = out.transpose(0, 1)
        if attn is None:
            return out, None
        w = attn.mean(1) if average_attn_weights else attn
        return out, (w.reshape(w.shape[1:]) if nd == 2 else w)

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, batch_first={self.batch_first}"


def _activation(activation: str | Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    if callable(activation):
        return activation
    if activation == "relu":
        return F.relu
    if activation == "gelu":
        return F.gelu
    raise ValueError(f"activation: should be 'relu', 'gelu' or a callable, got {activation!r}")


class TransformerEncoderLayer(Module):
    """torch.nn.TransformerEncoderLayer: self-attention + feed-forward, each with residual, dropout and LayerNorm.
    ``forward(src, src_mask=None, src_key_padding_mask=None, is_causal=False)``."""

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str | Callable[[Tensor], Tensor] = "relu",
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation = _activation(activation)

    def _sa_block(self, x: Tensor, attn_mask: Any, key_padding_mask: Any, is_causal: bool) -> Tensor:
        y = self.self_attn(
            x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False, is_causal=is_causal
        )[0]
        return self.dropout1(y)

    def _ff_block(self, x: Tensor) -> Tensor:
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))

    def forward(
        self, src: Tensor, src_mask: Any = None, src_key_padding_mask: Any = None, is_causal: bool = False
    ) -> Tensor:
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff_block(self.norm2(x))
        x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff_block(x))


class TransformerEncoder(Module):
    """torch.nn.TransformerEncoder: ``num_layers`` deep copies of ``encoder_layer`` (parameters ``layers.i.*``) and an
    optional final ``norm``. ``forward(src, mask=None, src_key_padding_mask=None, is_causal=None)``. (torch's eval-mode
    nested-tensor fast path returns 0 at padded positions; this module always computes them, like torch in training.)
    """

    def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int, norm: Module | None = None) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers: must be >= 1, got {num_layers}")
        self.layers = ModuleList([copy.deepcopy(encoder_layer) for _ in range(num_layers)])
        self.num_layers = num_layers
        self.norm = norm

    def forward(
        self, src: Tensor, mask: Any = None, src_key_padding_mask: Any = None, is_causal: bool | None = None
    ) -> Tensor:
        x = src
        for layer in self.layers:
            x = layer(x, src_mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=bool(is_causal))
        return self.norm(x) if self.norm is not None else x
