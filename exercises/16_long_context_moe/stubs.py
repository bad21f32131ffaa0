"""Exercises for notebook 16 (long context and mixture of experts). Replace each ``raise NotImplementedError`` with
your code, then run

    pytest exercises/16_long_context_moe                  # your answers
    pytest exercises/16_long_context_moe --impl=reference

Each stub's NotImplementedError names the library code its reference answer (reference.py) uses. Bad input raises
ValueError whose message starts with the argument's name (``"top_k: ..."``) and shows the offending value.
"""

from __future__ import annotations

import numpy as np
import torch


def merge_partial_attention(
    o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attentions of the same queries over DISJOINT key sets K1 and K2 into the attention over
    K1 u K2: what one ring-attention step does with the K/V block it has just received (FlashAttention's online
    softmax, one block at a time).

    A partial attention over key set K, per query row i (s_ij = scale * q_i . k_j, the scaled scores):

        o_i   = sum_{j in K} softmax_K(s_i)_j v_j       [..., N, Dv]   normalised over K only
        lse_i = log sum_{j in K} exp(s_ij)              [..., N]       (-inf when the row sees no key of K)

    The merge (a weighted average whose weights are each part's share of the softmax denominator):

        lse = log(exp(lse1) + exp(lse2))                computed stably: m = max(lse1, lse2), lse = m + log(...)
        o   = exp(lse1 - lse) * o1 + exp(lse2 - lse) * o2

    Return ``(o, lse)``: o shaped and typed like ``o1``, lse like ``lse1``. The result is itself a partial attention
    (over K1 u K2), so merges fold: merging P ring steps one after another gives the attention over all keys.

    Empty parts: a row with lse_a = -inf has no key in that part; its o_a row is IGNORED (it may hold anything, NaN
    included, as a 0/0 would give) and the other part passes through unchanged. A row empty in both parts gives
    o = 0 and lse = -inf (torch's convention for a fully masked row). Never produce NaN for such rows, in the
    forward or in the backward: the function must be differentiable with torch autograd in all four inputs.

    Bad input -> ValueError naming the argument: any input not a floating-point torch.Tensor; ``o1`` with no
    dimension; ``o2`` of another shape, dtype or device than ``o1``; ``lse1``/``lse2`` not of shape
    ``o1.shape[:-1]``, of another dtype than each other, or holding NaN or +inf.
    """
    raise NotImplementedError("reference solution: the online-softmax merge in tinylearn/parallel/ring_attention.py")


def topk_route(logits: np.ndarray, top_k: int, capacity: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Top-k mixture-of-experts routing with a per-expert capacity (Switch Transformer, GShard).

    ``logits`` [T, E]: the router's scores of T tokens for E experts. Returns ``(expert, gate, kept)``, each [T, top_k]:

    expert  int64: token t's j-th choice, the experts in decreasing logit order; ties go to the LOWER expert index
    gate    the gate weight, in the dtype of ``logits``, from probs = softmax(logits, axis=-1) (computed in float64):
            top_k == 1: the raw probability probs[t, expert[t, 0]] (Switch); top_k >= 2: the chosen probabilities
            renormalised to sum to 1 per token (GShard / Mixtral). Gates ignore the capacity: a dropped
            assignment keeps its gate, ``kept`` says it is dropped (the layer multiplies gate by kept).
    kept    bool: whether assignment (t, j) fits in its expert's ``capacity`` slots. Slots are handed out in
            PRIORITY ORDER: slot j = 0 of every token in token order, then slot j = 1 of every token, ... (so a
            token's second choice never evicts another token's first choice). An assignment arriving at an expert
            that already holds ``capacity`` assignments is dropped. ``capacity`` None: dropless, all kept.

    Example: logits [[2, 1, 0], [0, 3, 1]], top_k 2, capacity 1 -> expert [[0, 1], [1, 2]]; priority order
    (t0, j0) -> expert 0 kept, (t1, j0) -> expert 1 kept, (t0, j1) -> expert 1 full: dropped, (t1, j1) -> expert 2
    kept; kept [[True, False], [True, True]].

    Bad input -> ValueError naming the argument: ``logits`` not a 2-D floating-point array with at least one
    expert, or holding NaN / inf; ``top_k`` not an int (a bool is not an int) in 1..E; ``capacity`` not None and not
    an int >= 1. T = 0 tokens is allowed (empty outputs).
    """
    raise NotImplementedError("reference solution: tinylearn/nn/moe.py:route (probs, top_k, cap) and moe_ffn's gates")


def block_sparse_mask(n: int, block: int, window: int, n_global: int, causal: bool = False) -> np.ndarray:
    """The token-level boolean attention mask [n, n] (True = query i may attend to key j) of a Longformer-style
    block-sparse pattern, decided at BLOCK granularity on blocks of ``block`` tokens (the last block may be short):

    with qb = i // block, kb = j // block, g = ceil(n_global / block) (global tokens rounded up to whole blocks):

        allowed(i, j) = |qb - kb| <= window          a sliding window of 2 * window + 1 blocks
                        or qb < g  or  kb < g        the first g blocks attend everywhere and are seen by everyone
        causal:         allowed(i, j) and j <= i     then the token-level causal mask on top (the diagonal kept)

    The same mask as ``(local(window) | global_tokens(n_global) [| causal()]).layout(n, n, block).dense_mask()`` in
    tinylearn.nn.sparse_attention; passed to torch's ``scaled_dot_product_attention(attn_mask=mask)`` it gives
    what tinylearn's ``block_sparse_attention`` computes by visiting only the kept tiles. Every row keeps at least
    its diagonal (i, i), so no row is fully masked.

    Bad input -> ValueError naming the argument: ``n`` or ``block`` not an int >= 1; ``window`` or ``n_global`` not
    an int >= 0 (a bool is not an int); ``causal`` not a bool.
    """
    raise NotImplementedError("reference solution: tinylearn/nn/sparse_attention.py: local | global_tokens | causal")
