"""llguidance against xgrammar on this model's vocabulary: the one-off tokenizer view, grammar compile time for
the test schemas, the allowed-token mask per step at B = 1 and 32, and memory — the numbers rosefast chose
llguidance by. xgrammar is not a dependency (it pulls in triton, ~1 GB): `pip install xgrammar` to compare.

    python -m benches.grammar_engines
"""
import argparse
import json
import random
import resource
import time

import torch

from benches.schemas import SCHEMAS
from rosefast.engine import _sample_ops_py
from rosefast.sources import load_tokenizer, resolve_model

STEPS = 40


def _rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _walk(fill, consume, finished, matchers, vocab, words):
    """Mean ms per mask fill over STEPS steps of random walks along the masks (each row takes one allowed token)."""
    steps = STEPS
    bitmask = torch.full((len(matchers), words), -1, dtype=torch.int32)
    rng, spent = random.Random(0), 0.0
    for _ in range(steps):
        t = time.perf_counter()
        fill(matchers, bitmask)
        spent += time.perf_counter() - t
        x = _sample_ops_py.mask(torch.zeros(len(matchers), vocab), torch.arange(len(matchers)), bitmask)
        for i, m in enumerate(matchers):
            allowed = torch.isfinite(x[i]).nonzero().flatten().tolist()
            if allowed and not finished(m):
                consume(m, rng.choice(allowed))
    return spent / steps * 1e3


def llguidance_numbers(tok, vocab):
    import llguidance
    import llguidance.hf

    before, t = _rss_mb(), time.perf_counter()
    ltok = llguidance.hf.from_tokenizer(tok, n_vocab=vocab)
    setup = (time.perf_counter() - t, _rss_mb() - before)
    compile_ms = {}
    for name, schema in SCHEMAS.items():
        t = time.perf_counter()
        grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema),
                                                                defaults={"whitespace_flexible": False})
        llguidance.LLMatcher(ltok, grammar)
        compile_ms[name] = (time.perf_counter() - t) * 1e3
    executor = llguidance.LLExecutor()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMAS["order"]),
                                                            defaults={"whitespace_flexible": False})
    words = (vocab + 31) // 32

    def fill(ms, bitmask):
        executor.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(ms)], bitmask.data_ptr(), words * 4, len(ms))

    masks = {B: _walk(fill, lambda m, t: m.consume_token(t), lambda m: m.is_stopped(),
                      [llguidance.LLMatcher(ltok, grammar) for _ in range(B)], vocab, words) for B in (1, 32)}
    return setup, compile_ms, masks


def xgrammar_numbers(tok, vocab):
    import xgrammar as xgr

    before, t = _rss_mb(), time.perf_counter()
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab), max_threads=2)
    setup = (time.perf_counter() - t, _rss_mb() - before)
    compile_ms = {}
    for name, schema in SCHEMAS.items():
        t = time.perf_counter()
        compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
        compile_ms[name] = (time.perf_counter() - t) * 1e3
    compiled = compiler.compile_json_schema(json.dumps(SCHEMAS["order"]), any_whitespace=False)
    batch = xgr.BatchGrammarMatcher(max_threads=2) if hasattr(xgr, "BatchGrammarMatcher") else None

    def fill(ms, bitmask):
        if batch is not None:
            batch.batch_fill_next_token_bitmask(ms, bitmask)
        else:
            for i, m in enumerate(ms):
                m.fill_next_token_bitmask(bitmask, i)

    masks = {B: _walk(fill, lambda m, t: m.accept_token(t), lambda m: m.is_terminated(),
                      [xgr.GrammarMatcher(compiled) for _ in range(B)], vocab, (vocab + 31) // 32) for B in (1, 32)}
    return setup, compile_ms, masks


def main(argv=None):
    global STEPS
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=STEPS)
    STEPS = p.parse_args(argv).steps
    model = resolve_model()
    tok = load_tokenizer(model)
    vocab = len(tok)
    rows = []
    for name, numbers in (("llguidance", llguidance_numbers), ("xgrammar", xgrammar_numbers)):
        try:
            rows.append((name, numbers(tok, vocab)))
        except ImportError:
            print(f"{name} is not installed: pip install {name} to compare")
    print(f"vocabulary {vocab} tokens; the 'order' schema for the masks ({STEPS} steps of a random walk)")
    print("| engine | tokenizer view s (+MB) | compile ms: " + " / ".join(SCHEMAS) + " | mask ms/step B=1 | B=32 |")
    print("|---|---|---|---|---|")
    for name, ((setup_s, setup_mb), compile_ms, masks) in rows:
        print(f"| {name} | {setup_s:.2f} (+{setup_mb:.0f}) | {' / '.join(f'{v:.1f}' for v in compile_ms.values())} "
              f"| {masks[1]:.2f} | {masks[32]:.2f} |")


if __name__ == "__main__":
    main()
