"""Structured output in the engine: a grammar's allowed-token masks hold every output to its schema, regex or
choice — greedy or sampled, on the tiny model and the real one — without touching the unconstrained rows
of the same batch."""
import json
import re

import jsonschema
import pytest
import torch

from benches.schemas import SCHEMAS, SINGLE_PATH
from rosefast.engine import _sample_ops_py, sample_ops
from rosefast.engine.grammar import GrammarError
from rosefast.engine.llm_engine import LLMEngine
from rosefast.engine.sampling_params import SamplingParams
from tests.conftest import REQUIRE_EXTENSIONS

PROMPTS = ["Describe it as JSON:", "x", "The order was"]


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return LLMEngine(model=tiny_llama, dtype="float32", kv_cache_tokens=16384, max_batch_size=32)


def _valid(text, schema):
    jsonschema.validate(json.loads(text), schema)
    return True


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_output_follows_its_schema_greedy_and_sampled(engine, name):
    schema = SCHEMAS[name]
    grammar = engine.grammars.compile("json_schema", schema)
    params = [SamplingParams(max_tokens=300, temperature=0, grammar=grammar)] * len(PROMPTS) + \
             [SamplingParams(max_tokens=300, temperature=1.0, seed=s, grammar=grammar) for s in range(6)]
    prompts = PROMPTS + ["a sampled one"] * 6
    for out in engine.generate(prompts, params, use_tqdm=False):
        assert out["finish_reason"] == "stop", out
        assert _valid(out["text"], schema)


def test_n_choices_each_follow_the_grammar(engine):
    # n > 1: the forked choices start from their parent's mask (one prefill)
    schema = SCHEMAS["tags"]
    grammar = engine.grammars.compile("json_schema", schema)
    forks = engine.forks
    rid = engine.add_request(engine.tokenizer("tags:").input_ids,
                             SamplingParams(max_tokens=200, temperature=1.0, seed=1, grammar=grammar),
                             request_id="parent", fork_ids=["c1", "c2", "c3"])
    tokens = {r: [] for r in (rid, "c1", "c2", "c3")}
    while engine.has_unfinished():
        for o in engine.step().outputs:
            tokens[o.request_id] += o.new_token_ids
    assert engine.forks == forks + 3
    texts = [engine.tokenizer.decode(t, skip_special_tokens=True) for t in tokens.values()]
    assert all(_valid(t, schema) for t in texts) and len(set(texts)) > 1


def test_a_single_path_schema_never_leaves_a_row_without_a_token(engine):
    grammar = engine.grammars.compile("json_schema", SINGLE_PATH)
    params = [SamplingParams(max_tokens=50, temperature=2.0, seed=s, grammar=grammar) for s in range(8)]
    outs = engine.generate(["say yes"] * 8, params, use_tqdm=False)
    assert [o["text"] for o in outs] == ['{"answer":"yes"}'] * 8
    assert all(o["finish_reason"] == "stop" for o in outs)


def test_regex_and_choice(engine):
    regex = engine.grammars.compile("regex", r"[0-9]{3}-[a-z]{2}")
    choice = engine.grammars.compile("choice", ["red", "green", "blue"])
    outs = engine.generate(PROMPTS * 2, [SamplingParams(max_tokens=20, temperature=1.0, seed=i, grammar=g)
                                         for i, g in enumerate([regex] * 3 + [choice] * 3)], use_tqdm=False)
    assert all(re.fullmatch(r"[0-9]{3}-[a-z]{2}", o["text"]) for o in outs[:3])
    assert all(o["text"] in ("red", "green", "blue") for o in outs[3:])


def test_constrained_and_unconstrained_rows_in_one_batch_do_not_disturb_each_other(engine):
    grammar = engine.grammars.compile("json_schema", SCHEMAS["order"])
    free = [SamplingParams(max_tokens=40, temperature=0, ignore_eos=True),
            SamplingParams(max_tokens=40, temperature=1.0, seed=9, ignore_eos=True)]
    held = SamplingParams(max_tokens=300, temperature=0, grammar=grammar)
    solo_free = [engine.generate([p], [sp], use_tqdm=False)[0]["token_ids"] for p, sp in zip(PROMPTS, free)]
    solo_held = engine.generate([PROMPTS[2]], held, use_tqdm=False)[0]["token_ids"]
    mixed = engine.generate(PROMPTS, free + [held], use_tqdm=False)
    assert [m["token_ids"] for m in mixed[:2]] == solo_free
    assert mixed[2]["token_ids"] == solo_held


