"""The API keys: which requests carry one (ROSEFAST_API_KEY, one key or several comma-separated; with none set,
every request does), as `Authorization: Bearer <key>` (OpenAI's clients) or `x-api-key: <key>` (Anthropic's), and
which caller that makes: what the Responses API stores belongs to its caller."""
import functools
import hashlib
import hmac

from flask import request


@functools.lru_cache(maxsize=8)
def _keys(api_key):
    """(key bytes, the caller's name: a digest of the key, so the key itself is kept nowhere else) per key set."""
    return tuple((k.encode(), hashlib.sha256(k.encode()).hexdigest()[:16])
                 for k in (part.strip() for part in api_key.split(",")) if k)


def caller(config):
    """The name of this request's caller: "" where no key is set, else the digest of the key it sent; None for a
    request without a right key. Every key is compared, in constant time each."""
    keys = _keys(config.api_key)
    if not keys:
        return ""
    auth = request.headers.get("Authorization", "")
    sent = (auth[7:] if auth.startswith("Bearer ") else "").encode(), request.headers.get("x-api-key", "").encode()
    found = None
    for key, name in keys:
        if hmac.compare_digest(sent[0], key) | hmac.compare_digest(sent[1], key):
            found = name
    return found


def authorized(config):
    """Whether this request may see what the API keys guard."""
    return caller(config) is not None
