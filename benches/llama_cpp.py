"""rosefast beside llama.cpp's `llama-server` on the same GGUF (the embedded SmolLM2 Q4_1, or --model), the same lean SSE
client, one run: greedy (or --temperature) completions streamed at 1 and 32 concurrent requests, alternating rounds; TTFT, ITL
and tok/s side by side. llama-server is built from the vendored source of the llama-cpp-python sdist
(README: "Beside llama.cpp").

    python -m benches.llama_cpp --llama-server /path/to/llama-server --tokens 128 --rounds 2
    python -m benches.llama_cpp --llama-server ... --model smollm2-135m-q4_k_m.gguf    # another GGUF, both servers
    python -m benches.llama_cpp --llama-server ... --distinct --prompt-repeats 8   # TTFT: a real prefill each time
    python -m benches.llama_cpp --llama-server ... --activations two-digit,one-digit   # a rosefast server for each

By default every request sends one prompt, so llama.cpp's TTFT reuses the KV of the one before it token by token
(rosefast's prefix cache keeps whole 16-token blocks only); with --distinct each request's prompt starts with its own
number, so both servers prefill the whole prompt (--prompt-repeats: that many copies of it, a longer prefill).
"""
import argparse
import itertools
import os

from rosefast.bench.drivers import burst_figures
from rosefast.sources.resolve import default_gguf_path
from server.process import Server

PROMPT = "Write a story about a lighthouse keeper who finds a message in a bottle."


_numbers = itertools.count()


def run(url, streams, tokens, temperature=0.0, distinct=False, repeats=1):
    text = " ".join([PROMPT] * repeats)
    prompts = [f"{next(_numbers)}. {text}" if distinct else text for _ in range(streams)]
    return burst_figures(url, prompts, tokens, temperature=temperature)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llama-server", required=True, help="the llama-server binary")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--concurrent", default="1,32")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--quantization", default="auto", help="rosefast's ROSEFAST_QUANTIZATION")
    p.add_argument("--activations", default="two-digit", help="rosefast's ROSEFAST_ACTIVATIONS, comma-separated: a "
                   "rosefast server for each (named by it when there are several)")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy; else sampled at it (top_p 1)")
    p.add_argument("--model", default=None, help="a .gguf both servers load (default: the embedded SmolLM2 Q4_1)")
    p.add_argument("--distinct", action="store_true", help="each request's prompt its own (no KV reused between them)")
    p.add_argument("--prompt-repeats", type=int, default=1, help="copies of the prompt in each request")
    a = p.parse_args(argv)
    levels = [int(c) for c in a.concurrent.split(",")]
    gguf = os.path.abspath(a.model) if a.model else str(default_gguf_path())
    slots = max(levels)
    servers = {}
    try:
        servers["llama.cpp"] = Server({}, command=[a.llama_server, "-m", gguf, "--host", "127.0.0.1", "--port", "{port}",
                                                   "-c", str(slots * (a.tokens + 64 + 20 * a.prompt_repeats)),
                                                   "-np", str(slots),
                                                   "-t", str(a.threads), "--no-webui"], startup_timeout=300)
        kinds = a.activations.split(",")
        for kind in kinds:
            servers["rosefast" if len(kinds) == 1 else f"rosefast ({kind})"] = Server(
                {"ROSEFAST_QUANTIZATION": a.quantization, "ROSEFAST_MAX_INFLIGHT_REQUESTS": 0,
                 "ROSEFAST_GENERATION_CONFIG": "none", "ROSEFAST_ACTIVATIONS": kind,
                 **({"ROSEFAST_MODEL": gguf} if a.model else {})}, startup_timeout=600)
        for url in (s.url for s in servers.values()):
            run(url, 2, 8)   # warm
        rows = []
        for r in range(a.rounds):
            for c in levels:
                for name, s in servers.items():
                    rows.append((name, c, r, run(s.url, c, a.tokens, a.temperature, a.distinct, a.prompt_repeats)))
    finally:
        for s in servers.values():
            s.stop()
    kind = "greedy" if a.temperature == 0 else f"sampled (temperature {a.temperature:g})"
    print(f"{a.tokens} {kind} tokens per request (ignore_eos), {os.path.basename(gguf)}, {a.threads} threads; "
          f"rosefast ROSEFAST_QUANTIZATION={a.quantization}; prompts: {a.prompt_repeats} cop"
          f"{'y' if a.prompt_repeats == 1 else 'ies'} of one, {'each its own' if a.distinct else 'the same for all'}")
    print("| server | concurrent | round | completed | TTFT p50 ms | ITL per event p50 / p99 ms | tok/s |")
    print("|---|---|---|---|---|---|---|")
    for name, c, r, f in rows:
        print(f"| {name} | {c} | {r + 1} | {f['completed']} | {f['ttft']['p50']:.1f} | "
              f"{f['itl_per_event']['p50']:.1f} / {f['itl_per_event']['p99']:.1f} | "
              f"{f.get('throughput_completion_tok_s', 0):,.1f} |")
    for ours_name in (n for n in servers if n != "llama.cpp"):
        for c in levels:
            ours = [f for n, cc, _, f in rows if n == ours_name and cc == c]
            theirs = [f for n, cc, _, f in rows if n == "llama.cpp" and cc == c]
            itl = sum(f["itl_per_event"]["p50"] for f in ours) / sum(f["itl_per_event"]["p50"] for f in theirs)
            tps = sum(f["throughput_completion_tok_s"] for f in ours) / sum(f["throughput_completion_tok_s"] for f in theirs)
            ttft = sum(f["ttft"]["p50"] for f in ours) / sum(f["ttft"]["p50"] for f in theirs)
            print(f"c={c}: {ours_name} / llama.cpp ITL p50 {itl:.2f}x, tok/s {tps:.2f}x, TTFT p50 {ttft:.2f}x")
    return rows


if __name__ == "__main__":
    main()
