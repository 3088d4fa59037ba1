"""Prometheus metrics: request outcomes and latencies observed here, live engine state read at scrape."""
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


# (family, name, help, key): read from manager.stats(), or from engine.stats() once loaded, at scrape time
MANAGER_LIVE = (
    (GaugeMetricFamily, "rosefast_inflight_requests", "requests holding an admission slot", "inflight"),
    (CounterMetricFamily, "rosefast_admitted", "requests admitted", "admitted"),
    (CounterMetricFamily, "rosefast_rejected", "requests refused with 429", "rejected"),
    (CounterMetricFamily, "rosefast_tokenized_prompts", "prompts encoded", "tokenized_prompts"),
    (CounterMetricFamily, "rosefast_merged_chunks", "deltas that reached a lagging reader merged into an earlier "
                                                    "chunk (0 while every reader keeps up)", "merged_chunks"),
)
ENGINE_LIVE = (
    (GaugeMetricFamily, "rosefast_kv_blocks_used", "KV cache blocks in use", "kv_blocks_used"),
    (GaugeMetricFamily, "rosefast_kv_blocks_total", "KV cache blocks", "kv_blocks_total"),
    (CounterMetricFamily, "rosefast_prefix_cache_hits", "prefix cache block hits", "prefix_cache_hits"),
    (CounterMetricFamily, "rosefast_prefix_cache_misses", "prefix cache block misses", "prefix_cache_misses"),
    (CounterMetricFamily, "rosefast_prefix_cache_evictions", "cached blocks evicted", "prefix_cache_evictions"),
    (CounterMetricFamily, "rosefast_preemptions", "sequences preempted", "preemptions"),
    (CounterMetricFamily, "rosefast_engine_steps", "engine steps run", "steps"),
    (GaugeMetricFamily, "rosefast_running_requests", "sequences in the engine", "running"),
    (GaugeMetricFamily, "rosefast_waiting_requests", "sequences waiting for admission to the engine", "waiting"),
)


class _LiveState:
    """Reads the manager's and the engine's stats() at scrape time (no bookkeeping on the request path)."""

    def __init__(self, state):
        self._state = state

    def collect(self):
        m = self._state.manager
        yield GaugeMetricFamily("rosefast_ready", "1 when the model is loaded", value=int(bool(m and m.ready)))
        if m is None:
            return
        stats = m.stats()
        for family, name, doc, key in MANAGER_LIVE:
            yield family(name, doc, value=stats[key])
        backlog = m.backlog
        yield HistogramMetricFamily("rosefast_backlog_depth", "deltas per chunk a stream takes (1: not merged)",
                                    buckets=backlog.buckets(), sum_value=backlog.depth_sum)
        books = GaugeMetricFamily("rosefast_bookkeeping_entries", "what is held per request (0 when idle)",
                                  labels=["map"])
        for name, size in m.bookkeeping().items():
            books.add_metric([name], size)
        yield books
        engine = m.engine
        if engine is not None:
            stats = engine.stats()
            for family, name, doc, key in ENGINE_LIVE:
                yield family(name, doc, value=stats[key])


class Metrics:
    def __init__(self, state):
        self.registry = CollectorRegistry()
        self.requests = Counter("rosefast_requests", "HTTP requests by endpoint and status", ["endpoint", "status"],
                                registry=self.registry)
        self.prompt_tokens = Counter("rosefast_prompt_tokens", "prompt tokens of completed requests",
                                     registry=self.registry)
        self.completion_tokens = Counter("rosefast_completion_tokens", "tokens generated", registry=self.registry)
        self.ttft = Histogram("rosefast_ttft_seconds", "request arrival to first token", buckets=LATENCY_BUCKETS,
                              registry=self.registry)
        self.itl = Histogram("rosefast_itl_seconds", "gap between a request's consecutive streamed events",
                             buckets=LATENCY_BUCKETS, registry=self.registry)
        self.e2e = Histogram("rosefast_e2e_seconds", "request arrival to its last token", buckets=LATENCY_BUCKETS,
                             registry=self.registry)
        self.registry.register(_LiveState(state))

    def render(self):
        return generate_latest(self.registry)


ENDPOINTS = {"/v1/completions": "completions", "/v1/chat/completions": "chat", "/v1/models": "models",
             "/tokenize": "tokenize", "/detokenize": "detokenize", "/tokenizer_info": "tokenizer_info"}


def count_request(state, environ, endpoint, status):
    """One increment of rosefast_requests_total per request, whichever path answered it (the mark is kept
    in the WSGI environ: a streaming body finishes outside Flask's request context)."""
    if not environ.get("rosefast.counted"):
        environ["rosefast.counted"] = True
        state.metrics.requests.labels(endpoint, status).inc()
