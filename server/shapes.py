"""OpenAI response bodies for one request: the same id and created in every chunk, a choice per index."""
import time
import uuid


def new_id(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


class Shapes:
    def __init__(self, chat, model):
        self.chat = chat
        self.id = new_id("chatcmpl" if chat else "cmpl")
        self.created = int(time.time())
        self.model = model

    def _base(self, obj):
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def chunk(self, index, text, finish_reason, role=False, logprobs=None, usage=None):
        """One streamed event of choice `index` (chat: the role goes with the choice's first delta)."""
        if self.chat:
            delta = {"role": "assistant", "content": text} if role else ({"content": text} if text else {})
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
            body = {**self._base("chat.completion.chunk"), "choices": [choice]}
        else:
            choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
            body = {**self._base("text_completion"), "choices": [choice]}
        if usage is not None:
            body["usage"] = usage
        return body

    def usage_chunk(self, usage):
        return {**self._base("chat.completion.chunk" if self.chat else "text_completion"), "choices": [],
                "usage": usage}

    def full(self, choices, usage):
        """choices: (index, text, finish_reason, logprobs) in index order."""
        if self.chat:
            out = [{"index": i, "message": {"role": "assistant", "content": text}, "logprobs": lp,
                    "finish_reason": reason} for i, text, reason, lp in choices]
            return {**self._base("chat.completion"), "choices": out, "usage": usage}
        out = [{"index": i, "text": text, "logprobs": lp, "finish_reason": reason} for i, text, reason, lp in choices]
        return {**self._base("text_completion"), "choices": out, "usage": usage}


def usage(prompt_tokens, completion_tokens):
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def openai_finish_reason(reason):
    """Our finish reasons in OpenAI's words ("abort" never reaches a client that is still there)."""
    return {"stop": "stop", "length": "length"}.get(reason, reason)
