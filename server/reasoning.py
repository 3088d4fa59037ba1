"""A reasoning block (`<think>...</think>` for Qwen3) taken apart from the answer, for the families that write
one (rosefast.models.registry: Family.reasoning). The chat routes return it as the message's
`reasoning_content` and `reasoning` (clients read either name); streamed, as deltas of those fields.

    split = ReasoningSplit(("<think>", "</think>"))
    reasoning, content = split.feed(text)     # what can go out now of each ("" when nothing)
    reasoning, content = split.flush()        # at the end: what was held back

A choice whose text does not begin (after white space) with the opening tag is all content. Text that could
still be the start of a tag is held back until it is known.
"""
from rosefast.serving.stops import stop_automaton
from server.opening import Opening


class ReasoningSplit:
    __slots__ = ("_open", "_opening", "_close", "_held", "_state", "_at", "found")

    def __init__(self, tags):
        self._open, self._close = tags[0], stop_automaton((tags[1],))   # the closing tag: matched as a stop string
        self._opening = Opening(tags[0])   # before the opening tag could be known (linear: server.opening)
        self._held = ""
        self.found = False   # whether the text opened a reasoning block
        self._at = 0            # the closing tag's automaton state over the reasoning so far
        self._state = "start"   # start: before the opening tag could be known; reasoning; gap: after the block,
                                # before the answer's first non-space character; content

    def feed(self, text):
        """(reasoning, content) that can go out now."""
        if self._state == "content":
            return "", text
        if self._state == "gap":   # after the block: the answer starts at its first non-space character
            text = text.lstrip()
            if text:
                self._state = "content"
            return "", text
        if self._state == "start":
            opens = self._opening.feed(text)
            if opens:
                text = self._opening.take().lstrip()[len(self._open):]
                self._state, self.found = "reasoning", True
            elif opens is None:   # still could be the tag (or only white space so far)
                return "", ""
            else:
                self._state = "content"
                return "", self._opening.take()
        state, end, length = self._close.feed(self._at, text)
        buf = self._held + text
        if end >= 0:   # the block ends: what follows is the answer (its leading white space dropped)
            end += len(buf) - len(text) + 1
            reasoning, rest = buf[:end - length], buf[end:].lstrip()
            self._state, self._held = "content" if rest else "gap", ""
            return reasoning, rest
        self._at, keep = state, self._close.depth[state]   # what could still begin the closing tag is held
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep], ""

    def flush(self):
        """At the end of the choice: what was held (an unfinished block stays reasoning; a lone start, content)."""
        held, self._held = self._held + self._opening.take(), ""
        return (held, "") if self._state == "reasoning" else ("", held)


def split_reasoning(text, tags):
    """(reasoning or None, content) of a whole text: None when it does not begin with the opening tag."""
    if not text.lstrip().startswith(tags[0]):
        return None, text
    split = ReasoningSplit(tags)
    reasoning, content = split.feed(text)
    more_reasoning, more_content = split.flush()
    return reasoning + more_reasoning, content + more_content
