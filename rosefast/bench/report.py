"""The streaming benchmark's figures (p50/p95/p99 of every stage) and the report it prints."""
from rosefast.bench.stats import fmt, summary


def _runs(samples):
    """The samples of each repeated run (--repeat-runs: each run's indices start again at 0), in order."""
    runs = []
    for s in samples:
        if not runs or s.index <= runs[-1][-1].index:
            runs.append([])
        runs[-1].append(s)
    return runs


def figures(samples, args, http, engine=None):
    """engine: what the run added to the engine's counters (steps, spec_proposed, spec_accepted), when known."""
    ok = [s for s in samples if not s.rejected and s.error is None and s.first_recv is not None]
    rejected = [s for s in samples if s.rejected]
    runs = _runs(samples)
    out = {"requests": len(samples), "completed": len(ok), "rejected": len(rejected),
           "errors": sum(1 for s in samples if s.error), "prompt_tokens": sum(s.prompt_tokens for s in ok),
           "completion_tokens": sum(s.completion_tokens for s in ok),
           "submit_wall_ms": sum(run[-1].t_call - run[0].t_call for run in runs) * 1e3}
    gaps = [b.t_call - a.t_call for run in runs for a, b in zip(run, run[1:])]   # within each run
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
    events = sum(len(s.event_times) for s in ok)
    out["events"] = events   # a lagging reader gets merged chunks: fewer events than tokens
    out["events_per_token"] = events / out["completion_tokens"] if out["completion_tokens"] else None
    if ok:
        span = max(s.last_recv for s in ok) - min(s.t_call for s in samples)
        out["throughput_completion_tok_s"] = out["completion_tokens"] / span
        out["throughput_total_tok_s"] = (out["completion_tokens"] + out["prompt_tokens"]) / span
    if engine is not None and engine["steps"]:
        out["engine"] = dict(engine, tokens_per_step=out["completion_tokens"] / engine["steps"],
                             acceptance=engine["spec_accepted"] / engine["spec_proposed"]
                             if engine["spec_proposed"] else None)
    return out


def print_report(f, args, http, model_name, device):
    p = print
    p(f"Model: {model_name}   Device: {device}   Mode: {'HTTP ' + args.url if http else 'in-process'}")
    p(f"Settings: max_batch_size={args.max_batch_size} prefill_max_batch_size={args.prefill_max_batch_size} "
      f"max_active_requests={args.max_active_requests or '-'} max_inflight_requests={args.max_inflight_requests or 'unbounded'} "
      f"tokenize_workers={args.tokenize_workers} pretok={args.pretok} max_new_tokens={args.max_new_tokens} "
      f"stop_on_eos={not args.no_stop_on_eos} prefix_cache={not args.no_prefix_cache} "
      f"temperature={args.temperature} top_p={args.top_p}")
    p(f"Requests: {f['requests']}   Completed: {f['completed']}   Rejected: {f['rejected']}   Errors: {f['errors']}")
    p(f"Prompt tokens (accepted): {f['prompt_tokens']}   Completion tokens: {f['completion_tokens']}")
    p(f"Submit wall: {f['submit_wall_ms']:.1f} ms")
    p(f"Submit interval/schedule: {args.submit_interval_ms} ms {args.submit_schedule}"
      + (f" (burstiness {args.burstiness})" if args.submit_schedule == "gamma" else "")
      + f"; actual gap mean {f['submit_gap']['mean']:.3f} ms")
    if getattr(args, "submitter_note", None):
        p(f"Submitter: {args.submitter_priority} ({args.submitter_note})")
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
    if f["events_per_token"] is not None:
        p(f"{'SSE events' if http else 'Chunks'} per token: {f['events_per_token']:.3f} "
          f"({f['events']} for {f['completion_tokens']} tokens; below 1: merged deliveries to lagging readers)")
    if "engine" in f:
        e = f["engine"]
        p(f"Engine steps: {e['steps']:.0f}, {e['tokens_per_step']:.2f} completion tokens per step (prefill steps "
          f"counted); speculation: {e['spec_proposed']:.0f} tokens proposed, {e['spec_accepted']:.0f} kept"
          + (f" ({e['acceptance']:.0%})" if e["acceptance"] is not None else ""))
    if "throughput_completion_tok_s" in f:
        p(f"Throughput: completion {f['throughput_completion_tok_s']:.1f} tok/s, "
          f"total {f['throughput_total_tok_s']:.1f} tok/s")
