"""Exercises for notebook 14 (compression). Replace each ``raise NotImplementedError`` with your code, then run

    pytest exercises/14_compression                  # your answers
    pytest exercises/14_compression --impl=reference

Each stub's NotImplementedError names the library function or class its reference answer (reference.py) uses.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import tinylearn as tl


class LoRALinear(tl.nn.Module):
    """LoRA on a ``tl.nn.Linear`` ``base`` (Hu et al. 2021)::

        y = base(x) + (x @ lora_A.T) @ lora_B.T * scaling          scaling = alpha / r

    Attributes: ``base_layer`` (the wrapped Linear, kept as is), ``lora_A`` a ``tl.nn.Parameter`` [r, in_features]
    (kaiming-uniform with a = sqrt(5), i.e. U(-1/sqrt(in), 1/sqrt(in)), as peft), ``lora_B`` a Parameter
    [out_features, r] of zeros (so the wrapped layer starts exactly at the base layer), ``r``, ``alpha``,
    ``scaling``, ``merged`` (False). The base layer's parameters are frozen (``requires_grad = False``); only
    lora_A and lora_B are trainable.

    ``merge()``: W += scaling * B @ A (one matmul at inference, no extra latency); ``unmerge()`` subtracts it again.
    A merged layer's forward is the base layer alone. Merging a merged layer, or unmerging an unmerged one, raises
    RuntimeError. Bad input: ``r`` not an int in [1, min(in_features, out_features)] or ``alpha <= 0`` raise
    ValueError naming the argument and the value.
    """

    def __init__(self, base: Any, r: int, alpha: float) -> None:
        super().__init__()
        raise NotImplementedError("reference solution: tinylearn/compress/lora.py:LoRALinear")

    def forward(self, x: Any) -> Any:
        raise NotImplementedError("reference solution: tinylearn/compress/lora.py:LoRALinear.forward")

    def merge(self) -> None:
        raise NotImplementedError("reference solution: tinylearn/compress/lora.py:LoRALinear.merge")

    def unmerge(self) -> None:
        raise NotImplementedError("reference solution: tinylearn/compress/lora.py:LoRALinear.unmerge")


def distill_loss(student_logits: Any, teacher_logits: Any, T: float, alpha: float, targets: Any = None) -> Any:
    """The distillation loss of Hinton et al. (2015), on tinylearn Tensors (differentiable w.r.t. the student)::

        alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T)) + (1 - alpha) * cross_entropy(student, targets)

    KL summed over classes and averaged over the batch (torch's ``F.kl_div(log_p_student, log_p_teacher,
    reduction="batchmean", log_target=True)``). The teacher is frozen: detach it (no gradient reaches it). The T^2
    factor keeps the soft term's gradient independent of T (d KL / d s is O(1/T^2) for large T). ``targets`` (int
    class ids [N]) is required when alpha < 1. Bad input: T <= 0 or alpha outside [0, 1] -> ValueError naming it;
    teacher_logits of a different shape than student_logits -> ValueError.
    """
    raise NotImplementedError("reference solution: tinylearn/compress/distill.py:distill_loss")


def rank_for_energy(W: np.ndarray, energy: float) -> int:
    """The smallest rank r whose top-r singular values of the 2-D matrix ``W`` keep at least ``energy`` of its
    squared Frobenius norm: sum_{i<r} s_i^2 >= energy * sum_i s_i^2 (= energy * ||W||_F^2). By Eckart-Young, the
    truncated SVD W_r then has ||W - W_r||_F^2 <= (1 - energy) ||W||_F^2 and no rank-r matrix does better.
    ``energy`` in (0, 1], else ValueError naming ``energy``; W not 2-D -> ValueError naming ``W``. A zero matrix
    has rank 1 by convention (the factorised layer needs r >= 1)."""
    raise NotImplementedError("reference solution: tinylearn/compress/lowrank.py:rank_for_energy")


def svd_factors(W: np.ndarray, r: int) -> tuple[np.ndarray, np.ndarray]:
    """(A [r, n], B [m, r]) with B @ A the best rank-r approximation of W [m, n] (truncated SVD, the singular values
    split evenly: A = S_r^1/2 V_r^T, B = U_r S_r^1/2): what a factorised Linear(in, r) -> Linear(r, out) holds.
    ``r`` outside [1, min(m, n)] -> ValueError naming it."""
    raise NotImplementedError("reference solution: tinylearn/compress/lowrank.py:svd_factors")
