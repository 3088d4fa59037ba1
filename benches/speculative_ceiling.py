"""What speculation can gain at one stream on this CPU, whatever proposes: the task sets of benches/speculative.py,
in-process, one request at a time (greedy, to EOS or --tokens), on one engine with the server's default weights,
each configuration in turn for --rounds rounds:

- off: no speculation (the baseline, and the greedy continuation every other row must reproduce);
- auto / ngram: prompt lookup, as served (auto) and proposing the most wherever a match is found (ngram);
- lookup, best in hindsight: the ceiling of prompt lookup itself. Among every earlier place in the prompt and
  output where the sequence's last token occurs (every n-gram match of any length is one of them), it takes the
  one whose following tokens agree longest with the recorded continuation and proposes exactly those (up to
  --ngram-tokens); nothing where none agrees. No lookup proposer keeps more or wastes fewer rows;
- oracle k: a proposer that proposes the next k tokens of the recorded greedy continuation — every proposal is
  right, so its speed is the ceiling of any proposer (a draft model included) that proposes k tokens a step.

Reported: completion tok/s over the set's wall time, the ratio to off, tokens per decode step, proposed and kept
tokens, whether the texts equal off's, and the engine's mean decode-step time by row count (what a verified row
costs here).

    python -m benches.speculative_ceiling [--set input-grounded] [--k 4,8,16] [--tokens 256] [--rounds 2]
"""
import argparse
import time

from benches.speculative import TASKS
from rosefast.config import EngineConfig
from rosefast.engine.llm_engine import LLMEngine
from rosefast.engine.sampling_params import SamplingParams
from rosefast.engine.speculation import prompt_lookup


class RecordedContinuation:
    """A proposer that knows each prompt's greedy continuation: it proposes the next k tokens of it (or falls back
    to prompt lookup for a prompt it has not recorded)."""

    def __init__(self, prompts, outputs):
        self.known = {tuple(p): list(o) for p, o in zip(prompts, outputs)}

    def __call__(self, seq, k):
        out = self.known.get(tuple(seq.token_ids[:seq.num_prompt_tokens]))
        if out is None:
            return prompt_lookup(seq, k)
        done = seq.num_output_tokens
        return out[done:done + k]


class BestLookup(RecordedContinuation):
    """Prompt lookup with hindsight: the earlier occurrence of the last token whose continuation agrees longest
    with the recorded one, cut where it stops agreeing."""

    def __call__(self, seq, k):
        out = self.known.get(tuple(seq.token_ids[:seq.num_prompt_tokens]))
        if out is None:
            return prompt_lookup(seq, k)
        tokens, truth = seq.token_ids, out[seq.num_output_tokens:seq.num_output_tokens + k]
        last, best = tokens[-1], []
        for q in range(len(tokens) - 1):
            if tokens[q] == last:
                m = 0
                while m < len(truth) and q + 1 + m < len(tokens) and tokens[q + 1 + m] == truth[m]:
                    m += 1
                if m > len(best):
                    best = truth[:m]
        return best


def run(engine, prompts, params, mode, k, proposer):
    """(tokens, seconds, decode steps, proposed, kept, outputs) for the prompts one after another."""
    spec = engine.speculator
    spec.mode, spec.max_tokens, spec.proposer = mode, k, proposer
    before = dict(spec.stats(), steps=engine.stats()["steps"])
    outs, start = [], time.perf_counter()
    for p in prompts:
        outs.append(engine.generate([p], params, use_tqdm=False)[0]["token_ids"])
    secs = time.perf_counter() - start
    after = dict(spec.stats(), steps=engine.stats()["steps"])
    return (sum(map(len, outs)), secs, after["steps"] - before["steps"],
            after["spec_proposed"] - before["spec_proposed"], after["spec_accepted"] - before["spec_accepted"], outs)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--set", choices=sorted(TASKS), default="input-grounded")
    p.add_argument("--k", default="4,8,16", help="the oracle's proposal lengths")
    p.add_argument("--ngram-tokens", type=int, default=8, help="speculative_tokens of the auto and ngram rows")
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args(argv)
    engine = LLMEngine(EngineConfig(speculative="auto", speculative_tokens=a.ngram_tokens))
    tok = engine.tokenizer
    prompts = [list(tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                            tokenize=True, return_dict=True)["input_ids"]) for t in TASKS[a.set]]
    params = SamplingParams(max_tokens=a.tokens, temperature=0)
    engine.generate([prompts[0][:16]], SamplingParams(max_tokens=8, temperature=0), use_tqdm=False)   # warm
    reference = run(engine, prompts, params, "off", 0, prompt_lookup)[5]
    oracle = RecordedContinuation(prompts, reference)
    configs = [("off", "off", 0, prompt_lookup), ("auto", "auto", a.ngram_tokens, prompt_lookup),
               ("ngram", "ngram", a.ngram_tokens, prompt_lookup),
               ("lookup, best in hindsight", "ngram", a.ngram_tokens, BestLookup(prompts, reference))]
    configs += [(f"oracle k={k}", "ngram", int(k), oracle) for k in a.k.split(",")]
    rows = {name: [0, 0.0, 0, 0, 0, 0] for name, *_ in configs}
    for _ in range(a.rounds):
        for name, mode, k, proposer in configs:
            n, secs, steps, proposed, kept, outs = run(engine, prompts, params, mode, k, proposer)
            r = rows[name]
            for i, v in enumerate((n, secs, steps, proposed, kept)):
                r[i] += v
            r[5] += sum(o == ref for o, ref in zip(outs, reference))
            print(f"{name}: {n / secs:.1f} tok/s", flush=True)
    model = engine.model.name
    print(f"{a.set}, {len(prompts)} prompts one at a time, greedy to EOS or {a.tokens} tokens, {model}, "
          f"{a.rounds} rounds interleaved")
    print("| proposer | tok/s | x off | tokens per step | kept / proposed | texts as off |")
    print("|---|---|---|---|---|---|")
    base = rows["off"][0] / rows["off"][1]
    for name, *_ in configs:
        n, secs, steps, proposed, kept, same = rows[name]
        print(f"| {name} | {n / secs:.1f} | {n / secs / base:.2f}x | {n / steps:.2f} | "
              f"{kept}/{proposed} | {same}/{len(prompts) * a.rounds} |")
    cost = engine.speculator.cost.by_rows
    print("decode step by rows (ms, the recent mean): "
          + ", ".join(f"{r}: {t * 1e3:.1f}" for r, t in sorted(cost.items())))
    return rows


if __name__ == "__main__":
    main()
