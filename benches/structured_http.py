"""Structured output over HTTP, one run: 32 chat streams on the default model with and without a JSON schema
held by the grammar (alternating rounds, the same server), tok/s and ITL side by side. Every stream runs to
max_tokens inside one long string field, so both sides generate the same number of tokens.

    python -m benches.structured_http --streams 32 --tokens 128 --rounds 2
"""
import argparse

from rosefast.bench.drivers import burst_figures
from server.process import Server

SCHEMA = {"type": "object", "properties": {"story": {"type": "string", "minLength": 2000, "maxLength": 2000}},
          "required": ["story"], "additionalProperties": False}
PROMPT = "Write a long story about a lighthouse keeper, as JSON."


def run(url, streams, tokens, constrained, temperature):
    extra = {"response_format": {"type": "json_schema", "json_schema": {"name": "story", "schema": SCHEMA}}} \
        if constrained else None
    return burst_figures(url, [PROMPT] * streams, tokens, chat=True, temperature=temperature, extra_body=extra)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--model", default="smollm2-135m", help="ROSEFAST_MODEL of the server")
    p.add_argument("--quantization", default="none", help="ROSEFAST_QUANTIZATION of the server")
    a = p.parse_args(argv)
    server = Server({"ROSEFAST_MODEL": a.model, "ROSEFAST_QUANTIZATION": a.quantization, "ROSEFAST_MAX_INFLIGHT_REQUESTS": 0,
                     "ROSEFAST_GENERATION_CONFIG": "none"}, startup_timeout=600)
    rows = []
    try:
        for constrained in (False, True):   # warm both paths (the first grammar builds llguidance's tokenizer view)
            run(server.url, 4, 8, constrained, a.temperature)
        for r in range(a.rounds):
            for constrained in (False, True):
                rows.append((constrained, r, run(server.url, a.streams, a.tokens, constrained, a.temperature)))
    finally:
        server.stop()
    print(f"{a.streams} chat streams x {a.tokens} tokens, temperature {a.temperature}, model {a.model}")
    print("| round | response_format | completed | errors | TTFT p50 ms | ITL per event p50 / p99 ms | tok/s |")
    print("|---|---|---|---|---|---|---|")
    for constrained, r, f in rows:
        print(f"| {r + 1} | {'json_schema' if constrained else 'none'} | {f['completed']} | {f['errors']} | "
              f"{f['ttft']['p50']:.1f} | {f['itl_per_event']['p50']:.1f} / {f['itl_per_event']['p99']:.1f} | "
              f"{f.get('throughput_completion_tok_s', 0):,.1f} |")
    free = [f["throughput_completion_tok_s"] for c, _, f in rows if not c]
    held = [f["throughput_completion_tok_s"] for c, _, f in rows if c]
    print(f"constrained / unconstrained tok/s: {sum(held) / sum(free):.2f}x")
    return rows


if __name__ == "__main__":
    main()
