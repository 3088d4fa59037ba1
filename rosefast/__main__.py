"""Command line: `python -m rosefast generate "prompt"` prints a completion (greedy) from our engine."""
import argparse
import sys


def _generate(args):
    from rosefast.engine.llm_engine import LLMEngine
    from rosefast.engine.sampling_params import SamplingParams

    engine = LLMEngine(model=args.model, dtype=args.dtype, kv_cache_tokens=4096)
    prompt = args.prompt
    if not args.raw and engine.tokenizer.chat_template:
        prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                      add_generation_prompt=True, tokenize=False)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0)
    print(engine.generate([prompt], params, use_tqdm=False)[0]["text"])


def main(argv=None):
    parser = argparse.ArgumentParser(prog="rosefast", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="print a completion of PROMPT")
    gen.add_argument("prompt")
    gen.add_argument("--model", default="smollm2-135m",
                     help="smollm2-135m, a Hugging Face directory, a .gguf, or a hub name (owner/repo:Q4_K_M)")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--dtype", default="auto", help="auto (bf16 where the CPU has it), float32, bfloat16")
    gen.add_argument("--raw", action="store_true", help="complete the text as is, without the chat template")
    args = parser.parse_args(argv)
    from rosefast.sources import ModelError

    try:
        _generate(args)
    except (ModelError, ValueError) as e:
        print(f"rosefast: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
