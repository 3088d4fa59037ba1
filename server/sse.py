"""Server-sent events framing: one `data: <json>\\n\\n` event per merged chunk, then `data: [DONE]` (OpenAI's
chat and completions); `event: <type>\\ndata: <json>\\n\\n` for the APIs whose events are typed (Responses,
Messages)."""
from server.json_text import utf8

DONE = b"data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def event(payload):
    """One SSE event carrying `payload` as compact JSON (an event ends with a blank line)."""
    return b"data: " + utf8(payload, separators=(",", ":")) + b"\n\n"



def typed_event(kind, payload):
    """One SSE event named `kind` whose data is `payload` with its `type` first, as compact JSON."""
    return b"event: " + kind.encode() + b"\ndata: " + utf8({"type": kind, **payload}, separators=(",", ":")) + \
        b"\n\n"
