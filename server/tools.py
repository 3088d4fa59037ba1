"""Tool calls: the request's `tools` and `tool_choice`, rendered into the prompt, constrained where the choice
forces a call, and parsed out of the output into OpenAI's shape.

The wire format in the model's text is Hermes' (Qwen's and many fine-tunes'): a call is
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, a tool's answer comes back as a "tool" message.
A chat template that takes `tools` (it names them) renders them itself; one that does not — SmolLM2's —
gets them in a system message that lists the functions and says how to call one (FALLBACK below).
`tool_choice`: "none" (no tools in the prompt, nothing parsed), "auto" (the model decides; a reply that
starts with `<tool_call>` is parsed), "required" or a named function (the output is held by a grammar to one
call of a given function with arguments that follow its parameters schema — closed: no property the function
does not declare, unless the schema allows others (server.structured.closed) —, so it parses and ends).
Every API reads its own tool shape into `make_tools` (chat here; server.responses_api, server.messages_api).
"""
import json
import random
import re

from server.errors import bad_request, parse_json
from server.opening import Opening
from server.structured import closed

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
FALLBACK = ("You can call these functions; their parameters are JSON schemas:\n<tools>\n{tools}\n</tools>\n"
            "To call a function, reply with only " + OPEN + '{{"name": <function name>, "arguments": <the '
            "arguments as a JSON object>}}" + CLOSE + ".")
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


class Tools:
    """The request's functions (name -> {description, parameters}) and its tool_choice."""

    def __init__(self, functions, choice):
        self.functions, self.choice = functions, choice

    @property
    def active(self):
        return self.choice != "none"

    @property
    def forced(self):
        """The names the output must call one of ("required": any, a named function: that one), or None."""
        if self.choice == "required":
            return list(self.functions)
        return [self.choice] if self.choice not in ("none", "auto") else None

    def grammar(self):
        """(kind, value) of the grammar for a forced call: the tags around a JSON {"name", "arguments"}."""
        calls = [{"type": "object", "properties": {"name": {"const": name},
                                                   "arguments": closed(self.functions[name]["parameters"])},
                  "required": ["name", "arguments"], "additionalProperties": False} for name in self.forced]
        schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
        schema = {**schema, "x-guidance": {"whitespace_flexible": False}}   # compact JSON, as in json_schema
        return "lark", f'start: "{OPEN}" call "{CLOSE}"\ncall: %json {json.dumps(schema)}'

    def listing(self):
        return "\n".join(json.dumps({"name": n, **f}) for n, f in self.functions.items())


