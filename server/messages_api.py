"""Anthropic's Messages API (POST /v1/messages, POST /v1/messages/count_tokens): the body translated into the
one internal request, and its Run written back as a `message` or as Anthropic's event stream.

Usage follows Anthropic's meaning: `input_tokens` are the prompt tokens not served from the prefix cache,
`cache_read_input_tokens` those that were (their sum is the prompt's length)."""
import json

from server import sse
from server.errors import APIError, bad_request, json_response
from server.request_fields import SAMPLING, check_known, plain_text
from server.request_model import Generation, Options
from server.structured import EXTRAS as GUIDED
from server.structured import json_schema_grammar, one_grammar
from server.tools import make_tools

# temperature, top_p and top_k: sent by older SDKs (the current one takes them in extra_body), with the
# batched sampler's other fields (vLLM's extras: seed, min_p, penalties...); cache_control: the prefix cache
# here is automatic, so it changes nothing
SAMPLING_FIELDS = SAMPLING | {"ignore_eos"}
FIELDS = {"model", "messages", "system", "max_tokens", "stop_sequences", "stream", "tools", "tool_choice", "thinking",
          "output_config", "metadata", "service_tier", "cache_control"} | SAMPLING_FIELDS | GUIDED
COUNT_FIELDS = {"model", "messages", "system", "tools", "tool_choice", "thinking"}
NAMES = {"stop": "stop_sequences"}
STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}


def _check(body, fields):
    check_known(body, fields, lambda names: f"{names[0]}: Extra inputs are not permitted")   # Anthropic's words


def generation(body):
    """POST /v1/messages as the one internal request; a 400 naming the field."""
    _check(body, FIELDS)
    if "max_tokens" not in body:
        raise bad_request("max_tokens: Field required", "max_tokens")
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise bad_request("stream: must be a boolean", "stream")
    if body.get("stop_sequences") is not None and not isinstance(body["stop_sequences"], list):
        raise bad_request("stop_sequences: must be a list of strings", "stop_sequences")
    sampling = {k: body[k] for k in SAMPLING_FIELDS if k in body}
    sampling["max_tokens"], sampling["stop"] = body["max_tokens"], body.get("stop_sequences")
    return Generation("messages", Options(stream=bool(body.get("stream", False))), sampling,
                      messages=chat_messages(body), template_kwargs=_thinking(body.get("thinking")),
                      tools=_tools(body), grammar=one_grammar(_output_format(body.get("output_config")), body),
                      model=body.get("model"), names=NAMES, id_prefix="msg_")


def _output_format(config):
    """`output_config.format` ({type: json_schema, schema}): the output held to the schema, closed as Anthropic's
    structured outputs require (no properties beyond those declared); `effort` changes nothing here."""
    if config is None:
        return None
    if not isinstance(config, dict):
        raise bad_request("output_config: must be an object", "output_config")
    fmt = config.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or "schema" not in fmt:
        raise bad_request("output_config.format: must be {'type': 'json_schema', 'schema': {...}}", "output_config")
    return json_schema_grammar(fmt["schema"], True, "output_config")


def count_generation(body):
    """POST /v1/messages/count_tokens: the same prompt, nothing to generate."""
    _check(body, COUNT_FIELDS)
    return Generation("count_tokens", Options(), {}, messages=chat_messages(body),
                      template_kwargs=_thinking(body.get("thinking")), tools=_tools(body), model=body.get("model"),
                      names=NAMES)


def _thinking(thinking):
    """`thinking` for a family that thinks (Qwen3's template reads enable_thinking); others ignore it."""
    if thinking is None:
        return {}
    if not isinstance(thinking, dict) or thinking.get("type") not in ("enabled", "disabled", "adaptive"):
        raise bad_request("thinking: must be an object whose type is enabled, disabled or adaptive", "thinking")
    return {"enable_thinking": thinking["type"] != "disabled"}


