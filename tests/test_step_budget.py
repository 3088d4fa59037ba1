"""The ITL budget (rosefast.engine.step_budget): a prefill step beside decoding streams takes the prompt tokens
that keep their gap within the target, from the steps' measured costs, never slowing a long prompt below half its
alone speed; the scheduler holds it; on the stand-in engine (steps of a set cost per step and per token) a long
prompt beside a decoding stream is prefilled in many chunks, and alone in as few as the token limit allows."""
import pytest

from rosefast.config import EngineConfig
from rosefast.engine.block_manager import BlockManager
from rosefast.engine.sampling_params import SamplingParams
from rosefast.engine.scheduler import Scheduler
from rosefast.engine.sequence import Sequence
from rosefast.engine.step_budget import StepBudget


def _measured(target_ms=0.0, d=0.010, a=0.002, b=0.0001, max_tokens=2048):
    budget = StepBudget(max_tokens, target_ms)
    budget.observe(False, 1, d)
    for n in (100, 400, 100, 400):
        budget.observe(True, n, a + n * b)
    return budget


def test_the_auto_target_keeps_a_gap_within_three_decode_steps():
    budget = _measured()
    a, b = budget.fit()
    assert a == pytest.approx(0.002) and b == pytest.approx(0.0001)
    assert budget.tokens == 180   # (3 x 10 ms - 10 ms - 2 ms) / 0.1 ms
    assert budget.gap_s(budget.tokens) <= 3 * 0.010 + 1e-9
    share = budget.tokens * b / budget.gap_s(budget.tokens)
    assert share >= 0.5   # the long prompt's prefill keeps more than half its alone speed


def test_a_set_target_and_the_limits():
    assert _measured(target_ms=100).tokens == 880
    assert _measured(target_ms=1000).tokens == 2048            # never above max_num_batched_tokens
    assert _measured(b=0.01).tokens == 16                      # never below a block
    assert StepBudget(2048).tokens == 2048                     # nothing measured: as before


def test_the_prompts_speed_floor_wins_over_a_target_it_cannot_keep():
    budget = _measured(a=0.010)    # a step's fixed cost as large as a decode step's
    assert budget.tokens == 200    # (10 + 10 ms) / 0.1 ms, not the target's (30 - 20) / 0.1 = 100
    assert budget.tokens * 0.0001 / budget.gap_s(budget.tokens) == pytest.approx(0.5)


def test_the_scheduler_sizes_prefill_beside_decodes_only():
    config = EngineConfig(model="unused", block_size=4, max_batch_size=4, max_num_batched_tokens=512,
                          speculative="off")
    scheduler = Scheduler(config, BlockManager(1000, 4, enable_prefix_cache=False))
    scheduler.budget = _measured(max_tokens=512)   # 180 tokens beside decodes
    alone = Sequence("alone", list(range(1000)), SamplingParams(max_tokens=2))
    scheduler.add(alone)
    step = scheduler.schedule()
    assert step.is_prefill and step.chunks == [512]   # nothing decodes: the whole token limit
    scheduler.finish(alone, "abort")
    short = Sequence("short", [1, 2, 3], SamplingParams(max_tokens=50))
    scheduler.add(short)
    scheduler.schedule()
    short.num_cached = 3
    short.token_ids.append(9)   # it decodes from now on
    scheduler.add(Sequence("long", list(range(1000)), SamplingParams(max_tokens=2)))
    kinds = [scheduler.schedule() for _ in range(2)]
    assert [(s.is_prefill, s.chunks) for s in kinds] == [(False, [1]), (True, [180])]


@pytest.mark.parametrize("beside", [True, False])
def test_a_long_prompt_beside_a_decoding_stream_prefills_in_chunks(beside, default_model):
    """Stand-in steps of 4 ms and 0.04 ms a prompt token: beside a decoding stream a 4,000-token prompt goes
    in chunks of ~200 tokens (a 12 ms gap for the stream instead of 4 + 4 + 82), the stream decoding between
    them; alone in two steps (the 2,048-token limit)."""
    from rosefast.engine.llm_engine import LLMEngine

    engine = LLMEngine(model="stand-in", stand_in_step_ms=4, stand_in_token_ms=0.04, speculative="off",
                       kv_cache_tokens=16384)
    if beside:
        stream = engine.seqs[engine.add_request([5] * 8, SamplingParams(max_tokens=1000, ignore_eos=True))]
        for _ in range(4):   # its prefill and decodes: the costs measured
            engine.step()
        decoded = stream.num_output_tokens
    seq = engine.seqs[engine.add_request([7] * 4000, SamplingParams(max_tokens=1, ignore_eos=True))]
    chunks = 0   # the steps that prefilled some of it (the last one gives its token)
    while not seq.num_output_tokens:
        before = seq.num_cached
        engine.step()
        chunks += seq.num_cached != before or bool(seq.num_output_tokens)
    if beside:
        assert chunks >= 8 and stream.num_output_tokens - decoded >= chunks - 1   # it decoded between them
    else:
        assert chunks == 2


def test_short_prompts_beside_decodes_go_whole_past_the_cap():
    """The cap bounds a long prompt's chunks; prompts within it are admitted whole, as many as the step's limits
    take (holding them back would trade their TTFT for a bound they do not threaten)."""
    config = EngineConfig(model="unused", block_size=4, max_batch_size=8, max_num_batched_tokens=512,
                          speculative="off")
    scheduler = Scheduler(config, BlockManager(1000, 4, enable_prefix_cache=False))
    scheduler.budget = _measured(max_tokens=512)   # 180
    short = Sequence("short", [1, 2, 3], SamplingParams(max_tokens=50))
    scheduler.add(short)
    scheduler.schedule()
    short.num_cached = 3
    short.token_ids.append(9)
    for i in range(4):
        scheduler.add(Sequence(f"p{i}", [10 + i] * 100, SamplingParams(max_tokens=2)))
    scheduler.add(Sequence("long", list(range(1000)), SamplingParams(max_tokens=2)))
    scheduler.schedule()   # the decode
    step = scheduler.schedule()
    assert [s.request_id for s in step.seqs] == ["p0", "p1", "p2", "p3"] and step.chunks == [100] * 4
    assert [s.request_id for s in scheduler.waiting] == ["long"]   # nothing left of the cap for it in this step
