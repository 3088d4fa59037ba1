"""Structured output: grammars compiled by llguidance, a matcher per sequence, the step's allowed-token masks.

    grammar = engine.grammars.compile("json_schema", schema)      # cached by (kind, source); GrammarError
    params = SamplingParams(grammar=grammar, ...)                  # each sequence gets its own matcher

Kinds: json_schema (a schema object), json_object (any JSON object), regex, choice (one of a list of
strings), lark (a Lark grammar, llguidance's dialect). llguidance over xgrammar (`python -m benches.grammar_engines`,
the README's table): on this model's 49,152-token vocabulary it compiled the test schemas 4-20x faster and
filled one row's mask 5-25x faster, the two were within noise at B = 32, and it brings no dependencies
(xgrammar pulls in triton, ~1 GB). Its parser limits bound each step's work, so a
pathological grammar errors instead of stalling the engine thread.

Masks (`GrammarMasks`) are filled on a helper thread while the forward pass runs (llguidance drops the GIL
and fans the rows out over its own threads): a sequence's matcher has taken every token sampled before this
step, so its mask does not depend on the logits. The sampler applies them (`allowed=`, sample_ops.mask).
EOS is allowed only where the grammar can end; a matcher that has stopped ends its sequence ("stop").
"""
import json
from collections import OrderedDict

import torch

from rosefast._native import native_lock, start_native_thread

KINDS = ("json_schema", "json_object", "regex", "choice", "lark")
CACHE_SIZE = 256


class GrammarError(ValueError):
    """A grammar that cannot be compiled: the message says why (llguidance's own words)."""


def panic_error(e):
    """A GrammarError for a Rust panic inside llguidance (its message's first line); anything else raised again.
    pyo3's PanicException derives from BaseException, so an `except Exception` lets it through (to a 500, or out
    of the engine thread): every llguidance call site catches BaseException and passes it here."""
    if type(e).__name__ != "PanicException":
        raise e
    return GrammarError(f"the grammar library failed on this grammar: {(str(e).strip().splitlines() or ['?'])[0][:200]}")


def _llguidance():
    try:
        import llguidance
    except ImportError:   # a dependency of rosefast: only a broken install lacks it
        raise GrammarError("structured output needs the llguidance package (pip install llguidance)") from None
    return llguidance


def grammar_source(kind, value):
    """llguidance's grammar text for a (kind, value); GrammarError when the value is the wrong type."""
    llg = _llguidance().LLMatcher
    if kind == "json_schema":
        if not isinstance(value, (dict, bool)):
            raise GrammarError(f"a JSON schema must be an object, got {type(value).__name__}")
        return llg.grammar_from_json_schema(json.dumps(value), defaults={"whitespace_flexible": False})
    if kind == "json_object":
        return llg.grammar_from_json_schema(json.dumps({"type": "object"}), defaults={"whitespace_flexible": False})
    if kind == "regex":
        if not isinstance(value, str) or not value:
            raise GrammarError("a regex must be a non-empty string")
        return llg.grammar_from_regex(value)
    if kind == "choice":
        if not (isinstance(value, list) and value and all(isinstance(c, str) and c for c in value)):
            raise GrammarError("a choice must be a non-empty list of non-empty strings")
        return llg.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in value))
    if kind == "lark":
        if not isinstance(value, str) or not value.strip():
            raise GrammarError("a grammar must be a non-empty string")
        return llg.grammar_from_lark(value)
    raise GrammarError(f"grammar kind must be one of {', '.join(KINDS)}, got {kind!r}")


class Grammar:
    """A compiled grammar: a pristine matcher that each sequence's own is copied from."""
    __slots__ = ("kind", "key", "_template")

    def __init__(self, kind, key, template):
        self.kind, self.key, self._template = kind, key, template

    def matcher(self):
        try:
            return self._template.deep_copy()
        except BaseException as e:
            raise panic_error(e) from None

    def __repr__(self):
        return f"Grammar({self.kind}, {self.key[1][:60]!r})"


