"""Streaming benchmark: TTFT broken down (tokenize -> queue wait -> prefill to first token), TPOT, ITL,
latency and throughput as p50/p95/p99, under an arrival schedule you set, with rejects counted.

    python -m rosefast.bench.streaming --model tiny --num-requests 64 --submit-interval-ms 5
    python -m rosefast.bench.streaming --url http://127.0.0.1:8000 --num-requests 64   # any OpenAI server

In-process mode drives a SchedulerManager and knows every stage. --url mode drives a server over SSE:
the parts only the server knows are omitted, and ITL is per SSE event (a merged event carries several
tokens when the client lags). This module is the command line; drivers.py holds the two drivers and
the arrival loop they share, report.py the figures and the report.
"""
import argparse
import json
import sys
from dataclasses import asdict, fields

from rosefast.bench.drivers import run_http, run_inprocess
from rosefast.bench.hub import HubConsumers
from rosefast.bench.priority import MODES, resolve
from rosefast.bench.report import figures, print_report
from rosefast.bench.schedule import SCHEDULES
from rosefast.config import QUANTIZATION_MODES, SPECULATIVE_MODES, EngineConfig

#: the engine's own defaults: the benchmark's settings of the engine start where the server's do
ENGINE = {f.name: f.default for f in fields(EngineConfig)}


def build_parser():
    p = argparse.ArgumentParser(prog="python -m rosefast.bench.streaming", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("--url", help="drive this OpenAI-compatible server over HTTP/SSE instead of an in-process manager")
    a("--model", default=ENGINE["model"],
      help="smollm2-135m (default), tiny, stand-in (no model: sizes the frontend), a HF directory or a .gguf")
    a("--stand-in-step-ms", type=float, default=ENGINE["stand_in_step_ms"], help="with --model stand-in: how long each engine step takes")
    a("--itl-target-ms", type=float, default=ENGINE["itl_target_ms"],
      help="the gap a decoding stream may see beside prefills (0: 3 x a decode step; 60000: no budget)")
    a("--client", choices=("httpx", "raw"), default="httpx",
      help="--url: httpx (default) or raw (a lean asyncio SSE client, for thousands of streams)")
    a("--device", default=ENGINE["device"])
    a("--dtype", default=ENGINE["dtype"])
    a("--prompt", default="Explain why streaming responses matter for interactive applications.")
    a("--prompt-repeats", type=int, default=1, help="repeat the prompt text this many times (longer prompts)")
    a("--unique-prompts", action="store_true", help="make every prompt distinct (no prefix-cache sharing)")
    a("--chat", action="store_true", help="wrap prompts in the chat template (in-process) / use chat endpoint")
    a("--extra-body", type=json.loads, default=None, metavar="JSON",
      help="over HTTP: fields added to every request body, e.g. a response_format")
    a("--num-requests", type=int, default=32)
    a("--max-new-tokens", type=int, default=32)
    a("--max-batch-size", type=int, default=ENGINE["max_batch_size"])
    a("--prefill-max-batch-size", type=int, default=ENGINE["prefill_max_batch_size"])
    a("--max-active-requests", type=int, default=ENGINE["max_active_requests"])
    a("--max-inflight-requests", type=int, default=0, help="0: unbounded")
    a("--tokenize-workers", type=int, default=0)
    a("--kv-cache-tokens", type=int, default=ENGINE["kv_cache_tokens"])
    a("--pretok", action="store_true", help="submit token ids (tokenized before the run)")
    a("--no-stop-on-eos", action="store_true", help="ignore EOS: every request makes --max-new-tokens tokens")
    a("--temperature", type=float, default=0.0, help="0 (default): greedy")
    a("--top-p", type=float, default=1.0)
    a("--no-prefix-cache", action="store_true")
    a("--quantization", choices=QUANTIZATION_MODES, default=ENGINE["quantization"],
      help="in-process: the weights (auto, as the server: a GGUF's own blocks on CPU, the default model's int4)")
    a("--speculative", choices=SPECULATIVE_MODES, default=ENGINE["speculative"],
      help="in-process: speculative decoding by prompt lookup (auto: where it pays)")
    a("--speculative-tokens", type=int, default=ENGINE["speculative_tokens"], help="in-process: the most tokens a sequence proposes per step")
    a("--no-cuda-graph", action="store_true")
    a("--nvtx", action="store_true", help="NVTX ranges around engine steps (CUDA; a no-op on CPU)")
    a("--warmup-runs", type=int, default=1)
    a("--repeat-runs", type=int, default=1)
    a("--submit-interval-ms", type=float, default=0.0)
    a("--submit-schedule", choices=SCHEDULES, default="absolute")
    a("--burstiness", type=float, default=1.0, help="gamma shape: < 1 burstier, > 1 more regular")
    a("--submitter-priority", choices=MODES, default="auto",
      help="the arrival loop's thread: realtime (SCHED_FIFO while it submits, so a woken submit does not wait "
           "for a core the engine holds), normal, or auto (realtime where the OS permits it; the default)")
    a("--seed", type=int, default=ENGINE["seed"])
    a("--output-json", metavar="PATH")
    a("--plot", metavar="PATH.png")
    a("--no-progress", action="store_true")
    return p


def make_prompts(args, tokenizer=None):
    prompts = []
    for i in range(args.num_requests):
        text = " ".join([args.prompt] * args.prompt_repeats)
        if args.unique_prompts:
            text = f"[request {i}] {text}"
        if args.chat and tokenizer is not None:
            text = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                 tokenize=False)
        prompts.append(text)
    if args.pretok and tokenizer is not None:
        return [tokenizer(p)["input_ids"] for p in prompts]
    return prompts


