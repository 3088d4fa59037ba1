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