class Grammars:
    """The grammars of one tokenizer: compiled on demand (from any thread; llguidance drops the GIL), kept
    by (kind, source) in an LRU of CACHE_SIZE."""

    def __init__(self, hf_tokenizer, vocab_size, eos_token_ids):
        self._hf, self.vocab_size, self._eos = hf_tokenizer, vocab_size, sorted(eos_token_ids)
        self._tokenizer = None
        self._lock = native_lock()   # compiles run on native threads: a gevent-patched Lock would not hold
        self._cache = OrderedDict()
        self.compiled = 0   # grammars compiled (cache misses)

    @property
    def tokenizer_built(self):
        return self._tokenizer is not None

    @property
    def tokenizer(self):
        """llguidance's view of the vocabulary (about 0.5 s to build; once)."""
        if self._tokenizer is None:
            with self._lock:
                if self._tokenizer is None:
                    import llguidance.hf

                    self._tokenizer = llguidance.hf.from_tokenizer(self._hf, n_vocab=self.vocab_size,
                                                                   eos_token=self._eos)
        return self._tokenizer

    def cached(self, kind, value=None):
        """Whether compile(kind, value) would come from the cache."""
        try:
            return (kind, grammar_source(kind, value)) in self._cache
        except Exception:  # noqa: BLE001 - compile() reports what is wrong with it
            return False

    def compile(self, kind, value=None):
        """The Grammar for (kind, value), from the cache or compiled now; GrammarError naming the problem —
        whatever llguidance or its bindings refuse with (a schema it cannot take, Infinity, a lone surrogate,
        nesting past the recursion limit), here, the one place they are called."""
        try:
            return self._compile(kind, value)
        except GrammarError:
            raise
        except (ValueError, TypeError, RecursionError, OverflowError) as e:   # UnicodeError is a ValueError
            raise GrammarError(f"{type(e).__name__}: {e}") from None
        except BaseException as e:
            raise panic_error(e) from None

    def _compile(self, kind, value):
        source = grammar_source(kind, value)
        key = (kind, source)
        grammar = self._cache.get(key)
        if grammar is not None:
            self._cache.move_to_end(key)
            return grammar
        llg = _llguidance()
        failed, messages = llg.LLMatcher.validate_grammar_with_warnings(source, self.tokenizer)
        if failed:
            raise GrammarError(messages[0].strip())
        template = llg.LLMatcher(self.tokenizer, source, log_level=0)
        if template.is_error():
            raise GrammarError(template.get_error().strip())
        grammar = self._cache[key] = Grammar(kind, key, template)
        self.compiled += 1
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return grammar


class GrammarMasks:
    """The allowed-token bitmasks of a step's constrained rows, filled on a helper thread while the model
    runs: `start(seqs)` before the forward pass, `result()` after it."""

    def __init__(self, vocab_size):
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self._helper = None
        self._executor = None
        self._buffer = torch.empty(0, self.words, dtype=torch.int32)

    def start(self, seqs):
        """Begin filling the masks of the sequences that have a matcher; None when none has."""
        rows = [i for i, s in enumerate(seqs) if s.matcher is not None]
        if not rows:
            return None
        if self._executor is None:
            self._executor = _llguidance().LLExecutor()
            self._helper = _Helper()
        if self._buffer.shape[0] < len(rows):
            self._buffer = torch.empty(max(len(rows), 2 * self._buffer.shape[0]), self.words, dtype=torch.int32)
        bitmask = self._buffer[:len(rows)]
        matchers = [(seqs[i].matcher, j) for j, i in enumerate(rows)]
        self._helper.submit(lambda: self._fill(matchers, bitmask))
        return rows, bitmask, self._helper

    def _fill(self, matchers, bitmask):
        self._executor.unsafe_compute_mask_ptr(matchers, bitmask.data_ptr(), self.words * 4, len(matchers))

    @staticmethod
    def result(job):
        """(rows, bitmask [R, W] int32) once the fill is done."""
        rows, bitmask, helper = job
        try:
            helper.wait()
        except BaseException as e:   # fails the step's requests, not the engine thread
            raise panic_error(e) from None
        return rows, bitmask


class _Helper:
    """One native thread that runs one job at a time (a gevent-patched Thread would be a greenlet of the
    engine thread: no overlap, and a join that hangs at exit)."""

    def __init__(self):
        self._go, self._done = native_lock(), native_lock()
        self._go.acquire()
        self._done.acquire()
        self._job = self._error = None
        start_native_thread(self._loop)

    def _loop(self):
        while True:
            self._go.acquire()
            try:
                self._job()
            except BaseException as e:  # noqa: BLE001 - raised again in wait()
                self._error = e
            self._done.release()

    def submit(self, job):
        self._job, self._error = job, None
        self._go.release()

    def wait(self):
        self._done.acquire()
        if self._error is not None:
            raise self._error
