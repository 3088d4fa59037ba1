"""add_request latency: tokenize_workers 0 (encode inline) vs N (enqueue only), one run.

    python -m benches.add_request                  # 256-word prompt, 400 requests per setting, 2 ms apart

Each setting runs its own SchedulerManager on the default model; requests ask for one token so the
engine stays lightly loaded, and are submitted on an absolute schedule (t0 + i * interval) so every
call starts from the same state. Reported: p50/p90/p99/max of the call itself, in microseconds.
"""
import argparse
import time

from rosefast.bench.stats import percentile
from rosefast.manager import SchedulerManager


def measure(workers, n, interval_s, prompt, model):
    with SchedulerManager(model=model, tokenize_workers=workers, max_inflight_requests=None) as m:
        m.add_request(prompt, max_tokens=1)        # warm-up: tokenizer, engine
        time.sleep(0.5)
        samples, ids = [], []
        t0 = time.perf_counter()
        for i in range(n):
            while time.perf_counter() < t0 + i * interval_s:
                pass                               # spin to the target: no sleep overshoot in the figure
            t = time.perf_counter()
            ids.append(m.add_request(prompt, max_tokens=1))
            samples.append(time.perf_counter() - t)
        for rid in ids:
            for _ in m.stream(rid):
                pass
    return [s * 1e6 for s in samples]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--workers", default="0,4", help="tokenize_workers settings to compare")
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--interval-ms", type=float, default=2.0)
    p.add_argument("--prompt-repeats", type=int, default=256)
    a = p.parse_args(argv)
    prompt = " ".join(["hello"] * a.prompt_repeats)
    print(f"add_request, {a.prompt_repeats}-word prompt, {a.requests} requests {a.interval_ms} ms apart")
    print("| tokenize workers | p50 us | p90 us | p99 us | max us |")
    print("|---|---|---|---|---|")
    rows = []
    for w in (int(x) for x in a.workers.split(",")):
        us = sorted(measure(w, a.requests, a.interval_ms / 1e3, prompt, a.model))
        row = (w, percentile(us, 50), percentile(us, 90), percentile(us, 99), us[-1])
        rows.append(row)
        print("| {} | {:.1f} | {:.1f} | {:.1f} | {:.1f} |".format(*row), flush=True)
    return rows


if __name__ == "__main__":
    main()
