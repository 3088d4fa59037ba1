"""Structured output over HTTP: which grammar a request asks for (OpenAI's response_format, vLLM's guided_* and
structured_outputs extras), compiled off the hub within ROSEFAST_GRAMMAR_TIMEOUT_S."""
import json

from rosefast._native import native_sleep
from rosefast.serving.values import GrammarError
from server.errors import bad_request, parse_json

FIELDS = {"response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs"}
EXTRAS = FIELDS - {"response_format"}   # vLLM's: taken on every API beside its own field
_GUIDED = (("guided_json", "json_schema"), ("guided_regex", "regex"), ("guided_choice", "choice"),
           ("guided_grammar", "lark"))
_STRUCTURED = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "lark",
               "json_object": "json_object"}


def _schema(value, field):
    """A schema given as an object, or as a JSON string of one (vLLM's guided_json takes both)."""
    if isinstance(value, str):
        value = parse_json(value, field, f"'{field}' is not valid JSON")
    if not isinstance(value, (dict, bool)):
        raise bad_request(f"'{field}' must be a JSON schema object", field)
    return value


def _response_format(rf):
    if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema"):
        raise bad_request("'response_format' must be an object whose 'type' is text, json_object or json_schema",
                          "response_format")
    if rf["type"] == "text":
        return None
    if rf["type"] == "json_object":
        return "json_object", None
    spec = rf.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
        raise bad_request("'response_format.json_schema' must be an object with a 'name' and a 'schema'",
                          "response_format")
    # strict or not, the output is held to the schema: a grammar cannot "mostly" follow one
    return json_schema_grammar(spec.get("schema", {}), spec.get("strict"), "response_format")[:2]


_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SUBSCHEMAS = ("items", "additionalProperties", "not", "if", "then", "else", "contains")


def closed(schema):
    """A tool's parameters as its call is held to them: every object schema that declares its `properties`
    and says nothing of others gets `additionalProperties: false` (as OpenAI's strict tools and xgrammar's
    strict mode read it), so a call's arguments are what the function declares and the call can end — a
    model left free to add properties may write them until its token limit. A copy; nested schemas too."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed(s) for s in out[key]]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: closed(s) for k, s in out[key].items()}
    for key in _SUBSCHEMAS:
        if isinstance(out.get(key), dict):
            out[key] = closed(out[key])
    if isinstance(out.get("properties"), dict) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def json_schema_grammar(schema, strict, field):
    """(kind, value, field) of a json_schema grammar. With `strict: true` the schema is closed as a tool
    call's parameters are (every object that declares its properties takes no others, as OpenAI's strict
    mode requires of a schema); without it, the schema means what JSON Schema says (other properties are
    allowed where it does not forbid them): the client's schema is its contract."""
    if strict is not None and not isinstance(strict, bool):
        raise bad_request(f"'{field}': 'strict' must be a boolean", field)
    schema = _schema(schema, field)
    return "json_schema", closed(schema) if strict else schema, field


def one_grammar(given, body):
    """An API's own structured-output field (`given`: (kind, value, field) or None) with vLLM's guided_* and
    structured_outputs extras in `body`: the one grammar asked for, or a 400 when there are two."""
    extra = requested_grammar({k: body[k] for k in EXTRAS if k in body})
    if given is not None and extra is not None:
        raise bad_request(f"give one grammar, not 2: {given[2]}, {extra[2]}", extra[2])
    return given or extra


def requested_grammar(body):
    """(kind, value, field) for the grammar the request asks for, or None; a 400 for a malformed one or more
    than one."""
    found = []
    rf = body.get("response_format")
    if rf is not None:
        spec = _response_format(rf)
        if spec is not None:
            found.append((*spec, "response_format"))
    for field, kind in _GUIDED:
        value = body.get(field)
        if value is not None:
            found.append((kind, _schema(value, field) if kind == "json_schema" else value, field))
    so = body.get("structured_outputs")
    if so is not None:
        given = [k for k, v in so.items() if v is not None] if isinstance(so, dict) else None
        if not given or len(given) != 1 or given[0] not in _STRUCTURED:
            raise bad_request("'structured_outputs' must be an object with exactly one of "
                              f"{', '.join(sorted(_STRUCTURED))}", "structured_outputs")
        kind = _STRUCTURED[given[0]]
        value = so[given[0]]
        if kind == "json_object":
            if value is not True:
                raise bad_request("'structured_outputs.json_object' must be true", "structured_outputs")
            value = None
        elif kind == "json_schema":
            value = _schema(value, "structured_outputs")
        found.append((kind, value, "structured_outputs"))
    if len(found) > 1:
        raise bad_request(f"give one grammar, not {len(found)}: {', '.join(f for _, _, f in found)}", found[1][2])
    return found[0] if found else None


def compile_grammar(state, kind, value, field):
    """The request's Grammar, compiled in the server's grammar pool (server.grammar_pool: native threads of its
    own, identical compiles merged; the hub serves on meanwhile, llguidance drops the GIL) and waited for at
    most ROSEFAST_GRAMMAR_TIMEOUT_S; a 400 naming the field when it fails or times out."""
    grammars = state.manager.grammars
    timeout = state.config.grammar_timeout_s
    pool = state.grammar_pool
    try:
        if not grammars.tokenizer_built:   # once: llguidance's view of the vocabulary (~0.5 s), without a limit
            pool.run("tokenizer", lambda: grammars.tokenizer, None)
        key = (kind, value if isinstance(value, str) else json.dumps(value, sort_keys=True))
        delay = state.config.fault_grammar_delay_s

        def compile_now():   # on a pool thread
            if delay and not grammars.cached(kind, value):
                native_sleep(delay)
            return grammars.compile(kind, value)
        return pool.run(key, compile_now, timeout)
    except GrammarError as e:
        raise bad_request(f"'{field}': {e}", field) from None
    except (TypeError, ValueError, RecursionError) as e:   # a value json.dumps cannot key (grammars.compile
        raise bad_request(f"'{field}': {type(e).__name__}: {e}", field) from None   # refuses these too)
    except TimeoutError:
        raise bad_request(f"'{field}': the grammar did not compile within {timeout:g} s", field) from None
