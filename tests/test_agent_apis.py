"""OpenAI's Responses API and Anthropic's Messages API through their official SDKs against a real gunicorn:
text equal to the chat route's for the same request, every streamed event valid in the SDK's own types,
exact usage (the prefix cache's share included), tools with a result sent back, structured output, 429s
before any byte, a disconnect that frees the slot, and each API's own 400 shape."""
import json
import time

import anthropic
import jsonschema
import openai
import pytest
import requests
from anthropic.types import Message, RawMessageStreamEvent
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from benches.schemas import SCHEMAS, WEATHER_TOOL
from server.structured import closed
from tests.serving import Server, client, one_slot, server  # noqa: F401 - the shared fixtures

FUNCTION = WEATHER_TOOL["function"]
FLAT_TOOL = {"type": "function", "name": FUNCTION["name"], "description": FUNCTION["description"],
             "parameters": FUNCTION["parameters"]}
CLAUDE_TOOL = {"name": FUNCTION["name"], "description": FUNCTION["description"],
               "input_schema": FUNCTION["parameters"]}
QUESTION = "What is the weather in Paris?"
SYSTEM = "You answer briefly."
RESPONSE_EVENT = TypeAdapter(ResponseStreamEvent)
MESSAGE_EVENT = TypeAdapter(RawMessageStreamEvent)


@pytest.fixture(scope="module")
def oai(client):
    return client


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def chat(oai, messages, **kw):
    """The chat route's answer to the same request: the reference every other API must equal."""
    return oai.chat.completions.create(model="tiny", messages=messages, **kw)


def sse(server, path, body, headers=None):
    """[(event name, payload)] of a streamed answer, read raw."""
    r = requests.post(server.url + path, json={**body, "stream": True}, headers=headers, stream=True, timeout=60)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("text/event-stream")
    events, name = [], None
    for line in r.iter_lines(decode_unicode=True):
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            events.append((name, json.loads(line[6:])))
            name = None
    return events


# -- OpenAI Responses -------------------------------------------------------------------------------------------

def test_responses_text_and_usage_equal_the_chat_route(server, oai):
    ref = chat(oai, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}], max_tokens=12,
               temperature=1.0, seed=7)
    got = oai.responses.create(model="tiny", instructions=SYSTEM, input=QUESTION, max_output_tokens=12,
                               temperature=1.0, extra_body={"seed": 7})
    assert got.output_text == ref.choices[0].message.content
    assert got.usage.input_tokens == ref.usage.prompt_tokens and got.usage.output_tokens == ref.usage.completion_tokens
    assert got.usage.total_tokens == ref.usage.total_tokens and got.id.startswith("resp_")
    assert (got.status, got.incomplete_details.reason) == ("incomplete", "max_output_tokens")   # 12 tokens, no end
    raw = requests.post(server.url + "/v1/responses", json={"model": "tiny", "input": QUESTION, "instructions": SYSTEM,
                                                            "max_output_tokens": 12, "temperature": 1.0, "seed": 7})
    Response.model_validate(raw.json(), strict=False)   # every field the SDK's model requires, typed
    assert raw.json()["output"][0]["content"][0]["text"] == got.output_text


def test_responses_stream_is_the_typed_event_sequence(server, oai):
    body = {"model": "tiny", "input": QUESTION, "max_output_tokens": 10, "temperature": 0}
    whole = oai.responses.create(**body)
    events = sse(server, "/v1/responses", body)
    for name, payload in events:
        RESPONSE_EVENT.validate_python(payload)
        assert name == payload["type"]
    assert [p["sequence_number"] for _, p in events] == list(range(len(events)))
    kinds = [p["type"] for _, p in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    deltas = "".join(p["delta"] for _, p in events if p["type"] == "response.output_text.delta")
    assert deltas == whole.output_text == events[-1][1]["response"]["output"][0]["content"][0]["text"]
    assert events[-1][1]["response"]["usage"]["output_tokens"] == 10
    streamed = list(oai.responses.create(**body, stream=True))   # the SDK parses them into its own types
    assert _runs([e.type for e in streamed]) == _runs(kinds)   # (a lagging reader may get fewer, merged deltas)
    assert "".join(e.delta for e in streamed if e.type == "response.output_text.delta") == deltas


def _runs(kinds):
    """The kinds with each run of one kind as one."""
    return [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k]


def test_responses_function_call_and_its_output_sent_back(server, oai):
    schema = FUNCTION["parameters"]
    first = oai.responses.create(model="tiny", input=QUESTION, tools=[FLAT_TOOL], tool_choice="required",
                                 max_output_tokens=80, temperature=0)
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), schema)
    assert first.status == "completed"
    events = sse(server, "/v1/responses", {"model": "tiny", "input": QUESTION, "tools": [FLAT_TOOL],
                                           "tool_choice": "required", "max_output_tokens": 80, "temperature": 0})
    for _, payload in events:
        RESPONSE_EVENT.validate_python(payload)
    kinds = [p["type"] for _, p in events]
    assert kinds[2:6] == ["response.output_item.added", "response.function_call_arguments.delta",
                          "response.function_call_arguments.done", "response.output_item.done"]
    assert events[4][1]["arguments"] == call.arguments and kinds[-1] == "response.completed"
    # the call and its output sent back: the same prompt as the chat route's history with the call and the answer
    second = oai.responses.create(model="tiny", max_output_tokens=8, temperature=0, tools=[FLAT_TOOL], input=[
        {"role": "user", "content": QUESTION}, call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "18 C and sunny"}])
    ref = chat(oai, [{"role": "user", "content": QUESTION},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": call.call_id, "type": "function",
                          "function": {"name": call.name, "arguments": call.arguments}}]},
                     {"role": "tool", "tool_call_id": call.call_id, "content": "18 C and sunny"}],
               tools=[WEATHER_TOOL], max_tokens=8, temperature=0)
    assert second.usage.input_tokens == ref.usage.prompt_tokens
    assert second.output_text == (ref.choices[0].message.content or "")


