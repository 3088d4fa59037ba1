"""A lean SSE client for thousands of concurrent streams from one process: HTTP/1.1 straight on asyncio
streams, with none of a general client's per-line machinery (httpx costs several times more CPU per event,
and at thousands of streams the client shares the machine with the server it measures).

It reads `data:` lines out of the (chunked) body as they arrive: a chunk-size line never starts with
"data:", and the server writes every event whole, so the framing can be skipped without decoding it.
"""
import asyncio
import json

_DATA, _DONE = b"data: ", b"data: [DONE]"


class HTTPStatusError(Exception):
    def __init__(self, status, body):
        super().__init__(f"HTTP {status}: {body[:200]!r}")
        self.status, self.body = status, body


async def stream_events(host, port, path, payload, on_headers, on_event, headers=()):
    """POST `payload` as JSON; `on_headers(status)` once the response headers are in, then `on_event(obj)`
    for each JSON event until `data: [DONE]`. A non-200 status reads the body and raises HTTPStatusError."""
    body = json.dumps(payload).encode()
    reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
    try:
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers)
        writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\nAccept: text/event-stream\r\n{extra}\r\n".encode() + body)
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        on_headers(status)
        if status != 200:
            raise HTTPStatusError(status, await reader.read(65536))
        tail = b""
        while True:
            data = await reader.read(1 << 16)
            if not data:
                raise ConnectionError("the stream ended before data: [DONE]")
            lines = (tail + data).split(b"\n")
            tail = lines.pop()
            for line in lines:
                if line.startswith(_DATA):
                    if line.startswith(_DONE):
                        return
                    on_event(json.loads(line[6:]))
    finally:
        writer.close()
