"""The server's Prometheus metrics, in a registry of their own (one per app, so apps in one process do not
share counts). Served as text at ``GET /metrics``.

==========================================  =========  ====================================================
name                                        kind       what it counts
==========================================  =========  ====================================================
torch_stablehlo_requests_total              counter    requests answered, by endpoint and outcome: ``stop``
                                                       (eos), ``length`` (max_tokens), ``cancelled`` (the
                                                       client went away), ``rejected`` (4xx), ``error`` (5xx)
torch_stablehlo_prompt_tokens_total         counter    prompt tokens of the requests the engine accepted
torch_stablehlo_generation_tokens_total     counter    tokens generated (eos included)
torch_stablehlo_queue_depth                 gauge      requests waiting for a slot, read at scrape time
torch_stablehlo_slots_busy                  gauge      slots decoding a request, read at scrape time
torch_stablehlo_slots                       gauge      the engine's slots
torch_stablehlo_time_to_first_token_seconds histogram  from the request's arrival to its first token
torch_stablehlo_inter_token_latency_seconds histogram  between consecutive tokens of one request
torch_stablehlo_request_duration_seconds    histogram  from arrival to the last token
==========================================  =========  ====================================================
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

PREFIX = "torch_stablehlo"
OUTCOMES = ("stop", "length", "cancelled", "rejected", "error")
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12)
_FIRST_TOKEN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)


class ServerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, engine):
        self.registry = CollectorRegistry()
        self.requests = Counter(f"{PREFIX}_requests", "Requests answered, by endpoint and outcome",
                                ["endpoint", "outcome"], registry=self.registry)
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "Prompt tokens of accepted requests",
                                     registry=self.registry)
        self.generation_tokens = Counter(f"{PREFIX}_generation_tokens", "Tokens generated",
                                         registry=self.registry)
        self.time_to_first_token = Histogram(f"{PREFIX}_time_to_first_token_seconds",
                                             "Seconds from a request's arrival to its first token",
                                             buckets=_FIRST_TOKEN_BUCKETS,
                                             registry=self.registry)
        self.inter_token_latency = Histogram(f"{PREFIX}_inter_token_latency_seconds",
                                             "Seconds between consecutive tokens of a request",
                                             buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.request_duration = Histogram(f"{PREFIX}_request_duration_seconds",
                                          "Seconds from a request's arrival to its last token",
                                          buckets=_DURATION_BUCKETS, registry=self.registry)
        for name, help_text, read in (("queue_depth", "Requests waiting for a slot", lambda: engine.queue_depth),
                                      ("slots_busy", "Slots decoding a request", lambda: engine.slots_busy),
                                      ("slots", "The engine's slots", lambda: engine.slots)):
            Gauge(f"{PREFIX}_{name}", help_text, registry=self.registry).set_function(read)

    def count(self, endpoint: str, outcome: str) -> None:
        self.requests.labels(endpoint=endpoint, outcome=outcome).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
