"""Structured output and tool calls over HTTP, through the official openai client and LangChain against a real
gunicorn: response_format, vLLM's guided_* extras, tools with every tool_choice, and their 400s."""
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from benches.schemas import SCHEMAS, WEATHER_TOOL
from server.tools import CLOSE, OPEN, CallWatch, parse_calls
from tests.serving import Bystander, Server, never_stalled, tiny_env

CHAT = [{"role": "user", "content": "Answer in JSON."}]
FUNCTIONS = {"get_weather": {}}
PARIS = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'


@pytest.fixture(scope="module")
def server(tiny_llama):
    s = Server(tiny_env(tiny_llama, max_inflight_requests=0, grammar_timeout_s=0.3))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _streamed(stream):
    """(content, tool calls as (name, arguments), finish reason) of a streamed chat completion."""
    content, calls, reason = "", [], None
    for event in stream:
        if not event.choices:
            continue
        delta = event.choices[0].delta
        content += delta.content or ""
        calls += [(c.function.name, c.function.arguments) for c in delta.tool_calls or ()]
        reason = event.choices[0].finish_reason or reason
    return content, calls, reason


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_holds_and_streamed_equals_not_streamed(client, name):
    schema = SCHEMAS[name]
    fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
    whole = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=300, temperature=0,
                                           response_format=fmt)
    text = whole.choices[0].message.content
    jsonschema.validate(json.loads(text), schema)
    assert whole.choices[0].finish_reason == "stop"
    content, _, reason = _streamed(client.chat.completions.create(
        model="tiny", messages=CHAT, max_tokens=300, temperature=0, response_format=fmt, stream=True))
    assert (content, reason) == (text, "stop")
    sampled = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=300, temperature=1.0, seed=3,
                                             n=3, response_format=fmt)
    for choice in sampled.choices:
        jsonschema.validate(json.loads(choice.message.content), schema)


def test_guided_extras_and_completions(client):
    r = client.completions.create(model="tiny", prompt="pick one", max_tokens=20,
                                  extra_body={"guided_choice": ["red", "green", "blue"]})
    assert r.choices[0].text in ("red", "green", "blue")
    r = client.completions.create(model="tiny", prompt="a code", max_tokens=20,
                                  extra_body={"guided_regex": r"[0-9]{3}-[a-z]{2}"})
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", r.choices[0].text)
    r = client.completions.create(model="tiny", prompt="json", max_tokens=300, temperature=0,
                                  extra_body={"guided_json": json.dumps(SCHEMAS["tags"])})
    jsonschema.validate(json.loads(r.choices[0].text), SCHEMAS["tags"])
    r = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=300, temperature=0,
                                       extra_body={"structured_outputs": {"json": SCHEMAS["person"]}})
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMAS["person"])
    r = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=20,
                                       extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert r.choices[0].message.content in ("yes", "no")
    r = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=5, response_format={"type": "text"})
    assert r.choices[0].finish_reason == "length"


def test_max_tokens_inside_the_object_is_length(client):
    r = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=4, temperature=0,
                                       response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "length" and r.choices[0].message.content.startswith("{")


