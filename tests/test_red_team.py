"""The red team's last three defects as they came over HTTP, against a real gunicorn, each beside a bystander stream
that must come through whole: a long run before a tool call (the watch once copied the text per token), a stop-string
scan of 16 long strings that never match over a long output, and a streamed tool call whose arguments hold a lone
surrogate (once a broken transfer). Each answer ends with its final events, well-formed; the linear-time proofs at
scale are the unit tests' (test_sse, test_reasoning, test_stops)."""
import json
import re
import threading

import pytest
import requests

from benches.schemas import WEATHER_TOOL
from server.tools import CLOSE, OPEN
from tests.serving import Bystander, server  # noqa: F401 - the shared fixture

CHAT = [{"role": "user", "content": "What is the weather?"}]
SURROGATE_CALL = '{"name": "get_weather", "arguments": {"city": "\\ud800", "unit": "celsius"}}'


def events(r):
    """The data payloads of a raw SSE answer, each parsed (a malformed one raises)."""
    out = []
    for line in r.iter_lines():
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            out.append(json.loads(line[6:]))
        elif line == b"data: [DONE]":
            out.append("[DONE]")
    return out


def attack(server, path, body):
    r = requests.post(server.url + path, json={"model": "tiny", "stream": True, **body}, stream=True, timeout=120)
    assert r.status_code == 200, r.text
    return events(r)


def long_run_before_a_call(server):
    forced = " {600}" + re.escape(OPEN + '{"name": "get_weather", "arguments": {"city": "Paris"}}' + CLOSE)
    got = attack(server, "/v1/chat/completions", {"messages": CHAT, "tools": [WEATHER_TOOL], "max_tokens": 800,
                                                  "guided_regex": forced})
    calls = [c for e in got[:-1] for c in e["choices"][0]["delta"].get("tool_calls", [])] if got else []
    assert got[-1] == "[DONE]" and [c["function"]["name"] for c in calls] == ["get_weather"]
    assert got[-2]["choices"][0]["finish_reason"] == "tool_calls"


def stop_strings_that_never_match(server):
    stops = [f"{i:02d}" + "z" * 254 for i in range(16)]
    got = attack(server, "/v1/completions", {"prompt": "go", "max_tokens": 600, "ignore_eos": True, "stop": stops,
                                             "temperature": 0, "stream_options": {"include_usage": True}})
    assert got[-1] == "[DONE]" and got[-2]["usage"]["completion_tokens"] == 600


def a_lone_surrogate_in_a_streamed_call(server):
    forced = re.escape(OPEN + SURROGATE_CALL + CLOSE)
    got = attack(server, "/v1/chat/completions", {"messages": CHAT, "tools": [WEATHER_TOOL], "max_tokens": 80,
                                                  "guided_regex": forced})
    calls = [c for e in got[:-1] for c in e["choices"][0]["delta"].get("tool_calls", [])]
    assert got[-1] == "[DONE]" and json.loads(calls[0]["function"]["arguments"])["city"] == "\ud800"
    items = attack(server, "/v1/responses", {"input": "What is the weather?", "tools": [
        {"type": "function", **WEATHER_TOOL["function"]}], "max_output_tokens": 80, "guided_regex": forced,
        "store": False})
    assert items[-1]["type"] == "response.completed"
    assert json.loads(items[-1]["response"]["output"][0]["arguments"])["city"] == "\ud800"


@pytest.mark.parametrize("shape", [long_run_before_a_call, stop_strings_that_never_match,
                                   a_lone_surrogate_in_a_streamed_call])
def test_a_red_team_shape_ends_well_formed_beside_a_whole_bystander(server, shape):
    failures = []

    def run():
        try:
            shape(server)
        except BaseException as e:  # noqa: BLE001 - reported below, in the test's thread
            failures.append(e)

    with Bystander(server, tokens=96) as beside:
        t = threading.Thread(target=run)
        t.start()
        t.join(120)
    assert not t.is_alive() and not failures, failures
    assert beside.whole(96)
