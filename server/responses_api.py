"""OpenAI's Responses API (POST /v1/responses): the body translated into the one internal request, and its
Run written back as a `response` object or as the typed event stream the official client parses.

Stateless: nothing is stored, so `store: true`, `previous_response_id` and `background: true` are refused
with a 400 that says so (send the whole conversation in `input`, as Codex does with `store: false`)."""
import time

from server import sse
from server.errors import APIError, bad_request, json_response, parse_json
from server.request_fields import SAMPLING, check_known, plain_text
from server.request_model import Generation, Options
from server.shapes import new_id
from server.structured import EXTRAS as GUIDED
from server.structured import json_schema_grammar, one_grammar
from server.tools import make_tools

FIELDS = {"model", "input", "instructions", "tools", "tool_choice", "text", "max_output_tokens", "temperature",
          "top_p", "reasoning", "stream", "store", "previous_response_id", "background", "metadata", "user",
          "parallel_tool_calls", "truncation", "include", "service_tier", "safety_identifier", "prompt_cache_key",
          "stream_options", "ignore_eos"} | SAMPLING | GUIDED   # with vLLM's extras: the sampler's, the grammars
NAMES = {"max_tokens": "max_output_tokens", "messages": "input"}
ROLES = {"user", "assistant", "system", "developer"}


def generation(body):
    """POST /v1/responses as the one internal request; a 400 naming the field."""
    check_known(body, FIELDS)
    if body.get("store") is True:
        raise bad_request("this server stores no responses: send 'store': false (or leave it out) and the whole "
                          "conversation in 'input'", "store")
    if body.get("previous_response_id") is not None:
        raise bad_request("this server stores no responses, so 'previous_response_id' cannot be followed: send "
                          "the whole conversation in 'input'", "previous_response_id")
    if body.get("background"):
        raise bad_request("'background' responses are not supported (nothing is stored to poll)", "background")
    if body.get("truncation") not in (None, "disabled"):
        raise bad_request("'truncation' must be 'disabled': an input longer than the context is refused, not cut",
                          "truncation")
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise bad_request("'stream' must be a boolean", "stream")
    messages = input_messages(body.get("input"), body.get("instructions"))
    sampling = {k: body[k] for k in SAMPLING | {"ignore_eos"} if k in body}
    sampling["max_tokens"] = body.get("max_output_tokens")
    kwargs = {}
    reasoning = body.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, dict):
        raise bad_request("'reasoning' must be an object", "reasoning")
    if reasoning and reasoning.get("effort") in ("none", "minimal"):   # a family that thinks (Qwen3): it does not
        kwargs["enable_thinking"] = False
    return Generation("responses", Options(stream=bool(body.get("stream", False))), sampling, messages=messages,
                      template_kwargs=kwargs, tools=_tools(body),
                      grammar=one_grammar(_text_format(body.get("text")), body),
                      model=body.get("model"), names=NAMES, id_prefix="resp_")


def _text(content, where):
    """A message's content: a string, or a list of input_text / output_text parts."""
    if isinstance(content, str):
        return plain_text(content, where)
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") in ("input_text", "output_text")
                                         and isinstance(p.get("text"), str) for p in content):
        return plain_text("".join(p["text"] for p in content), where)
    raise bad_request(f"{where} must be a string or a list of input_text / output_text parts (this server takes "
                      "text only)", "input")


