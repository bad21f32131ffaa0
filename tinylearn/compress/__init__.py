"""``tinylearn.compress``: adapting, distilling and factorising models (topic 14).

    LoRA (lora.py)              LoRALinear, apply_lora, merge/unmerge, adapter-only state dicts; parity with peft
                                (peft_compat.py); several adapters on one base (multi_lora.py); gated LoRA and a
                                rank advisor (lora_adapt.py)
    QLoRA (nf4.py, qlora.py)    the NF4 data type derived from normal quantiles, block-wise absmax with double
                                quantization, a dequantize-on-the-fly matmul in C++ (cpp_src/compress_nf4.cpp)
    distillation (distill.py)   distill_loss with the T^2 scaling, feature distillation, a Distiller loop,
                                (T, pruning ratio) schedule search
    low rank (lowrank.py)       SVD / randomized SVD factorisation of Linear and Conv2d, rank by energy or budget;
                                PowerSGD-style gradient compression (grad_compress.py)
    search (nas.py, latency_table.py, mixed_config.py)   a measured per-op latency table and predictor, an
                                evolutionary hardware-aware search, per-layer (rank, bits) assignment

Names resolve lazily (``tl.compress.LoRALinear`` imports lora.py on first use).
"""

from __future__ import annotations

from .._lazy import lazy_exports

_EXPORTS = {
    "LoRALinear": "lora",
    "LoRAConv2d": "lora",
    "apply_lora": "lora",
    "merge_lora": "lora",
    "unmerge_lora": "lora",
    "trainable_parameters": "lora",
    "lora_state_dict": "lora",
    "load_lora_state_dict": "lora",
    "add_adapter": "lora_named",
    "use_adapters": "lora_named",
    "adapter_names": "lora_named",
    "to_peft_state_dict": "peft_compat",
    "from_peft_state_dict": "peft_compat",
    "MultiLoRALinear": "multi_lora",
    "AdapterCache": "multi_lora",
    "SimHashIndex": "multi_lora",
    "GatedLoRA": "lora_adapt",
    "RankAdvisor": "lora_adapt",
    "resize_rank": "lora_adapt",
    "nf4_matmul": "nf4",
    "nf4_quantize": "nf4",
    "nf4_dequantize": "nf4",
    "QLoRALinear": "qlora",
    "apply_qlora": "qlora",
    "distill_loss": "distill",
    "Distiller": "distill",
    "FeatureDistill": "distill",
    "LowRankLinear": "lowrank",
    "rank_for_energy": "lowrank",
    "randomized_svd": "lowrank",
    "factorize": "lowrank",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
