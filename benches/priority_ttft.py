"""Priority scheduling beside a batch job, one run: a server whose batch is full of low-priority streams (priority
5) with as many again waiting takes a high-priority request (priority -1) every 0.3 s; its time to first
token against the same request on the idle server, under ROSEFAST_SCHEDULING=priority and =fcfs (a server
each, one after the other, the same load).

    python -m benches.priority_ttft --batch 8 --low 16 --tokens 256 --probes 5
"""
import argparse
import statistics
import threading
import time

import requests

from server.process import Server


def ttft_ms(url, priority, tokens, prompt):
    """(time to the first streamed text, whether the stream ended whole)."""
    t0, first = time.perf_counter(), None
    r = requests.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": tokens, "temperature": 0,
                                                     "ignore_eos": True, "stream": True, "priority": priority},
                      stream=True, timeout=600)
    last = None
    for line in r.iter_lines():
        if line:
            if first is None and line.startswith(b"data: {"):
                first = time.perf_counter()
            last = line
    return (first - t0) * 1e3, last == b"data: [DONE]"


def measure(scheduling, a):
    server = Server({"ROSEFAST_MODEL": a.model, "ROSEFAST_MAX_BATCH_SIZE": a.batch, "ROSEFAST_SCHEDULING": scheduling,
                     "ROSEFAST_MAX_INFLIGHT_REQUESTS": 0, "ROSEFAST_SPECULATIVE": "off"}, startup_timeout=600)
    try:
        ttft_ms(server.url, 0, 2, "warm up")
        idle = [ttft_ms(server.url, -1, 8, f"Question {i}: what is a lighthouse?")[0] for i in range(a.probes)]
        done = []
        lows = [threading.Thread(target=lambda i=i: done.append(ttft_ms(server.url, 5, a.tokens,
                                                                          f"Batch job {i}: write a story.")[1]))
                for i in range(a.low)]
        for t in lows:
            t.start()
        time.sleep(1.0)
        loaded = []   # the probes go at 0.3 s apart on their own, each while the batch job runs
        probes = [threading.Thread(target=lambda i=i: loaded.append(
            ttft_ms(server.url, -1, 8, f"Question {i}: what is a lighthouse?")[0])) for i in range(a.probes)]
        for t in probes:
            t.start()
            time.sleep(0.3)
        waiting = server.metric("rosefast_waiting_requests")
        for t in probes + lows:
            t.join()
        return idle, loaded, sum(done), waiting
    finally:
        server.stop()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8, help="ROSEFAST_MAX_BATCH_SIZE")
    p.add_argument("--low", type=int, default=16, help="low-priority streams")
    p.add_argument("--tokens", type=int, default=256, help="tokens per low-priority stream")
    p.add_argument("--probes", type=int, default=5, help="high-priority requests")
    p.add_argument("--model", default="smollm2-135m")
    a = p.parse_args(argv)
    rows = {s: measure(s, a) for s in ("priority", "fcfs")}
    print(f"model {a.model}, batch {a.batch}, {a.low} low-priority streams x {a.tokens} tokens, {a.probes} probes")
    print("| scheduling | high-priority TTFT idle p50 ms | beside the batch job p50 / max ms | low streams whole |")
    print("|---|---|---|---|")
    for s, (idle, loaded, whole, _) in rows.items():
        print(f"| {s} | {statistics.median(idle):.1f} | {statistics.median(loaded):.1f} / {max(loaded):.1f} | "
              f"{whole}/{a.low} |")
    return rows


if __name__ == "__main__":
    main()
