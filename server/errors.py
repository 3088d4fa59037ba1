"""OpenAI-style error bodies: {"error": {"message", "type", "param", "code"}}, the JSON response every
non-streamed answer goes out as, and what the serving core's exceptions become for a client."""
import json

from flask import Response

from rosefast.errors import EngineError, NotReadyError, OverloadedError, ShutdownError
from server.json_text import dumps

MANAGER_ERRORS = (OverloadedError, ShutdownError, EngineError, ValueError)
LOADING_RETRY_AFTER_S = 5


def json_response(payload, status=200, headers=None):
    return Response(dumps(payload), status=status, mimetype="application/json", headers=headers)


class APIError(Exception):
    """An error answered to the client with its HTTP status and an OpenAI error body."""

    def __init__(self, status, message, type_="invalid_request_error", param=None, code=None, headers=None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def body(self):
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self):
        return json_response(self.body(), self.status, self.headers)


def bad_request(message, param=None):
    return APIError(400, message, param=param)


def _reject_constant(name):
    raise ValueError(f"{name} is not valid JSON")


def parse_json(text, param=None, what="invalid JSON"):
    """json.loads, with every refusal of the parser (bad syntax or bytes, NaN / Infinity, nesting past Python's
    recursion limit) as a 400 naming `param`: the one place JSON from a client is parsed."""
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise bad_request(f"{what}: nested too deeply", param) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"{what}: {e}", param) from None


def api_error(e, retry_after, param=None):
    """What the manager raised (at admission or while the request runs) as the client's APIError;
    `param` names the field a plain ValueError is about."""
    if isinstance(e, OverloadedError):
        return APIError(429, str(e), "rate_limit_error", code="rate_limit_exceeded",
                        headers={"Retry-After": str(retry_after)})
    if isinstance(e, NotReadyError):
        return APIError(503, "the model is still loading; retry shortly", "server_error",
                        headers={"Retry-After": str(LOADING_RETRY_AFTER_S)})
    if isinstance(e, ShutdownError):
        return APIError(503, "the server is shutting down", "server_error")
    if isinstance(e, EngineError):
        return APIError(500, str(e), "server_error")
    return bad_request(str(e), param)
