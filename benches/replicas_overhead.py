"""nginx in front of rosefast, one run: the TTFT and ITL it adds against going straight to a replica, and
how a 3x overload of one replica's admission limit spills to the other (stand-in replicas, so that the
model's step does not hide the proxy; the lean SSE client).

    python -m benches.replicas_overhead --streams 32 --tokens 64 --step-ms 20
"""
import argparse

from deploy.replicas import Nginx
from rosefast.bench.drivers import burst_figures
from server.process import Server, free_port


def run(url, streams, tokens):
    burst_figures(url, ["Once upon a time"] * 4, tokens)   # warm
    return burst_figures(url, ["Once upon a time"] * streams, tokens)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=32, help="also each replica's ROSEFAST_MAX_INFLIGHT_REQUESTS")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--step-ms", type=float, default=20.0)
    a = p.parse_args(argv)
    env = {"ROSEFAST_MODEL": "stand-in", "ROSEFAST_STAND_IN_STEP_MS": a.step_ms,
           "ROSEFAST_MAX_INFLIGHT_REQUESTS": a.streams}
    servers = [Server(env) for _ in range(2)]
    nginx = one = None
    try:
        nginx = Nginx(free_port(), [s.port for s in servers])
        one = Nginx(free_port(), [servers[0].port])   # the same replica behind nginx: what the proxy adds
        rows = [("direct to one replica", a.streams, run(servers[0].url, a.streams, a.tokens)),
                ("through nginx, to that one replica", a.streams, run(one.url, a.streams, a.tokens)),
                ("3x overload, direct to one replica", 3 * a.streams, run(servers[0].url, 3 * a.streams, a.tokens)),
                ("3x overload, through nginx (2 replicas)", 3 * a.streams, run(nginx.url, 3 * a.streams, a.tokens))]
    finally:
        for proxy in (nginx, one):
            if proxy is not None:
                proxy.stop()
        for s in servers:
            s.stop()
    print(f"{a.tokens} tokens per stream, stand-in step {a.step_ms} ms, max {a.streams} in flight per replica")
    print("| path | streams | completed | 429 | errors | TTFT p50 / p99 ms | ITL per event p50 / p99 ms | tok/s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, n, f in rows:
        print(f"| {name} | {n} | {f['completed']} | {f['rejected']} | {f['errors']} | {f['ttft']['p50']:.1f} / "
              f"{f['ttft']['p99']:.1f} | {f['itl_per_event']['p50']:.1f} / {f['itl_per_event']['p99']:.1f} | "
              f"{f.get('throughput_completion_tok_s', 0):,.0f} |")
    return rows


if __name__ == "__main__":
    main()
