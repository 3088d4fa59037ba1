"""Incremental detokenization (tokenizers' DecodeStream: UTF-8 safe) and stop strings.

Text that could still turn into a stop string is held back until it either completes one (the stream
ends there; the stop string itself is not emitted unless asked) or can no longer (it is released). The
stop strings are matched by one automaton per stop set (rosefast.serving.stops): a token's cost is its own
characters, not the number or length of the stop strings.
"""
from tokenizers.decoders import DecodeStream

from rosefast.serving.stops import stop_automaton

PROMPT_CONTEXT = 4   # prompt tokens given to the stream so the first output token decodes in context


class IncrementalDetokenizer:
    __slots__ = ("_tokenizer", "_stream", "_stop", "_state", "_include_stop", "_held", "_echo", "stopped", "stop_string",
                 "used")

    def __init__(self, tokenizer, prompt_ids=(), stop=(), include_stop=False, skip_special_tokens=True):
        """tokenizer: a `tokenizers.Tokenizer` (a transformers fast tokenizer's `backend_tokenizer`)."""
        self._tokenizer = tokenizer
        context = list(prompt_ids[-PROMPT_CONTEXT:])
        self._stream = DecodeStream(ids=context, skip_special_tokens=skip_special_tokens) if context else \
            DecodeStream(skip_special_tokens=skip_special_tokens)
        # A context that ends inside a UTF-8 character gives DecodeStream no prefix, so its first text would
        # repeat the context's: that text (up to the broken character) is cut from the front of the first text.
        self._echo = ""
        if context:
            head = tokenizer.decode(context, skip_special_tokens=skip_special_tokens)
            if head.endswith("\ufffd"):
                self._echo = head.rstrip("\ufffd")
        self._stop = stop_automaton(tuple(stop)) if stop else None
        self._state = 0
        self._include_stop = include_stop
        self._held = ""
        self.stopped = False
        self.stop_string = None   # the stop string that ended the text
        self.used = 0             # of the last step's tokens, how many its text took (all but after a stop)

    def step(self, token_ids):
        """The text these new tokens add (possibly ""), with stop strings applied; sets `stopped`. Several tokens
        (a speculative step's) are taken one at a time while there are stop strings: the text ends at the token
        that completes one, and `used` says how many of them the text took (the rest are not output)."""
        if len(token_ids) == 1 or self._stop is None:   # a decode step's one token, or nothing to stop at
            self.used = len(token_ids)
            return self._step(token_ids)
        parts = []
        for used, token in enumerate(token_ids, start=1):
            parts.append(self._step((token,)))
            if self.stopped:
                break
        self.used = used
        return "".join(parts)

    def _step(self, token_ids):
        if len(token_ids) == 1:
            text = self._stream.step(self._tokenizer, token_ids[0]) or ""
        else:
            text = "".join(filter(None, (self._stream.step(self._tokenizer, t) for t in token_ids)))
        if self._echo and text:
            text, self._echo = text[len(self._echo):] if text.startswith(self._echo) else text, ""
        if self._stop is None or not text:
            return text
        return self._apply_stop(text)

    def _apply_stop(self, text):
        """Only the new text runs through the automaton; what is held is the part of the stream so far that
        could still begin a stop string (the automaton state's depth)."""
        state, end, length = self._stop.feed(self._state, text)
        buf = self._held + text
        if end >= 0:
            self.stopped = True
            self._held = ""
            end += len(buf) - len(text) + 1          # the match ends here in buf
            self.stop_string = buf[end - length:end]
            return buf[:end - length] + (buf[end - length:end] if self._include_stop else "")
        self._state = state
        keep = self._stop.depth[state]
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep]

    def flush(self):
        """At the end of the stream: whatever was held back (it did not become a stop string)."""
        held, self._held = self._held, ""
        return held
