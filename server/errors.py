"""OpenAI-style error bodies: {"error": {"message", "type", "param", "code"}}, and the JSON response
every non-streamed answer goes out as."""
import json

from flask import Response


def json_response(payload, status=200, headers=None):
    return Response(json.dumps(payload), status=status, mimetype="application/json", headers=headers)


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
