"""The API key: which requests carry it (ROSEFAST_API_KEY; with none set, every request does)."""
import hmac

from flask import request


def authorized(config):
    """Whether this request may see what the API key guards: `Authorization: Bearer <key>`."""
    if not config.api_key:
        return True
    given = request.headers.get("Authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {config.api_key}".encode())
