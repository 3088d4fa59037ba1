"""Speculative decoding side by side, one run: rosefast with ROSEFAST_SPECULATIVE=off and =auto, and (with
--llama-server) llama.cpp's `llama-server` with its n-gram speculation (`--spec-type ngram-simple`) and without,
on the same GGUF (the embedded SmolLM2 Q4_1, or --model), the same lean SSE client. Two task sets of chat
requests, greedy, each to its own end (EOS) or --tokens: input-grounded ones (rewrite a paragraph, extract
fields, edit code, summarize with quotes: the answer copies from the prompt) and free writing. At each
concurrency c the set's prompts (cycled to c) are sent at once; c=1 runs them one after another. Reported:
completion tok/s (tokens over the wall time of the set), and whether rosefast's texts with speculation equal its
texts without (greedy: they must).

    python -m benches.speculative [--llama-server /path/to/llama-server] [--concurrent 1,4,32] [--rounds 2]
"""
import argparse
import os

from rosefast.bench.drivers import burst_figures
from rosefast.sources.resolve import default_gguf_path
from server.process import Server

PARAGRAPH = ("Continuous batching lets an inference server admit new requests between decode steps instead of "
             "waiting for a whole batch to finish. Each step, the scheduler decides which sequences run, the model "
             "computes one token for each of them, and finished sequences leave at once, so short requests are not "
             "held behind long ones. A paged KV cache keeps each sequence's keys and values in fixed-size blocks, "
             "which lets sequences share a prompt's blocks and frees memory the moment a request ends.")
CODE = '''def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item["price"] * item["quantity"]
    tax = subtotal * tax_rate
    return subtotal + tax


def cheapest(items):
    best = None
    for item in items:
        if best is None or item["price"] < best["price"]:
            best = item
    return best
'''
RECORD = ("Order 48213 was placed by Maria Jensen on 14 March 2026 from Aarhus, Denmark. She ordered two "
          "Lumina desk lamps at 39.90 EUR each and one pack of LED bulbs at 12.50 EUR. The parcel was shipped "
          "with DHL, tracking number 00340434161094015902, and delivered on 18 March 2026.")
GROUNDED = [
    "Rewrite the following paragraph with British spelling, changing nothing else:\n\n" + PARAGRAPH,
    "Extract the order number, customer name, city, country, items, carrier and tracking number from this "
    "text as JSON:\n\n" + RECORD,
    "Rename the variable `items` to `products` everywhere in this Python code and return the whole code:\n\n"
    + CODE,
    "Summarize this paragraph in two sentences, quoting its key phrases exactly:\n\n" + PARAGRAPH,
]
FREE = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Write a poem about the sea at night.",
    "Explain to a child why the sky is blue.",
    "Describe your ideal weekend in a few paragraphs.",
]
TASKS = {"input-grounded": GROUNDED, "free writing": FREE}


def run_set(url, prompts, c, tokens):
    """(completion tokens, seconds, texts) for the set at concurrency c."""
    if c == 1:
        done = [_burst(url, [p], tokens) for p in prompts]
        return sum(d[0] for d in done), sum(d[1] for d in done), [t for d in done for t in d[2]]
    return _burst(url, [prompts[i % len(prompts)] for i in range(c)], tokens)


def _burst(url, batch, tokens):
    samples = []
    f = burst_figures(url, batch, tokens, chat=True, ignore_eos=False, samples=samples)
    span = f["completion_tokens"] / f["throughput_completion_tok_s"]
    return f["completion_tokens"], span, ["".join(s.texts) for s in sorted(samples, key=lambda s: s.index)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llama-server", help="the llama-server binary (omit: rosefast alone)")
    p.add_argument("--tokens", type=int, default=256, help="max_tokens of each request")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--concurrent", default="1,4,32")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--model", default=None, help="a .gguf both servers load (default: the embedded SmolLM2 Q4_1)")
    a = p.parse_args(argv)
    levels = [int(c) for c in a.concurrent.split(",")]
    gguf = os.path.abspath(a.model) if a.model else str(default_gguf_path())
    slots = max(levels)
    configs = {"rosefast off": {"ROSEFAST_SPECULATIVE": "off"}, "rosefast auto": {"ROSEFAST_SPECULATIVE": "auto"}}
    if a.llama_server:
        configs["llama.cpp none"] = []
        configs["llama.cpp ngram"] = ["--spec-type", "ngram-simple"]
    rows = {}   # (config, task set, c) -> [tokens, seconds], summed over rounds
    texts = {}  # (config, task set, c) -> the last round's texts
    for name, extra in list(configs.items()):   # one server at a time: they do not share the two cores
        try:
            if name.startswith("rosefast"):
                server = Server({"ROSEFAST_MAX_INFLIGHT_REQUESTS": 0, "ROSEFAST_GENERATION_CONFIG": "none", **extra,
                                 **({"ROSEFAST_MODEL": gguf} if a.model else {})}, startup_timeout=600)
            else:
                server = Server({}, command=[a.llama_server, "-m", gguf, "--host", "127.0.0.1", "--port", "{port}",
                                             "-c", str(slots * (a.tokens + 512)), "-np", str(slots), "-t",
                                             str(a.threads), "--no-webui", *extra], startup_timeout=300)
        except RuntimeError as e:   # a server that does not start is left out of the table, with its reason
            print(f"{name}: did not start ({str(e).splitlines()[0]})")
            del configs[name]
            continue
        try:
            run_set(server.url, FREE[:2], 2, 8)   # warm
            for _ in range(a.rounds):
                for task, prompts in TASKS.items():
                    for c in levels:
                        n, secs, out = run_set(server.url, prompts, c, a.tokens)
                        row = rows.setdefault((name, task, c), [0, 0.0])
                        row[0] += n
                        row[1] += secs
                        texts[(name, task, c)] = out
        finally:
            server.stop()
        print(f"{name}: " + ", ".join(f"{task} c={c} {rows[(name, task, c)][0] / rows[(name, task, c)][1]:.1f} tok/s"
                                      for task in TASKS for c in levels), flush=True)
    print(f"greedy chat completions to EOS or {a.tokens} tokens, {os.path.basename(gguf)}, {a.threads} threads, "
          f"{a.rounds} rounds")
    print("| task set | c | " + " | ".join(f"{n} tok/s" for n in configs) + " | auto / off | same texts |")
    print("|---|---|" + "---|" * len(configs) + "---|---|")
    for task in TASKS:
        for c in levels:
            rate = {n: rows[(n, task, c)][0] / rows[(n, task, c)][1] for n in configs}
            same = sum(x == y for x, y in zip(texts[("rosefast off", task, c)], texts[("rosefast auto", task, c)]))
            print(f"| {task} | {c} | " + " | ".join(f"{rate[n]:.1f}" for n in configs)
                  + f" | {rate['rosefast auto'] / rate['rosefast off']:.2f}x | {same}/{len(texts[('rosefast off', task, c)])} |")
            if "llama.cpp ngram" in configs and "llama.cpp none" in configs:
                print(f"|  | c={c}: rosefast auto / llama.cpp ngram {rate['rosefast auto'] / rate['llama.cpp ngram']:.2f}x, "
                      f"llama.cpp ngram / none {rate['llama.cpp ngram'] / rate['llama.cpp none']:.2f}x |" + " |" * len(configs))
    return rows, texts


if __name__ == "__main__":
    main()
