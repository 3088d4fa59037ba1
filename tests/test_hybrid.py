"""Hybrid attention (rosefast.models.delta_net, rosefast.engine.state_slots): the chunked delta rule is the token-by-
token one; a prefill cut anywhere, a long prompt across chunks, and every engine schedule (batched, preempted,
aborted, forked) give each sequence the logits and tokens it gets alone, with every state slot back at the end. The
families' logits against Hugging Face's are tests/test_model_runner.py's (TINY_VARIANTS) and their HTTP runs
tests/test_models.py's."""
from types import SimpleNamespace

import pytest
import torch

from rosefast.engine.model_runner import SeqInput
from rosefast.engine.sampling_params import SamplingParams
from rosefast.models import delta_net
from rosefast.models.delta_net import DeltaNet
from rosefast.sources import tiny_random
from tests.paged import max_abs_diff, run_hf, run_ours
from tests.test_engine import make_engine
from tests.test_model_runner import load_hf_model, runner_for

GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
PROMPTS = [[17, 923, 4410, 88, 1024, 3], [5000, 5001, 77, 12, 9], list(range(300, 340)), [31000, 2, 9, 401, 8],
           list(range(900, 921)), [44, 45]]


def _net(seed=0):
    args = SimpleNamespace(linear_k_heads=2, linear_v_heads=4, linear_k_dim=8, linear_v_dim=12, norm_eps=1e-6,
                           hidden_size=32, linear_conv=4)
    torch.manual_seed(seed)
    net = DeltaNet(args)
    for p in net.parameters():
        torch.nn.init.normal_(p, std=0.5)
    return net


