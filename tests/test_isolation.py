"""One request's failure is its own: a row whose sampling, penalties or text fails ends alone with its own error
(its blocks freed), and the rows beside it get every token they would have had without it."""
import pytest

from rosefast.serving import engine_thread
from rosefast.serving.detok import IncrementalDetokenizer
from rosefast.engine import sampler as sampler_module
from rosefast.engine.llm_engine import SEED_SPAN, LLMEngine
from rosefast.engine.sampling_params import SamplingParams
from rosefast.errors import EngineError
from rosefast.serving.manager import SchedulerManager

BYSTANDERS = {"seeded": ([1, 2, 3, 4, 5], SamplingParams(max_tokens=12, temperature=0.8, seed=7, ignore_eos=True)),
              "penalized": ([9, 8, 7], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True,
                                                      repetition_penalty=1.3, frequency_penalty=0.5)),
              "greedy": ([4, 4, 4, 4], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))}
BAD = SamplingParams(max_tokens=12, temperature=1.0, ignore_eos=True, repetition_penalty=1.2)


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return LLMEngine(model=tiny_llama, dtype="float32", kv_cache_tokens=4096, block_size=8)


def _run(engine, extra=()):
    """Every bystander (and `extra`: (request id, prompt, params, fork ids)) to its end; (tokens by id, the failed
    ids with their errors)."""
    for rid, (prompt, params) in BYSTANDERS.items():
        engine.add_request(prompt, params, request_id=rid)
    for rid, prompt, params, forks in extra:
        engine.add_request(prompt, params, request_id=rid, fork_ids=forks)
    tokens, failed = {}, {}
    while engine.has_unfinished():
        result = engine.step()
        for out in result.outputs:
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        failed.update((rid, result.errors.get(rid, result.error)) for rid in result.failed)
    assert not engine.seqs and engine.block_manager.num_used_blocks == 0 and len(engine.runner.sampler.penalties) == 0
    return tokens, failed


def _faulty(original, where):
    def call(self, *args):
        seqs = args[-1] if where == "rows" else args[1]
        if any(s.request_id == "bad" for s in seqs):
            raise RuntimeError(f"injected fault in {where}")
        return original(self, *args)
    return call


@pytest.mark.parametrize("where", ["sampling", "penalties"])
def test_a_row_that_fails_its_sampling_fails_alone(engine, monkeypatch, where):
    want, none = _run(engine)
    assert not none
    if where == "sampling":
        monkeypatch.setattr(sampler_module.Sampler, "_sample", _faulty(sampler_module.Sampler._sample, "sampling"))
    else:
        monkeypatch.setattr(sampler_module.PenaltyState, "rows", _faulty(sampler_module.PenaltyState.rows, "rows"))
    got, failed = _run(engine, [("bad", [5, 6, 7], BAD, ())])
    assert list(failed) == ["bad"] and "injected fault" in str(failed["bad"])
    assert {rid: got[rid] for rid in BYSTANDERS} == want   # every token, the same ones (penalties counted once)


def test_a_seed_at_the_top_of_int64_with_n_2_wraps_and_fails_nobody(engine):
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=SEED_SPAN - 1, ignore_eos=True)
    want, _ = _run(engine)
    got, failed = _run(engine, [("top", [3, 1, 4], params, ("top-1",))])
    assert not failed and {rid: got[rid] for rid in BYSTANDERS} == want
    assert len(got["top"]) == len(got["top-1"]) == 8
    wrapped, _ = _run(engine, [("zero", [3, 1, 4], SamplingParams(max_tokens=8, temperature=1.0, seed=0,
                                                                  ignore_eos=True), ())])
    assert wrapped["zero"] == got["top-1"]   # choice 1 draws with (seed + 1) mod 2**63


def test_a_failed_step_fails_the_choices_it_forked_and_the_next_step_runs(engine, monkeypatch):
    """The defect a seed overflow once showed: a step that failed after forking left the new choice running,
    and the next step failed for everyone."""
    original = LLMEngine._sample
    calls = {"n": 0}

    def once(self, logits, seqs, allowed):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected fault after the fork")
        return original(self, logits, seqs, allowed)

    monkeypatch.setattr(LLMEngine, "_sample", once)
    engine.add_request([3, 1, 4], SamplingParams(max_tokens=4, temperature=0), request_id="forked",
                       fork_ids=("forked-1", "forked-2"))
    result = engine.step()
    assert sorted(result.failed) == ["forked", "forked-1", "forked-2"] and not engine.seqs
    got, failed = _run(engine)
    assert not failed and all(len(got[rid]) == 12 for rid in BYSTANDERS)


class FaultyText(IncrementalDetokenizer):
    """The real detokenizer, except for a prompt holding token 999: its text raises."""

    def __init__(self, decoder, prompt_ids, *args):
        super().__init__(decoder, prompt_ids, *args)
        self.poisoned = 999 in prompt_ids

    def step(self, new_ids):
        if self.poisoned:
            raise RuntimeError("injected detokenizing fault")
        return super().step(new_ids)


@pytest.mark.timeout(120)
def test_a_request_whose_text_fails_fails_alone(tiny_llama, monkeypatch):
    monkeypatch.setattr(engine_thread, "IncrementalDetokenizer", FaultyText)
    m = SchedulerManager(model=tiny_llama, dtype="float32", kv_cache_tokens=4096, block_size=8)
    try:
        def take(rid):
            return [t for chunk in m.stream(rid) for t in chunk.token_ids]

        want = take(m.add_request(prompt_token_ids=[9, 8, 7], max_tokens=12, temperature=0, ignore_eos=True))
        bystander = m.add_request(prompt_token_ids=[9, 8, 7], max_tokens=12, temperature=0, ignore_eos=True)
        bad = m.add_request(prompt_token_ids=[999, 8, 7], max_tokens=12, temperature=0, ignore_eos=True)
        with pytest.raises(EngineError, match="detokenizing failed: RuntimeError\\('injected detokenizing fault'\\)"):
            take(bad)
        assert take(bystander) == want
        assert m.inflight == 0 and m.engine.block_manager.num_used_blocks == 0
    finally:
        m.close()
