"""Whether a streamed text opens with a tag (after any leading white space): a tool call's `<tool_call>`
(server.tools.CallWatch), a reasoning block's `<think>` (server.reasoning). Linear in the text: the pieces are
kept and joined once, and only the first len(tag) characters after the white space are looked at (red team: a
long run of white space, or a long call, had the whole text copied and stripped at every token).

    opening = Opening("<tool_call>")
    opening.feed("  <tool")     # None: not known yet;  True: it opens with the tag;  False: it cannot
    opening.take()              # the text so far, once (the pieces let go)
"""


class Opening:
    __slots__ = ("tag", "parts", "_lead")

    def __init__(self, tag):
        self.tag, self.parts, self._lead = tag, [], ""

    def feed(self, text):
        """Add `text`: True once the text opens with the tag, False once it cannot, None while it could."""
        self.parts.append(text)
        self._lead = (self._lead + (text if self._lead else text.lstrip()))[:len(self.tag)]
        if self._lead == self.tag:
            return True
        return None if self.tag.startswith(self._lead) else False

    def take(self):
        """The text fed so far, joined; the pieces let go."""
        text, self.parts = "".join(self.parts), []
        return text
