"""tl.inference — LLM inference on tinylearn's own nn: TinyGPT (RoPE, GQA/MQA, dense KV cache), sampling and
``generate``, a paged KV cache with copy-on-write prefix sharing, a hash index over full blocks (automatic prefix
caching), INT8 mode and token-priority eviction / re-expansion, paged attention, speculative decoding, and a
static-vs-continuous batching serving simulator with an SLA (earliest-deadline) priority queue.

    model = tl.inference.TinyGPT(vocab_size=64, d_model=64, n_heads=4, n_layers=2, max_seq_len=128, n_kv_heads=2)
    tokens = tl.inference.generate(model, [1, 2, 3], max_new_tokens=16, temperature=0.8, top_p=0.9, seed=0)
"""

from .adaptive_temperature import TemperatureController, generate_adaptive, repetition_rate, semantic_consistency
from .batching import form_batches, padding_stats
from .checks import InvalidDistributionError
from .config import GPTConfig
from .kv_delta import delta_compress, delta_decompress, delta_stats
from .model import DenseKVCache, TinyGPT, apply_rope, causal_mask, kv_append, kv_gather, rope_tables, rotate_half
from .paged import (
    PagedKVCache,
    attention_received,
    blocks_needed,
    dense_attention,
    dequantize_int8,
    kv_bytes_per_token,
    locate,
    paged_attention,
    paged_attention_batch,
    priority_keep,
    quantize_int8,
)
from .sampling import filter_probs, generate, sample_from, softmax, top_k_filter, top_p_filter
from .serving import linear_step_cost, poisson_requests, simulate_serving
from .session import GPTSession, TableLM, open_session
from .shared_device import estimate_footprint, simulate_shared_device, weighted_tail_latency
from .speculative import accept_draft, residual_distribution, speculative_generate
from .torch_ref import torch_reference

__all__ = [
    "GPTConfig",
    "TinyGPT",
    "DenseKVCache",
    "kv_append",
    "kv_gather",
    "torch_reference",
    "rope_tables",
    "rotate_half",
    "apply_rope",
    "causal_mask",
    "generate",
    "filter_probs",
    "InvalidDistributionError",
    "softmax",
    "top_k_filter",
    "top_p_filter",
    "sample_from",
    "PagedKVCache",
    "paged_attention",
    "paged_attention_batch",
    "priority_keep",
    "attention_received",
    "blocks_needed",
    "locate",
    "dense_attention",
    "quantize_int8",
    "dequantize_int8",
    "kv_bytes_per_token",
    "speculative_generate",
    "accept_draft",
    "residual_distribution",
    "simulate_serving",
    "linear_step_cost",
    "poisson_requests",
    "GPTSession",
    "TableLM",
    "open_session",
    "form_batches",
    "padding_stats",
    "simulate_shared_device",
    "weighted_tail_latency",
    "estimate_footprint",
    "delta_compress",
    "delta_decompress",
    "delta_stats",
    "TemperatureController",
    "generate_adaptive",
    "repetition_rate",
    "semantic_consistency",
]
