"""/v1/embeddings beside llama.cpp's `llama-server --embeddings --pooling last` on the same GGUF (the embedded
SmolLM2 Q4_1, or --model), one run: inputs per second one input a request (batch 1, requests back to back) and 32
inputs a request (batch 32), alternating rounds, each input its own sentence; and how close the two servers'
vectors are (both last-token, L2-normalized).

    python -m benches.embeddings --llama-server /path/to/llama-server --inputs 64 --rounds 2
"""
import argparse
import os
import statistics
import time

import numpy as np
import requests

from rosefast.sources.resolve import default_gguf_path
from server.process import Server

WORDS = "the keeper lit the lamp as the storm came in from the grey sea and the ships turned home".split()


def sentence(i):
    """A distinct sentence of ~24 tokens per i (no two alike: no server serves one from another's cache)."""
    return f"Note {i}: " + " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(20))


def embed(url, texts):
    r = requests.post(url + "/v1/embeddings", json={"input": texts, "model": "bench"}, timeout=600)
    r.raise_for_status()
    return np.array([d["embedding"] for d in sorted(r.json()["data"], key=lambda d: d["index"])])


def rate(url, texts, batch):
    """Inputs per second for `texts`, `batch` to a request, requests back to back."""
    t0 = time.perf_counter()
    for i in range(0, len(texts), batch):
        embed(url, texts[i:i + batch])
    return len(texts) / (time.perf_counter() - t0)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llama-server", required=True, help="the llama-server binary")
    p.add_argument("--model", default=None, help="a .gguf both servers load (default: the embedded SmolLM2 Q4_1)")
    p.add_argument("--inputs", type=int, default=64, help="inputs per measurement")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    gguf = os.path.abspath(a.model) if a.model else str(default_gguf_path())
    servers = {}
    rows = []
    try:
        servers["llama.cpp"] = Server({}, command=[
            a.llama_server, "-m", gguf, "--host", "127.0.0.1", "--port", "{port}", "--embeddings", "--pooling", "last",
            "-c", "8192", "-np", "32", "-b", "2048", "-ub", "2048", "-t", str(a.threads), "--no-webui"],
            startup_timeout=300)
        servers["rosefast"] = Server({"ROSEFAST_MODEL": gguf, "ROSEFAST_SERVED_MODEL_NAME": "bench",
                                      "ROSEFAST_MAX_INFLIGHT_REQUESTS": 0, "ROSEFAST_NUM_THREADS": a.threads},
                                     startup_timeout=600)
        probe = [sentence(10_000 + i) for i in range(8)]
        vectors = {name: embed(s.url, probe) for name, s in servers.items()}   # (and a warm-up)
        cos = (vectors["rosefast"] * vectors["llama.cpp"]).sum(-1)
        for r in range(a.rounds):
            for batch in (1, 32):
                for name, s in servers.items():
                    texts = [sentence(100_000 * (r + 1) + 1000 * batch + i) for i in range(a.inputs)]
                    rows.append((r + 1, batch, name, rate(s.url, texts, batch)))
    finally:
        for s in servers.values():
            s.stop()
    print(f"{os.path.basename(gguf)}, {a.threads} threads, {a.inputs} inputs of ~24 tokens per measurement")
    print("| round | inputs per request | server | inputs/s |")
    print("|---|---|---|---|")
    for r, batch, name, value in rows:
        print(f"| {r} | {batch} | {name} | {value:.1f} |")
    for batch in (1, 32):
        ours = statistics.median(v for _, b, n, v in rows if b == batch and n == "rosefast")
        theirs = statistics.median(v for _, b, n, v in rows if b == batch and n == "llama.cpp")
        print(f"batch {batch}: rosefast / llama.cpp inputs/s = {ours / theirs:.2f}x")
    print(f"cosine between the two servers' vectors: min {cos.min():.4f}, median {np.median(cos):.4f}")
    return rows


if __name__ == "__main__":
    main()
