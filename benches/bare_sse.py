"""The framework's floor for the frontend benchmark: a plain WSGI app under the same `gunicorn -k gevent`
streaming the bytes rosefast's stand-in streams — the same events, pre-serialized, one per stream per tick
of one shared clock (BARE_STEP_MS, as the stand-in's engine step) — with no admission, engine thread,
collectors, detokenizer or JSON work.

    BARE_STEP_MS=20 gunicorn -k gevent benches.bare_sse:app
"""
import json
import os
import time

import gevent
from gevent.event import Event

from rosefast.engine.stand_in import stand_in_tokens
from rosefast.sources import load_tokenizer, resolve_model

STEP = float(os.environ.get("BARE_STEP_MS", "20")) / 1000.0
_tokenizer = load_tokenizer(resolve_model())
_pieces = [_tokenizer.decode([t]) for t in stand_in_tokens(_tokenizer)]
_tick = [Event()]


def _clock():
    while True:
        gevent.sleep(STEP)
        tick, _tick[0] = _tick[0], Event()
        tick.set()


def _event(body):
    return b"data: " + json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def _events(max_tokens):
    created = int(time.time())
    base = {"id": "cmpl-0123456789abcdef01234567", "object": "text_completion", "created": created,
            "model": "stand-in"}
    out = [_event({**base, "choices": [{"index": 0, "text": _pieces[i % len(_pieces)], "logprobs": None,
                                        "finish_reason": "length" if i == max_tokens - 1 else None}]})
           for i in range(max_tokens)]
    out.append(_event({**base, "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": max_tokens,
                                                       "total_tokens": 9 + max_tokens}}))
    return out


_cache = {}
_clock_greenlet = []


def app(environ, start_response):
    if environ["PATH_INFO"] == "/health":
        start_response("200 OK", [("Content-Type", "application/json")])
        return [b'{"status": "ok"}']
    if environ["PATH_INFO"] == "/v1/models":
        start_response("200 OK", [("Content-Type", "application/json")])
        return [b'{"object": "list", "data": [{"id": "stand-in", "object": "model"}]}']
    length = int(environ.get("CONTENT_LENGTH") or 0)
    max_tokens = json.loads(environ["wsgi.input"].read(length) or b"{}").get("max_tokens", 16)
    events = _cache.get(max_tokens) or _cache.setdefault(max_tokens, _events(max_tokens))
    if not _clock_greenlet:
        _clock_greenlet.append(gevent.spawn(_clock))
    start_response("200 OK", [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache")])

    def body():
        for i, e in enumerate(events):
            if i < max_tokens:
                _tick[0].wait()
            yield e
        yield b"data: [DONE]\n\n"

    return body()
