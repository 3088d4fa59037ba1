"""JSON text with pieces already serialized: a response whose logprobs are written straight to text (one string
per choice instead of a dict per token and per alternative) goes out through the same json.dumps as the rest.

    body = {"choices": [{"logprobs": Raw('{"content":[...]}')}]}
    dumps(body)     # the Raw's text in place, as it is
"""
import json
import random
import re


class Raw:
    """A JSON value given as its text."""
    __slots__ = ("text",)

    def __init__(self, text):
        self.text = text


def dumps(payload, **kwargs):
    """json.dumps(payload, **kwargs) with each Raw's text in its place (one pass over the output). A Raw goes
    in as a string of a NUL, a nonce drawn for this call and its number (json.dumps escapes the NULs, with or
    without ensure_ascii), which no text of the payload can hold."""
    raws = []
    nonce = f"{random.getrandbits(64):016x}"

    def slot(obj):
        if isinstance(obj, Raw):
            raws.append(obj.text)
            return f"\x00{nonce}:{len(raws) - 1}\x00"
        raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")

    text = json.dumps(payload, default=slot, **kwargs)
    if not raws:
        return text
    return re.sub(rf'"\\u0000{nonce}:(\d+)\\u0000"', lambda m: raws[int(m.group(1))], text)


def utf8(payload, **kwargs):
    """dumps(payload, ensure_ascii=False, **kwargs) as UTF-8 bytes; where a string of the payload holds a lone
    surrogate (a tool call's arguments parsed from a model's `"\\ud800"`: UTF-8 cannot carry one), the whole
    payload escaped to ASCII instead — the same JSON value, never an error in the middle of a response."""
    try:
        return dumps(payload, ensure_ascii=False, **kwargs).encode()
    except UnicodeEncodeError:
        return dumps(payload, ensure_ascii=True, **kwargs).encode()