def test_responses_text_format_json_schema_holds(server, oai):
    schema = SCHEMAS[sorted(SCHEMAS)[0]]
    fmt = {"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}}
    got = oai.responses.create(model="tiny", input="Answer in JSON.", text=fmt, max_output_tokens=300, temperature=0)
    jsonschema.validate(json.loads(got.output_text), schema)
    assert got.status == "completed"
    with oai.responses.stream(model="tiny", input="Answer in JSON.", text=fmt, max_output_tokens=300,
                              temperature=0) as stream:
        assert stream.get_final_response().output_text == got.output_text


# -- Anthropic Messages -----------------------------------------------------------------------------------------

def test_messages_text_and_usage_equal_the_chat_route(claude, oai):
    ref = chat(oai, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}], max_tokens=12,
               temperature=1.0, seed=3)
    got = claude.messages.create(model="tiny", system=[{"type": "text", "text": SYSTEM}], max_tokens=12,
                                 messages=[{"role": "user", "content": [{"type": "text", "text": QUESTION}]}],
                                 extra_body={"temperature": 1.0, "seed": 3})   # sent by older SDKs; vLLM's extra
    assert "".join(b.text for b in got.content) == ref.choices[0].message.content
    Message.model_validate(got.model_dump())
    assert got.id.startswith("msg_") and got.stop_reason == "max_tokens" and got.stop_sequence is None
    assert got.usage.input_tokens + got.usage.cache_read_input_tokens == ref.usage.prompt_tokens
    assert got.usage.output_tokens == ref.usage.completion_tokens == 12
    greedy = chat(oai, [{"role": "user", "content": QUESTION}], max_tokens=12, temperature=0)
    text = greedy.choices[0].message.content
    same = claude.messages.create(model="tiny", max_tokens=12, messages=[{"role": "user", "content": QUESTION}],
                                  extra_body={"temperature": 0})
    assert [b.type for b in same.content] == ["text"] and same.content[0].text == text
    # a stop sequence ends it: Anthropic's stop_reason and the sequence that matched
    word = text.split()[len(text.split()) // 2]
    stopped = claude.messages.create(model="tiny", max_tokens=12, messages=[{"role": "user", "content": QUESTION}],
                                     stop_sequences=[word], extra_body={"temperature": 0})
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", word)
    assert stopped.content[0].text == text[:text.index(word)]


def test_messages_stream_events_are_anthropics(server, claude):
    body = {"model": "tiny", "max_tokens": 10, "messages": [{"role": "user", "content": QUESTION}], "temperature": 0}
    whole = claude.messages.create(**{k: v for k, v in body.items() if k != "temperature"},
                                   extra_body={"temperature": 0})
    events = sse(server, "/v1/messages", body)
    for name, payload in events:
        MESSAGE_EVENT.validate_python(payload) if payload["type"] != "ping" else None
        assert name == payload["type"]
    kinds = [p["type"] for _, p in events]
    assert kinds[:3] == ["message_start", "ping", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[3:-3]) == {"content_block_delta"}
    assert events[0][1]["message"]["usage"]["input_tokens"] + events[0][1]["message"]["usage"][
        "cache_read_input_tokens"] == whole.usage.input_tokens + whole.usage.cache_read_input_tokens
    with claude.messages.stream(model="tiny", max_tokens=10, messages=[{"role": "user", "content": QUESTION}],
                                extra_body={"temperature": 0}) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert (final.stop_reason, final.usage.output_tokens) == ("max_tokens", 10)


def test_messages_tool_use_and_its_result_sent_back(server, claude, oai):
    first = claude.messages.create(model="tiny", max_tokens=80, messages=[{"role": "user", "content": QUESTION}],
                                   tools=[CLAUDE_TOOL], tool_choice={"type": "any"}, extra_body={"temperature": 0})
    assert first.stop_reason == "tool_use"
    (use,) = first.content
    assert use.type == "tool_use" and use.name == "get_weather" and use.id.startswith("toolu_")
    jsonschema.validate(use.input, FUNCTION["parameters"])
    with claude.messages.stream(model="tiny", max_tokens=80, messages=[{"role": "user", "content": QUESTION}],
                                tools=[CLAUDE_TOOL], tool_choice={"type": "tool", "name": "get_weather"},
                                extra_body={"temperature": 0}) as stream:
        partial = "".join(e.delta.partial_json for e in stream if e.type == "content_block_delta")
        final = stream.get_final_message()
    assert json.loads(partial) == final.content[0].input == use.input and final.stop_reason == "tool_use"
    second = claude.messages.create(model="tiny", max_tokens=8, tools=[CLAUDE_TOOL], extra_body={"temperature": 0},
                                    messages=[{"role": "user", "content": QUESTION},
                                              {"role": "assistant", "content": first.content},
                                              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                                            "content": "18 C and sunny"}]}])
    ref = chat(oai, [{"role": "user", "content": QUESTION},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": "call_1", "type": "function",
                          "function": {"name": use.name, "arguments": json.dumps(use.input)}}]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"}],
               tools=[WEATHER_TOOL], max_tokens=8, temperature=0)
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens == ref.usage.prompt_tokens
    assert "".join(b.text for b in second.content if b.type == "text") == (ref.choices[0].message.content or "")
    # the prompt's length as count_tokens gives it, before running anything
    counted = claude.messages.count_tokens(model="tiny", tools=[CLAUDE_TOOL], messages=[
        {"role": "user", "content": QUESTION}, {"role": "assistant", "content": first.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18 C and sunny"}]}])
    assert counted.input_tokens == ref.usage.prompt_tokens


def test_messages_output_config_json_schema_holds(claude):
    schema = SCHEMAS[sorted(SCHEMAS)[0]]
    got = claude.messages.create(model="tiny", max_tokens=300, messages=[{"role": "user", "content": "JSON."}],
                                 output_config={"format": {"type": "json_schema", "schema": schema}},
                                 extra_body={"temperature": 0})
    jsonschema.validate(json.loads(got.content[0].text), schema)
    assert got.stop_reason == "end_turn"


# -- what every API shares --------------------------------------------------------------------------------------

def test_the_prefix_cache_share_is_reported_on_every_api(server, oai, claude):
    prompt = "Continuous batching keeps every stream moving, " * 12   # several 16-token blocks
    messages = [{"role": "user", "content": prompt}]
    first = chat(oai, messages, max_tokens=2, temperature=0)
    again = chat(oai, messages, max_tokens=2, temperature=0)
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens == again.usage.prompt_tokens > 64
    assert cached % 16 == 0 and again.usage.prompt_tokens - 16 <= cached < again.usage.prompt_tokens
    r = oai.responses.create(model="tiny", input=prompt, max_output_tokens=2, temperature=0)
    assert (r.usage.input_tokens, r.usage.input_tokens_details.cached_tokens) == (again.usage.prompt_tokens, cached)
    m = claude.messages.create(model="tiny", max_tokens=2, messages=messages, extra_body={"temperature": 0})
    assert (m.usage.input_tokens, m.usage.cache_read_input_tokens) == (again.usage.prompt_tokens - cached, cached)
    c = oai.completions.create(model="tiny", prompt=prompt + "?", max_tokens=2, temperature=0)
    assert c.usage.prompt_tokens_details.cached_tokens == 0   # another text from its first token: no hit


@pytest.mark.parametrize("path, body, field, message", [
    ("/v1/responses", {"input": "x", "store": "yes"}, "store", "a boolean"),
    ("/v1/responses", {"input": "x", "store": False, "background": True}, "background", "must be stored"),
    ("/v1/responses", {"input": "x", "background": True, "stream": True}, "background", "poll"),
    ("/v1/responses", {"input": "x", "previous_response_id": 7}, "previous_response_id", "a string"),
    ("/v1/responses", {"input": []}, "input", "non-empty"),
    ("/v1/responses", {"input": [{"type": "input_image", "image_url": "x"}]}, "input", "not supported"),
    ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input", "text only"),
    ("/v1/responses", {"input": "x", "max_output_tokens": 0}, "max_output_tokens", "max_output_tokens"),
    ("/v1/responses", {"input": "x", "temperature": "hot"}, "temperature", "a number"),
    ("/v1/responses", {"input": "x", "tools": [{"type": "web_search"}]}, "tools", "only function tools"),
    ("/v1/responses", {"input": "x", "tools": [FLAT_TOOL], "tool_choice": {"type": "function", "name": "nope"}},
     "tool_choice", "not in 'tools'"),
    ("/v1/responses", {"input": "x", "text": {"format": {"type": "xml"}}}, "text.format", "json_schema"),
    ("/v1/responses", {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{x"}]},
     "input", "not JSON"),
    ("/v1/responses", {"input": "x", "bogus": 1}, "bogus", "unsupported"),
    ("/v1/responses", {"input": "x", "truncation": "auto"}, "truncation", "not cut"),
])
def test_responses_bad_input_is_a_400_naming_the_field(server, path, body, field, message):
    r = requests.post(server.url + path, json={"model": "tiny", **body}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field and message in error["message"], error


@pytest.mark.parametrize("body, message", [
    ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens: Field required"),
    ({"max_tokens": 5, "messages": []}, "messages"),
    ({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "role"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "'image'"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "stop_sequences": "ab"}, "stop_sequences"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "any"}}, "needs tools"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": "bad name"}]}, "tools.0"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "bash_20250124",
                                                                                 "name": "bash"}]}, "custom tools"),
    ({"max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "top_k": 1.5}, "top_k"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "output_config": {"format": {"type": "x"}}},
     "output_config"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "bogus": 1}, "bogus"),
])
def test_messages_bad_input_is_anthropics_400_naming_the_field(server, claude, body, message):
    r = requests.post(server.url + "/v1/messages", json={"model": "tiny", **body}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    assert message in r.json()["error"]["message"], r.json()
    with pytest.raises(anthropic.BadRequestError):   # the SDK reads it as Anthropic's own error
        claude.post("/v1/messages", body={"model": "tiny", **body}, cast_to=Message)


def test_a_prompt_past_the_context_fails_in_each_apis_shape(server):
    # found by the tokenize worker after the 200 of a stream: the API's own failure event, then the end
    long = "word " * 3000
    events = sse(server, "/v1/responses", {"model": "tiny", "input": long, "max_output_tokens": 5})
    assert [p["type"] for _, p in events] == ["response.created", "response.in_progress", "response.failed"]
    RESPONSE_EVENT.validate_python(events[-1][1])
    assert "context length" in events[-1][1]["response"]["error"]["message"]
    events = sse(server, "/v1/messages", {"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": long}]})
    assert [(name, p["error"]["type"]) for name, p in events] == [("error", "invalid_request_error")]
    r = requests.post(server.url + "/v1/messages", json={"model": "tiny", "max_tokens": 5,
                                                         "messages": [{"role": "user", "content": long}]})
    assert r.status_code == 400 and "context length" in r.json()["error"]["message"]


