"""Streaming benchmark: TTFT broken down (tokenize -> queue wait -> prefill to first token), TPOT, ITL,
latency and throughput as p50/p95/p99, under an arrival schedule you set, with rejects counted.

    python -m rosefast.bench.streaming --model tiny --num-requests 64 --submit-interval-ms 5
    python -m rosefast.bench.streaming --url http://127.0.0.1:8000 --num-requests 64   # any OpenAI server

In-process mode drives a SchedulerManager and knows every stage. --url mode drives a server over SSE:
the parts only the server knows are omitted, and ITL is per SSE event (a merged event carries several
tokens when the client lags).
"""
import _queue
import argparse
import asyncio
import json
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

from rosefast.bench.schedule import SCHEDULES, arrival_offsets
from rosefast.bench.stats import fmt, summary


@dataclass
class Sample:
    index: int
    target: float = None        # absolute target time (absolute/poisson/gamma), perf_counter seconds
    t_call: float = None        # submit started
    t_return: float = None      # add_request returned (in-process) / response headers arrived (--url)
    rejected: bool = False
    error: str = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tokenized: float = None     # the rest: in-process only
    scheduled: float = None
    first_token: float = None
    token_times: list = field(default_factory=list)
    first_recv: float = None    # client side: first chunk with tokens / text
    last_recv: float = None
    event_times: list = field(default_factory=list)

    def received(self, now):
        """A chunk with tokens (in-process) or text (--url) arrived at `now`."""
        self.first_recv = self.first_recv or now
        self.last_recv = now
        self.event_times.append(now)


def build_parser():
    p = argparse.ArgumentParser(prog="python -m rosefast.bench.streaming", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("--url", help="drive this OpenAI-compatible server over HTTP/SSE instead of an in-process manager")
    a("--model", default="smollm2-135m", help="smollm2-135m (default), tiny, a HF directory or a .gguf")
    a("--device", default="auto")
    a("--dtype", default="auto")
    a("--prompt", default="Explain why streaming responses matter for interactive applications.")
    a("--prompt-repeats", type=int, default=1, help="repeat the prompt text this many times (longer prompts)")
    a("--unique-prompts", action="store_true", help="make every prompt distinct (no prefix-cache sharing)")
    a("--chat", action="store_true", help="wrap prompts in the chat template (in-process) / use chat endpoint")
    a("--num-requests", type=int, default=32)
    a("--max-new-tokens", type=int, default=32)
    a("--max-batch-size", type=int, default=64)
    a("--prefill-max-batch-size", type=int, default=16)
    a("--max-active-requests", type=int, default=0)
    a("--max-inflight-requests", type=int, default=0, help="0: unbounded")
    a("--tokenize-workers", type=int, default=0)
    a("--kv-cache-tokens", type=int, default=0)
    a("--pretok", action="store_true", help="submit token ids (tokenized before the run)")
    a("--no-stop-on-eos", action="store_true", help="ignore EOS: every request makes --max-new-tokens tokens")
    a("--no-prefix-cache", action="store_true")
    a("--no-cuda-graph", action="store_true")
    a("--nvtx", action="store_true", help="NVTX ranges around engine steps (CUDA; a no-op on CPU)")
    a("--warmup-runs", type=int, default=1)
    a("--repeat-runs", type=int, default=1)
    a("--submit-interval-ms", type=float, default=0.0)
    a("--submit-schedule", choices=SCHEDULES, default="absolute")
    a("--burstiness", type=float, default=1.0, help="gamma shape: < 1 burstier, > 1 more regular")
    a("--seed", type=int, default=0)
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


def _wait_until(target):
    while True:
        left = target - time.perf_counter()
        if left <= 0:
            return
        time.sleep(left if left > 0.002 else 0)


# -- in-process --------------------------------------------------------------------------------------

def _model_spec(args):
    if args.model == "tiny":
        from rosefast.models import tiny_random

        return tiny_random("llama")
    return args.model


def make_manager(args):
    from rosefast.manager import SchedulerManager

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
        before_step=before_step)


