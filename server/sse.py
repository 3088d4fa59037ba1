"""Server-sent events framing: one `data: <json>\\n\\n` event per merged chunk, then `data: [DONE]`."""
from server.json_text import dumps

DONE = b"data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def event(payload):
    """One SSE event carrying `payload` as compact JSON (an event ends with a blank line)."""
    return b"data: " + dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"

