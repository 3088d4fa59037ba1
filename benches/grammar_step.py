"""What structured output adds to a decode step's sampling: the allowed-token masks filled (llguidance, GrammarMasks)
and applied (sample_ops.mask) at B = 1 and 32 with 0 / 50 / 100 % of the rows constrained, on random logits over
the default model's vocabulary (the forward pass is left out: in the engine the fill overlaps it).

    python -m benches.grammar_step
"""
import argparse
import time

import torch

from benches.schemas import SCHEMAS
from rosefast.engine.grammar import GrammarMasks, Grammars
from rosefast.engine.sampler import Sampler
from rosefast.engine.sampling_params import SamplingParams
from rosefast.engine.sequence import Sequence
from rosefast.sources import load_tokenizer, resolve_model

STEPS = 60


def step_ms(grammars, vocab, batch, share, temperature, steps=STEPS):
    """Mean ms of (fill + sample + advance) per step over `steps` steps; the matchers restart when they finish."""
    grammar = grammars.compile("json_schema", SCHEMAS["order"])
    held = round(batch * share)
    seqs = [Sequence(i, [1, 2, 3], SamplingParams(max_tokens=10_000, temperature=temperature, seed=i,
                                                  grammar=grammar if i < held else None)) for i in range(batch)]
    sampler, masks = Sampler(vocab), GrammarMasks(vocab)
    g = torch.Generator().manual_seed(0)
    logits = [torch.randn(batch, vocab, generator=g) for _ in range(4)]
    spent = 0.0
    for step in range(steps):
        t = time.perf_counter()
        job = masks.start(seqs)
        allowed = None
        if job is not None:
            rows, bitmask = GrammarMasks.result(job)
            allowed = (torch.tensor(rows), bitmask)
        tokens = sampler(logits[step % 4], seqs, allowed).token_ids
        for seq, token in zip(seqs, tokens):
            seq.token_ids.append(token)
            if seq.matcher is not None and (not seq.matcher.consume_token(token) or seq.matcher.is_stopped()):
                seq.matcher = grammar.matcher()
        spent += time.perf_counter() - t
    return spent / steps * 1e3


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=STEPS)
    steps = p.parse_args(argv).steps
    tok = load_tokenizer(resolve_model())
    vocab = len(tok)
    grammars = Grammars(tok, vocab, [tok.eos_token_id])
    print(f"one sampling step, ms (the 'order' schema; {vocab}-token vocabulary; {torch.get_num_threads()} threads)")
    print("| B | sampling | 0 % constrained | 50 % | 100 % | 100 % minus 0 % |")
    print("|---|---|---|---|---|---|")
    for batch in (1, 32):
        for temperature, name in ((0.0, "greedy"), (1.0, "temperature 1")):
            ms = [step_ms(grammars, vocab, batch, share, temperature, steps) if batch * share in (0, 1) or batch > 1
                  else None for share in (0, 0.5, 1)]
            half = "—" if ms[1] is None else f"{ms[1]:.2f}"   # half of one row: none
            print(f"| {batch} | {name} | {ms[0]:.2f} | {half} | {ms[2]:.2f} | {ms[2] - ms[0]:+.2f} |")


if __name__ == "__main__":
    main()