def input_messages(items, instructions):
    """`instructions` and `input` (a string, or a list of message, function_call and function_call_output items)
    as chat messages; consecutive function calls go into one assistant message."""
    messages = []
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad_request("'instructions' must be a string", "instructions")
        messages.append({"role": "system", "content": plain_text(instructions, "instructions")})
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise bad_request("'input' must be a non-empty string or array of items", "input")
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            if item.get("role") not in ROLES:
                raise bad_request(f"{where}.role must be one of {sorted(ROLES)}", "input")
            messages.append({"role": item["role"], "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            if not isinstance(item.get("name"), str) or not isinstance(item.get("arguments"), str) \
                    or not isinstance(item.get("call_id"), str):
                raise bad_request(f"{where}: a function_call needs 'call_id', 'name' and 'arguments' (a JSON "
                                  "string)", "input")
            arguments = parse_json(item["arguments"], "input", f"{where}.arguments is not JSON")
            call = {"name": item["name"], "arguments": arguments}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls") and not last["content"]:
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(item.get("call_id"), str):
                raise bad_request(f"{where}: a function_call_output needs its 'call_id'", "input")
            messages.append({"role": "tool", "content": _text(output, f"{where}.output")})
        elif kind == "reasoning":   # a previous turn's reasoning, sent back: the chat templates drop it too
            continue
        else:
            raise bad_request(f"{where}: items of type {str(kind)[:40]!r} are not supported (message, function_call, "
                              "function_call_output and reasoning are)", "input")
    if not any(m["role"] != "system" for m in messages):
        raise bad_request("'input' has no message to answer", "input")
    return messages


def _tools(body):
    """Function tools in the Responses' flat shape ({type: function, name, description, parameters})."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if not tools:
        if choice not in (None, "none", "auto"):
            raise bad_request("'tool_choice' needs 'tools'", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise bad_request("'tools' must be an array of function tools", "tools")
    functions = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise bad_request(f"tools[{i}]: only function tools are served here, not {str(kind)[:40]!r}", "tools")
        functions.append((tool.get("name"), tool.get("description"), tool.get("parameters"), f"tools[{i}]"))
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise bad_request("'tool_choice' must be none, auto, required or {'type': 'function', 'name': ...}",
                              "tool_choice")
        choice = ("function", choice["name"])
    elif choice not in (None, "none", "auto", "required"):
        raise bad_request("'tool_choice' must be none, auto, required or {'type': 'function', 'name': ...}",
                          "tool_choice")
    return make_tools(functions, choice or "auto")


def _text_format(text):
    """`text.format`: text (no grammar), json_object, or json_schema {name, schema, strict}."""
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None and isinstance(text, dict):
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise bad_request("'text.format' must be an object whose 'type' is text, json_object or json_schema",
                          "text.format")
    if fmt["type"] == "text":
        return None
    if fmt["type"] == "json_object":
        return "json_object", None, "text.format"
    if not isinstance(fmt.get("name"), str) or not fmt["name"]:
        raise bad_request("'text.format' of type json_schema needs a 'name' and a 'schema'", "text.format")
    return json_schema_grammar(fmt.get("schema", {}), fmt.get("strict"), "text.format")


class ResponsesWriter:
    """The Run as a `response` object: output items (reasoning, message with output_text, function_call)."""

    def __init__(self, run, model):
        self.run, self.model, self.request = run, model, run.body
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
                "max_output_tokens": b.get("max_output_tokens"), "store": False,
                "text": b.get("text") or {"format": {"type": "text"}}, "usage": usage}

    def _usage(self, reasoning_tokens=0):
        prompt, completion, cached = self.run.usage()
        return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
                "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
                "total_tokens": prompt + completion}

    @staticmethod
    def _incomplete(reason):
        return {"reason": "max_output_tokens"} if reason == "length" else None

    def body(self):
        choice = self.run.outcome()[0]
        if choice.reasoning is not None:
            self.output.append(_reasoning_item(new_id("rs_"), choice.reasoning, "completed"))
        if choice.calls:
            self.output += [_call_item(call, "completed") for call in choice.calls]
        elif choice.text or not self.output:
            self.output.append(_message_item(new_id("msg_"), choice.text, "completed"))
        incomplete = self._incomplete(choice.reason)
        return json_response(self._response("incomplete" if incomplete else "completed", self._usage(),
                                            incomplete=incomplete))

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
                              response=self._response("incomplete" if incomplete else "completed", self._usage(),
                                                      incomplete=incomplete))
        except APIError as e:   # after the 200: the response failed, with the reason
            yield self._event("response.failed", response=self._response(
                "failed", self._usage(), error={"code": "server_error" if e.status >= 500 else "invalid_prompt",
                                                "message": e.message}))
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
