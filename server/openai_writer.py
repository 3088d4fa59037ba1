"""A Run's deltas as OpenAI's chat and completions answers: `chat.completion.chunk` / `text_completion` SSE
events then `data: [DONE]`, or one JSON body."""
from server import sse
from server.errors import APIError, json_response
from server.logprobs import chat_logprobs, completion_logprobs
from server.shapes import Shapes, usage


class OpenAIWriter:
    def __init__(self, run, chat, model, strings):
        self.run, self.chat, self.strings = run, chat, strings
        self.shapes = Shapes(chat, model, run.id)

    def _usage(self):
        return usage(*self.run.usage())

    def _logprobs(self, choice, entries):
        if entries is None:
            return None
        if self.chat:
            return chat_logprobs(self.strings, entries)
        body, choice.offset = completion_logprobs(self.strings, entries, choice.offset)
        return body

    def events(self):
        """The SSE stream: a chunk per delta (a plain text delta from bytes made once per choice), the usage
        chunk when asked, an error event after the 200 where the request fails, then [DONE]."""
        shapes, opts = self.shapes, self.run.options
        deltas = self.run.deltas()
        try:
            for choice, text, thought, calls, reason, entries, first in deltas:
                role = self.chat and first
                if calls:
                    yield sse.event(shapes.chunk(choice.index, "", None, role, tool_calls=calls))
                    role = False
                if text and not (reason or role or entries or thought or opts.continuous_usage):
                    yield shapes.text_event(choice.index, text)
                elif text or reason or role or entries or thought:
                    yield sse.event(shapes.chunk(choice.index, text, reason, role, self._logprobs(choice, entries),
                                                 self._usage() if opts.continuous_usage else None,
                                                 reasoning=thought))
            if opts.include_usage:
                yield sse.event(shapes.usage_chunk(self._usage()))
        except APIError as e:   # after the 200: an error event, then [DONE]
            yield sse.event(e.body())
        finally:
            deltas.close()
        yield sse.DONE

    def body(self):
        logprobs = self.run.options.logprobs is not None
        choices = [(c.index, None if c.calls else c.text, c.reason, self._logprobs(c, c.entries) if logprobs else None,
                    c.calls, c.reasoning) for c in self.run.outcome()]
        return json_response(self.shapes.full(choices, self._usage()))
