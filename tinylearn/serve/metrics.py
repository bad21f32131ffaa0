"""Prometheus metrics of one server (its own CollectorRegistry, never the process-global one).

Gauges are read from the engine's stats snapshot when /metrics is scraped; histograms and counters are observed by
the request handlers:

    tinylearn_serve_queue_depth          requests waiting for admission (engine waiting queue)
    tinylearn_serve_running / _swapped   requests running / preempted to the host tier
    tinylearn_serve_kv_usage             fraction of KV blocks in use;  _kv_blocks_used, _kv_blocks_total
    tinylearn_serve_prefix_hit_rate      prompt tokens served from the prefix cache / prompt tokens
    tinylearn_serve_ttft_seconds         histogram: arrival -> first generated token
    tinylearn_serve_tpot_seconds         histogram: (e2e - ttft) / (output tokens - 1), per request with >= 2 tokens
    tinylearn_serve_e2e_latency_seconds  histogram: arrival -> last token
    tinylearn_serve_requests_total{finish_reason}      finished requests (stop / length / abort / error)
    tinylearn_serve_generated_tokens_total, _prompt_tokens_total
    tinylearn_serve_http_responses_total{code}          responses by HTTP status (200, 400, 429, 503, ...)
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

PREFIX = "tinylearn_serve"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TOKEN_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
GAUGES = {
    "queue_depth": ("waiting", "Requests waiting for admission"),
    "running": ("running", "Requests running (prefill or decode)"),
    "swapped": ("swapped", "Requests preempted to the host tier"),
    "kv_usage": ("kv_usage", "Fraction of KV-cache blocks in use"),
    "kv_blocks_used": ("kv_blocks_used", "KV-cache blocks in use"),
    "kv_blocks_total": ("kv_blocks_total", "KV-cache blocks in the pool"),
    "prefix_hit_rate": ("prefix_hit_rate", "Prompt tokens served from the prefix cache / prompt tokens"),
}
CONTENT_TYPE = CONTENT_TYPE_LATEST


class ServerMetrics:
    """One server's metrics; ``render(stats)`` refreshes the gauges and returns the Prometheus text format."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.gauges = {k: Gauge(f"{PREFIX}_{k}", doc, registry=r) for k, (_, doc) in GAUGES.items()}
        self.ttft = Histogram(f"{PREFIX}_ttft_seconds", "Time to first token", buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram(f"{PREFIX}_tpot_seconds", "Time per output token", buckets=TOKEN_BUCKETS, registry=r)
        self.e2e = Histogram(
            f"{PREFIX}_e2e_latency_seconds", "Request latency", buckets=LATENCY_BUCKETS, registry=r
        )  # fmt: skip
        self.requests = Counter(f"{PREFIX}_requests", "Finished requests", ["finish_reason"], registry=r)
        self.gen_tokens = Counter(f"{PREFIX}_generated_tokens", "Generated tokens", registry=r)
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "Prompt tokens", registry=r)
        self.http = Counter(f"{PREFIX}_http_responses", "HTTP responses by status code", ["code"], registry=r)

    def observe_request(
        self, *, ttft_s: float | None, e2e_s: float, n_output: int, n_prompt: int, finish_reason: str
    ) -> None:
        """Record one finished request (TPOT only with >= 2 output tokens: the first token's time is TTFT)."""
        self.requests.labels(finish_reason=finish_reason or "unknown").inc()
        self.gen_tokens.inc(max(0, n_output))
        self.prompt_tokens.inc(max(0, n_prompt))
        self.e2e.observe(max(0.0, e2e_s))
        if ttft_s is not None:
            self.ttft.observe(max(0.0, ttft_s))
            if n_output >= 2:
                self.tpot.observe(max(0.0, (e2e_s - ttft_s) / (n_output - 1)))

    def count_response(self, code: int) -> None:
        self.http.labels(code=str(int(code))).inc()

    def render(self, stats: dict[str, Any]) -> bytes:
        for k, (key, _) in GAUGES.items():
            v = stats.get(key)
            if isinstance(v, int | float) and not isinstance(v, bool):
                self.gauges[k].set(float(v))
        return generate_latest(self.registry)
