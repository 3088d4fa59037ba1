"""Prometheus metrics: request outcomes and latencies observed here, live engine state read at scrape."""
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _LiveState:
    """Reads the manager and engine at scrape time (no bookkeeping on the request path)."""

    def __init__(self, state):
        self._state = state

    def collect(self):
        m = self._state.manager
        yield GaugeMetricFamily("rosefast_ready", "1 when the model is loaded", value=int(bool(m and m.ready)))
        if m is None:
            return
        adm = m.admission
        yield GaugeMetricFamily("rosefast_inflight_requests", "requests holding an admission slot", value=adm.inflight)
        yield CounterMetricFamily("rosefast_admitted", "requests admitted", value=adm.accepted_total)
        yield CounterMetricFamily("rosefast_rejected", "requests refused with 429", value=adm.rejected_total)
        yield CounterMetricFamily("rosefast_tokenized_prompts", "prompts encoded", value=m.tokenized_total)
        books = GaugeMetricFamily("rosefast_bookkeeping_entries", "per-request map sizes (0 when idle)",
                                  labels=["map"])
        for name, size in m.bookkeeping().items():
            books.add_metric([name], size)
        yield books
        engine = m.engine
        if engine is None:
            return
        bm = engine.block_manager
        yield GaugeMetricFamily("rosefast_kv_blocks_used", "KV cache blocks in use", value=bm.num_used_blocks)
        yield GaugeMetricFamily("rosefast_kv_blocks_total", "KV cache blocks", value=bm.num_blocks)
        yield CounterMetricFamily("rosefast_prefix_cache_hits", "prefix cache block hits", value=bm.hits)
        yield CounterMetricFamily("rosefast_prefix_cache_misses", "prefix cache block misses", value=bm.misses)
        yield CounterMetricFamily("rosefast_prefix_cache_evictions", "cached blocks evicted", value=bm.evictions)
        yield CounterMetricFamily("rosefast_preemptions", "sequences preempted", value=engine.scheduler.preemptions)
        yield CounterMetricFamily("rosefast_engine_steps", "engine steps run", value=engine.steps)
        yield GaugeMetricFamily("rosefast_running_requests", "sequences in the engine",
                                value=len(engine.scheduler.running))
        yield GaugeMetricFamily("rosefast_waiting_requests", "sequences waiting for admission to the engine",
                                value=len(engine.scheduler.waiting))


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