def requested_tools(body):
    """Tools from a chat request's `tools` and `tool_choice`, or None when it gives no tools; a 400 naming the
    field."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None:
        if choice not in (None, "none"):
            raise bad_request("'tool_choice' needs 'tools'", "tool_choice")
        return None
    shape = "{'type': 'function', 'function': {'name': ...}}"
    if not isinstance(tools, list):
        raise bad_request(f"'tools' must be an array of {shape}", "tools")
    functions = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(fn, dict):
            raise bad_request(f"tools[{i}] must be {shape}", "tools")
        functions.append((fn.get("name"), fn.get("description"), fn.get("parameters"), f"tools[{i}].function"))
    if isinstance(choice, dict):
        name = choice.get("function", {}).get("name") if choice.get("type") == "function" and \
            isinstance(choice.get("function"), dict) else None
        if not isinstance(name, str):
            raise bad_request("'tool_choice' must be none, auto, required or {'type': 'function', 'function': "
                              "{'name': ...}}", "tool_choice")
        choice = ("function", name)
    elif choice is not None and choice not in ("none", "auto", "required"):
        raise bad_request("'tool_choice' must be none, auto, required or {'type': 'function', 'function': "
                          "{'name': ...}}", "tool_choice")
    return make_tools(functions, choice or "auto")


def make_tools(functions, choice, field="tools", choice_field="tool_choice", schema_name="parameters"):
    """Tools from each function's (name, description or None, parameters schema or None, where it is in the
    request) and the choice: "none", "auto", "required" or ("function", name). Each API reads its own shape
    into these; the checks and their 400s (naming `field` / `choice_field`) are here, once."""
    if not functions or len(functions) > 128:
        raise bad_request(f"'{field}' must be a non-empty array of at most 128 functions", field)
    out = {}
    for name, description, params, where in functions:
        if not isinstance(name, str) or not _NAME.match(name):
            raise bad_request(f"{where}: a function needs a 'name' of 1-64 letters, digits, _ or -", field)
        params = NO_PARAMETERS if params is None else params
        if not isinstance(params, dict):
            raise bad_request(f"{where}.{schema_name} must be a JSON schema object", field)
        if name in out:
            raise bad_request(f"{field}: the function '{name}' is given twice", field)
        entry = {"parameters": params}
        if isinstance(description, str):
            entry = {"description": description, **entry}
        out[name] = entry
    if isinstance(choice, tuple):
        if choice[1] not in out:
            raise bad_request(f"'{choice_field}' names the function '{str(choice[1])[:64]}', which is not in "
                              f"'{field}'", choice_field)
        choice = choice[1]
    return Tools(out, choice)


def template_takes_tools(tokenizer):
    return "tools" in (tokenizer.chat_template or "")


def render_messages(messages, tools, native):
    """The messages as the chat template gets them: with the tool listing in the system message (a template
    without tool support), assistant tool calls and tool answers in the wire format."""
    out = []
    for m in messages:
        content, calls = m["content"], m.get("tool_calls")
        if calls and not native:
            content = (content or "") + "".join(
                f"{OPEN}{json.dumps({'name': c['name'], 'arguments': c['arguments']})}{CLOSE}" for c in calls)
        elif calls:
            out.append({"role": m["role"], "content": content or "",
                        "tool_calls": [{"type": "function", "function": c} for c in calls]})
            continue
        out.append({"role": m["role"], "content": content or ""})
    if tools is not None and tools.active and not native:
        listing = FALLBACK.format(tools=tools.listing())
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + listing}
        else:
            out.insert(0, {"role": "system", "content": listing})
    return out


def history_tool_calls(i, calls):
    """An assistant message's tool_calls: [{name, arguments (a dict)}]; a 400 naming the message if malformed."""
    if not isinstance(calls, list) or not calls:
        raise bad_request(f"messages[{i}].tool_calls must be a non-empty array", "messages")
    out = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments"), str):
            raise bad_request(f"messages[{i}].tool_calls entries must be {{'type': 'function', 'function': "
                              "{'name': ..., 'arguments': a JSON string}}", "messages")
        arguments = parse_json(fn["arguments"], "messages",
                               f"messages[{i}].tool_calls: the arguments of '{fn['name'][:64]}' are not JSON")
        out.append({"name": fn["name"], "arguments": arguments})
    return out


def _call_bodies(text):
    """What each `<tool_call>...</tool_call>` holds, stripped (the last may be unclosed): found with str.find,
    linear in the text (a lazy regex backtracked quadratically on a long run of spaces)."""
    at = text.find(OPEN)
    while at >= 0:
        start = at + len(OPEN)
        end = text.find(CLOSE, start)
        if end < 0:
            yield text[start:].strip()
            return
        yield text[start:end].strip()
        at = text.find(OPEN, end + len(CLOSE))


def parse_calls(text, functions):
    """(content, tool calls in OpenAI's shape) from an output: calls only when it starts with a tool-call tag
    and every call in it is a JSON object naming a given function; otherwise (None calls) the text is content."""
    if not text.lstrip().startswith(OPEN):
        return text, None
    calls = []
    for body in _call_bodies(text):
        try:
            call = json.loads(body)
        except (ValueError, RecursionError):   # not a call: the text stays content
            return text, None
        if not isinstance(call, dict) or call.get("name") not in functions or \
                not isinstance(call.get("arguments", {}), dict):
            return text, None
        calls.append({"id": f"call_{random.getrandbits(96):024x}", "type": "function",
                      "function": {"name": call["name"],
                                   "arguments": json.dumps(call.get("arguments", {}), ensure_ascii=False)}})
    return (None, calls) if calls else (text, None)


class CallWatch:
    """One streamed choice with tools: content goes out as it comes until the text could still be a tool
    call (its start is a prefix of the tag, or it begins with it); then it is held to the end and parsed.
    Linear in the text (server.opening): the held pieces are joined once, at the end (`held`)."""
    __slots__ = ("_opening", "_calling", "streaming")

    def __init__(self):
        self._opening, self._calling, self.streaming = Opening(OPEN), False, False

    @property
    def held(self):
        """The text held back so far (joined: read it once, at the end of the choice)."""
        return "".join(self._opening.parts)

    def feed(self, text):
        """What can go out as content now."""
        if self.streaming:
            return text
        if self._calling:
            self._opening.parts.append(text)
            return ""
        opens = self._opening.feed(text)
        if opens is False:
            self.streaming = True
            return self._opening.take()
        self._calling = bool(opens)
        return ""
