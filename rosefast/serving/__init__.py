"""The serving layer: one record per request (request.py) found through its table, admission and the tokenize
workers (manager.py, tokenize_pool.py), the engine's native thread (engine_thread.py), the one way outputs leave
it (outbox.py), detokenizing and stop strings (detok.py, stops.py), per-request timing and latency histograms
(timing.py, histogram.py). server/ uses it through SchedulerManager; it never reaches into the engine."""
