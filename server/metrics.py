"""Prometheus metrics: request outcomes and latencies observed here, live engine state read at scrape."""
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from rosefast.serving.histogram import LATENCY_BOUNDS, Histogram

# name -> help of the latency histograms observed by the streams (rosefast.serving.histogram: no lock per event)
LATENCIES = {"ttft": ("rosefast_ttft_seconds", "request arrival to first token"),
             "itl": ("rosefast_itl_seconds", "gap between a request's consecutive streamed events"),
             "e2e": ("rosefast_e2e_seconds", "request arrival to its last token")}


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
    (GaugeMetricFamily, "rosefast_kv_window_blocks_used", "the sliding-window layers' own KV blocks in use (0: no "
                                                          "such pool)", "kv_window_blocks_used"),
    (GaugeMetricFamily, "rosefast_kv_window_blocks_total", "the sliding-window layers' own KV blocks",
     "kv_window_blocks_total"),
    (GaugeMetricFamily, "rosefast_state_slots_used", "linear-attention layers' recurrent-state slots in use (0: no "
                                                     "such layers)", "state_slots_used"),
    (GaugeMetricFamily, "rosefast_state_slots_total", "linear-attention layers' recurrent-state slots",
     "state_slots_total"),
    (CounterMetricFamily, "rosefast_state_checkpoints_saved", "linear-attention states saved at a prefill's "
                                                              "checkpoint tokens", "state_checkpoints_saved"),
    (CounterMetricFamily, "rosefast_state_checkpoint_hits", "prompts started from a saved linear-attention state "
                                                            "(a prefix-cache hit)", "state_checkpoint_hits"),
    (CounterMetricFamily, "rosefast_prefix_cache_hits", "prefix cache block hits", "prefix_cache_hits"),
    (CounterMetricFamily, "rosefast_prefix_cache_misses", "prefix cache block misses", "prefix_cache_misses"),
    (CounterMetricFamily, "rosefast_prefix_cache_evictions", "cached blocks evicted", "prefix_cache_evictions"),
    (CounterMetricFamily, "rosefast_preemptions", "sequences preempted", "preemptions"),
    (CounterMetricFamily, "rosefast_engine_steps", "engine steps run", "steps"),
    (GaugeMetricFamily, "rosefast_prefill_budget_tokens", "prompt tokens a prefill step may take beside decoding "
                                                          "streams (ROSEFAST_ITL_TARGET_MS)", "prefill_budget_tokens"),
    (GaugeMetricFamily, "rosefast_decode_step_seconds", "a decode step's recent cost", "decode_step_seconds"),
    (GaugeMetricFamily, "rosefast_prefill_token_seconds", "a prefill step's measured cost per prompt token",
     "prefill_token_seconds"),
    (GaugeMetricFamily, "rosefast_running_requests", "sequences in the engine", "running"),
    (GaugeMetricFamily, "rosefast_waiting_requests", "sequences waiting for admission to the engine", "waiting"),
    (CounterMetricFamily, "rosefast_spec_proposed_tokens", "speculative decoding: tokens proposed", "spec_proposed"),
    (CounterMetricFamily, "rosefast_spec_accepted_tokens", "speculative decoding: proposed tokens the model kept",
     "spec_accepted"),
    (CounterMetricFamily, "rosefast_spec_steps", "speculative decoding: decode steps that verified proposals",
     "spec_steps"),
)

GRAMMAR_POOL = (
    ("rosefast_grammar_pool_runs", "grammar compiles (cache lookups included) run in the grammar pool", "runs"),
    ("rosefast_grammar_pool_merged", "requests that waited on an identical compile in flight", "merged"),
    ("rosefast_grammar_pool_abandoned", "compiles dropped unrun: every request for them had timed out",
     "abandoned"),
)


def histogram_family(name, doc, histogram):
    return HistogramMetricFamily(name, doc, buckets=[(floatToGoString(b), n) for b, n in histogram.buckets()],
                                 sum_value=histogram.sum)


def priority_class(priority):
    """A request's `priority` as a label of few values: high (< 0), normal (0, the default), low (> 0)."""
    return "high" if priority < 0 else "low" if priority > 0 else "normal"


PRIORITY_CLASSES = ("high", "normal", "low")
BY_PRIORITY = {"ttft": ("rosefast_priority_ttft_seconds", "request arrival to first token, by priority class"),
               "e2e": ("rosefast_priority_e2e_seconds", "request arrival to its last token, by priority class")}


