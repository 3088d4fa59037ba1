"""The frontend at scale, no model in the way: `gunicorn -k gevent server:app` on the stand-in engine
(ROSEFAST_MODEL=stand-in) at thousands of streams, beside the framework's floor (benches/bare_sse.py: the
same bytes from a plain gevent WSGI app), one run. The client is the streaming benchmark's lean SSE client
(--client raw) in this process; it shares the cores with the server, so the figure that travels between
machines is the server worker's CPU time per delivered token (from /proc/<pid>/task/*/stat: the gevent hub
thread and the rest — engine thread, tokenize workers — apart).

    python -m benches.frontend_scale --streams 256,1024,4096 --tokens 64 --step-ms 20
"""
import argparse
import os
import sys
from types import SimpleNamespace

from rosefast.bench.drivers import run_http
from rosefast.bench.report import figures
from server.process import Server

TICK = os.sysconf("SC_CLK_TCK")


def worker_pid(master):
    """gunicorn's one worker: the master's child."""
    with open(f"/proc/{master}/task/{master}/children") as f:
        children = f.read().split()
    if len(children) != 1:
        raise RuntimeError(f"expected one gunicorn worker, found {children}")
    return int(children[0])


def cpu_seconds(pid):
    """(main thread, other threads) CPU seconds of a process: user + system time per thread."""
    main = rest = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:   # a thread that ended between the listing and the read
            continue
        ticks = int(fields[11]) + int(fields[12])
        if int(tid) == pid:
            main += ticks
        else:
            rest += ticks
    return main / TICK, rest / TICK


def stream_args(url, streams, tokens):
    return SimpleNamespace(url=url, client="raw", chat=False, max_new_tokens=tokens, temperature=0.0, top_p=1.0,
                           no_stop_on_eos=True, submit_interval_ms=0.0, submit_schedule="absolute",
                           burstiness=1.0, seed=0, pretok=False)


def measure(server, streams, tokens, prompt):
    pid = worker_pid(server.proc.pid)
    args = stream_args(server.url, streams, tokens)
    run_http(args, [prompt] * min(streams, 8))   # warm: connections, caches
    before = cpu_seconds(pid)
    samples, _ = run_http(args, [prompt] * streams)
    after = cpu_seconds(pid)
    f = figures(samples, args, True)
    hub, rest = after[0] - before[0], after[1] - before[1]
    delivered = f["completion_tokens"]
    return {"streams": streams, "completed": f["completed"], "errors": f["errors"] + f["rejected"],
            "tok_s": f.get("throughput_completion_tok_s", 0.0), "ttft": f["ttft"], "itl": f["itl_per_event"],
            "events_per_token": f["events_per_token"], "delivered": delivered,
            "cpu_us_per_token": (hub + rest) / delivered * 1e6 if delivered else None,
            "hub_us_per_token": hub / delivered * 1e6 if delivered else None,
            "threads_us_per_token": rest / delivered * 1e6 if delivered else None}


def start(kind, step_ms, max_streams, switch_ms=None):
    connections = ["--worker-connections", str(max_streams + 64), "--backlog", str(max(2048, max_streams))]
    if kind == "bare":
        return Server({"BARE_STEP_MS": step_ms}, command=[sys.executable, "-m", "gunicorn", "-k", "gevent",
                                                           "benches.bare_sse:app", "--bind", "127.0.0.1:{port}",
                                                           "--config", "/dev/null", *connections])
    env = {"ROSEFAST_MODEL": "stand-in", "ROSEFAST_STAND_IN_STEP_MS": step_ms, "ROSEFAST_MAX_BATCH_SIZE": max_streams,
           "ROSEFAST_MAX_ACTIVE_REQUESTS": max_streams, "ROSEFAST_MAX_INFLIGHT_REQUESTS": max_streams,
           "ROSEFAST_PREFILL_MAX_BATCH_SIZE": 256, "ROSEFAST_KV_CACHE_TOKENS": max_streams * 128}
    if switch_ms is not None:
        env["ROSEFAST_SWITCH_INTERVAL_MS"] = switch_ms
    return Server(env, command=[sys.executable, "-m", "gunicorn", "-k", "gevent", "server:app", "--bind",
                                "127.0.0.1:{port}", *connections])


def label(kind, switch_ms):
    return f"rosefast (stand-in), switch {switch_ms:g} ms" if kind == "rosefast" else "bare gevent WSGI, same bytes"


def row(name, r):
    return (f"| {name} | {r['streams']} | {r['completed']} | {r['errors']} | {r['tok_s']:,.0f} | "
            f"{r['ttft']['p50']:.0f} / {r['ttft']['p99']:.0f} | "
            f"{r['itl']['p50']:.1f} / {r['itl']['p99']:.1f} | {r['events_per_token']:.2f} | "
            f"{r['cpu_us_per_token']:.1f} ({r['hub_us_per_token']:.1f} + {r['threads_us_per_token']:.1f}) |")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", default="256,1024,4096")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--prompt", default="Explain why streaming responses matter.")
    p.add_argument("--switch-interval-ms", default="5",
                   help="rosefast runs at each of these GIL switch intervals (ROSEFAST_SWITCH_INTERVAL_MS)")
    p.add_argument("--no-bare", action="store_true", help="skip the bare gevent reference")
    a = p.parse_args(argv)
    counts = [int(x) for x in a.streams.split(",")]
    results = []
    servers = [("rosefast", float(x)) for x in a.switch_interval_ms.split(",")]
    servers += [] if a.no_bare else [("bare", None)]
    for kind, switch_ms in servers:
        server = start(kind, a.step_ms, max(counts), switch_ms)
        try:
            for n in counts:
                r = measure(server, n, a.tokens, a.prompt)
                r["switch_interval_ms"] = switch_ms
                results.append((kind, r))
                print(row(label(kind, switch_ms), r), file=sys.stderr, flush=True)
        finally:
            server.stop()
    print(f"{a.tokens} tokens per stream, engine step {a.step_ms} ms (stand-in), client: the lean SSE client in "
          "the same machine")
    print("| server | streams | completed | errors | delivered tok/s | TTFT p50 / p99 ms | ITL per event p50 / p99 ms "
          "| events per token | server CPU µs per token (hub + other threads) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kind, r in results:
        print(row(label(kind, r["switch_interval_ms"]), r))
    for kind, switch_ms in servers:
        ours = {r["streams"]: r for k, r in results if k == kind and r["switch_interval_ms"] == switch_ms}
        if len(ours) > 1:
            lo, hi = ours[min(ours)], ours[max(ours)]
            print(f"{label(kind, switch_ms)}: tok/s at {hi['streams']} streams / at {lo['streams']}: "
                  f"{hi['tok_s'] / lo['tok_s']:.2f}x")
    return results


if __name__ == "__main__":
    main()