def _blocks(content, where):
    """A message's content as a list of blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise bad_request(f"{where}.content: must be a string or a list of content blocks", "messages")
    return content


def _block_text(block, where):
    if not isinstance(block.get("text"), str):
        raise bad_request(f"{where}: a text block needs its 'text'", "messages")
    return plain_text(block["text"], "messages")


def _system(system):
    if system is None:
        return []
    if isinstance(system, str):
        text = plain_text(system, "system")
    elif isinstance(system, list) and all(isinstance(b, dict) and b.get("type") == "text" and
                                          isinstance(b.get("text"), str) for b in system):
        text = plain_text("\n\n".join(b["text"] for b in system), "system")
    else:
        raise bad_request("system: must be a string or a list of text blocks", "system")
    return [{"role": "system", "content": text}] if text else []


def chat_messages(body):
    """`system` and `messages` as chat messages: text blocks joined, an assistant's tool_use blocks as its tool
    calls, a user's tool_result blocks as tool messages (before the text the turn also holds)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages: must be a non-empty list", "messages")
    out = _system(body.get("system"))
    for i, m in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise bad_request(f"{where}.role: must be 'user' or 'assistant'", "messages")
        texts, calls, results = [], [], []
        for k, block in enumerate(_blocks(m.get("content"), where)):
            kind, at = block.get("type"), f"{where}.content.{k}"
            if kind == "text":
                texts.append(_block_text(block, at))
            elif kind == "tool_use" and m["role"] == "assistant":
                if not isinstance(block.get("name"), str) or not isinstance(block.get("input"), dict):
                    raise bad_request(f"{at}: a tool_use block needs 'id', 'name' and 'input' (an object)", "messages")
                calls.append({"name": block["name"], "arguments": block["input"]})
            elif kind == "tool_result" and m["role"] == "user":
                if not isinstance(block.get("tool_use_id"), str):
                    raise bad_request(f"{at}: a tool_result block needs its 'tool_use_id'", "messages")
                content = block.get("content", "")
                parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
                if not isinstance(parts, list) or any(not isinstance(p, dict) or p.get("type") != "text"
                                                      for p in parts):
                    raise bad_request(f"{at}.content: must be a string or a list of text blocks", "messages")
                results.append("".join(_block_text(p, at) for p in parts))
            elif kind in ("thinking", "redacted_thinking") and m["role"] == "assistant":
                continue   # a previous turn's thinking, sent back: the chat templates drop it too
            else:
                raise bad_request(f"{at}.type: {str(kind)[:40]!r} blocks are not supported in a {m['role']} turn "
                                  "(text, tool_use in assistant turns, tool_result in user turns)", "messages")
        out += [{"role": "tool", "content": r} for r in results]
        if texts or calls or not results:
            message = {"role": m["role"], "content": "".join(texts)}
            if calls:
                message["tool_calls"] = calls
            out.append(message)
    return out


