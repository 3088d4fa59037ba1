"""A reasoning block taken apart from the answer (server.reasoning): streamed in any pieces as the whole text
splits, and through a real gunicorn serving a Qwen3 model (chat, streamed and not; chat_template_kwargs)."""
import json
import shutil

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from rosefast.sources import load_tokenizer, tiny_random
from server.reasoning import ReasoningSplit, split_reasoning
from tests.serving import Server, tiny_env

TAGS = ("<think>", "</think>")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["<think>", "</think>", "\n", " ", "abc", "<th", "</th", "Paris", "<"]), max_size=10),
       st.lists(st.integers(0, 60), max_size=6))
def test_streamed_in_any_pieces_it_splits_as_the_whole_text(parts, cuts):
    text = "".join(parts)
    pieces, last = [], 0
    for cut in sorted(min(c, len(text)) for c in cuts):
        pieces.append(text[last:cut])
        last = cut
    pieces.append(text[last:])
    split = ReasoningSplit(TAGS)
    thought, content = "", ""
    for piece in pieces + [None]:
        r, c = split.feed(piece) if piece is not None else split.flush()
        thought, content = thought + r, content + c
    whole_thought, whole_content = split_reasoning(text, TAGS)
    assert (thought, content) == (whole_thought or "", whole_content)


def test_what_the_split_takes_apart():
    assert split_reasoning("<think>\nI reason.\n</think>\n\nParis", TAGS) == ("\nI reason.\n", "Paris")
    assert split_reasoning("  <think>unfinished", TAGS) == ("unfinished", "")
    assert split_reasoning("Paris <think>x</think>", TAGS) == (None, "Paris <think>x</think>")


@pytest.mark.timeout(60)
def test_a_long_run_of_white_space_before_the_block_is_split_in_linear_time():
    """Token by token, 400,000 spaces before the opening tag, 200,000 pieces of reasoning, then the answer: the
    start held the whole text and stripped it at every token (quadratic: the red team's kind of request)."""
    split = ReasoningSplit(TAGS)
    pieces = [" "] * 400_000 + ["<think>"] + ["x"] * 200_000 + ["</think>", "\n\nParis"]
    thought, content = zip(*(split.feed(p) for p in pieces))
    assert "".join(thought) == "x" * 200_000 and "".join(content) == "Paris" and split.flush() == ("", "")
    other = ReasoningSplit(TAGS)
    assert "".join(other.feed(p)[1] for p in [" "] * 400_000 + ["Paris"]) + other.flush()[1] == \
        " " * 400_000 + "Paris"


FORCED = r"<think>\nI reason\.\n</think>\n\nParis"   # what the grammar makes the tiny model write


@pytest.fixture(scope="module")
def qwen3_server(tmp_path_factory, default_model):
    """A tiny Qwen3 whose chat template reads `enable_thinking` as Qwen3's does (an empty block when false)."""
    path = tmp_path_factory.mktemp("qwen3") / "model"
    shutil.copytree(tiny_random("qwen3").path, path)
    (path / "chat_template.jinja").write_text(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and "
        "enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}")
    s = Server(tiny_env(type("M", (), {"path": path})()))
    yield s
    s.stop()


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Capital of France?"}], "max_tokens": 40,
        "temperature": 0, "guided_regex": FORCED}


def test_a_qwen3_reasoning_block_comes_apart_from_the_answer(qwen3_server):
    r = requests.post(qwen3_server.url + "/v1/chat/completions", json=CHAT, timeout=60)
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    assert message["content"] == "Paris"
    assert message["reasoning_content"] == message["reasoning"] == "\nI reason.\n"
    events = requests.post(qwen3_server.url + "/v1/chat/completions", json={**CHAT, "stream": True},
                           timeout=60).text.split("\n\n")
    deltas = [json.loads(e[6:])["choices"][0]["delta"] for e in events if e.startswith("data: {")]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "\nI reason.\n"
    assert "".join(d.get("reasoning", "") for d in deltas) == "\nI reason.\n"
    assert "".join(d.get("content") or "" for d in deltas) == "Paris"


def test_chat_template_kwargs_reach_the_template(qwen3_server):
    url = qwen3_server.url + "/v1/chat/completions"
    body = {"model": "tiny", "messages": CHAT["messages"], "max_tokens": 1}
    plain = requests.post(url, json=body, timeout=60).json()["usage"]["prompt_tokens"]
    off = requests.post(url, json={**body, "chat_template_kwargs": {"enable_thinking": False}},
                        timeout=60).json()["usage"]["prompt_tokens"]
    tok = load_tokenizer(tiny_random("qwen3"))
    assert off - plain == len(tok("<think>\n\n</think>\n\n", add_special_tokens=False).input_ids)
    bad = requests.post(url, json={**body, "chat_template_kwargs": {"tools": []}}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "chat_template_kwargs"


def test_the_reasoning_block_is_a_reasoning_item_and_a_thinking_block(qwen3_server):
    import anthropic
    import openai

    oai = openai.OpenAI(base_url=qwen3_server.url + "/v1", api_key="unused", max_retries=0)
    body = dict(model="tiny", input="Capital of France?", max_output_tokens=40, temperature=0,
                extra_body={"guided_regex": FORCED})
    r = oai.responses.create(**body)
    assert [item.type for item in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == "\nI reason.\n" and r.output_text == "Paris"
    events = list(oai.responses.create(**body, stream=True))
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "\nI reason.\n"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Paris"
    assert [e.item.type for e in events if e.type == "response.output_item.done"] == ["reasoning", "message"]
    claude = anthropic.Anthropic(base_url=qwen3_server.url, api_key="unused", max_retries=0)
    kw = dict(model="tiny", max_tokens=40, messages=[{"role": "user", "content": "Capital of France?"}],
              thinking={"type": "enabled", "budget_tokens": 1024},
              extra_body={"temperature": 0, "guided_regex": FORCED})
    m = claude.messages.create(**kw)
    def blocks(message):
        return [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in message.content]

    assert blocks(m) == [("thinking", "\nI reason.\n"), ("text", "Paris")]
    with claude.messages.stream(**kw) as stream:
        assert blocks(stream.get_final_message()) == blocks(m)
