"""TinyGPT's decode fast path: one new token per sequence, no autograd graph, the same kernels in the same order.

A decode step is ~90 small ops (per layer: LayerNorm, q/k/v projections, two RoPEs, the cache write, attention, the
output projection, a residual add, LayerNorm, the MLP's two Linears and GELU, a residual add). At these sizes the
work per op is a few microseconds and the framework's own cost per op is as large: ``Module.__call__``, the
functional wrapper, ``Function.apply`` (input scan, ``needs_input_grad``, a ``Tensor`` around each output). Under
``no_grad`` none of that is needed, so ``step`` calls each op's ``Function.forward`` directly on the arrays with a
throw-away context -- the very code ``apply`` runs, so the logits are bitwise those of the module path.

``eligible(model)`` decides per call; anything that could observe or change the module path sends the call there:
grad mode on, a ``tl.profile`` / ``tl.compile`` trace / autocast hook installed, anomaly mode, a forward hook or
pre-hook on any module (pruning's re-parametrisation is one), a submodule that is not the plain class (a LoRA or
quantised Linear), learned positions instead of RoPE. Measured (1 thread, S = 32, TinyGPT bench config): the
step goes from ~0.70 ms to ~0.45 ms (torch with its KV cache: ~0.49 ms).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..autograd import function as _function
from ..autograd import ops_elementwise as _ew
from ..autograd import ops_shape as _sh
from ..autograd.linalg import linear_arrays
from ..autograd.tensor import Tensor
from ..nn import GELU, Embedding, LayerNorm, Linear, ModuleList
from ..nn import functional as F
from ..nn import functional_fused as _fused
from ..nn.functional import EmbeddingFn
from ..nn.functional_norm import LayerNormFn


class _Ctx:
    """A context for calling ``Function.forward`` outside ``apply``: saves nothing, records nothing."""

    needs_input_grad = (False, False, False, False)

    def save_for_backward(self, *values: Any) -> None:
        pass

    def mark_non_differentiable(self, *idx: int) -> None:
        pass


def _plain(m: Any, cls: type) -> bool:
    return type(m) is cls and not m._forward_pre_hooks and not m._forward_hooks


def eligible(model: Any, classes: tuple[type, type, type]) -> tuple | None:
    """The modules ``step`` runs, or None when the module path must run (see the module docstring); ``classes``:
    the model's (Block, Attention, MLP) classes (model.py passes them: no import cycle). One walk per call: the
    submodules are read from ``_modules`` directly (``Module.__getattr__`` costs ~0.5 us a lookup)."""
    if _function._GradMode.enabled or _function._GradMode.anomaly:
        return None
    if _function._trace_hook is not None or _function._autocast_hook is not None or _function._profile_hook is not None:
        return None
    top = model.__dict__["_modules"]
    emb, blocks, ln_f, head = top.get("tok_emb"), top.get("blocks"), top.get("ln_f"), top.get("lm_head")
    if model._rope is None or model._forward_pre_hooks or model._forward_hooks:
        return None
    if not (_plain(emb, Embedding) and _plain(ln_f, LayerNorm) and _plain(head, Linear) and _plain(blocks, ModuleList)):
        return None
    block_cls, attention_cls, mlp_cls = classes
    plan = []
    for blk in blocks:
        bm = blk.__dict__["_modules"] if type(blk) is block_cls else {}
        a, m, ln1, ln2 = bm.get("attn"), bm.get("mlp"), bm.get("ln1"), bm.get("ln2")
        if not (_plain(blk, block_cls) and _plain(ln1, LayerNorm) and _plain(ln2, LayerNorm)):
            return None
        if not (_plain(a, attention_cls) and _plain(m, mlp_cls)):
            return None
        am, mm = a.__dict__["_modules"], m.__dict__["_modules"]
        lins = (am.get("q_proj"), am.get("k_proj"), am.get("v_proj"), am.get("o_proj"), mm.get("fc"), mm.get("proj"))
        if not (all(_plain(lin, Linear) for lin in lins) and _plain(mm.get("act"), GELU)):
            return None
        plan.append((ln1, *lins, ln2, mm["act"]))
    return emb, plan, ln_f, head


def _linear(lin: Any, x: np.ndarray) -> np.ndarray:
    return linear_arrays(x, lin.weight.data, None if lin.bias is None else lin.bias.data)  # Linear.forward's math


def _layer_norm(ln: Any, x: np.ndarray) -> np.ndarray:
    ns = (ln.normalized_shape,) if isinstance(ln.normalized_shape, int) else tuple(ln.normalized_shape)
    w = None if ln.weight is None else ln.weight.data
    b = None if ln.bias is None else ln.bias.data
    return LayerNormFn.forward(_Ctx(), x, w, b, normalized_shape=ns, eps=ln.eps)


def step(model: Any, ids: np.ndarray, cache: Any, start: int, rope: Any, plan: tuple) -> Tensor:
    """Logits [B, 1, V] of one new token per sequence after ``start`` cached ones; advances ``cache.length``.
    ``rope``: the model's Rope Function; ``plan``: what ``eligible`` returned (model.py passes both)."""
    c = model.config
    b, t = ids.shape
    h, hkv, hd, g = c.n_heads, c.kv_heads, c.head_dim, c.group
    emb, blocks, ln_f, head = plan
    x = EmbeddingFn.forward(_Ctx(), emb.weight.data, ids)
    cos = np.asarray(model._rope[0][start : start + t], x.dtype)
    sin = np.asarray(model._rope[1][start : start + t], x.dtype)
    for i, (ln1, wq, wk, wv, wo, fc, proj, ln2, act) in enumerate(blocks):
        a = _layer_norm(ln1, x)
        q = _linear(wq, a).reshape(b, t, h, hd).transpose(0, 2, 1, 3)
        k = _linear(wk, a).reshape(b, t, hkv, hd).transpose(0, 2, 1, 3)
        v = _linear(wv, a).reshape(b, t, hkv, hd).transpose(0, 2, 1, 3)
        q, k = rope.forward(_Ctx(), q, cos, sin), rope.forward(_Ctx(), k, cos, sin)
        ka, va = cache.write(i, k, v)
        qg = _sh.Reshape.forward(_Ctx(), q, (b, hkv, g, hd))
        o = F.scaled_dot_product_attention(Tensor(qg), Tensor(ka), Tensor(va)).data  # as Attention's t == 1 branch
        x = _ew.Add.forward(_Ctx(), x, _linear(wo, o.reshape(b, 1, h * hd)))
        f = _fused.GELU.forward(_Ctx(), _linear(fc, _layer_norm(ln2, x)), approximate=act.approximate)
        x = _ew.Add.forward(_Ctx(), x, _linear(proj, f))
    cache.length = start + t
    return Tensor(_linear(head, _layer_norm(ln_f, x)))
