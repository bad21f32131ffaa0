"""FLOPs and bytes moved per op, from its name and its input/output shapes (the profiler's cost model).

Counting conventions (the ones torch.utils.flop_counter.FlopCounterMode uses, so the two agree):

- matmul / mm / bmm / linear: 2 * M * K * N per (broadcast) batch — one multiply and one add per MAC; a linear's
  bias add is not counted (torch counts ``addmm`` as ``mm``).
- convolution: 2 * prod(output shape) * (C_in / groups) * prod(kernel spatial) — 2 * MACs.
- scaled-dot-product attention: 4 * B * H * N * M * D (QK^T and PV, 2 FLOPs per MAC each); softmax not counted.
- element-wise ops (add, mul, relu, exp, ...): 1 FLOP per output element; reductions: 1 per input element;
  softmax / log_softmax / cross-entropy: ~5 per element (max, sub, exp, sum, div/log); layer/group/batch norm:
  ~8 per element (mean, var, normalise, affine); pooling: 1 per input element; embedding / gather / im2col /
  movement ops: 0 FLOPs (pure data movement); int8 GEMMs: 2 integer ops per MAC, counted as FLOPs.
- a backward ("<Name>Backward") costs 2x the forward for matmul-like ops (one GEMM per input gradient) and 1x for
  the rest.
- bytes moved = every input array + every output array at its dtype's itemsize (a compulsory-traffic lower bound:
  caches can only make real traffic larger once the working set spills). Embedding reads only the gathered rows.
- an op this model does not know gets ``flops=None`` (bytes still counted), so tables show "-" rather than a guess.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

Shape = tuple[int, ...]

_MATMUL = {"matmul", "mm", "bmm", "gemm", "int8_gemm"}  # int8: "ops" (2 per MAC) counted like FLOPs
_LINEAR = {"linear", "linearact", "quantsavedlinear", "nf4linearfunction", "nf4linear", "addmm"}
_CONV = {"conv", "conv1d", "conv2d", "conv3d", "convnd", "convndfunction", "convact", "convolution"}
# (block-sparse attention is not here: a dense count would overstate its work by the sparsity)
_ATTN = {"scaleddotproductattention", "sdpa", "attention", "flash_attention"}
_SOFTMAX = {"softmax", "logsoftmax", "log_softmax", "crossentropy", "crossentropyfn", "cross_entropy", "logsumexp"}
_NORM = {"layernorm", "layer_norm", "layernormfn", "groupnorm", "groupnormfn", "batchnorm", "batchnormfn", "rmsnorm"}
_ELEMENTWISE = set(
    "add sub mul div neg abs exp log sqrt pow relu gelu tanh sigmoid erf clip where lerp atan2 copysign "
    "remainder round unary compare cmpf relu_backward silu dropout dropoutfn logaddexp cast autocastcast "
    "rope bias_add fp8_encode fp8_decode quantize_per_tensor dequantize_per_tensor".split()
)
_REDUCE = {"sum", "mean", "max", "min", "var", "prod", "maxdim", "cumsum", "cumprod", "cummax", "argmax", "reduce_sum"}
# pooling: ~1 compare/add per input element read (each read once for non-overlapping windows)
_POOL = set(
    "max_pool2d maxpool2dfunction maxpool2ddirect avgpool2dfunction avgpoolndfunction maxpoolnd avgpoolnd "
    "adaptiveavgpoolfunction adaptiveavgpoolnd adaptivemaxpoolnd".split()
)
_MOVE = set(
    "embedding embeddingfn gather getitem reshape permute expand cat stack pad clone repeat roll scatter "
    "diagonal transpose copy contiguous im2col col2im".split()
)


@functools.cache
def _itemsize(dtype: object) -> int:
    try:
        return int(np.dtype(dtype).itemsize)  # type: ignore[call-overload]
    except TypeError:
        return 4  # dtypes numpy does not know (bf16 tags, torch dtypes): count 4 bytes


def _numel(shape: Shape) -> int:
    return int(math.prod(shape))


def normalize(name: str) -> str:
    """'gemm.matmul' -> 'matmul', 'LinearBackward' -> 'linear', 'CrossEntropyFn' -> 'crossentropyfn' (lower case)."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"name: expected a non-empty op name string, got {name!r}")
    base = name.rsplit(".", 1)[-1]
    if base.endswith("Backward") and len(base) > len("Backward"):
        base = base[: -len("Backward")]
    return base.lower().lstrip("_")


def is_backward(name: str) -> bool:
    return name.rsplit(".", 1)[-1].endswith("Backward") or name.endswith("_backward")


