"""A chained Responses conversation, one run: per turn, the time to the first text event of a turn sent with
`previous_response_id` (only the new question on the wire; the server renders the stored conversation) against
the same turn of another conversation that resends its whole history (`store: false`). The two conversations
alternate turn by turn on one server; each is its own text, so neither is served by the other's prefix cache.

    python -m benches.responses_chain --turns 10 --tokens 48
"""
import argparse
import statistics
import time

import openai

from server.process import Server

QUESTIONS = ["Tell me about lighthouses.", "Why are they painted?", "Who keeps them now?", "What about storms?",
             "Name a famous one.", "How tall is it?", "When was it built?", "Can people visit it?",
             "What is the light made of?", "How far can it be seen?", "What replaced the keepers?",
             "Summarise what you said."]


def streamed(client, **kw):
    """(TTFT in ms to the first text delta, the completed response) of one streamed turn."""
    t0, first, done = time.perf_counter(), None, None
    for event in client.responses.create(model="bench", stream=True, temperature=0, **kw):
        if first is None and event.type == "response.output_text.delta":
            first = time.perf_counter()
        if event.type in ("response.completed", "response.incomplete"):
            done = event.response
    return ((first or time.perf_counter()) - t0) * 1e3, done


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--tokens", type=int, default=48, help="max_output_tokens per turn")
    p.add_argument("--model", default="smollm2-135m", help="ROSEFAST_MODEL of the server")
    a = p.parse_args(argv)
    server = Server({"ROSEFAST_MODEL": a.model, "ROSEFAST_SERVED_MODEL_NAME": "bench",
                     "ROSEFAST_GENERATION_CONFIG": "none"}, startup_timeout=600)
    rows = []
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        streamed(client, input="warm up", max_output_tokens=4, store=False)
        previous, history = None, [{"role": "user", "content": "(conversation B) Hello."}]
        _, start = streamed(client, input=history, max_output_tokens=a.tokens, store=False)
        history.append({"role": "assistant", "content": start.output_text})
        _, opened = streamed(client, input="(conversation A) Hello.", max_output_tokens=a.tokens)
        previous = opened.id
        for turn in range(a.turns):
            question = QUESTIONS[turn % len(QUESTIONS)]
            ttft_chain, chained = streamed(client, input=question, previous_response_id=previous,
                                           max_output_tokens=a.tokens)
            previous = chained.id
            history.append({"role": "user", "content": question})
            ttft_whole, whole = streamed(client, input=history, max_output_tokens=a.tokens, store=False)
            history.append({"role": "assistant", "content": whole.output_text})
            rows.append((turn + 2, chained.usage.input_tokens, chained.usage.input_tokens_details.cached_tokens,
                         ttft_chain, whole.usage.input_tokens, whole.usage.input_tokens_details.cached_tokens,
                         ttft_whole))
    finally:
        server.stop()
    print(f"model {a.model}, {a.tokens} output tokens a turn, temperature 0")
    print("| turn | chained: prompt (cached) tokens | TTFT ms | whole history: prompt (cached) tokens | TTFT ms |")
    print("|---|---|---|---|---|")
    for turn, pc, cc, tc, pw, cw, tw in rows:
        print(f"| {turn} | {pc} ({cc}) | {tc:.1f} | {pw} ({cw}) | {tw:.1f} |")
    chain, whole = [r[3] for r in rows], [r[6] for r in rows]
    print(f"TTFT median: chained {statistics.median(chain):.1f} ms, whole history {statistics.median(whole):.1f} ms "
          f"({statistics.median(chain) / statistics.median(whole):.2f}x)")
    return rows


if __name__ == "__main__":
    main()