def run_inprocess(manager, args, prompts, progress=None):
    from rosefast.engine.sampling import SamplingParams
    from rosefast.errors import OverloadedError

    params = SamplingParams(max_tokens=args.max_new_tokens, temperature=0, ignore_eos=args.no_stop_on_eos)
    work = _queue.SimpleQueue()
    samples = [Sample(i) for i in range(len(prompts))]

    def consumer():
        while True:
            item = work.get()
            if item is None:
                return
            rid, s = item
            t = manager.timing(rid)
            try:
                for chunk in manager.stream(rid):
                    if chunk.token_ids:
                        s.received(time.perf_counter())
                        s.completion_tokens += len(chunk.token_ids)
            except Exception as e:  # noqa: BLE001 - counted, not crashed on
                s.error = repr(e)
            if t is not None:
                s.tokenized, s.scheduled, s.first_token = t.tokenized, t.scheduled, t.first_token
                s.token_times, s.prompt_tokens = t.token_times, t.prompt_tokens
            if progress is not None:
                progress.update()

    threads = [threading.Thread(target=consumer, daemon=True) for _ in range(len(prompts))]
    for t in threads:
        t.start()
    offsets = arrival_offsets(args.submit_schedule, len(prompts), args.submit_interval_ms / 1e3, args.burstiness,
                              args.seed)
    interval = args.submit_interval_ms / 1e3
    t0 = time.perf_counter()
    for i, prompt in enumerate(prompts):
        s = samples[i]
        if offsets is not None:
            s.target = t0 + offsets[i]
            _wait_until(s.target)
        s.t_call = time.perf_counter()
        try:
            if isinstance(prompt, list):
                rid = manager.add_request(prompt_token_ids=prompt, params=params)
            else:
                rid = manager.add_request(prompt, params=params)
            s.t_return = time.perf_counter()
            work.put((rid, s))
        except OverloadedError:
            s.t_return = time.perf_counter()
            s.rejected = True
            if progress is not None:
                progress.update()
        if offsets is None and interval:
            time.sleep(interval)   # relative: the real gap is add_request time + interval
    for _ in threads:
        work.put(None)
    for t in threads:
        t.join()
    return samples


# -- over HTTP ---------------------------------------------------------------------------------------