@pytest.mark.parametrize("body, param, message", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
     "response_format", "Invalid type: strin"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}},
     "response_format", "Unimplemented keys"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nope"}}}},
     "response_format", "nope"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}, "response_format", "'name'"),
    ({"response_format": {"type": "xml"}}, "response_format", "text, json_object or json_schema"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a+"}, "guided_regex", "give one grammar"),
    ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
    ({"guided_regex": "a(b"}, "guided_regex", "unclosed group"),
    ({"guided_choice": []}, "guided_choice", "non-empty list"),
    ({"structured_outputs": {"json": {}, "regex": "a"}}, "structured_outputs", "exactly one of"),
    ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "'nope', which is not in 'tools'"),
    ({"tool_choice": "required"}, "tool_choice", "needs 'tools'"),
    ({"tools": [{"type": "function"}]}, "tools", "tools[0]"),
    ({"tools": [WEATHER_TOOL, WEATHER_TOOL]}, "tools", "given twice"),
    ({"tools": [WEATHER_TOOL], "tool_choice": "always"}, "tool_choice", "none, auto, required"),
    ({"tools": [WEATHER_TOOL], "tool_choice": "required", "response_format": {"type": "json_object"}},
     "response_format", "give one grammar"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f",
                                                                                         "arguments": "{x"}}]}]},
     "messages", "are not JSON"),
])
def test_bad_grammars_and_tools_are_400s_naming_the_field(server, body, param, message):
    r = requests.post(server.url + "/v1/chat/completions", json={"messages": CHAT, "max_tokens": 5, **body},
                      timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and message in error["message"], error


@pytest.mark.timing
def test_a_slow_grammar_is_a_400_and_the_hub_serves_on_meanwhile(pool_server):
    # a compile that takes over a second (the pool server's drill), past its 0.3 s limit
    server = pool_server
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    choices = ["slow-one", "slow-two"]
    _pool(server)   # llguidance's tokenizer built first (once per server, ~0.5 s of Python)
    seen = []

    def health_during():
        import threading

        def poll():
            t_end = time.monotonic() + 0.3
            while time.monotonic() < t_end:
                t = time.perf_counter()
                ok = requests.get(server.url + "/health", timeout=5).status_code == 200
                seen.append((ok, time.perf_counter() - t))
                time.sleep(0.02)
        thread = threading.Thread(target=poll)
        thread.start()
        return thread

    poller = health_during()
    with pytest.raises(openai.BadRequestError, match="did not compile within 0.3 s"):
        client.completions.create(model="tiny", prompt="pick", max_tokens=5, extra_body={"guided_choice": choices})
    poller.join()
    # the 400 came at the limit while the compile ran on; the polls during it were answered (a hub held by the
    # compile would have answered one, after it)
    assert len(seen) >= 3 and all(ok for ok, _ in seen)


def test_forced_tool_calls_parse_into_their_schema(client):
    schema = WEATHER_TOOL["function"]["parameters"]
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        whole = client.chat.completions.create(model="tiny", messages=CHAT, tools=[WEATHER_TOOL], tool_choice=choice,
                                               max_tokens=200, temperature=0)
        message = whole.choices[0].message
        assert whole.choices[0].finish_reason == "tool_calls" and message.content is None
        (call,) = message.tool_calls
        assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), schema)
        content, calls, reason = _streamed(client.chat.completions.create(
            model="tiny", messages=CHAT, tools=[WEATHER_TOOL], tool_choice=choice, max_tokens=200, temperature=0,
            stream=True))
        assert (content, calls, reason) == ("", [("get_weather", call.function.arguments)], "tool_calls")


def test_auto_parses_a_call_the_model_makes_and_streams_plain_text(client):
    # the tiny model never writes a call by itself: a regex makes it write one, and "auto" must parse it
    forced = re.escape(OPEN + PARIS + CLOSE)
    whole = client.chat.completions.create(model="tiny", messages=CHAT, tools=[WEATHER_TOOL], max_tokens=60,
                                           extra_body={"guided_regex": forced})
    (call,) = whole.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "celsius"}
    assert whole.choices[0].finish_reason == "tool_calls"
    content, calls, reason = _streamed(client.chat.completions.create(
        model="tiny", messages=CHAT, tools=[WEATHER_TOOL], max_tokens=60, extra_body={"guided_regex": forced},
        stream=True))
    assert (content, len(calls), reason) == ("", 1, "tool_calls")
    # text that is not a call streams as content, finish_reason as usual; "none" parses nothing
    for choice in ("auto", "none"):
        text = f"{OPEN}no" if choice == "none" else "Paris is sunny"
        content, calls, reason = _streamed(client.chat.completions.create(
            model="tiny", messages=CHAT, tools=[WEATHER_TOOL], tool_choice=choice, max_tokens=30, stream=True,
            extra_body={"guided_regex": re.escape(text)}))
        assert (content, calls, reason) == (text, [], "stop")


def test_tool_calls_and_tool_answers_in_the_history_are_rendered(server, client):
    history = CHAT + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                              "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"}]
    r = client.chat.completions.create(model="tiny", messages=history, tools=[WEATHER_TOOL], max_tokens=3)
    assert r.choices[0].finish_reason == "length"
    prompt = r.usage.prompt_tokens
    without = client.chat.completions.create(model="tiny", messages=CHAT, tools=[WEATHER_TOOL], max_tokens=3)
    assert prompt > without.usage.prompt_tokens + 20   # the call and the answer are in the prompt
    tokens = requests.post(server.url + "/tokenize", json={"model": "tiny", "messages": history}, timeout=30).json()
    assert tokens["count"] > 0


