"""The block kernels' activations, two int8 digits against one (ROSEFAST_ACTIVATIONS), on a real model over a real
text, one run: each token's next-token distribution against the unquantized forward's (the file's own weights
dequantized, fp32 activations: what the blocks mean), as `llama-perplexity --kl-divergence` measures a
quantization — mean / p99 / max KL divergence, top-1 agreement — and the same for one digit against two.

    python -m benches.activations                       # the default model, /usr/share/common-licenses/GPL-3
    python -m benches.activations --model q4_k_m.gguf --text some.txt --tokens 4096 --window 512

The text is cut into windows of --window tokens, each a fresh context (so every token has at most that many
before it).
"""
import argparse
import os

import torch

from rosefast.engine.llm_engine import LLMEngine
from rosefast.engine.model_runner import SeqInput
from rosefast.sources import resolve_model

TEXT = "/usr/share/common-licenses/GPL-3"   # a long English text on every Debian machine


def window_logits(engine, ids):
    """Log-softmax of the logits after every token of `ids` (one prefill from position 0), [T, V] fp32."""
    runner = engine.runner
    blocks = list(range(-(-len(ids) // runner.block_size)))
    logits = runner.forward([SeqInput(list(ids), 0, blocks)], True, all_logits=True)
    return torch.log_softmax(logits.float(), dim=-1)


def compare(ref, got):
    """Per token KL(ref || got) [T] and whether the top tokens agree [T]."""
    kl = (ref.exp() * (ref - got)).sum(-1).clamp_min(0)
    return kl, ref.argmax(-1) == got.argmax(-1)


def figures(kl, same):
    kl = kl.double()
    return {"kl_mean": kl.mean().item(), "kl_p99": kl.quantile(0.99).item(), "kl_max": kl.max().item(),
            "top1": same.double().mean().item()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--text", default=TEXT)
    p.add_argument("--tokens", type=int, default=4096, help="the text's first this many tokens")
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--cpu-kernels", default="auto")
    a = p.parse_args(argv)
    if not os.path.exists(a.text):
        raise SystemExit(f"no text at {a.text}: give one with --text")
    model = resolve_model(a.model)
    common = dict(model=model, dtype="float32", device="cpu", kv_cache_tokens=a.window + 64, cpu_kernels=a.cpu_kernels,
                  speculative="off")
    engines = {"fp32": LLMEngine(quantization="none", **common)}
    for kind in ("two-digit", "one-digit"):
        engines[kind] = LLMEngine(quantization="auto", activations=kind, **common)
    with open(a.text, encoding="utf-8") as f:
        ids = engines["fp32"].tokenizer.encode(f.read())[:a.tokens]
    pairs = {("two-digit", "fp32"): [], ("one-digit", "fp32"): [], ("one-digit", "two-digit"): []}
    with torch.inference_mode():
        for start in range(0, len(ids) - 1, a.window):
            chunk = ids[start:start + a.window]
            logp = {name: window_logits(e, chunk) for name, e in engines.items()}
            for (got, ref) in pairs:
                pairs[got, ref].append(compare(logp[ref], logp[got]))
    kernels = engines["one-digit"].runner.model.layers[0].qkv.kernels
    if kernels is None:
        print("torch's ops in force (ROSEFAST_CPU_KERNELS=torch or the pure-Python flavour): the digits are the block "
              "kernels', so both rows are torch's numbers")
    print(f"{os.path.basename(str(model.path)) if hasattr(model, 'path') else a.model}: {len(ids)} tokens of "
          f"{os.path.basename(a.text)} in windows of {a.window}; block kernels {getattr(kernels, 'name', kernels)}")
    print("| activations | against | KL mean | KL p99 | KL max | top-1 agreement |")
    print("|---|---|---|---|---|---|")
    rows = {}
    for (got, ref), parts in pairs.items():
        f = figures(torch.cat([k for k, _ in parts]), torch.cat([s for _, s in parts]))
        rows[got, ref] = f
        print(f"| {got} | {ref} | {f['kl_mean']:.2e} | {f['kl_p99']:.2e} | {f['kl_max']:.2e} | {100 * f['top1']:.2f} % |")
    return rows


if __name__ == "__main__":
    main()
