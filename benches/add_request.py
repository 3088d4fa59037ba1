"""add_request latency: tokenize_workers 0 (encode inline) vs N (enqueue only), one run.

    python -m benches.add_request          # 256-word prompt, 300 requests per row, back to back and 2 ms apart

Each row runs its own SchedulerManager on the default model; requests ask for one token, and are
submitted on an absolute schedule (t0 + i * interval, spinning to the target so no sleep overshoot
lands in the figure). Reported: p50/p90/p99/max of the call itself, in microseconds.

Two controls time a trivial Python call (building a SamplingParams, ~0.4 us warm):
- *control, idle*: on the same cadence with nothing else running;
- *control under load*: inside each add_request row, halfway between two submits, with the engine and
  the workers busy exactly as add_request sees them. Code runs slower on a core whose caches another
  thread has just used; this row shows how much slower, a floor that add_request, being Python, cannot beat.
"""
import argparse
import time

from rosefast.bench.stats import percentile
from rosefast.engine.sampling_params import SamplingParams
from rosefast.serving.manager import SchedulerManager


def timed_at(call, target, out):
    """Spin until perf_counter() reaches `target`, then time one call into `out`."""
    while time.perf_counter() < target:
        pass
    t = time.perf_counter()
    call()
    out.append(time.perf_counter() - t)


def on_schedule(call, n, interval_s, control=None):
    """Call `call()` n times at t0 + i * interval (and `control()` halfway between): the seconds each took."""
    samples, controls = [], []
    t0 = time.perf_counter()
    for i in range(n):
        timed_at(call, t0 + i * interval_s, samples)
        if control is not None:
            timed_at(control, t0 + (i + 0.5) * interval_s, controls)
    return samples, controls


def trivial_call():
    SamplingParams(max_tokens=1)


def measure(workers, n, interval_s, prompt, model):
    """add_request's times and, under the same load, the trivial call's."""
    with SchedulerManager(model=model, tokenize_workers=workers, max_inflight_requests=None) as m:
        m.add_request(prompt, max_tokens=1)        # warm-up: tokenizer, engine
        time.sleep(0.5)
        ids = []
        samples, controls = on_schedule(lambda: ids.append(m.add_request(prompt, max_tokens=1)), n, interval_s,
                                        control=trivial_call)
        for rid in ids:
            for _ in m.stream(rid):
                pass
    return samples, controls


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
        runs = [("control, idle", on_schedule(trivial_call, a.requests, interval / 1e3)[0])]
        for w in (int(x) for x in a.workers.split(",")):
            samples, controls = measure(w, a.requests, interval / 1e3, prompt, a.model)
            runs += [(w, samples), (f"{w}: control under load", controls)]
        for setting, seconds in runs:
            us = sorted(s * 1e6 for s in seconds)
            row = (interval, setting, percentile(us, 50), percentile(us, 90), percentile(us, 99), us[-1])
            rows.append(row)
            print("| {:g} ms | {} | {:.1f} | {:.1f} | {:.1f} | {:.1f} |".format(*row), flush=True)
    return rows


if __name__ == "__main__":
    main()
