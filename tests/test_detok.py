"""Incremental detokenization with the real tokenizer, and stop strings with hold-back."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rosefast.serving.detok import IncrementalDetokenizer
from rosefast.serving.stops import StopAutomaton
from rosefast.sources import load_tokenizer

MULTIBYTE = "Hi 🚀 東京タワー, naïve café — 👩‍👩‍👧 ok, Ελληνικά and עברית!"


@pytest.fixture(scope="module")
def tok(default_model):
    return load_tokenizer(default_model)


def stream(tok, ids, **kw):
    d = IncrementalDetokenizer(tok.backend_tokenizer, **kw)
    pieces = []
    for t in ids:
        pieces.append(d.step([t]))
        if d.stopped:
            break
    return pieces, d


def test_multibyte_streams_exactly_without_replacement_chars(tok):
    ids = tok(MULTIBYTE).input_ids
    pieces, d = stream(tok, ids)
    assert "".join(pieces) + d.flush() == MULTIBYTE
    assert not any("\ufffd" in p for p in pieces)
    assert any(p == "" for p in pieces)   # some tokens carried half a character: held, not garbled


def test_prompt_context_and_special_tokens(tok):
    prompt = tok("Say:").input_ids
    ids = tok(" hello world<|im_end|>").input_ids
    pieces, _ = stream(tok, ids, prompt_ids=prompt)
    assert "".join(pieces) == " hello world"


@pytest.mark.parametrize("stop, include, expected", [
    (["world"], False, "Hello "),
    (["world"], True, "Hello world"),
    (["o w", "xyz"], False, "Hell"),
    (["lo", "Hel"], False, ""),
    (["nothing here"], False, "Hello world, again"),
])
def test_stop_strings_cut_exactly(tok, stop, include, expected):
    ids = tok("Hello world, again").input_ids
    pieces, d = stream(tok, ids, stop=stop, include_stop=include)
    out = "".join(pieces) + ("" if d.stopped else d.flush())
    assert out == expected
    assert d.stopped == (expected != "Hello world, again")


def test_text_that_may_become_a_stop_string_is_held_back(tok):
    d = IncrementalDetokenizer(tok.backend_tokenizer, stop=["</end>"])
    ids = tok("abc</e").input_ids
    emitted = "".join(d.step([t]) for t in ids)
    assert emitted == "abc" and not d.stopped
    assert d.flush() == "</e"   # the stream ended: what was held is released


def test_a_prompt_that_ends_inside_a_character_is_not_echoed(tok):
    """The issue's prompt: "Hello" and the first byte of a character (ids 19556, 173); a completion token that
    finishes the character gives that character, never the prompt's own text again."""
    prompt = [19556, 173]
    assert tok.decode(prompt).endswith("\ufffd")
    finish = next(t for t in range(tok.vocab_size) if len(tok.decode([173, t])) == 1
                  and tok.decode([173, t]) != "\ufffd")   # a continuation byte: one whole character
    pieces, d = stream(tok, [finish, 19556], prompt_ids=prompt)
    assert "".join(pieces) + d.flush() == tok.decode([173, finish, 19556])   # the character, then the word


def first_stop(text, stops, include):
    """The reference: the text as if it came one character at a time, cut where a stop string first ends
    (the longest one ending there)."""
    for end in range(1, len(text) + 1):
        hits = [s for s in stops if text[:end].endswith(s)]
        if hits:
            hit = max(hits, key=len)
            return text[:end - len(hit)] + (hit if include else ""), True
    return text, False


@settings(max_examples=150, deadline=None)
@given(text=st.text(alphabet="ab </>\n", min_size=1, max_size=40),
       stops=st.lists(st.text(alphabet="ab </>\n", min_size=1, max_size=6), min_size=1, max_size=6),
       include=st.booleans())
def test_stop_strings_end_the_text_where_one_first_ends_whatever_the_tokens(tok, text, stops, include):
    ids = tok(text, add_special_tokens=False).input_ids
    assert tok.decode(ids) == text
    for chunk in (1, 3):   # one token per step, and several (a prefill's or a merged step's)
        d = IncrementalDetokenizer(tok.backend_tokenizer, stop=stops, include_stop=include)
        out = []
        for i in range(0, len(ids), chunk):
            out.append(d.step(ids[i:i + chunk]))
            if d.stopped:
                break
        got = "".join(out) + ("" if d.stopped else d.flush())
        assert (got, d.stopped) == first_stop(text, stops, include), (ids, chunk)


def test_the_automaton_holds_back_exactly_what_could_still_become_a_stop_string():
    auto = StopAutomaton(("abcab", "bca", "xyz"))
    state, end, _ = auto.feed(0, "zzabca")
    assert end == 5 and auto.out[state] == 3          # "bca" ends first (at index 5), before "abcab" could
    state, end, _ = auto.feed(0, "qqabc")
    assert end == -1 and auto.depth[state] == 3       # "abc" may still become "abcab"
    state, end, _ = auto.feed(0, "qqxy")
    assert end == -1 and auto.depth[state] == 2
    state, end, _ = auto.feed(state, "q")
    assert end == -1 and auto.depth[state] == 0