async def _http_one(client, args, model, prompt, s, progress):
    chat = args.chat and isinstance(prompt, str)
    body = {"model": model, "max_tokens": args.max_new_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if args.no_stop_on_eos:
        body["ignore_eos"] = True
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    path = "/v1/chat/completions" if chat else "/v1/completions"
    try:
        async with client.stream("POST", path, json=body) as r:
            s.t_return = time.perf_counter()
            if r.status_code == 429:
                s.rejected = True
                await r.aread()
                return
            if r.status_code != 200:
                s.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    s.error = event["error"].get("message")
                    continue
                if event.get("usage"):
                    s.prompt_tokens = event["usage"]["prompt_tokens"]
                    s.completion_tokens = event["usage"]["completion_tokens"]
                for choice in event.get("choices") or []:
                    text = choice.get("text") if "text" in choice else (choice.get("delta") or {}).get("content")
                    if text:
                        s.received(time.perf_counter())
    except Exception as e:  # noqa: BLE001
        s.error = repr(e)
    finally:
        if progress is not None:
            progress.update()


async def _run_http_async(args, prompts, progress):
    import httpx

    limits = httpx.Limits(max_connections=len(prompts) + 8, max_keepalive_connections=len(prompts) + 8)
    async with httpx.AsyncClient(base_url=args.url.rstrip("/"), limits=limits, timeout=600) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        samples = [Sample(i) for i in range(len(prompts))]
        offsets = arrival_offsets(args.submit_schedule, len(prompts), args.submit_interval_ms / 1e3,
                                  args.burstiness, args.seed)
        tasks = []
        t0 = time.perf_counter()
        for i, prompt in enumerate(prompts):
            s = samples[i]
            if offsets is not None:
                s.target = t0 + offsets[i]
                delay = s.target - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            s.t_call = time.perf_counter()
            tasks.append(asyncio.create_task(_http_one(client, args, model, prompt, s, progress)))
            await asyncio.sleep(0)   # let the request go out
            if offsets is None and args.submit_interval_ms:
                await asyncio.sleep(args.submit_interval_ms / 1e3)
        await asyncio.gather(*tasks)
        return samples, model


def run_http(args, prompts, progress=None):
    return asyncio.run(_run_http_async(args, prompts, progress))


# -- report ------------------------------------------------------------------------------------------

def figures(samples, args, http):
    ok = [s for s in samples if not s.rejected and s.error is None and s.first_recv is not None]
    rejected = [s for s in samples if s.rejected]
    calls = [s.t_call for s in samples]
    out = {"requests": len(samples), "completed": len(ok), "rejected": len(rejected),
           "errors": sum(1 for s in samples if s.error), "prompt_tokens": sum(s.prompt_tokens for s in ok),
           "completion_tokens": sum(s.completion_tokens for s in ok),
           "submit_wall_ms": (max(calls) - min(calls)) * 1e3 if calls else 0.0}
    gaps = [b - a for a, b in zip(calls, calls[1:])]
    out["submit_gap"] = summary(gaps)
    targeted = [s for s in samples if s.target is not None]
    if targeted:
        out["submit_lag"] = summary([s.t_call - s.target for s in targeted])
    accepted = [s for s in samples if not s.rejected and s.t_return is not None]
    out["add_request" if not http else "response_headers"] = summary([s.t_return - s.t_call for s in accepted])
    out["reject_latency"] = summary([s.t_return - s.t_call for s in rejected])
    if not http:
        out["tokenize"] = summary([s.tokenized - s.t_call for s in ok if s.tokenized])
        out["queue_wait"] = summary([s.scheduled - s.tokenized for s in ok if s.scheduled and s.tokenized])
        out["prefill_to_first_token"] = summary([s.first_token - s.scheduled for s in ok if s.first_token and s.scheduled])
    out["ttft"] = summary([s.first_recv - s.t_call for s in ok])
    out["tpot"] = summary([(s.last_recv - s.first_recv) / (s.completion_tokens - 1) for s in ok
                           if s.completion_tokens > 1])
    if http:
        out["itl_per_event"] = summary([b - a for s in ok for a, b in zip(s.event_times, s.event_times[1:])])
    else:
        out["itl"] = summary([b - a for s in ok for a, b in zip(s.token_times, s.token_times[1:])])
    out["latency"] = summary([s.last_recv - s.t_call for s in ok])
    if ok:
        span = max(s.last_recv for s in ok) - min(s.t_call for s in samples)
        out["throughput_completion_tok_s"] = out["completion_tokens"] / span
        out["throughput_total_tok_s"] = (out["completion_tokens"] + out["prompt_tokens"]) / span
    return out


def print_report(f, args, http, model_name, device):
    p = print
    p(f"Model: {model_name}   Device: {device}   Mode: {'HTTP ' + args.url if http else 'in-process'}")
    p(f"Settings: max_batch_size={args.max_batch_size} prefill_max_batch_size={args.prefill_max_batch_size} "
      f"max_active_requests={args.max_active_requests or '-'} max_inflight_requests={args.max_inflight_requests or 'unbounded'} "
      f"tokenize_workers={args.tokenize_workers} pretok={args.pretok} max_new_tokens={args.max_new_tokens} "
      f"stop_on_eos={not args.no_stop_on_eos} prefix_cache={not args.no_prefix_cache}")
    p(f"Requests: {f['requests']}   Completed: {f['completed']}   Rejected: {f['rejected']}   Errors: {f['errors']}")
    p(f"Prompt tokens (accepted): {f['prompt_tokens']}   Completion tokens: {f['completion_tokens']}")
    p(f"Submit wall: {f['submit_wall_ms']:.1f} ms")
    p(f"Submit interval/schedule: {args.submit_interval_ms} ms {args.submit_schedule}"
      + (f" (burstiness {args.burstiness})" if args.submit_schedule == "gamma" else "")
      + f"; actual gap mean {f['submit_gap']['mean']:.3f} ms")
    if "submit_lag" in f:
        p(f"Submit lag: {fmt(f['submit_lag'])}")
    if http:
        p(f"Response headers: {fmt(f['response_headers'])}")
    else:
        p(f"add_request latency: {fmt(f['add_request'], 'ms')}")
    p(f"Reject latency: {fmt(f['reject_latency'])}")
    if not http:
        p(f"Tokenize: {fmt(f['tokenize'])}")
        p(f"Queue wait (post-tok): {fmt(f['queue_wait'])}")
        p(f"Prefill->first token: {fmt(f['prefill_to_first_token'])}")
    p(f"TTFT: {fmt(f['ttft'])}")
    p(f"TPOT: {fmt(f['tpot'])}")
    if http:
        p(f"ITL (per SSE event; a merged event carries several tokens): {fmt(f['itl_per_event'])}")
    else:
        p(f"ITL: {fmt(f['itl'])}")
    p(f"Latency: {fmt(f['latency'])}")
    if "throughput_completion_tok_s" in f:
        p(f"Throughput: completion {f['throughput_completion_tok_s']:.1f} tok/s, "
          f"total {f['throughput_total_tok_s']:.1f} tok/s")


def measure(args, prompts, run):
    """Warm-up runs on a few prompts, then --repeat-runs measured runs; `run(prompts, progress)` -> samples."""
    for _ in range(args.warmup_runs):
        run(prompts[:min(4, len(prompts))], None)
    progress = _progress(args, len(prompts) * args.repeat_runs)
    samples = []
    for _ in range(args.repeat_runs):
        samples += run(prompts, progress)
    progress.close()
    return samples


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.num_requests < 1 or args.max_new_tokens < 1 or args.prompt_repeats < 1:
        raise SystemExit("--num-requests, --max-new-tokens and --prompt-repeats must be >= 1")
    sys.setswitchinterval(0.0005)   # as the server does: the submit loop is not kept off the GIL for 5 ms
    http = args.url is not None
    if http:
        tokenizer = None
        if args.pretok:
            from rosefast.models import load_tokenizer

            tokenizer = load_tokenizer(_model_spec(args))
        names = []

        def run(prompts, progress):
            samples, name = run_http(args, prompts, progress)
            names.append(name)
            return samples

        samples = measure(args, make_prompts(args, tokenizer), run)
        model_name, device = names[-1], "remote"
    else:
        manager = make_manager(args)
        try:
            samples = measure(args, make_prompts(args, manager.tokenizer),
                              lambda prompts, progress: run_inprocess(manager, args, prompts, progress))
            model_name = manager.model.name
            device = f"{manager.engine.runner.device} ({str(manager.engine.runner.dtype).removeprefix('torch.')})"
        finally:
            manager.close()
    f = figures(samples, args, http)
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
