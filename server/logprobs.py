"""Logprobs in OpenAI's two shapes, written straight to JSON text (server.json_text.Raw): one string per
choice, not a dict per token and per alternative (a request may ask for ~1M entries). An entry is (token id,
(logprob, [(token id, logprob)] top k)), or (token id, None) for a prompt's first token, which has no logprob."""
from json import JSONEncoder
from json import dumps as _json

from server.json_text import Raw



def _byte_level_alphabet():
    """The printable character GPT-2's byte-level BPE writes for each byte (its vocabulary's alphabet)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


_BYTE_OF = _byte_level_alphabet()


class TokenStrings:
    """Each token's text (its own decode) and raw bytes, as logprobs show them, and both as JSON; cached per id."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self._text, self._bytes, self._json_text, self._json_bytes = {}, {}, {}, {}

    def text(self, token):
        text = self._text.get(token)
        if text is None:
            text = self._text[token] = self._tokenizer.decode([token])
        return text

    def bytes(self, token):
        raw = self._bytes.get(token)
        if raw is None:
            piece = self._tokenizer.convert_ids_to_tokens(token)
            if isinstance(piece, str) and piece and all(c in _BYTE_OF for c in piece):
                raw = [_BYTE_OF[c] for c in piece]   # byte-level BPE: the token's own bytes, a partial
            else:                                    # UTF-8 character included
                raw = list(self.text(token).encode("utf-8"))
            self._bytes[token] = raw
        return raw

    def json_text(self, token):
        out = self._json_text.get(token)
        if out is None:
            out = self._json_text[token] = _json(self.text(token))
        return out

    def json_bytes(self, token):
        out = self._json_bytes.get(token)
        if out is None:
            out = self._json_bytes[token] = _json(self.bytes(token), separators=(",", ":"))
        return out


def _num(x):
    """A logprob as json.dumps writes a float (None: null)."""
    return "null" if x is None else _json(x) if x != x or x in (_INF, -_INF) else repr(float(x))


_INF = float("inf")
_compact = JSONEncoder(ensure_ascii=True, separators=(",", ":")).encode


def completion_logprobs(strings, entries, offset):
    """{tokens, token_logprobs, top_logprobs, text_offset} (legacy completions), offsets from `offset`;
    top_logprobs holds the top k and the chosen token (as vLLM's does). Returns (that as Raw JSON, the next
    offset)."""
    tokens, lps, tops, offsets = [], [], [], []
    text_of = strings.text
    for token, entry in entries:
        text = text_of(token)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if entry is None:
            lps.append(None)
            tops.append("null")
            continue
        chosen, top = entry
        lps.append(chosen)
        ranked = {text_of(t): lp for t, lp in top}   # one key per text, the last one's value
        ranked.setdefault(text, chosen)
        tops.append(_compact(ranked))   # a string now: no dict per token is kept
    return Raw(f'{{"tokens":{_compact(tokens)},"token_logprobs":{_compact(lps)},'
               f'"top_logprobs":[{",".join(tops)}],"text_offset":{_compact(offsets)}}}'), offset


def chat_logprobs(strings, entries):
    """{"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]} (chat), as Raw JSON."""
    content = []
    for token, (chosen, top) in entries:
        alternatives = ",".join(f'{{"token":{strings.json_text(t)},"logprob":{_num(lp)},'
                                f'"bytes":{strings.json_bytes(t)}}}' for t, lp in top)
        content.append(f'{{"token":{strings.json_text(token)},"logprob":{_num(chosen)},'
                       f'"bytes":{strings.json_bytes(token)},"top_logprobs":[{alternatives}]}}')
    return Raw('{"content":[' + ",".join(content) + "]}")
