"""The API key: which requests carry it (ROSEFAST_API_KEY; with none set, every request does), as
`Authorization: Bearer <key>` (OpenAI's clients) or `x-api-key: <key>` (Anthropic's)."""
import hmac

from flask import request


def authorized(config):
    """Whether this request may see what the API key guards: `Authorization: Bearer <key>` or `x-api-key: <key>`."""
    if not config.api_key:
        return True
    bearer = hmac.compare_digest(request.headers.get("Authorization", "").encode(), f"Bearer {config.api_key}".encode())
    header = hmac.compare_digest(request.headers.get("x-api-key", "").encode(), config.api_key.encode())
    return bearer or header