def test_compiled_grammars_are_cached_and_bad_ones_are_refused_by_name(engine):
    before = engine.grammars.compiled
    a = engine.grammars.compile("json_schema", SCHEMAS["person"])
    b = engine.grammars.compile("json_schema", json.loads(json.dumps(SCHEMAS["person"])))
    assert a is b and engine.grammars.compiled <= before + 1
    for kind, value, message in [("json_schema", {"type": "strin"}, "strin"),
                                 ("json_schema", {"$ref": "#/nope"}, "nope"),
                                 ("json_schema", [1, 2], "must be an object"),
                                 ("regex", "a(b", "unclosed group"),
                                 ("choice", [], "non-empty list"),
                                 ("yaml", "x", "grammar kind must be one of")]:
        with pytest.raises(GrammarError, match=re.escape(message)):
            engine.grammars.compile(kind, value)
    with pytest.raises(ValueError, match="grammar must be a Grammar"):
        SamplingParams(grammar="{}")


def test_a_panic_inside_llguidance_is_the_requests_grammar_error(engine):
    """Found by the reliability suite's fuzzer: llguidance panics (a Rust panic, pyo3's PanicException: no
    Exception) cutting its error message inside a multi-byte character; that is the request's 400, not a 500."""
    schema = {"type": "number", "maximum": [None, None, 1e15, {"\x1f\x1f\x1f\x1f": None,
                                                                "0\x1f\x1f\x1f\x1f\x1f\u0800\u0800": None}]}
    with pytest.raises(GrammarError, match="the grammar library failed on this grammar"):
        engine.grammars.compile("json_schema", schema)


def test_the_stand_in_refuses_a_grammar(engine):
    stand_in = LLMEngine(model="stand-in", kv_cache_tokens=4096)
    grammar = engine.grammars.compile("json_object")
    with pytest.raises(ValueError, match="structured output needs a model"):
        stand_in.add_request([1, 2, 3], SamplingParams(grammar=grammar))


@pytest.mark.parametrize("flavour", ["c", "py"])
def test_the_mask_op_twins_agree(flavour, monkeypatch):
    if flavour == "c" and sample_ops.impl is _sample_ops_py:
        if REQUIRE_EXTENSIONS:
            raise AssertionError("the compiled sampling kernels are not built")
        pytest.skip("compiled sampling kernels not built")
    g = torch.Generator().manual_seed(3)
    for V, words in ((70, 3), (49152, 1536), (100, 3), (100, 2)):   # the last: a bitmask narrower than V
        x = torch.randn(6, V, generator=g)
        bitmask = torch.randint(-2**31, 2**31 - 1, (3, words), generator=g, dtype=torch.int32)
        bitmask[:, ::3] = -1
        rows = torch.tensor([4, 0, 2])
        allowed = torch.zeros(3, V, dtype=torch.bool)
        for r in range(3):
            for t in range(min(V, 32 * words)):
                allowed[r, t] = bool((int(bitmask[r, t // 32]) >> (t % 32)) & 1)
        want = x.clone()
        for r, row in enumerate(rows.tolist()):
            want[row][~allowed[r]] = float("-inf")
        impl = sample_ops.impl if flavour == "c" else _sample_ops_py
        assert torch.equal(impl.mask(x.clone(), rows, bitmask), want)


def test_schemas_hold_on_the_real_model(default_model):
    engine = LLMEngine(model=default_model, dtype="float32", kv_cache_tokens=8192, max_batch_size=16)
    prompts, params, schemas = [], [], []
    for name, schema in SCHEMAS.items():
        grammar = engine.grammars.compile("json_schema", schema)
        ask = engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Give me a {name} record as JSON."}], add_generation_prompt=True,
            tokenize=False)
        for temperature in (0, 1.0):
            prompts.append(ask)
            params.append(SamplingParams(max_tokens=200, temperature=temperature, seed=2, grammar=grammar))
            schemas.append(schema)
    # any JSON object (the tiny model's random text may run to max_tokens inside a string; "length" then, as
    # it would be here for "describe a cat", where greedy nests objects without end)
    any_object = engine.grammars.compile("json_object")
    for ask, temperature, seed in [('Reply with a JSON object with the keys "name" and "age" for a person.', 0, 0),
                                   ('Reply with a JSON object with the keys "name" and "age" for a person.', 1.0, 1),
                                   ("Give the capital of France as JSON.", 0, 0)]:
        prompts.append(engine.tokenizer.apply_chat_template([{"role": "user", "content": ask}],
                                                            add_generation_prompt=True, tokenize=False))
        params.append(SamplingParams(max_tokens=200, temperature=temperature, seed=seed, grammar=any_object))
        schemas.append({"type": "object"})
    for out, schema in zip(engine.generate(prompts, params, use_tqdm=False), schemas):
        assert out["finish_reason"] == "stop" and _valid(out["text"], schema), out


def test_the_grammar_benchmarks_run(capsys):
    from benches import grammar_engines, grammar_step

    grammar_engines.main(["--steps", "2"])
    grammar_step.main(["--steps", "2"])
    out = capsys.readouterr().out
    assert "| llguidance |" in out and "| 32 | temperature 1 |" in out
