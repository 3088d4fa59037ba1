"""Logprobs in OpenAI's two shapes. An entry is (token id, (logprob, [(token id, logprob)] top k)), or
(token id, None) for a prompt's first token, which has no logprob."""


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
    """Each token's text (its own decode) and raw bytes, as logprobs show them; cached per id."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self._text, self._bytes = {}, {}

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


def completion_logprobs(strings, entries, offset):
    """{tokens, token_logprobs, top_logprobs, text_offset} (legacy completions), offsets from `offset`;
    top_logprobs holds the top k and the chosen token (as vLLM's does). Returns (that, the next offset)."""
    tokens, lps, tops, offsets = [], [], [], []
    for token, entry in entries:
        text = strings.text(token)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if entry is None:
            lps.append(None)
            tops.append(None)
            continue
        chosen, top = entry
        lps.append(chosen)
        ranked = {strings.text(t): lp for t, lp in top}
        ranked.setdefault(text, chosen)
        tops.append(ranked)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}, offset


def chat_logprobs(strings, entries):
    """{"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]} (chat)."""
    content = []
    for token, (chosen, top) in entries:
        content.append({"token": strings.text(token), "logprob": chosen, "bytes": strings.bytes(token),
                        "top_logprobs": [{"token": strings.text(t), "logprob": lp, "bytes": strings.bytes(t)}
                                         for t, lp in top]})
    return {"content": content}
