"""Pruning: masks (unstructured, structured, N:M, global), importance scores, schedules, channel surgery.

Mirrors torch.nn.utils.prune on tinylearn.nn modules: one abstract ``compute_mask`` per method, the
``weight_orig`` (Parameter) * ``weight_mask`` (buffer) reparameterisation applied by a forward pre-hook,
composition of repeated pruning (PruningContainer), ``remove`` to make it permanent.

    tl.prune.l1_unstructured(module, name, amount) ; random_unstructured ; ln_structured(module, name, amount, n, dim)
    tl.prune.global_unstructured(parameters, amount) ; tl.prune.n_m_sparsity(module, name, n=2, m=4)
    tl.prune.remove(module, name) ; tl.prune.is_pruned(module) ; tl.prune.sparsity(module_or_array) -> float
    tl.prune.AGPSchedule(initial_sparsity, final_sparsity, start_step, end_step, frequency)(step) -> float

Submodules: masks (numpy math), methods, functional, schedules, scores (magnitude, gradient, Taylor, SNIP,
OBD/Fisher), sensitivity (per-layer sweeps), surgery (physically remove channels),
rigl (dynamic sparse training: RigL, train_rigl), lottery (iterative pruning
with rewinding), bench.
"""

from .functional import (
    custom_from_mask,
    global_unstructured,
    identity,
    is_pruned,
    l1_unstructured,
    ln_structured,
    n_m_sparsity,
    random_structured,
    random_unstructured,
    remove,
    restore,
    sparsity,
)
from .masks import l1_unstructured_mask, ln_structured_mask, n_m_mask, random_unstructured_mask
from .methods import (
    BasePruningMethod,
    CustomFromMask,
    Identity,
    L1Unstructured,
    LnStructured,
    NMSparsity,
    PruningContainer,
    RandomStructured,
    RandomUnstructured,
)
from .rigl import RigL, cosine_update_fraction, drop_and_grow, train_rigl
from .schedules import AGPSchedule, OneShotSchedule, amount_to_reach

__all__ = [
    "AGPSchedule",
    "BasePruningMethod",
    "CustomFromMask",
    "Identity",
    "L1Unstructured",
    "LnStructured",
    "NMSparsity",
    "OneShotSchedule",
    "PruningContainer",
    "RandomStructured",
    "RandomUnstructured",
    "RigL",
    "amount_to_reach",
    "cosine_update_fraction",
    "drop_and_grow",
    "custom_from_mask",
    "global_unstructured",
    "identity",
    "is_pruned",
    "l1_unstructured",
    "l1_unstructured_mask",
    "ln_structured",
    "ln_structured_mask",
    "n_m_mask",
    "n_m_sparsity",
    "random_structured",
    "random_unstructured",
    "random_unstructured_mask",
    "remove",
    "restore",
    "sparsity",
    "train_rigl",
]
