"""``tinylearn.serve``: an LLM serving engine and an OpenAI-compatible HTTP server on TinyGPT (topic 13).

    Engine (engine.py)          continuous batching: one scheduler step = choose requests (scheduler.py), allocate
                                paged KV blocks with prefix caching (block_manager.py), one ragged batched forward of
                                prefill chunks + decode tokens (runner.py), sample, stream; preemption by swap or
                                recompute; KV tiers behind the arena (tiering.py); a delta-compressed host tier
                                for swapped blocks (delta_tier.py: keyframe + thresholded token deltas)
    SamplingParams, RequestOutput, EngineFull, AdmissionRejected (types.py); ByteTokenizer (tokenizer.py)
    server (server.py)          FastAPI app: /v1/completions, /v1/chat/completions (SSE), /v1/models, /health,
                                /metrics; 400 naming the field, 429/503 with Retry-After; `tinylearn serve`
    models                      safetensors checkpoints (checkpoint.py); Hugging Face GPT-2 -> TinyGPT (hf.py)
    latency.py                  a step-cost MODEL fitted from measured steps, used for admission control
    journal.py, prewarm.py, eviction.py, autoscale.py, pipeline.py, beams.py, parallel_choice.py: the serving
                                questions of notebook 13 (append-only KV log, shard prewarming, scored eviction,
                                autoscaling, stage pipelines, branch merging, decode-strategy choice)

Names resolve lazily, so ``import tinylearn.serve`` does not import FastAPI until the server is used.
"""

from __future__ import annotations

from .._lazy import lazy_exports

_EXPORTS = {
    "Engine": "engine",
    "SamplingParams": "types",
    "RequestOutput": "types",
    "EngineFull": "types",
    "AdmissionRejected": "types",
    "ByteTokenizer": "tokenizer",
    "TieredKVStore": "tiering",
    "DeltaKVStore": "delta_tier",
    "StepCostModel": "latency",
    "AdmissionController": "latency",
    "create_app": "server",
    "AsyncEngine": "async_engine",
    "save_model": "checkpoint",
    "load_model": "checkpoint",
    "tiny_model": "checkpoint",
    "from_hf": "hf",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
