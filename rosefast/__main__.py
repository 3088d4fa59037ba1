"""Command line: `python -m rosefast generate "prompt"` prints a completion from the default model."""
import argparse
import sys


def _generate(args):
    from rosefast.generate import generate_text

    text = generate_text(args.prompt, model=args.model, max_tokens=args.max_tokens, chat=not args.raw)
    print(text)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="rosefast", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="print a completion of PROMPT")
    gen.add_argument("prompt")
    gen.add_argument("--model", default="smollm2-135m", help="smollm2-135m, a Hugging Face directory or a .gguf")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--raw", action="store_true", help="complete the text as is, without the chat template")
    args = parser.parse_args(argv)
    from rosefast.models import ModelError

    try:
        _generate(args)
    except (ModelError, ValueError) as e:
        print(f"rosefast: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
