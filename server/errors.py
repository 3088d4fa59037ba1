"""OpenAI-style error bodies: {"error": {"message", "type", "param", "code"}}."""
import json

from flask import Response


class APIError(Exception):
    """An error answered to the client with its HTTP status and an OpenAI error body."""

    def __init__(self, status, message, type_="invalid_request_error", param=None, code=None, headers=None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def body(self):
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self):
        return Response(json.dumps(self.body()), status=self.status, mimetype="application/json",
                        headers=self.headers)


def bad_request(message, param=None):
    return APIError(400, message, param=param)
