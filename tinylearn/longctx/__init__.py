"""``tinylearn.longctx``: long context and mixture of experts (topic 16), one place to find them.

The mechanisms live where a torch user looks for them (``tl.parallel`` for what runs over processes, ``tl.nn`` for
layers); this package names them together and holds the topic's benchmark (``tinylearn bench longctx``):

    context parallelism     ring_attention (K/V blocks around the ring, online-softmax merge, zig-zag causal
                            balance), ulysses_attention (all-to-all sequence <-> heads), SequenceParallelMLP
                            (Megatron SP: reduce-scatter / all-gather around the TP layers)   tl.parallel;
                            the ring's chunk size from a probe + a fitted time/memory model (parallel/sp_chunk.py)
    mixture of experts      MoE (router, capacity, dropless grouped GEMM, switch aux + z-loss)   tl.nn
                            expert_parallel / ExpertParallelMoE (all-to-all dispatch, hot-expert replicas);
                            ExpertHeat: moving-average heat -> replicate / migrate / release (parallel/expert_heat.py)
    MoE communication       only the active experts' gradients, top-k or PowerSGD with error feedback
                            (parallel/expert_grads.py); per-layer bandwidth quotas by weighted water-filling
                            (parallel/bandwidth_quota.py); a router trained to avoid badly quantized experts
                            (nn/moe_quant_router.py, a MODEL of int4/int8 experts)
    sparse attention        block-sparse patterns (local, global tokens, strided, random) and the C++ kernel that
                            skips empty tiles (nn/sparse_attention.py); per-layer pattern search under a budget
                            (nn/pattern_search.py); token merging, also bounded by int8 error
                            (nn/token_merge.py, nn/token_merge_quant.py)
    attention extras        two-scale attention with a precision per scale (nn/multiscale_attention.py), a shared
                            K/V prefix attended once for a batch (nn/shared_kv_attention.py), pruning heads and keys
                            from cross-batch statistics (nn/attention_pruning.py)

Names resolve lazily (``tl.longctx.ring_attention`` imports ring_attention.py on first use).
"""

from __future__ import annotations

from .._lazy import lazy_exports

_MODULES = {
    ".parallel.ring_attention": ("ring_attention", "zigzag_shard", "zigzag_unshard", "shard_sequence", "ring_bytes",
                                  "ring_work", "attention_reference"),
    ".parallel.sp_chunk": ("chunked_ring_forward", "chunk_bytes", "ChunkModel", "ChunkChoice", "choose_chunk",
                           "probe_chunks", "fit_chunk_model"),
    ".parallel.ulysses": ("ulysses_attention", "ulysses_bytes"),
    ".parallel.seq_parallel": ("SequenceParallelMLP", "sp_bytes", "gather_from_sp", "reduce_scatter_to_sp"),
    ".parallel.moe_parallel": ("TorchMoE", "ExpertParallelMoE", "expert_parallel", "all_to_all", "plan_replication"),
    ".parallel.expert_heat": ("ExpertHeat", "HeatDecision", "swap_experts", "release_replica", "ep_forward_bytes",
                              "dispatch_rows", "expert_bytes"),
    "expert_grads": ("ExpertGradSync", "expert_grad_rows", "set_expert_grads", "make_buckets"),
    ".parallel.bandwidth_quota": ("water_fill", "is_weighted_max_min_fair", "layer_weights"),
    ".nn.moe_quant_router": ("QuantAwareRouter", "fake_quant_per_channel"),
    ".nn.moe": ("MoE", "capacity", "route", "grouped_linear"),
    ".nn.sparse_attention": ("BlockLayout", "BlockPattern", "block_sparse_attention", "local", "global_tokens",
                              "strided", "random_blocks", "dense", "causal"),
    ".nn.token_merge": ("bipartite_soft_matching", "merge", "unmerge", "merge_wavg"),
    "token_merge_quant": ("quant_aware_matching", "int8_roundtrip", "merge_quant_errors", "merged_attention_error"),
    "pattern_search": ("layer_qkv", "score_patterns", "search_patterns", "PatternScores", "SearchResult"),
    ".nn.multiscale_attention": ("multiscale_attention", "block_summaries", "precision_sweep", "choose_precision",
                                 "kv_bytes"),
    ".nn.shared_kv_attention": ("shared_prefix_attention", "KVReads", "per_sequence_attention", "shared_kv_bytes"),
    ".nn.attention_pruning": ("AttentionPruner", "PrunePlan", "pruned_attention", "attention_flops"),
}  # fmt: skip
_EXPORTS = {name: mod for mod, names in _MODULES.items() for name in names}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