class _Latencies:
    def __init__(self, metrics):
        self._metrics = metrics

    def collect(self):
        for key, (name, doc) in LATENCIES.items():
            yield histogram_family(name, doc, getattr(self._metrics, key))
        for key, (name, doc) in BY_PRIORITY.items():
            family = HistogramMetricFamily(name, doc, labels=["priority_class"])
            for cls, histogram in self._metrics.by_priority[key].items():
                family.add_metric([cls], [(floatToGoString(b), n) for b, n in histogram.buckets()], histogram.sum)
            yield family


class _LiveState:
    """Reads the manager's and the engine's stats() at scrape time (no bookkeeping on the request path)."""

    def __init__(self, state):
        self._state = state

    def collect(self):
        m = self._state.manager
        yield GaugeMetricFamily("rosefast_ready", "1 when the model is loaded", value=int(bool(m and m.ready)))
        pool = self._state.grammar_pool
        for name, doc, value in GRAMMAR_POOL:
            yield CounterMetricFamily(name, doc, value=getattr(pool, value))
        conns = self._state.connections
        yield GaugeMetricFamily("rosefast_idle_connections", "keep-alive connections waiting for their next request",
                                value=len(conns))
        yield CounterMetricFamily("rosefast_idle_connections_closed", "idle keep-alive connections closed longest "
                                  "idle first to stay within the limit", value=conns.reclaimed)
        if m is None:
            return
        stats = m.stats()
        for family, name, doc, key in MANAGER_LIVE:
            yield family(name, doc, value=stats[key])
        yield histogram_family("rosefast_backlog_depth", "deltas per chunk a stream takes (1: not merged)",
                               m.backlog)
        books = GaugeMetricFamily("rosefast_bookkeeping_entries", "what is held per request (0 when idle)",
                                  labels=["map"])
        for name, size in m.bookkeeping().items():
            books.add_metric([name], size)
        yield books
        stats = m.engine_stats()
        if stats is not None:
            for family, name, doc, key in ENGINE_LIVE:
                yield family(name, doc, value=stats[key])
            proposed = stats["spec_proposed"]
            yield GaugeMetricFamily("rosefast_spec_acceptance_rate", "speculative decoding: accepted / proposed "
                                    "tokens so far (0 before any proposal)",
                                    value=stats["spec_accepted"] / proposed if proposed else 0.0)


class Metrics:
    def __init__(self, state):
        self.registry = CollectorRegistry()
        self.requests = Counter("rosefast_requests", "HTTP requests by endpoint and status", ["endpoint", "status"],
                                registry=self.registry)
        self.prompt_tokens = Counter("rosefast_prompt_tokens", "prompt tokens of completed requests",
                                     registry=self.registry)
        self.completion_tokens = Counter("rosefast_completion_tokens", "tokens generated", registry=self.registry)
        self.ttft, self.itl, self.e2e = (Histogram(LATENCY_BOUNDS) for _ in LATENCIES)
        self.by_priority = {key: {c: Histogram(LATENCY_BOUNDS) for c in PRIORITY_CLASSES} for key in BY_PRIORITY}
        self.priority_requests = Counter("rosefast_priority_requests", "requests admitted to generate, by priority "
                                         "class (ROSEFAST_SCHEDULING)", ["priority_class"], registry=self.registry)
        self.registry.register(_Latencies(self))
        self.registry.register(_LiveState(state))

    def render(self):
        return generate_latest(self.registry)


ENDPOINTS = {"/v1/completions": "completions", "/v1/chat/completions": "chat", "/v1/responses": "responses",
             "/v1/messages": "messages", "/v1/embeddings": "embeddings", "/v1/messages/count_tokens": "count_tokens",
             "/v1/models": "models",
             "/tokenize": "tokenize", "/detokenize": "detokenize", "/tokenizer_info": "tokenizer_info"}


def count_request(state, environ, endpoint, status):
    """One increment of rosefast_requests_total per request, whichever path answered it (the mark is kept
    in the WSGI environ: a streaming body finishes outside Flask's request context)."""
    if not environ.get("rosefast.counted"):
        environ["rosefast.counted"] = True
        state.metrics.requests.labels(endpoint, status).inc()
