"""The SSE wire format, compared as exact bytes."""
from server import sse


def test_event_is_one_data_line_and_a_blank_line():
    assert sse.event({"a": 1, "t": "é 🚀"}) == 'data: {"a":1,"t":"é 🚀"}\n\n'.encode()
    assert sse.DONE == b"data: [DONE]\n\n"


def test_a_typed_event_names_its_type_and_carries_it_first():
    assert sse.typed_event("message_stop", {}) == b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    assert sse.typed_event("response.output_text.delta", {"sequence_number": 4, "delta": "é"}) == (
        'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","sequence_number":4,'
        '"delta":"é"}\n\n').encode()


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from server.shapes import Shapes, new_id  # noqa: E402


@settings(max_examples=300, deadline=None)
@given(text=st.text(min_size=1), index=st.integers(0, 40), chat=st.booleans(),
       model=st.sampled_from(["stand-in", 'a "quoted" \\ model', "mark \x00 inside"]))
def test_a_text_event_from_its_template_is_the_built_event_byte_for_byte(text, index, chat, model):
    shapes = Shapes(chat, model, new_id("chatcmpl-"))
    built = sse.event(shapes.chunk(index, text, None))
    assert shapes.text_event(index, text) == built
    assert shapes.text_event(index, text) == built   # the cached template, the second time


def test_a_lone_surrogate_in_a_tool_calls_arguments_goes_out_as_well_formed_events():
    """A model that writes `"\\ud800"` in a call's arguments: json.loads makes it a lone surrogate, which UTF-8
    cannot carry; the events escape it (the same JSON value) instead of failing mid-stream (red team)."""
    import json

    from server.tools import parse_calls

    content, calls = parse_calls('<tool_call>{"name": "f", "arguments": {"a": "x\\ud800y"}}</tool_call>', {"f": {}})
    arguments = calls[0]["function"]["arguments"]
    assert content is None and "\ud800" in arguments
    shapes = Shapes(True, "m", new_id("chatcmpl-"))
    events = [sse.event(shapes.chunk(0, "", None, "assistant", tool_calls=calls)),
              sse.typed_event("response.function_call_arguments.done", {"arguments": arguments}),
              shapes.text_event(0, "text \udc00 too")]
    payloads = [json.loads(e.decode("utf-8").split("data: ", 1)[1]) for e in events]   # well-formed UTF-8
    assert payloads[0]["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] == arguments
    assert payloads[1]["arguments"] == arguments
    assert payloads[2]["choices"][0]["delta"]["content"] == "text \udc00 too"
    assert sse.event({"t": "é"}) == 'data: {"t":"é"}\n\n'.encode()   # without one: as before, not escaped
