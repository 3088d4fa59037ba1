"""add_request latency: tokenize_workers 0 (encode inline) vs N (enqueue only), one run.

    python -m benches.add_request          # 256-word prompt, 300 requests per row, back to back and 2 ms apart

Each row runs its own SchedulerManager on the default model; requests ask for one token, and are
submitted on an absolute schedule (t0 + i * interval, spinning to the target so no sleep overshoot
lands in the figure). Reported: p50/p90/p99/max of the call itself, in microseconds.

The *control* rows time a trivial Python call (building a SamplingParams) on the same cadence, with
nothing else running: how much slower code that has not run for a while gets on this machine, a
floor that add_request, being Python, cannot beat.
"""
import argparse
import time

from rosefast.bench.stats import percentile
from rosefast.engine.sampling import SamplingParams
from rosefast.manager import SchedulerManager


def on_schedule(call, n, interval_s):
    """Call `call()` n times at t0 + i * interval; the seconds each call took."""
    samples = []
    t0 = time.perf_counter()
    for i in range(n):
        while time.perf_counter() < t0 + i * interval_s:
            pass
        t = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t)
    return samples


def measure(workers, n, interval_s, prompt, model):
    with SchedulerManager(model=model, tokenize_workers=workers, max_inflight_requests=None) as m:
        m.add_request(prompt, max_tokens=1)        # warm-up: tokenizer, engine
        time.sleep(0.5)
        ids = []
        samples = on_schedule(lambda: ids.append(m.add_request(prompt, max_tokens=1)), n, interval_s)
        for rid in ids:
            for _ in m.stream(rid):
                pass
    return samples


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--workers", default="0,4", help="tokenize_workers settings to compare")
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--intervals-ms", default="0,2", help="submit intervals to run (0: back to back)")
    p.add_argument("--prompt-repeats", type=int, default=256)
    a = p.parse_args(argv)
    prompt = " ".join(["hello"] * a.prompt_repeats)
    print(f"add_request, {a.prompt_repeats}-word prompt, {a.requests} requests per row")
    print("| interval | tokenize workers | p50 us | p90 us | p99 us | max us |")
    print("|---|---|---|---|---|---|")
    rows = []
    for interval in (float(x) for x in a.intervals_ms.split(",")):
        runs = [("control", on_schedule(lambda: SamplingParams(max_tokens=1), a.requests, interval / 1e3))]
        runs += [(w, measure(w, a.requests, interval / 1e3, prompt, a.model))
                 for w in (int(x) for x in a.workers.split(","))]
        for setting, seconds in runs:
            us = sorted(s * 1e6 for s in seconds)
            row = (interval, setting, percentile(us, 50), percentile(us, 90), percentile(us, 99), us[-1])
            rows.append(row)
            print("| {:g} ms | {} | {:.1f} | {:.1f} | {:.1f} | {:.1f} |".format(*row), flush=True)
    return rows


if __name__ == "__main__":
    main()