def test_langchain_structured_output_and_tools(server):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=server.url + "/v1", api_key="unused", model="tiny", temperature=0, max_tokens=300,
                     max_retries=0)
    person = llm.with_structured_output(SCHEMAS["person"] | {"title": "person"}, method="json_schema").invoke("who?")
    jsonschema.validate(person, SCHEMAS["person"])
    message = llm.bind_tools([WEATHER_TOOL], tool_choice="get_weather").invoke("weather in Paris?")
    (call,) = message.tool_calls
    assert call["name"] == "get_weather"
    jsonschema.validate(call["args"], WEATHER_TOOL["function"]["parameters"])


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["Paris is sunny", OPEN + PARIS + CLOSE, "  " + OPEN + PARIS + CLOSE + OPEN + PARIS + CLOSE,
                        OPEN + "{broken", "<tool", "<tool_x>", OPEN + PARIS]),
       st.lists(st.integers(0, 200), max_size=6))
def test_streamed_tool_call_watch_equals_the_whole_text_parse(text, cuts):
    """Split anywhere, a streamed choice gives what the whole text gives: content, or the same calls."""
    pieces, last = [], 0
    for cut in sorted(min(c, len(text)) for c in cuts):
        pieces.append(text[last:cut])
        last = cut
    pieces.append(text[last:])
    watch = CallWatch()
    out = "".join(watch.feed(p) for p in pieces)
    content, calls = parse_calls(watch.held, FUNCTIONS) if watch.held else ("", None)
    whole_content, whole_calls = parse_calls(text, FUNCTIONS)
    if whole_calls is None:
        assert calls is None and out + content == text == whole_content
    else:
        assert out == "" and [c["function"] for c in calls] == [c["function"] for c in whole_calls]


LAZY_CALL = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*(?:" + re.escape(CLOSE) + r"|$)", re.S)   # what it was


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([OPEN, CLOSE, PARIS, " ", "\n", "x", "{", "}"]), max_size=12))
def test_tool_call_bodies_are_found_as_the_regex_found_them(parts):
    from server.tools import _call_bodies

    text = "".join(parts)
    assert list(_call_bodies(text)) == LAZY_CALL.findall(text)


@pytest.mark.timeout(60)
def test_a_long_run_of_spaces_in_a_tool_call_parses_in_linear_time():
    """The lazy regex backtracked quadratically here (20,000 spaces between two characters: 2.4 s on the hub,
    200,000: minutes); the scan is linear."""
    text = OPEN + "x" + " " * 200_000 + "x"
    assert parse_calls(text, FUNCTIONS) == (text, None)
    assert parse_calls(OPEN + " " * 200_000 + PARIS + " " * 200_000 + CLOSE, FUNCTIONS)[1] is not None


@pytest.mark.timeout(60)
def test_a_long_streamed_tool_call_is_watched_in_linear_time():
    """Token by token, 200,000 spaces and then a call with 200,000 more pieces in it: the watch held the whole
    text and copied it at every token (red team: past 60 s); it is the pieces' own length now."""
    watch = CallWatch()
    pieces = [" "] * 200_000 + [OPEN, PARIS[:1]] + [" "] * 200_000 + [PARIS[1:], CLOSE]
    assert "".join(watch.feed(p) for p in pieces) == ""
    assert watch.held == "".join(pieces) and parse_calls(watch.held, FUNCTIONS)[1] is not None
    other = CallWatch()
    assert "".join(other.feed(p) for p in [" "] * 200_000 + ["Paris"] + ["!"] * 200_000) == \
        " " * 200_000 + "Paris" + "!" * 200_000


def test_the_http_benchmark_runs(tiny_llama, capsys):
    from benches import structured_http

    rows = structured_http.main(["--model", str(tiny_llama.path), "--streams", "2", "--tokens", "4", "--rounds", "1"])
    assert [(c, f["completed"], f["errors"]) for c, _, f in rows] == [(False, 2, 0), (True, 2, 0)]
    assert "constrained / unconstrained tok/s" in capsys.readouterr().out



GRAMMAR_DELAY_S = 1.0   # every compile that misses the cache takes at least this long (the drill)


@pytest.fixture(scope="module")
def pool_server(tiny_llama):
    """Every grammar compile that misses the cache takes at least 1 s here (ROSEFAST_FAULT_GRAMMAR_DELAY_S), past
    the 0.3 s limit: what the grammar pool does with slow compiles, whatever this machine's speed."""
    s = Server(tiny_env(tiny_llama, grammar_timeout_s=0.3, fault_grammar_delay_s=GRAMMAR_DELAY_S,
                        grammar_threads=2))
    yield s
    s.stop()


