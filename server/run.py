"""One admitted request on its way out, whatever API asked for it: its chunks folded into per-choice deltas
(text, reasoning, tool calls, finish reason, logprob entries) that the API's writer puts in its own shape, or
into whole choices; then the books (metrics, access log) once."""
import logging
import time

from flask import request

from server.errors import MANAGER_ERRORS, api_error
from server.metrics import count_request
from server.reasoning import ReasoningSplit
from server.tools import CallWatch, parse_calls

access = logging.getLogger("rosefast.access")


class Choice:
    """What one choice has said so far."""
    __slots__ = ("index", "started", "texts", "thoughts", "calls", "entries", "offset", "reason", "stop_string",
                 "tokens", "watch", "split")

    def __init__(self, index):
        self.index, self.started, self.texts, self.thoughts, self.calls = index, False, [], [], None
        self.entries, self.offset, self.reason, self.stop_string, self.tokens = [], 0, None, None, 0
        self.watch = None   # with tools: a CallWatch
        self.split = None   # a family with a reasoning block: a ReasoningSplit

    @property
    def text(self):
        return "".join(self.texts)

    @property
    def reasoning(self):
        """The reasoning block's text, or None where the choice did not open one."""
        return "".join(self.thoughts) if self.split is not None and self.split.found else None


class Run:
    """`id`: the response's id (logs); `endpoint`: the API's name in metrics and logs; `echoes`: per prompt, the
    text echoed before each of its choices (None without echo); `tools`: the request's Tools when the output
    may hold tool calls (server.tools); `reasoning`: the (opening, closing) tags of the reasoning block the
    model writes first, taken apart from the answer (server.reasoning); `body`: the client's request as sent
    (what an API echoes in its answer)."""

    def __init__(self, state, manager, rid, id_, endpoint, options, echoes, t0, stop_watch, tools=None,
                 reasoning=(), body=None):
        self.state, self.manager, self.rid, self.id, self.endpoint = state, manager, rid, id_, endpoint
        self.options, self.echoes = options, echoes
        self.t0, self.stop_watch = t0, stop_watch
        self.environ = request.environ
        self.choices = {}
        self.prompt_tokens = {}   # prompt index -> its length
        self.cached_tokens = {}   # prompt index -> the part of it the prefix cache served
        self.log_text = [] if state.config.log_text else None
        self.t_first = self.t_last = None
        self.status = "200"
        self.tools = tools
        self.reasoning = reasoning
        self.body = body
        self.carry = None   # what the API's writer needs from its translation (Generation.carry)
        self.priority = "normal"   # its priority class (server.metrics.priority_class)

    @property
    def completion_tokens(self):
        return sum(c.tokens for c in self.choices.values())

    def usage(self):
        """(prompt tokens, completion tokens, prompt tokens the prefix cache served), so far."""
        return sum(self.prompt_tokens.values()), self.completion_tokens, sum(self.cached_tokens.values())

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
                m.by_priority["ttft"][self.priority].observe(now - self.t0)
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
            prompt = index // self.options.n
            self.prompt_tokens[prompt] = chunk.prompt_tokens or 0
            self.cached_tokens[prompt] = chunk.cached_tokens or 0
            echo = self.echoes[prompt] if self.echoes else None
            if echo is not None:
                text = echo + text
                if entries is not None:
                    entries = (chunk.prompt_logprobs or []) + entries
        reason = None
        if chunk.finished:
            reason = choice.reason = chunk.finish_reason
            choice.stop_string = chunk.stop_string
        if self.log_text is not None:
            self.log_text.append(text)
        return choice, text, entries, reason, first

    def deltas(self):
        """Per chunk taken: (choice, text, reasoning text or None, tool calls or None, finish reason or None,
        logprob entries or None, whether it is the choice's first). A failure after admission is raised as
        the client's APIError; closing the generator aborts the request (the client went away)."""
        stream = self.manager.stream(self.rid)
        try:
            for chunk in stream:
                choice, text, entries, reason, first = self._take(chunk)
                thought = calls = None
                if self.reasoning:
                    if choice.split is None:
                        choice.split = ReasoningSplit(self.reasoning)
                    thought, text = choice.split.feed(text)
                    if reason is not None:
                        more_thought, more_text = choice.split.flush()
                        thought, text = thought + more_thought, text + more_text
                if self.tools is not None:
                    text, calls, reason = self._watch(choice, text, reason)
                yield choice, text, thought, calls, reason, entries, first
        except MANAGER_ERRORS as e:
            error = api_error(e, self.state.config.retry_after_seconds)
            self.status = str(error.status)
            raise error from None
        except GeneratorExit:
            self.status = "499"   # the client went away
            raise
        finally:
            stream.close()
            self._finish()

    def detach(self):
        """The run goes on without its client (a background response): its connection closing aborts nothing."""
        self.stop_watch()
        self.stop_watch = lambda: None

    def discard(self):
        """The answer failed before its stream was read: the request is aborted and forgotten."""
        self.stop_watch()
        self.manager.discard(self.rid)

    def _watch(self, choice, text, reason):
        """A choice with tools: (the content that can go out now, its tool calls once it has ended and they
        parse, its finish reason: "tool_calls" then)."""
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

    def outcome(self):
        """Every choice whole, in index order (its text, reasoning, calls, reason and entries gathered)."""
        for choice, text, thought, calls, _, entries, _ in self.deltas():
            choice.texts.append(text)
            if thought:
                choice.thoughts.append(thought)
            if calls:
                choice.calls = calls
            if entries is not None:
                choice.entries += entries
        return sorted(self.choices.values(), key=lambda c: c.index)

    def _finish(self):
        self.stop_watch()
        m = self.state.metrics
        prompt_tokens, completion_tokens, cached = self.usage()
        now = time.perf_counter()
        count_request(self.state, self.environ, self.endpoint, self.status)
        m.prompt_tokens.inc(prompt_tokens)
        m.completion_tokens.inc(completion_tokens)
        if self.t_last is not None:
            m.e2e.observe(self.t_last - self.t0)
            m.by_priority["e2e"][self.priority].observe(self.t_last - self.t0)
        access.info("%s %s status=%s prompt_tokens=%d cached_tokens=%d completion_tokens=%d ttft_ms=%s e2e_ms=%.1f",
                    self.id, self.endpoint, self.status, prompt_tokens, cached, completion_tokens,
                    "-" if self.t_first is None else f"{(self.t_first - self.t0) * 1e3:.1f}", (now - self.t0) * 1e3)
        if self.log_text is not None:
            access.info("%s completion=%r", self.id, "".join(self.log_text))