def _tools(body):
    """Custom tools ({name, description, input_schema}) and tool_choice ({type: auto | any | tool | none})."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if not tools:
        if choice is not None and not (isinstance(choice, dict) and choice.get("type") in ("auto", "none")):
            raise bad_request("tool_choice: needs tools", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise bad_request("tools: must be a list of tools", "tools")
    functions = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type", "custom") != "custom":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise bad_request(f"tools.{i}: only custom tools are served here, not {str(kind)[:40]!r}", "tools")
        functions.append((tool.get("name"), tool.get("description"), tool.get("input_schema"), f"tools.{i}"))
    if choice is None:
        choice = {"type": "auto"}
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise bad_request("tool_choice: must be {'type': 'auto' | 'any' | 'tool' | 'none'}", "tool_choice")
    kind = choice["type"]
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise bad_request("tool_choice: {'type': 'tool'} needs the tool's 'name'", "tool_choice")
        picked = ("function", choice["name"])
    else:
        picked = {"auto": "auto", "any": "required", "none": "none"}[kind]
    return make_tools(functions, picked, schema_name="input_schema")


class MessagesWriter:
    """The Run as an Anthropic `message`: content blocks (thinking, text, tool_use), stop_reason, usage."""

    def __init__(self, run, model):
        self.run, self.model = run, model

    def _usage(self):
        prompt, completion, cached = self.run.usage()
        return {"input_tokens": prompt - cached, "cache_read_input_tokens": cached,
                "cache_creation_input_tokens": 0, "output_tokens": completion}

    def _message(self, content, stop_reason, stop_sequence):
        return {"id": self.run.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": self._usage()}

    @staticmethod
    def _stop(choice):
        """(stop_reason, stop_sequence) of the finished choice."""
        if choice.stop_string is not None and choice.reason == "stop":
            return "stop_sequence", choice.stop_string
        return STOP_REASONS.get(choice.reason, "end_turn"), None

    def body(self):
        choice = self.run.outcome()[0]
        content = []
        if choice.reasoning is not None:
            content.append({"type": "thinking", "thinking": choice.reasoning, "signature": ""})
        if choice.text:
            content.append({"type": "text", "text": choice.text})
        content += [_tool_use(call) for call in choice.calls or ()]
        return json_response(self._message(content, *self._stop(choice)))

    def events(self):
        """message_start (once the prompt's length is known: with the first chunk) and a ping, each content
        block as content_block_start, its deltas and content_block_stop, then message_delta (stop_reason,
        usage) and message_stop; an `error` event when the request fails after the 200."""
        deltas = self.run.deltas()
        block = None    # the open block: [kind, index]
        blocks = 0      # blocks started so far
        try:
            for choice, text, thought, calls, reason, _, first in deltas:
                if first:
                    yield sse.typed_event("message_start", {"message": self._message([], None, None)})
                    yield sse.typed_event("ping", {})
                if thought:
                    if block is None or block[0] != "thinking":
                        yield from self._stop_block(block)
                        block, blocks = ["thinking", blocks], blocks + 1
                        yield sse.typed_event("content_block_start", {"index": block[1], "content_block": {
                            "type": "thinking", "thinking": "", "signature": ""}})
                    yield sse.typed_event("content_block_delta", {"index": block[1], "delta": {
                        "type": "thinking_delta", "thinking": thought}})
                if text:
                    if block is None or block[0] != "text":
                        yield from self._stop_block(block)
                        block, blocks = ["text", blocks], blocks + 1
                        yield sse.typed_event("content_block_start", {"index": block[1], "content_block": {
                            "type": "text", "text": ""}})
                    yield sse.typed_event("content_block_delta", {"index": block[1], "delta": {
                        "type": "text_delta", "text": text}})
                for call in calls or ():
                    yield from self._stop_block(block)
                    use = _tool_use(call)
                    block, blocks = ["tool_use", blocks], blocks + 1
                    yield sse.typed_event("content_block_start", {"index": block[1], "content_block": {**use, "input": {}}})
                    yield sse.typed_event("content_block_delta", {"index": block[1], "delta": {
                        "type": "input_json_delta", "partial_json": json.dumps(use["input"], ensure_ascii=False)}})
                if reason is not None:
                    yield from self._stop_block(block)
                    block = None
                    stop_reason, stop_sequence = self._stop(choice)
                    yield sse.typed_event("message_delta", {"delta": {"stop_reason": stop_reason,
                                                                  "stop_sequence": stop_sequence},
                                                        "usage": self._usage()})
            yield sse.typed_event("message_stop", {})
        except APIError as e:   # after the 200: Anthropic's error event
            yield sse.typed_event("error", {"error": e.anthropic_body()["error"]})
        finally:
            deltas.close()

    def _stop_block(self, block):
        if block is not None:
            yield sse.typed_event("content_block_stop", {"index": block[1]})


def _tool_use(call):
    """A parsed tool call (server.tools.parse_calls: OpenAI's chat shape) as a tool_use block."""
    return {"type": "tool_use", "id": "toolu_" + call["id"].split("_", 1)[1], "name": call["function"]["name"],
            "input": json.loads(call["function"]["arguments"])}
