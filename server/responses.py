"""One admitted request on its way out: its choices as SSE events or one JSON body, then the books."""
import logging
import time

from flask import request

from server import sse
from server.errors import MANAGER_ERRORS, api_error, json_response
from server.logprobs import chat_logprobs, completion_logprobs
from server.metrics import count_request
from server.shapes import openai_finish_reason, usage
from server.reasoning import ReasoningSplit, split_reasoning
from server.tools import CallWatch, parse_calls

access = logging.getLogger("rosefast.access")


class Choice:
    """What one choice has said so far."""
    __slots__ = ("index", "started", "texts", "entries", "offset", "reason", "tokens", "watch", "split")

    def __init__(self, index):
        self.index, self.started, self.texts, self.entries = index, False, [], []
        self.offset, self.reason, self.tokens = 0, None, 0
        self.watch = None   # with tools, streamed: a CallWatch
        self.split = None   # a family with a reasoning block, streamed: a ReasoningSplit


class Run:
    """`echoes`: per prompt, the text echoed before each of its choices (None without echo); `tools`: the
    request's Tools when the output may hold tool calls (server.tools); `reasoning`: the (opening, closing) tags
    of the reasoning block the model writes first, taken apart from the answer (server.reasoning)."""

    def __init__(self, state, manager, rid, shapes, options, echoes, strings, t0, stop_watch, tools=None,
                 reasoning=()):
        self.state, self.manager, self.rid, self.shapes = state, manager, rid, shapes
        self.options, self.echoes, self.strings = options, echoes, strings
        self.chat = shapes.chat
        self.t0, self.stop_watch = t0, stop_watch
        self.environ = request.environ
        self.choices = {}
        self.prompt_tokens = {}   # prompt index -> its length, from its choices' final chunks
        self.log_text = [] if state.config.log_text else None
        self.t_first = self.t_last = None
        self.status = "200"
        self.tools = tools
        self.reasoning = reasoning

    @property
    def completion_tokens(self):
        return sum(c.tokens for c in self.choices.values())

    def _usage(self):
        return usage(sum(self.prompt_tokens.values()), self.completion_tokens)

    def _take(self, chunk):
        """Fold one chunk into its choice: (choice, the text and logprob entries it adds, its finish reason,
        whether it is the choice's first chunk)."""
        now = time.perf_counter()
        index = chunk.index or 0
        choice = self.choices.get(index)
        if choice is None:
            choice = self.choices[index] = Choice(index)
        m = self.state.metrics
        if chunk.token_ids:
            if self.t_first is None:
                self.t_first = now
                m.ttft.observe(now - self.t0)
            else:
                m.itl.observe(now - self.t_last)
            self.t_last = now
        text, entries = chunk.text, None
        if self.options.logprobs is not None:
            entries = list(zip(chunk.token_ids, chunk.logprobs or ()))
        if self.options.score_only:   # the one token run for the prompt's logprobs is not the client's
            text, entries = "", ([] if entries is not None else None)
        else:
            choice.tokens += len(chunk.token_ids)
        first = not choice.started
        if first:
            choice.started = True
            echo = self.echoes[index // self.options.n] if self.echoes else None
            if echo is not None:
                text = echo + text
                if entries is not None:
                    entries = (chunk.prompt_logprobs or []) + entries
        reason = None
        if chunk.finished:
            self.prompt_tokens[index // self.options.n] = chunk.prompt_tokens or 0
            reason = choice.reason = openai_finish_reason(chunk.finish_reason)
        if self.log_text is not None:
            self.log_text.append(text)
        return choice, text, entries, reason, first

    def _logprobs(self, choice, entries):
        if entries is None:
            return None
        if self.chat:
            return chat_logprobs(self.strings, entries)
        body, choice.offset = completion_logprobs(self.strings, entries, choice.offset)
        return body

    def events(self):
        shapes, opts = self.shapes, self.options
        stream = self.manager.stream(self.rid)
        try:
            for chunk in stream:
                choice, text, entries, reason, first = self._take(chunk)
                role = self.chat and first
                thought = None
                if self.reasoning:
                    if choice.split is None:
                        choice.split = ReasoningSplit(self.reasoning)
                    thought, text = choice.split.feed(text)
                    if reason is not None:
                        more_thought, more_text = choice.split.flush()
                        thought, text = thought + more_thought, text + more_text
                if self.tools is not None:
                    text, calls, reason = self._watch(choice, text, reason)
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
        except MANAGER_ERRORS as e:   # after the 200: an error event, then [DONE]
            yield sse.event(self._failed(e).body())
        except GeneratorExit:
            self.status = "499"   # the client went away
            raise
        finally:
            stream.close()
            self._finish()
        yield sse.DONE

    def _watch(self, choice, text, reason):
        """A streamed choice with tools: (the content that can go out now, its tool calls once it has ended
        and they parse, its finish reason: "tool_calls" then)."""
        if choice.watch is None:
            choice.watch = CallWatch()
        out = choice.watch.feed(text)
        if reason is None or not choice.watch.held:
            return out, None, reason
        content, calls = parse_calls(choice.watch.held, self.tools.functions)
        if calls:
            choice.reason = "tool_calls"
            return out, calls, "tool_calls"
        return out + content, None, reason

    def collect(self):
        stream = self.manager.stream(self.rid)
        try:
            for chunk in stream:
                choice, text, entries, _, _ = self._take(chunk)
                choice.texts.append(text)
                if entries is not None:
                    choice.entries += entries
        except MANAGER_ERRORS as e:
            raise self._failed(e) from None
        finally:
            stream.close()
            self._finish()
        choices = []
        for c in sorted(self.choices.values(), key=lambda c: c.index):
            text, calls, thought = "".join(c.texts), None, None
            if self.reasoning:
                thought, text = split_reasoning(text, self.reasoning)
            if self.tools is not None:
                text, calls = parse_calls(text, self.tools.functions)
            choices.append((c.index, text, "tool_calls" if calls else c.reason,
                            self._logprobs(c, c.entries) if self.options.logprobs is not None else None, calls,
                            thought))
        return json_response(self.shapes.full(choices, self._usage()))

    def _failed(self, e):
        error = api_error(e, self.state.config.retry_after_seconds)
        self.status = str(error.status)
        return error

    def _finish(self):
        self.stop_watch()
        m = self.state.metrics
        prompt_tokens, completion_tokens = sum(self.prompt_tokens.values()), self.completion_tokens
        now = time.perf_counter()
        endpoint = "chat" if self.chat else "completions"
        count_request(self.state, self.environ, endpoint, self.status)
        m.prompt_tokens.inc(prompt_tokens)
        m.completion_tokens.inc(completion_tokens)
        if self.t_last is not None:
            m.e2e.observe(self.t_last - self.t0)
        access.info("%s %s status=%s prompt_tokens=%d completion_tokens=%d ttft_ms=%s e2e_ms=%.1f",
                    self.shapes.id, endpoint, self.status, prompt_tokens, completion_tokens,
                    "-" if self.t_first is None else f"{(self.t_first - self.t0) * 1e3:.1f}", (now - self.t0) * 1e3)
        if self.log_text is not None:
            access.info("%s completion=%r", self.shapes.id, "".join(self.log_text))
