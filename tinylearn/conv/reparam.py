"""Inference-time reparameterisation: fold a chain of affine ops into one layer.

Three folds, all exact in real arithmetic (the folded layer differs from the original by rounding only):

* **Linear chain** (no nonlinearity between): ``W2 (W1 x + b1) + b2 = (W2 W1) x + (W2 b1 + b2)``. Saves one
  GEMM's launch and its intermediate tensor; it saves FLOPs/parameters only when the hidden width ``h`` is wide
  enough: ``h (d_in + d_out) > d_in d_out`` (a low-rank bottleneck ``d -> r -> d`` with small ``r`` gets *bigger*
  when folded) -- ``linear_chain_cost`` counts both sides.
* **Per-channel scale/shift after a layer** (eval BatchNorm, a learned channel scale, a LayerScale):
  ``s * (W x + b) + t`` is one layer with ``W' = s[:, None...] * W``, ``b' = s * b + t``; for conv and linear
  weights alike (``fold_channel_scale`` reuses ``fold_batchnorm`` with mean 0, var 1, eps 0).
* **Per-feature affine before a linear** (a normalisation's gamma/beta, RMSNorm's weight): ``W (g * x + t) + b``
  is ``W' = W * g[None, :]``, ``b' = W t + b`` (``fold_input_affine``). Not valid before a zero-padded conv: the
  shift would also move the padding, which stays zero in the original.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ._params import as_float_array, as_vector
from .batchnorm_fold import fold_batchnorm


def _weights_biases(weights: Sequence[Any], biases: Sequence[Any] | None) -> tuple[list, list]:
    if isinstance(weights, np.ndarray) or not isinstance(weights, Sequence) or len(weights) == 0:
        raise ValueError(f"weights: expected a non-empty list of [out, in] matrices, got {type(weights).__name__}")
    ws = [as_float_array(w, f"weights[{i}]") for i, w in enumerate(weights)]
    for i, w in enumerate(ws):
        if w.ndim != 2:
            raise ValueError(f"weights[{i}]: expected a 2-D [out, in] matrix, got shape {w.shape}")
        if i and w.shape[1] != ws[i - 1].shape[0]:
            raise ValueError(
                f"weights[{i}]: input width {w.shape[1]} does not match weights[{i - 1}] output {ws[i - 1].shape[0]}"
            )
    if biases is None:
        return ws, [None] * len(ws)
    if isinstance(biases, np.ndarray) or not isinstance(biases, Sequence) or len(biases) != len(ws):
        raise ValueError(f"biases: expected None or a list of {len(ws)} entries (None or [out]), got {biases!r:.80}")
    bs: list = []
    for i, (w, b) in enumerate(zip(ws, biases, strict=True)):
        if b is None:
            bs.append(None)
            continue
        a = as_float_array(b, f"biases[{i}]")
        if a.shape != (w.shape[0],):
            raise ValueError(f"biases[{i}]: expected shape ({w.shape[0]},) to match weights[{i}], got {a.shape}")
        bs.append(a)
    return ws, bs


def fold_linear_chain(weights: Sequence[Any], biases: Sequence[Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(W, b) with ``W x + b == Wk(...(W2 (W1 x + b1) + b2)...) + bk`` for a chain with no nonlinearity between.

    ``weights[i]`` is ``[out_i, in_i]`` (torch ``nn.Linear.weight`` layout, ``in_{i+1} == out_i``); ``biases`` is
    None or one entry (None or ``[out_i]``) per weight. Products are formed in float64 and returned in the inputs'
    result dtype."""
    ws, bs = _weights_biases(weights, biases)
    dt = np.result_type(*ws, *(b for b in bs if b is not None))
    W = ws[0].astype(np.float64)
    b = np.zeros(ws[0].shape[0]) if bs[0] is None else bs[0].astype(np.float64)
    for w, bi in zip(ws[1:], bs[1:], strict=True):
        w64 = w.astype(np.float64)
        W = w64 @ W
        b = w64 @ b + (0.0 if bi is None else bi.astype(np.float64))
    return W.astype(dt), b.astype(dt)