def _matmul_flops(a: Shape, b: Shape) -> int | None:
    if len(a) < 1 or len(b) < 1:
        return None
    a2 = a if len(a) > 1 else (1,) + a
    b2 = b if len(b) > 1 else b + (1,)
    m, k = a2[-2], a2[-1]
    k2, n = b2[-2], b2[-1]
    if k != k2:
        return None
    batch_a, batch_b = a2[:-2], b2[:-2]
    nd = max(len(batch_a), len(batch_b))
    batch_a = (1,) * (nd - len(batch_a)) + batch_a
    batch_b = (1,) * (nd - len(batch_b)) + batch_b
    batch = math.prod(max(x, y) for x, y in zip(batch_a, batch_b))
    return 2 * batch * m * k * n


def forward_flops(name: str, in_shapes: Sequence[Shape], out_shapes: Sequence[Shape] = ()) -> int | None:
    """FLOPs of one forward call of op ``name`` (see the module docstring for the model); None when unknown."""
    key = normalize(name)
    ins = [tuple(s) for s in in_shapes]
    outs = [tuple(s) for s in out_shapes]
    out_elems = sum(_numel(s) for s in outs) if outs else (_numel(ins[0]) if ins else 0)
    if key in _MATMUL:
        return _matmul_flops(ins[0], ins[1]) if len(ins) >= 2 else None
    if key in _LINEAR:  # x (..., K), w (N, K)
        if len(ins) < 2 or len(ins[1]) != 2 or not ins[0] or ins[0][-1] != ins[1][1]:
            return None
        return 2 * _numel(ins[0][:-1]) * ins[1][1] * ins[1][0]
    if key in _CONV:  # x (N, C, *S), w (O, C/g, *K): 2 * out elems * C/g * prod(K)
        if len(ins) < 2 or len(ins[1]) < 3 or not outs:
            return None
        w = ins[1]
        return 2 * _numel(outs[0]) * w[1] * _numel(w[2:])
    if key in _ATTN:  # q (..., N, D), k (..., M, D)
        if len(ins) < 2 or len(ins[0]) < 2 or len(ins[1]) < 2:
            return None
        q, k = ins[0], ins[1]
        return 4 * _numel(q[:-2]) * q[-2] * k[-2] * q[-1]
    if key in _SOFTMAX:
        return 5 * (_numel(ins[0]) if ins else out_elems)
    if key in _NORM:
        return 8 * (_numel(ins[0]) if ins else out_elems)
    if key in _ELEMENTWISE:
        return out_elems
    if key in _REDUCE or key in _POOL:
        return _numel(ins[0]) if ins else None
    if key in _MOVE:
        return 0
    return None


def _backward_factor(key: str) -> int:
    return 2 if key in _MATMUL | _LINEAR | _CONV | _ATTN else 1


def op_cost(
    name: str,
    in_shapes: Sequence[Shape],
    in_dtypes: Sequence[object] = (),
    out_shapes: Sequence[Shape] = (),
    out_dtypes: Sequence[object] = (),
) -> tuple[int | None, int]:
    """(FLOPs or None, bytes moved) of one call of op ``name``.

    For a backward event pass the *forward's* input/output shapes: its FLOPs are the forward's times the backward
    factor, its bytes the same arrays once more (read the saved inputs and the incoming gradient, write the input
    gradients)."""
    if len(in_dtypes) not in (0, len(in_shapes)):
        raise ValueError(f"in_dtypes: {len(in_dtypes)} dtypes for {len(in_shapes)} input shapes")
    if len(out_dtypes) not in (0, len(out_shapes)):
        raise ValueError(f"out_dtypes: {len(out_dtypes)} dtypes for {len(out_shapes)} output shapes")
    key = normalize(name)
    f = forward_flops(name, in_shapes, out_shapes)
    if f is not None and is_backward(name):
        f *= _backward_factor(key)
    in_sizes = [_itemsize(d) for d in in_dtypes] or [4] * len(in_shapes)
    out_sizes = [_itemsize(d) for d in out_dtypes] or [4] * len(out_shapes)
    if key in ("embedding", "embeddingfn") and len(in_shapes) >= 2:
        # the table is not read in full: only the gathered rows (= the output) plus the indices
        nbytes = 2 * sum(_numel(tuple(s)) * z for s, z in zip(out_shapes, out_sizes))
        idx = min(range(len(in_shapes)), key=lambda i: _numel(tuple(in_shapes[i])))  # the indices: the smaller one
        return f, int(nbytes + _numel(tuple(in_shapes[idx])) * in_sizes[idx])
    nbytes = sum(_numel(tuple(s)) * z for s, z in zip(in_shapes, in_sizes))
    nbytes += sum(_numel(tuple(s)) * z for s, z in zip(out_shapes, out_sizes))
    return f, int(nbytes)
