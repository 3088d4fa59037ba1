"""A Responses run written back: the `response` object (output items: reasoning, message with output_text,
function_call) or the typed event stream the official client parses; the finished response handed to `keep`
(the store) where the request is stored."""
import time

from server import sse
from server.errors import APIError, json_response
from server.shapes import new_id


class ResponsesWriter:
    """The Run as a `response` object: output items (reasoning, message with output_text, function_call)."""

    def __init__(self, run, model, keep=None):
        self.run, self.model, self.request, self.keep = run, model, run.body, keep
        self.turn = run.carry   # server.responses_api.Turn
        self.created = int(time.time())
        self.output = []        # the finished output items
        self.seq = 0

    def _response(self, status, usage=None, error=None, incomplete=None):
        b = self.request
        return {"id": self.run.id, "object": "response", "created_at": self.created, "status": status,
                "model": self.model, "output": list(self.output), "error": error,
                "incomplete_details": incomplete, "instructions": b.get("instructions"),
                "metadata": b.get("metadata") or {}, "parallel_tool_calls": b.get("parallel_tool_calls", True),
                "temperature": b.get("temperature"), "top_p": b.get("top_p"),
                "tool_choice": b.get("tool_choice", "auto"), "tools": b.get("tools") or [],
                "max_output_tokens": b.get("max_output_tokens"), "store": self.turn.keep,
                "background": self.turn.background, "previous_response_id": self.turn.previous,
                "text": b.get("text") or {"format": {"type": "text"}}, "usage": usage}

    def response(self, status):
        """The response object as it stands (a background one answered at once: `queued`)."""
        return self._response(status)

    def _kept(self, response):
        if self.keep is not None:
            self.keep(response)
        return response

    def _usage(self, reasoning_tokens=0):
        prompt, completion, cached = self.run.usage()
        return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
                "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
                "total_tokens": prompt + completion}

    @staticmethod
    def _incomplete(reason):
        return {"reason": "max_output_tokens"} if reason == "length" else None

    def body(self):
        return json_response(self.result())

    def result(self):
        """The whole response, once the run has ended (kept where stored); an APIError where it failed."""
        choice = self.run.outcome()[0]
        if choice.reasoning is not None:
            self.output.append(_reasoning_item(new_id("rs_"), choice.reasoning, "completed"))
        if choice.calls:
            self.output += [_call_item(call, "completed") for call in choice.calls]
        elif choice.text or not self.output:
            self.output.append(_message_item(new_id("msg_"), choice.text, "completed"))
        incomplete = self._incomplete(choice.reason)
        return self._kept(self._response("incomplete" if incomplete else "completed", self._usage(),
                                         incomplete=incomplete))

    def failed(self, error):
        """The response failed after its admission (an APIError): its `failed` object, kept where stored."""
        return self._kept(self._response("failed", self._usage(), error={
            "code": "server_error" if error.status >= 500 else "invalid_prompt", "message": error.message}))

    def _event(self, kind, **fields):
        self.seq += 1
        return sse.typed_event(kind, {"sequence_number": self.seq - 1, **fields})

    def events(self):
        """The typed event stream: response.created / in_progress, then per output item its added, deltas and
        done events, then response.completed (response.incomplete at max_output_tokens; response.failed
        when the request fails after the 200)."""
        yield self._event("response.created", response=self._response("in_progress"))
        yield self._event("response.in_progress", response=self._response("in_progress"))
        deltas = self.run.deltas()
        item = None   # the open output item: [kind, id, output index, its text's pieces so far]
        incomplete = None
        try:
            for _, text, thought, calls, reason, _, _ in deltas:
                for kind, piece, extra in (("reasoning", thought, {}), ("message", text, {"logprobs": []})):
                    if not piece:
                        continue
                    if item is None or item[0] != kind:
                        yield from self._close(item)
                        item = yield from self._open(kind)
                    item[3].append(piece)   # (joined once, at its close: not copied per delta)
                    yield self._event("response.reasoning_text.delta" if kind == "reasoning" else
                                      "response.output_text.delta", item_id=item[1], output_index=item[2],
                                      content_index=0, delta=piece, **extra)
                if calls:
                    yield from self._close(item)
                    item = None
                    for call in calls:
                        yield from self._call_events(call)
                if reason is not None:
                    if item is None and not self.output:   # nothing said at all: an empty message
                        item = yield from self._open("message")
                    yield from self._close(item)
                    item = None
                    incomplete = self._incomplete(reason)
            yield self._event("response.incomplete" if incomplete else "response.completed",
                              response=self._kept(self._response("incomplete" if incomplete else "completed",
                                                                 self._usage(), incomplete=incomplete)))
        except APIError as e:   # after the 200: the response failed, with the reason
            yield self._event("response.failed", response=self.failed(e))
        finally:
            deltas.close()

    def _open(self, kind):
        """The added events of a new reasoning or message item; returns it: [kind, id, output index, pieces]."""
        reasoning = kind == "reasoning"
        item = [kind, new_id("rs_" if reasoning else "msg_"), len(self.output), []]
        yield self._event("response.output_item.added", output_index=item[2],
                          item=(_reasoning_item if reasoning else _message_item)(item[1], "", "in_progress", False))
        yield self._event("response.content_part.added", item_id=item[1], output_index=item[2], content_index=0,
                          part={"type": "reasoning_text", "text": ""} if reasoning else _text_part(""))
        return item

    def _close(self, item):
        """The done events of the open item, which joins the output."""
        if item is None:
            return
        kind, id_, index, pieces = item
        text = "".join(pieces)
        if kind == "reasoning":
            yield self._event("response.reasoning_text.done", item_id=id_, output_index=index, content_index=0,
                              text=text)
            yield self._event("response.content_part.done", item_id=id_, output_index=index, content_index=0,
                              part={"type": "reasoning_text", "text": text})
            done = _reasoning_item(id_, text, "completed")
        else:
            yield self._event("response.output_text.done", item_id=id_, output_index=index, content_index=0,
                              text=text, logprobs=[])
            yield self._event("response.content_part.done", item_id=id_, output_index=index, content_index=0,
                              part=_text_part(text))
            done = _message_item(id_, text, "completed")
        self.output.append(done)
        yield self._event("response.output_item.done", output_index=index, item=done)

    def _call_events(self, call):
        index, done = len(self.output), _call_item(call, "completed")
        arguments = done["arguments"]
        yield self._event("response.output_item.added", output_index=index,
                          item={**done, "arguments": "", "status": "in_progress"})
        yield self._event("response.function_call_arguments.delta", item_id=done["id"], output_index=index,
                          delta=arguments)
        yield self._event("response.function_call_arguments.done", item_id=done["id"], output_index=index,
                          name=done["name"], arguments=arguments)
        self.output.append(done)
        yield self._event("response.output_item.done", output_index=index, item=done)


def _text_part(text):
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(id_, text, status, parts=True):
    return {"id": id_, "type": "message", "role": "assistant", "status": status,
            "content": [_text_part(text)] if parts else []}


def _reasoning_item(id_, text, status, parts=True):
    return {"id": id_, "type": "reasoning", "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}] if parts else []}


def _call_item(call, status):
    """A parsed tool call (server.tools.parse_calls: OpenAI's chat shape) as a function_call item."""
    return {"id": new_id("fc_"), "type": "function_call", "status": status, "call_id": call["id"],
            "name": call["function"]["name"], "arguments": call["function"]["arguments"]}
