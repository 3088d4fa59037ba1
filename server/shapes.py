"""OpenAI response bodies for one request: the same id and created in every chunk, a choice per index."""
import random
import time
from json.encoder import encode_basestring   # the escaper json.dumps(ensure_ascii=False) uses for a str

from server import sse

_MARK = "\x00"   # a text no id or model name holds: where a text event's bytes split around the text


def new_id(prefix):
    """`prefix` (its separator included: "chatcmpl-", "resp_") and 24 random hex digits, as before from uuid4 but
    without a system call and a UUID per request (the module's generator is seeded from os.urandom, and again in
    each forked worker)."""
    return f"{prefix}{random.getrandbits(96):024x}"


class Shapes:
    def __init__(self, chat, model, id_):
        self.chat = chat
        self.id = id_
        self.created = int(time.time())
        self.model = model
        self._text_events = {}   # choice index -> (bytes before the text, bytes after it)

    def _base(self, obj):
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def chunk(self, index, text, finish_reason, role=False, logprobs=None, usage=None, tool_calls=None,
              reasoning=None):
        """One streamed event of choice `index` (chat: the role goes with the choice's first delta; `reasoning`,
        a reasoning block's text, goes as both names clients read)."""
        if self.chat:
            delta = {"role": "assistant", "content": text} if role else ({"content": text} if text else {})
            if reasoning:
                delta["reasoning_content"] = delta["reasoning"] = reasoning
            if tool_calls:
                delta["tool_calls"] = [{"index": k, **call} for k, call in enumerate(tool_calls)]
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
            body = {**self._base("chat.completion.chunk"), "choices": [choice]}
        else:
            choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
            body = {**self._base("text_completion"), "choices": [choice]}
        if usage is not None:
            body["usage"] = usage
        return body

    def text_event(self, index, text):
        """`sse.event(self.chunk(index, text, None))` for a plain text delta — the common event — from bytes
        made once per choice: only the text is escaped per event."""
        parts = self._text_events.get(index)
        if parts is None:
            parts = self._text_events[index] = sse.event(self.chunk(index, _MARK, None)).split(
                encode_basestring(_MARK).encode())
        if len(parts) != 2:   # the mark turned up elsewhere too: build it whole
            return sse.event(self.chunk(index, text, None))
        try:
            return encode_basestring(text).encode().join(parts)
        except UnicodeEncodeError:   # a lone surrogate: the event escaped whole (sse.event)
            return sse.event(self.chunk(index, text, None))

    def usage_chunk(self, usage):
        return {**self._base("chat.completion.chunk" if self.chat else "text_completion"), "choices": [],
                "usage": usage}

    def full(self, choices, usage):
        """choices: (index, text, finish_reason, logprobs, tool calls or None, reasoning or None) in index order."""
        if self.chat:
            out = [{"index": i, "message": {"role": "assistant", "content": text,
                                            **({"tool_calls": calls} if calls else {}),
                                            **({"reasoning_content": thought, "reasoning": thought}
                                               if thought is not None else {})},
                    "logprobs": lp, "finish_reason": reason} for i, text, reason, lp, calls, thought in choices]
            return {**self._base("chat.completion"), "choices": out, "usage": usage}
        out = [{"index": i, "text": text, "logprobs": lp, "finish_reason": reason}
               for i, text, reason, lp, *_ in choices]
        return {**self._base("text_completion"), "choices": out, "usage": usage}


def usage(prompt_tokens, completion_tokens, cached_tokens=0):
    """OpenAI's usage object; `prompt_tokens_details.cached_tokens`: the prompt tokens the prefix cache served."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}
