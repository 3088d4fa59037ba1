"""The SSE wire format, compared as exact bytes."""
from server import sse


def test_event_is_one_data_line_and_a_blank_line():
    assert sse.event({"a": 1, "t": "é 🚀"}) == 'data: {"a":1,"t":"é 🚀"}\n\n'.encode()
    assert sse.DONE == b"data: [DONE]\n\n"
