"""A decoding stream beside a long prefill, one run: a greedy stream runs; a while in, a ~6k-token prompt (a
different text each time: no prefix cache) arrives for one token. The stream's gaps while that prompt prefills
(its p50 / p99 / max) against its gaps before (idle p50), and the long prompt's TTFT beside the stream against
alone — for rosefast with its ITL budget (ROSEFAST_ITL_TARGET_MS=0, auto), rosefast with the budget off (a
60 s target: every prefill step takes max_num_batched_tokens) and llama.cpp's llama-server on the same file.

    python -m benches.prefill_beside --llama-server /path/to/llama-server --prompt-tokens 6000
    python -m benches.prefill_beside --chunk-costs --prompt-tokens 6000   # each prefill chunk's cost, in process
"""
import argparse
import os
import statistics
import threading
import time

import requests

from rosefast.sources.resolve import default_gguf_path
from server.process import Server


def long_prompt(tokens, tag):
    """About `tokens` tokens of distinct text (SmolLM2's tokenizer: ~4.9 tokens a word like w1234)."""
    return f"[{tag}] " + " ".join(f"w{(i * 7919 + tag) % 10007}" for i in range(int(tokens / 4.9)))


def stream_gaps(url, tokens, out):
    """A greedy stream of `tokens` tokens: the arrival time of each of its text events, in `out`."""
    r = requests.post(url + "/v1/completions", json={"prompt": "Tell me a long story.", "max_tokens": tokens,
                                                     "temperature": 0, "ignore_eos": True, "stream": True},
                      stream=True, timeout=600)
    for line in r.iter_lines():
        if line.startswith(b"data: {"):
            out.append(time.perf_counter())


def ttft(url, prompt):
    """(sent at, first token at) of a one-token streamed completion."""
    t0 = time.perf_counter()
    r = requests.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1, "temperature": 0,
                                                     "stream": True}, stream=True, timeout=600)
    for line in r.iter_lines():
        if line.startswith(b"data: {"):
            return t0, time.perf_counter()
    raise RuntimeError(f"no token: {r.status_code}")


def measure(url, a, tag):
    _, first = ttft(url, long_prompt(a.prompt_tokens, tag))   # (warm: the same length once)
    t0, t1 = ttft(url, long_prompt(a.prompt_tokens, tag + 1))
    alone = t1 - t0
    times = []
    runner = threading.Thread(target=stream_gaps, args=(url, a.stream_tokens, times))
    runner.start()
    while len(times) < 20:
        time.sleep(0.01)
    sent, got = ttft(url, long_prompt(a.prompt_tokens, tag + 2))
    runner.join()
    gaps = [(b - x, b) for x, b in zip(times, times[1:])]
    idle = [g for g, at in gaps if at < sent]
    during = sorted(g for g, at in gaps if sent < at <= got + max(idle))
    return {"idle_p50": statistics.median(idle) * 1e3, "during_p50": statistics.median(during) * 1e3,
            "during_p99": during[min(len(during) - 1, int(0.99 * len(during)))] * 1e3, "during_max": during[-1] * 1e3,
            "ttft_alone": alone * 1e3, "ttft_beside": (got - sent) * 1e3, "gaps_during": len(during)}


def chunk_costs(model, prompt_tokens, threads):
    """In process: the engine's own prefill steps of one long prompt beside a decoding stream — (its position,
    the chunk's tokens, ms) — and the budget's fit at the end."""
    from rosefast.engine.llm_engine import LLMEngine
    from rosefast.engine.sampling_params import SamplingParams
    from rosefast.sources import load_tokenizer

    engine = LLMEngine(model=model, speculative="off", num_threads=threads)
    tok = load_tokenizer(model)
    engine.add_request(tok("Tell me a long story.").input_ids, SamplingParams(max_tokens=100_000, ignore_eos=True))
    for _ in range(6):
        engine.step()
    seq = engine.seqs[engine.add_request(tok(long_prompt(prompt_tokens, 5)).input_ids, SamplingParams(max_tokens=1))]
    steps = []
    while not seq.num_output_tokens:
        at, t0 = seq.num_cached, time.perf_counter()
        engine.step()
        if seq.num_cached != at or seq.num_output_tokens:
            steps.append((at, (seq.num_cached or seq.num_tokens) - at, (time.perf_counter() - t0) * 1e3))
    budget = engine.scheduler.budget
    print(f"decode step {budget.decode_s * 1e3:.1f} ms; fit a = {budget.fit()[0] * 1e3:.1f} ms, "
          f"b = {budget.fit()[1] * 1e3:.2f} ms a token; budget {budget.tokens} tokens")
    print("| position | tokens | ms | ms a token |")
    print("|---|---|---|---|")
    for at, n, ms in steps[::max(1, len(steps) // 12)]:
        print(f"| {at} | {n} | {ms:.1f} | {ms / n:.2f} |")
    return steps


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llama-server", default=None, help="the llama-server binary (left out: rosefast only)")
    p.add_argument("--model", default=None, help="a .gguf (default: the embedded SmolLM2 Q4_1)")
    p.add_argument("--prompt-tokens", type=int, default=6000)
    p.add_argument("--stream-tokens", type=int, default=600)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--chunk-costs", action="store_true", help="only the in-process probe of each chunk's cost")
    a = p.parse_args(argv)
    gguf = os.path.abspath(a.model) if a.model else str(default_gguf_path())
    if a.chunk_costs:
        return chunk_costs(a.model or "smollm2-135m", a.prompt_tokens, a.threads)
    setups = [("rosefast, ITL budget (auto)", {"ROSEFAST_ITL_TARGET_MS": 0}),
              ("rosefast, budget off", {"ROSEFAST_ITL_TARGET_MS": 60000})]
    rows = []
    for i, (name, env) in enumerate(setups):
        s = Server({"ROSEFAST_MODEL": gguf, "ROSEFAST_MAX_INFLIGHT_REQUESTS": 0, "ROSEFAST_SPECULATIVE": "off",
                    "ROSEFAST_NUM_THREADS": a.threads, **env}, startup_timeout=600)
        try:
            rows.append((name, measure(s.url, a, 100 * i)))
        finally:
            s.stop()
    if a.llama_server:
        s = Server({}, command=[a.llama_server, "-m", gguf, "--host", "127.0.0.1", "--port", "{port}", "-c", "32768",
                                "-np", "2", "-t", str(a.threads), "--no-webui"], startup_timeout=300)
        try:
            rows.append(("llama.cpp", measure(s.url, a, 900)))
        finally:
            s.stop()
    print(f"{os.path.basename(gguf)}, a ~{a.prompt_tokens}-token prompt beside a {a.stream_tokens}-token stream, "
          f"{a.threads} threads")
    print("| server | stream gap idle p50 ms | during the prefill p50 / p99 / max ms | long prompt TTFT alone / "
          "beside ms |")
    print("|---|---|---|---|")
    for name, r in rows:
        print(f"| {name} | {r['idle_p50']:.1f} | {r['during_p50']:.1f} / {r['during_p99']:.1f} / "
              f"{r['during_max']:.1f} | {r['ttft_alone']:.0f} / {r['ttft_beside']:.0f} |")
    return rows


if __name__ == "__main__":
    main()