def _progress(args, total):
    from tqdm import tqdm

    return tqdm(total=total, desc="requests", unit="req", file=sys.stderr, disable=args.no_progress)


def _model_spec(args):
    if args.model == "tiny":
        from rosefast.sources import tiny_random

        return tiny_random("llama")
    return args.model


def make_manager(args, waker="thread"):
    from rosefast.serving.manager import SchedulerManager

    before_step = None
    if args.nvtx:
        import torch

        if torch.cuda.is_available():
            def before_step(n, _ids):
                torch.cuda.nvtx.range_pop() if n > 1 else None
                torch.cuda.nvtx.range_push(f"engine step {n}")
    return SchedulerManager(
        model=_model_spec(args), device=args.device, dtype=args.dtype, max_batch_size=args.max_batch_size,
        prefill_max_batch_size=args.prefill_max_batch_size, max_active_requests=args.max_active_requests,
        max_inflight_requests=args.max_inflight_requests or None, tokenize_workers=args.tokenize_workers,
        record_token_timestamps=True, enable_prefix_cache=not args.no_prefix_cache,
        cuda_graph=not args.no_cuda_graph, kv_cache_tokens=args.kv_cache_tokens, seed=args.seed,
        stand_in_step_ms=args.stand_in_step_ms, itl_target_ms=args.itl_target_ms, before_step=before_step, speculative=args.speculative,
        speculative_tokens=args.speculative_tokens, quantization=args.quantization, waker=waker)


ENGINE_COUNTERS = {"steps": "rosefast_engine_steps_total", "spec_proposed": "rosefast_spec_proposed_tokens_total",
                   "spec_accepted": "rosefast_spec_accepted_tokens_total"}


def scrape_counters(url):
    """The engine's counters from a rosefast server's /metrics (None from a server that has none)."""
    import re

    import httpx

    try:
        text = httpx.get(url.rstrip("/") + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    found = {key: re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M) for key, name in ENGINE_COUNTERS.items()}
    return {key: float(m.group(1)) for key, m in found.items() if m} if all(found.values()) else None


def measure(args, prompts, run, counters=lambda: None):
    """Warm-up runs on a few prompts, then --repeat-runs measured runs; `run(prompts, progress)` -> samples.
    `counters()`: the engine's step and speculation counters, read before and after the measured runs (None
    where they cannot be read); returns (samples, what the measured runs added to them, or None)."""
    for _ in range(args.warmup_runs):
        run(prompts[:min(4, len(prompts))], None)
    progress = _progress(args, len(prompts) * args.repeat_runs)
    samples, before = [], counters()
    for _ in range(args.repeat_runs):
        samples += run(prompts, progress)
    progress.close()
    after = counters()
    engine = None if before is None or after is None else {k: after[k] - before[k] for k in ENGINE_COUNTERS}
    return samples, engine


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.num_requests < 1 or args.max_new_tokens < 1 or args.prompt_repeats < 1:
        raise SystemExit("--num-requests, --max-new-tokens and --prompt-repeats must be >= 1")
    args.submitter_priority, args.submitter_note = resolve(args.submitter_priority)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)   # the arrival loop is not kept off the GIL for 5 ms by the consumer threads
    try:
        return _run(args)
    finally:   # the caller's own (a test, a notebook) afterwards
        sys.setswitchinterval(switch)


def _run(args):
    http = args.url is not None
    if http:
        tokenizer = None
        if args.pretok:
            from rosefast.sources import load_tokenizer

            tokenizer = load_tokenizer(_model_spec(args))
        names = []

        def run(prompts, progress):
            samples, name = run_http(args, prompts, progress)
            names.append(name)
            return samples

        samples, engine = measure(args, make_prompts(args, tokenizer), run, lambda: scrape_counters(args.url))
        model_name, device = names[-1], "remote"
    else:
        hub = HubConsumers()
        try:
            manager = make_manager(args, waker=hub.waker)
            try:
                samples, engine = measure(args, make_prompts(args, manager.tokenizer),
                                          lambda prompts, progress: run_inprocess(manager, hub, args, prompts,
                                                                                  progress),
                                          manager.engine_stats)
                model_name = manager.model.name
                device = f"{manager.engine.runner.device} ({str(manager.engine.runner.dtype).removeprefix('torch.')})"
            finally:
                manager.close()
        finally:
            hub.close()
    f = figures(samples, args, http, engine)
    print_report(f, args, http, model_name, device)
    if args.output_json:
        with open(args.output_json, "w", encoding="utf-8") as fh:
            json.dump({"settings": vars(args), "model": model_name, "device": device, "figures": f,
                       "samples": [asdict(s) for s in samples]}, fh, indent=1, default=str)
    if args.plot:
        from rosefast.bench.plot import plot

        plot(f, samples, args.plot, http)
    return f


if __name__ == "__main__":
    main()
