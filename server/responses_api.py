"""OpenAI's Responses API (POST /v1/responses): the body translated into the one internal request — with the
stored conversation that `previous_response_id` continues rendered before its input (server.response_store) —
and what the writer (server.responses_writer) needs to keep the answer."""
from dataclasses import dataclass

from server.errors import APIError, bad_request, parse_json
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
ITEM_IDS = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_", "reasoning": "rs_"}


@dataclass
class Turn:
    """What a Responses request keeps beside its Generation: whether its answer is stored (`keep`) or run in the
    background, its input as items with ids, and the stored conversation before it (`context`)."""
    keep: bool
    background: bool
    input_items: list
    context: tuple = ()
    previous: str = None


def not_found(id_, param=None):
    """OpenAI's 404 for a response id nothing here holds (never made, another caller's, deleted, put out)."""
    what = "Previous response" if param else "Response"
    return APIError(404, f"{what} with id '{str(id_)[:100]}' not found.", "invalid_request_error", param,
                    "previous_response_not_found" if param else "not_found")


def generation(body, store=None, owner=""):
    """POST /v1/responses as the one internal request (its Turn in `carry`); a 400 naming the field, a 404 for a
    `previous_response_id` the caller has not stored."""
    check_known(body, FIELDS)
    turn = _turn(body, store, owner)
    if body.get("truncation") not in (None, "disabled"):
        raise bad_request("'truncation' must be 'disabled': an input longer than the context is refused, not cut",
                          "truncation")
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise bad_request("'stream' must be a boolean", "stream")
    messages = input_messages(list(turn.context) + turn.input_items, body.get("instructions"), len(turn.context))
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
                      model=body.get("model"), names=NAMES, id_prefix="resp_", carry=turn)


def _turn(body, store, owner):
    """`store`, `background` and `previous_response_id` read against the store (None: nothing is kept)."""
    enabled = store is not None and store.enabled
    keep, background, previous = body.get("store", enabled), body.get("background", False), \
        body.get("previous_response_id")
    for name, value in (("store", keep), ("background", background)):
        if not isinstance(value, bool):
            raise bad_request(f"'{name}' must be a boolean", name)
    if keep and not enabled:
        raise bad_request("this server keeps no responses (ROSEFAST_RESPONSES_STORE_ENTRIES=0): send 'store': false "
                          "and the whole conversation in 'input'", "store")
    if background and not keep:
        raise bad_request("a 'background' response must be stored to be polled: leave 'store' true", "background")
    if background and body.get("stream"):
        raise bad_request("'background' with 'stream' is not served: create it, then poll GET /v1/responses/{id}",
                          "background")
    context = ()
    if previous is not None:
        if not isinstance(previous, str):
            raise bad_request("'previous_response_id' must be a string", "previous_response_id")
        earlier = store.get(owner, previous) if store is not None else None
        if earlier is None:
            raise not_found(previous, "previous_response_id")
        if earlier.run is not None:
            raise bad_request(f"the response '{previous[:100]}' is still running: wait for it to complete",
                              "previous_response_id")
        context = earlier.conversation()
    items = input_items(body.get("input"))
    if not isinstance(items, list) or not items:
        raise bad_request("'input' must be a non-empty string or array of items", "input")
    return Turn(keep, background, items, context, previous)


def input_items(items):
    """`input` as the items the store lists (each with an id and a status; a message's text as content parts).
    What is not an item is left as it is, for input_messages to refuse by its place."""
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list):
        return items
    out = []
    for item in items:
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind not in ITEM_IDS:
            out.append(item)
            continue
        item = {**item, "id": item.get("id") or new_id(ITEM_IDS[kind]), "type": kind}
        item.setdefault("status", "completed")
        if kind == "message" and isinstance(item.get("content"), str):
            part = "output_text" if item.get("role") == "assistant" else "input_text"
            item["content"] = [{"type": part, "text": item["content"]}]
        out.append(item)
    return out


def _text(content, where):
    """A message's content: a string, or a list of input_text / output_text parts."""
    if isinstance(content, str):
        return plain_text(content, where)
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") in ("input_text", "output_text")
                                         and isinstance(p.get("text"), str) for p in content):
        return plain_text("".join(p["text"] for p in content), where)
    raise bad_request(f"{where} must be a string or a list of input_text / output_text parts (this server takes "
                      "text only)", "input")


def input_messages(items, instructions, first=0):
    """`instructions` and the items (those of `input` from `first` on: message, function_call and
    function_call_output items; a stored conversation before them) as chat messages; consecutive function calls
    go into one assistant message."""
    messages = []
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad_request("'instructions' must be a string", "instructions")
        messages.append({"role": "system", "content": plain_text(instructions, "instructions")})
    for i, item in enumerate(items):
        where = f"input[{i - first}]"
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
