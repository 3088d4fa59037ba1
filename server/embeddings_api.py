"""POST /v1/embeddings, OpenAI's shape: `input` a string, a list of strings, token ids or lists of token ids;
`encoding_format` float or base64 (little-endian float32, as OpenAI's); `dimensions` (the first d of the vector,
normalized again where the model's pooling normalizes). Each input is a prefill-only request through the engine,
batched with the rest and admitted like any other (one slot per input: a 429 for all when they do not fit); its
KV is not kept for decoding (its full blocks stay in the prefix cache as any prompt's)."""
import base64

import numpy as np
from flask import Blueprint, current_app, request

from rosefast.serving.values import SamplingParams
from server import disconnect
from server.body import read_json_body
from server.errors import MANAGER_ERRORS, api_error, bad_request, json_response
from server.generation import check_model, ready_manager
from server.metrics import count_request
from server.request_fields import check_known, plain_text

bp = Blueprint("embeddings", __name__)
FIELDS = {"model", "input", "encoding_format", "dimensions", "user"}
MAX_INPUTS = 2048   # OpenAI's limit; each also takes an admission slot


def _inputs(value):
    """`input` as a list of strings and token-id lists; a 400 naming what is wrong."""
    if isinstance(value, str) or (isinstance(value, list) and value and all(_token(t) for t in value)):
        value = [value]
    if not isinstance(value, list) or not value:
        raise bad_request("'input' must be a non-empty string, list of strings, token ids or lists of token ids",
                          "input")
    if len(value) > MAX_INPUTS:
        raise bad_request(f"'input' has {len(value)} items; at most {MAX_INPUTS}", "input")
    out = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            if not item:
                raise bad_request(f"input[{i}] is empty", "input")
            out.append(plain_text(item, f"input[{i}]"))
        elif isinstance(item, list) and item and all(_token(t) for t in item):
            out.append(item)
        else:
            raise bad_request(f"input[{i}] must be a non-empty string or a non-empty list of token ids", "input")
    return out


def _token(t):
    return type(t) is int and t >= 0


@bp.post("/v1/embeddings")
def embeddings():
    state = current_app.extensions["rosefast"]
    manager = ready_manager(state)
    body = read_json_body()
    check_known(body, FIELDS)
    check_model(state, body.get("model"))
    inputs = _inputs(body.get("input"))
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise bad_request("'encoding_format' must be float or base64", "encoding_format")
    try:
        pooling = manager.embedding_pooling()
    except ValueError as e:
        raise bad_request(f"the model '{state.model_name}' cannot embed: {e}", "model") from None
    dims = body.get("dimensions")
    if dims is not None and (type(dims) is not int or not 1 <= dims <= manager.hidden_size):
        raise bad_request(f"'dimensions' must be an integer from 1 to {manager.hidden_size}", "dimensions")
    retry = state.config.retry_after_seconds
    params = SamplingParams(max_tokens=1, pooling=pooling.mode)
    try:
        rid = manager.add_requests(inputs, params=params)
    except MANAGER_ERRORS as e:
        raise api_error(e, retry, "input") from None
    stop_watch = disconnect.watch(request.environ, lambda: manager.abort(rid))
    try:
        vectors, tokens = manager.embeddings(rid)
    except MANAGER_ERRORS as e:
        raise api_error(e, retry, "input") from None
    finally:
        stop_watch()
    data = [{"object": "embedding", "index": i, "embedding": _encoded(v, dims, pooling.normalize, fmt)}
            for i, v in enumerate(vectors)]
    count_request(state, request.environ, "embeddings", "200")
    return json_response({"object": "list", "data": data, "model": state.model_name,
                          "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


def _encoded(vector, dims, normalize, fmt):
    """The vector cut to `dims` and normalized where the pooling does (in float32, one numpy pass: no per-element
    Python on the hub), as floats or base64 little-endian float32."""
    v = np.asarray(vector[:dims] if dims is not None else vector, dtype="<f4")
    if normalize:
        norm = float(np.linalg.norm(v))
        if norm:
            v = v / np.float32(norm)
    if fmt == "base64":
        return base64.b64encode(v.tobytes()).decode("ascii")
    return v.tolist()
