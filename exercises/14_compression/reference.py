"""Reference answers for exercises/14_compression, bound to tinylearn.compress (thin adapters where the exercise's
signature differs from the library's)."""

from __future__ import annotations

import numpy as np

from tinylearn.compress import distill as _distill
from tinylearn.compress import lora as _lora
from tinylearn.compress import lowrank as _lowrank


class LoRALinear(_lora.LoRALinear):
    """tinylearn's LoRALinear with the base layer frozen at construction (the library leaves that to apply_lora,
    as peft leaves it to get_peft_model)."""

    def __init__(self, base: object, r: int, alpha: float) -> None:
        super().__init__(base, r, alpha)  # type: ignore[arg-type]
        for p in self.base_layer.parameters():
            p.requires_grad = False


distill_loss = _distill.distill_loss
svd_factors = _lowrank.svd_factors


def rank_for_energy(W: np.ndarray, energy: float) -> int:
    W = np.asarray(W)
    if W.ndim != 2:
        raise ValueError(f"W: expected a 2-D matrix, got shape {W.shape}")
    return _lowrank.rank_for_energy(np.linalg.svd(W, compute_uv=False), energy)
