"""Error bodies — OpenAI's {"error": {"message", "type", "param", "code"}}, and Anthropic's {"type": "error",
"error": {"type", "message"}} on its routes —, the JSON response every non-streamed answer goes out as, and
what the serving core's exceptions become for a client."""
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

    def anthropic_body(self):
        """Anthropic's shape: its error type for the status, the message naming the field."""
        kind = ANTHROPIC_TYPES.get(self.status, "api_error" if self.status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": self.message}}

    def response(self, anthropic=False):
        return json_response(self.anthropic_body() if anthropic else self.body(), self.status, self.headers)


ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                   503: "overloaded_error"}


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