def _pool(server):
    """The grammar pool's counters, once llguidance's tokenizer is built (its build is a pool run of its own)."""
    warm = _until_compiled(server, {"model": "tiny", "prompt": "pick", "max_tokens": 1, "guided_choice": ["warm"]})
    assert warm.status_code == 200, warm.text
    return {k: server.metric(f"rosefast_grammar_pool_{k}_total") for k in ("runs", "merged", "abandoned")}


def _until_compiled(server, body, deadline_s=30):
    """Post until the answer is not a compile timeout (the compile that timed out went on and was cached)."""
    deadline = time.monotonic() + deadline_s
    while True:
        r = requests.post(server.url + "/v1/completions", json=body, timeout=60)
        if "did not compile within" not in r.text or time.monotonic() > deadline:
            return r
        time.sleep(0.3)


def test_identical_slow_compiles_are_merged_and_a_timed_out_one_is_cached_when_done(pool_server):
    """Four requests for one new grammar at once: one compile, three merged into it; each gets its 400 at the
    0.3 s limit; the compile finishes anyway and the next request for it is served from the cache."""
    s = pool_server
    before = _pool(s)
    body = {"model": "tiny", "prompt": "pick", "max_tokens": 20, "guided_choice": ["alpha-merge", "beta-merge"]}
    with ThreadPoolExecutor(4) as ex:
        answers = list(ex.map(lambda _: requests.post(s.url + "/v1/completions", json=body, timeout=30), range(4)))
    assert [a.status_code for a in answers] == [400] * 4
    assert all("did not compile within 0.3 s" in a.json()["error"]["message"] for a in answers)
    after = _pool(s)   # (its warm request is one more run: a cache hit)
    assert after["merged"] - before["merged"] == 3 and after["runs"] - before["runs"] == 2, (before, after)
    r = _until_compiled(s, body)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] in ("alpha-merge", "beta-merge"), r.text[:300]


@pytest.mark.timing
def test_a_compile_every_request_gave_up_on_is_dropped_unrun(pool_server):
    """Both grammar threads busy with slow compiles: a third grammar waits in the queue, its request times out,
    and when a thread frees it is dropped instead of compiled."""
    s = pool_server
    before = _pool(s)
    bodies = [{"model": "tiny", "prompt": "pick", "max_tokens": 3, "guided_choice": [f"{tag}-one", f"{tag}-two"]}
              for tag in ("busyA", "busyB", "queued")]
    with Bystander(s) as idle:
        pass
    with Bystander(s, tokens=128) as beside, ThreadPoolExecutor(3) as ex:   # a stream runs beside the compiles
        first = [ex.submit(requests.post, s.url + "/v1/completions", json=b, timeout=30) for b in bodies[:2]]
        time.sleep(0.1)
        queued = ex.submit(requests.post, s.url + "/v1/completions", json=bodies[2], timeout=30)
        assert [f.result().status_code for f in first] == [400, 400] and queued.result().status_code == 400
    deadline = time.monotonic() + 30
    while s.metric("rosefast_grammar_pool_abandoned_total") == before["abandoned"] and time.monotonic() < deadline:
        time.sleep(0.2)
    after = _pool(s)   # (the two slow compiles, and the warm request of each _pool call)
    assert after["abandoned"] - before["abandoned"] == 1 and after["runs"] - before["runs"] == 2 + 1, \
        (before, after)
    assert beside.whole(128) and never_stalled(beside, GRAMMAR_DELAY_S), (beside.gaps, idle.gaps)   # compiles off the hub


def test_a_grammar_the_library_refuses_while_generating_is_a_400(pool_server):
    """20,000 choices sharing a prefix compile, but llguidance refuses the parser row the first token opens
    (its limit is 2,000 items): that request's 400 with the library's words, not an engine 500."""
    body = {"model": "tiny", "prompt": "pick", "max_tokens": 5,
            "guided_choice": [f"merge{i:05d}{'x' * (i % 7)}" for i in range(20_000)]}
    r = _until_compiled(pool_server, body, deadline_s=60)
    assert r.status_code == 400, r.text[:300]
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error", error
    assert error["message"].startswith("the grammar failed while generating: Parser Error: Current row has 20001 "
                                       "items; max is 2000"), error