def linear_chain_cost(shapes: Sequence[tuple[int, int]], tokens: int = 1) -> dict[str, int]:
    """Parameters and forward FLOPs (2 per multiply-add) of a linear chain, unfolded vs folded, for ``tokens`` rows.

    ``shapes`` are the ``[out, in]`` weight shapes in order; biases are counted (one per output per layer; FLOPs
    one add per output). Returns dict(params_chain, params_folded, flops_chain, flops_folded, intermediate_elems)
    where ``intermediate_elems`` is the activation elements the chain writes and re-reads between its layers."""
    if isinstance(tokens, bool) or not isinstance(tokens, int | np.integer) or tokens < 1:
        raise ValueError(f"tokens: expected a positive int, got {tokens!r}")
    if not isinstance(shapes, Sequence) or len(shapes) == 0:
        raise ValueError(f"shapes: expected a non-empty list of (out, in) pairs, got {shapes!r:.80}")
    sh = []
    for i, s in enumerate(shapes):
        if (
            not isinstance(s, tuple | list)
            or len(s) != 2
            or not all(isinstance(v, int | np.integer) and not isinstance(v, bool) and v >= 1 for v in s)
        ):
            raise ValueError(f"shapes[{i}]: expected a pair of positive ints (out, in), got {s!r}")
        if i and s[1] != sh[-1][0]:
            raise ValueError(f"shapes[{i}]: input width {s[1]} does not match shapes[{i - 1}] output {sh[-1][0]}")
        sh.append((int(s[0]), int(s[1])))
    d_out, d_in = sh[-1][0], sh[0][1]
    return {
        "params_chain": sum(o * i + o for o, i in sh),
        "params_folded": d_out * d_in + d_out,
        "flops_chain": tokens * sum(2 * o * i + o for o, i in sh),
        "flops_folded": tokens * (2 * d_out * d_in + d_out),
        "intermediate_elems": tokens * sum(o for o, _ in sh[:-1]),
    }


def fold_channel_scale(w: Any, b: Any, scale: Any, shift: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """(W', b') with ``layer(x; W', b') == scale * layer(x; W, b) + shift`` per output channel.

    ``w`` is ``[OC, ...]`` (conv ``[OC, C/g, kh, kw]`` or linear ``[out, in]``), ``b`` None or ``[OC]``, ``scale`` and
    ``shift`` (None = 0) ``[OC]``. This is eval BatchNorm with mean 0, var 1, eps 0, so it reuses
    ``fold_batchnorm``."""
    w_ = as_float_array(w, "w")
    if w_.ndim < 2:
        raise ValueError(f"w: expected an [OC, ...] weight with at least 2 dims, got shape {w_.shape}")
    oc, what = w_.shape[0], f"w shape {w_.shape}"
    s = as_vector(scale, "scale", oc, what)
    t = np.zeros(oc, dtype=s.dtype) if shift is None else as_vector(shift, "shift", oc, what)
    b = None if b is None else as_vector(b, "b", oc, what)
    zeros, ones = np.zeros(oc, dtype=s.dtype), np.ones(oc, dtype=s.dtype)
    return fold_batchnorm(w_, b, zeros, ones, s, t, 0.0)


def fold_input_affine(w: Any, b: Any, scale: Any, shift: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """(W', b') with ``W' x + b' == W (scale * x + shift) + b`` for a linear ``w`` ``[out, in]``.

    Folds a normalisation's per-feature gamma (``scale``, ``[in]``) and beta (``shift``, None = 0) into the next
    linear layer: ``W' = W * scale[None, :]``, ``b' = W shift + b``."""
    w_ = as_float_array(w, "w")
    if w_.ndim != 2:
        raise ValueError(f"w: expected a 2-D [out, in] matrix, got shape {w_.shape}")
    (out, d_in), what = w_.shape, f"w shape {w_.shape}"
    s = as_vector(scale, "scale", d_in, what)
    t = np.zeros(d_in) if shift is None else as_vector(shift, "shift", d_in, what)
    b_ = np.zeros(out, dtype=w_.dtype) if b is None else as_vector(b, "b", out, what)
    dt = np.result_type(w_, b_, s, t) if shift is not None else np.result_type(w_, b_, s)
    w64 = w_.astype(np.float64)
    return (w64 * s.astype(np.float64)[None, :]).astype(dt), (w64 @ t.astype(np.float64) + b_).astype(dt)


__all__ = ["fold_channel_scale", "fold_input_affine", "fold_linear_chain", "linear_chain_cost"]