@pytest.mark.parametrize("n", [1, 5, 63, 64, 65, 150])
def test_the_chunked_rule_is_the_token_by_token_rule(n):
    """From a state already holding a past, n tokens in chunks of 64 (a chunk's triangular solve) give the outputs
    and the final state that n one-token steps do."""
    net = _net()
    x = torch.randn(n, net.conv_size)
    g = -torch.rand(n, net.v_heads) * 2
    beta = torch.rand(n, net.v_heads)
    start = torch.randn(1, net.v_heads, net.k_dim, net.v_dim)
    state = start[0].clone()
    with torch.no_grad():
        chunked = net._chunked(x, g, beta, state)
        pool, slots = start.clone(), torch.zeros(1, dtype=torch.long)
        steps = torch.cat([net._step(x[t:t + 1], g[t:t + 1], beta[t:t + 1], pool, slots) for t in range(n)])
    torch.testing.assert_close(chunked, steps, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state, pool[0], atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def next_model(default_model):
    return tiny_random("qwen3_next")


def test_a_prefill_cut_anywhere_gives_the_uncut_logits(next_model, monkeypatch):
    """Chunks of 4 tokens in the delta rule, and the prompt's prefill cut at every position of its first chunks (the
    state and conv tail carried in the slot across the two steps): every position's logits as one prefill gives (to
    fp32 rounding: ~1e-5 here, a matmul's rows summed in another order for another row count).""" 
    monkeypatch.setattr(delta_net, "CHUNK", 4)
    runner = runner_for(next_model, block_size=4)
    prompt = PROMPTS[4][:11]
    table = list(range(-(-len(prompt) // 4)))
    whole = runner.forward([SeqInput(prompt, 0, table, state_slot=0)], True, all_logits=True)
    for cut in range(1, len(prompt)):
        first = runner.forward([SeqInput(prompt[:cut], 0, table, state_slot=1)], True, all_logits=True)
        rest = runner.forward([SeqInput(prompt[cut:], cut, table, state_slot=1)], True, all_logits=True)
        torch.testing.assert_close(torch.cat((first, rest)), whole, atol=1e-4, rtol=0, msg=f"cut at {cut}")


def test_a_long_prompt_across_chunks_gives_hugging_faces_logits(default_model):
    """150 tokens: three chunks of the delta rule in one prefill, then decode steps, as Hugging Face computes them."""
    model = tiny_random("qwen3_5_text")
    prompt = [(7 * i + 100) % 40000 for i in range(150)]
    ref, fed = run_hf(load_hf_model(model), prompt, 4)
    ours = run_ours(runner_for(model), [prompt], 4, next_tokens=[fed])
    assert max_abs_diff([ref], ours) < 1e-4


@pytest.fixture(scope="module")
def solo(next_model):
    engine = make_engine(next_model)
    return [engine.generate([p], GREEDY, use_tqdm=False)[0]["token_ids"] for p in PROMPTS]


def _drive(engine, arrivals, params=GREEDY, abort=None):
    """arrivals {step: [prompt, ...]}; abort {step: request index}: {request id: token ids}."""
    out, ids, step = {}, [], 0
    while step <= max(arrivals) or engine.has_unfinished():
        for p in arrivals.get(step, []):
            ids.append(engine.add_request(p, params))
            out[ids[-1]] = []
        if abort and step in abort:
            engine.abort(ids[abort[step]])
        for o in engine.step().outputs:
            out[o.request_id] += o.new_token_ids
        step += 1
    return [out[i] for i in ids]


def _all_slots_back(engine):
    states = engine.block_manager.states
    states.check([s.state_slot for s in engine.seqs.values() if s.state_slot is not None])
    assert states.num_free == states.num_slots and engine.block_manager.num_used_blocks == 0


def test_batched_and_chunked_schedules_give_each_sequence_its_own_tokens(next_model, solo):
    """Prompts arriving over the steps, prefilled 8 tokens a step (a 40-token prompt over five steps) beside
    neighbours decoding: each sequence's tokens are the ones it gets alone."""
    engine = make_engine(next_model, max_num_batched_tokens=8)
    got = _drive(engine, {0: PROMPTS[:2], 2: PROMPTS[2:4], 5: PROMPTS[4:]})
    assert got == solo
    _all_slots_back(engine)
    assert engine.block_manager.enable_prefix_cache is False and not engine.speculator.enabled
    stats = engine.stats()
    assert stats["state_slots_used"] == 0 and stats["state_slots_total"] == engine.block_manager.states.num_slots


def test_fewer_state_slots_than_sequences_queue_the_rest(next_model, solo):
    """Two slots for six sequences: never more than two run, and each gets its own tokens."""
    engine = make_engine(next_model, max_batch_size=2)
    assert engine.block_manager.states.num_slots == 2
    running = []
    out, ids = {}, []
    for p in PROMPTS:
        ids.append(engine.add_request(p, GREEDY))
        out[ids[-1]] = []
    while engine.has_unfinished():
        for o in engine.step().outputs:
            out[o.request_id] += o.new_token_ids
        running.append(len(engine.scheduler.running))
    assert max(running) == 2 and [out[i] for i in ids] == solo
    _all_slots_back(engine)


def test_preemption_recomputes_the_state_from_the_first_token(next_model, solo):
    engine = make_engine(next_model, kv_cache_tokens=64)
    got = _drive(engine, {0: PROMPTS})
    assert engine.scheduler.preemptions > 0
    assert got == solo
    _all_slots_back(engine)


def test_an_abort_mid_prefill_and_mid_decode_gives_its_slot_back(next_model, solo):
    engine = make_engine(next_model, max_num_batched_tokens=8)
    got = _drive(engine, {0: PROMPTS[2:4], 1: PROMPTS[4:5]}, abort={2: 0, 6: 2})   # the 40-token prompt mid-prefill
    assert got[1] == solo[3]
    _all_slots_back(engine)


def test_forked_choices_each_carry_a_copy_of_the_prompts_state(next_model):
    """n = 3 sampled choices of one prompt (seeds 5, 6, 7), forked after its one prefill: each goes on from its own
    copy of the state (one shared would take all three choices' tokens), so each is the request of its seed alone."""
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=5, ignore_eos=True)
    alone = make_engine(next_model)
    want = [alone.generate([PROMPTS[0]], SamplingParams(max_tokens=10, temperature=1.0, seed=s, ignore_eos=True),
                           use_tqdm=False)[0]["token_ids"] for s in (5, 6, 7)]
    assert len({tuple(w) for w in want}) == 3
    engine = make_engine(next_model)
    engine.add_request(PROMPTS[0], params, request_id="a", fork_ids=["a-1", "a-2"])
    out = {"a": [], "a-1": [], "a-2": []}
    while engine.has_unfinished():
        for o in engine.step().outputs:
            out[o.request_id] += o.new_token_ids
    assert engine.forks == 2
    assert [out["a"], out["a-1"], out["a-2"]] == want
    _all_slots_back(engine)