def test_another_model_is_a_404_in_each_apis_shape(server):
    r = requests.post(server.url + "/v1/messages", json={"model": "claude-x", "max_tokens": 5,
                                                         "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error" and "claude-x" in r.text
    r = requests.post(server.url + "/v1/responses", json={"model": "gpt-x", "input": "x"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"


def _hold(server):
    """A long stream holding the server's one slot, its first event read (the line iterator is kept: dropping
    it closes the connection, which frees the slot)."""
    r = requests.post(server.url + "/v1/completions", json={"prompt": "hold", "max_tokens": 1000, "stream": True,
                                                            "ignore_eos": True}, stream=True)
    assert r.status_code == 200
    lines = r.iter_lines()
    assert next(lines).startswith(b"data: ")
    return r, lines


def test_a_full_server_answers_429_before_any_byte_on_both(one_slot):
    held, _ = _hold(one_slot)
    try:
        oai = openai.OpenAI(base_url=one_slot.url + "/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.RateLimitError) as e:
            oai.responses.create(model="tiny", input="x", max_output_tokens=5, stream=True)
        assert e.value.response.headers["Retry-After"] == "1"
        claude = anthropic.Anthropic(base_url=one_slot.url, api_key="unused", max_retries=0)
        with pytest.raises(anthropic.RateLimitError) as e:
            with claude.messages.stream(model="tiny", max_tokens=5, messages=[{"role": "user", "content": "x"}]):
                pass
        assert e.value.response.headers["Retry-After"] == "1"
        assert not e.value.response.headers["Content-Type"].startswith("text/event-stream")
        assert e.value.response.json()["error"]["type"] == "rate_limit_error"
    finally:
        held.close()


@pytest.mark.parametrize("path, body", [
    ("/v1/responses", {"input": "a long answer", "max_output_tokens": 1000, "ignore_eos": True}),
    ("/v1/messages", {"max_tokens": 1000, "messages": [{"role": "user", "content": "a long answer"}],
                      "ignore_eos": True}),
])
def test_a_client_that_goes_away_frees_its_slot(one_slot, path, body):
    deadline = time.monotonic() + 30
    while one_slot.metric("rosefast_inflight_requests") != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    r = requests.post(one_slot.url + path, json={"model": "tiny", "stream": True, **body}, stream=True)
    assert r.status_code == 200
    lines = r.iter_lines()
    while b"delta" not in next(lines):   # a token has come
        pass
    assert one_slot.metric("rosefast_inflight_requests") == 1
    r.close()
    deadline = time.monotonic() + 30
    while one_slot.metric("rosefast_inflight_requests") != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert one_slot.metric("rosefast_inflight_requests") == 0
    short = {k: 2 if k in ("max_tokens", "max_output_tokens") else v for k, v in body.items()}
    assert requests.post(one_slot.url + path, json={"model": "tiny", **short}).status_code == 200


def test_tool_parameters_are_closed_where_they_declare_their_properties():
    schema = {"type": "object", "properties": {"city": {"type": "string"},
                                               "where": {"type": "object", "properties": {"lat": {"type": "number"}}},
                                               "free": {"type": "object"},
                                               "open": {"type": "object", "properties": {},
                                                        "additionalProperties": True}},
              "$defs": {"d": {"properties": {"x": {}}}}, "anyOf": [{"properties": {"y": {}}}]}
    out = closed(schema)
    assert out["additionalProperties"] is False and out["properties"]["where"]["additionalProperties"] is False
    assert "additionalProperties" not in out["properties"]["free"]          # no properties declared: left open
    assert out["properties"]["open"]["additionalProperties"] is True         # said so: kept
    assert out["$defs"]["d"]["additionalProperties"] is False and out["anyOf"][0]["additionalProperties"] is False
    assert "additionalProperties" not in schema                               # the client's schema is not changed


@pytest.mark.slow
def test_the_real_model_ends_a_forced_tool_call_on_every_api(default_model, model_cache):
    # the issue's case: with the arguments held to the declared properties, the call can (and does) end
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Get the weather in a city.",
                                             "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                            "required": ["city"]}}}
    s = Server({"ROSEFAST_KV_CACHE_TOKENS": 4096, "ROSEFAST_SERVED_MODEL_NAME": "real"})
    try:
        oai = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        claude = anthropic.Anthropic(base_url=s.url, api_key="unused", max_retries=0)
        question = [{"role": "user", "content": QUESTION}]
        for seed in range(3):
            got = oai.chat.completions.create(model="real", messages=question, tools=[tool], tool_choice="required",
                                              max_tokens=60, seed=seed)
            assert got.choices[0].finish_reason == "tool_calls", got.choices[0].message.content
            assert set(json.loads(got.choices[0].message.tool_calls[0].function.arguments)) == {"city"}
            r = oai.responses.create(model="real", input=QUESTION, tools=[{"type": "function", **tool["function"]}],
                                     tool_choice="required", max_output_tokens=60, extra_body={"seed": seed})
            assert r.output[0].type == "function_call" and set(json.loads(r.output[0].arguments)) == {"city"}
            m = claude.messages.create(model="real", max_tokens=60, messages=question, tool_choice={"type": "any"},
                                       tools=[{"name": "get_weather", "description": "Get the weather in a city.",
                                               "input_schema": tool["function"]["parameters"]}],
                                       extra_body={"seed": seed})
            assert m.stop_reason == "tool_use" and set(m.content[0].input) == {"city"}
    finally:
        s.stop()


def test_a_strict_schema_is_closed_and_a_plain_one_means_what_json_schema_says():
    from server.responses_api import _text_format
    from server.structured import requested_grammar

    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    assert requested_grammar({"response_format": fmt})[1]["additionalProperties"] is False
    assert "additionalProperties" not in requested_grammar(
        {"response_format": {**fmt, "json_schema": {**fmt["json_schema"], "strict": False}}})[1]
    assert _text_format({"format": {"type": "json_schema", "name": "x", "schema": schema, "strict": True}})[1][
        "additionalProperties"] is False
