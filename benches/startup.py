"""What a start costs on a model file: the conversion (the first start, into a fresh cache), then a later start's
engine; each in its own process, with its peak RSS, its RSS once serving, the cache's size on disk and a few
greedy tokens (the same before and after a change to the load path).

    python -m benches.startup --model /tmp/qwen3-0.6b-q4_k_m.gguf [--starts 2]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

_ONE_START = """
import json, os, resource, sys, time
t0 = time.perf_counter()
from rosefast.engine.llm_engine import LLMEngine
from rosefast.engine.sampling_params import SamplingParams
from rosefast.sources.resolve import resolve_model
t1 = time.perf_counter()
resolved = resolve_model(sys.argv[1])
t2 = time.perf_counter()
engine = LLMEngine(model=resolved, kv_cache_tokens=2048, quantization=sys.argv[2])
t3 = time.perf_counter()
ids = engine.generate([[1, 2, 3, 4, 5]], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True),
                      use_tqdm=False)[0]["token_ids"]
size = sum(f.stat().st_size for f in resolved.path.rglob("*") if f.is_file())   # the tiles' directory too
with open("/proc/self/statm") as f:   # resident pages now, serving (the peak is the load's)
    rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
print(json.dumps({"converted": resolved.converted, "import_s": t1 - t0, "resolve_s": t2 - t1, "engine_s": t3 - t2,
                  "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, "rss_gb": rss / 1e9,
                  "cache_mb": size / 1e6, "tokens": ids}))
"""


def one_start(model, cache, quantization):
    env = {**os.environ, "ROSEFAST_CACHE": cache}
    out = subprocess.run([sys.executable, "-c", _ONE_START, model, quantization], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--starts", type=int, default=2, help="the first converts into a fresh cache; the rest read it")
    p.add_argument("--quantization", default="auto")
    a = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="rosefast-startup-") as cache:
        print("| start | converted | resolve (s) | engine (s) | peak RSS (GB) | RSS serving (GB) | cache (MB) "
              "| greedy tokens |")
        print("|---|---|---|---|---|---|---|---|")
        for i in range(a.starts):
            r = one_start(a.model, cache, a.quantization)
            rows.append(r)
            print(f"| {i + 1} | {r['converted']} | {r['resolve_s']:.1f} | {r['engine_s']:.1f} | {r['peak_rss_gb']:.2f} "
                  f"| {r['rss_gb']:.2f} | {r['cache_mb']:.0f} | {r['tokens']} |", flush=True)
    return rows


if __name__ == "__main__":
    main()
