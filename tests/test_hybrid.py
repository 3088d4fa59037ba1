"""Hybrid attention (rosefast.models.delta_net, rosefast.engine.state_slots): the chunked delta rule is the token-by-
token one; a prefill cut anywhere, a long prompt across chunks, and every engine schedule (batched, preempted,
aborted, forked) give each sequence the logits and tokens it gets alone, with every state slot back at the end. The
families' logits against Hugging Face's are tests/test_model_runner.py's (TINY_VARIANTS) and their HTTP runs
tests/test_models.py's."""
import pytest
import torch

from rosefast.engine.model_runner import SeqInput
from rosefast.engine.sampling_params import SamplingParams
from rosefast.kernels import layer_ops
from rosefast.models import delta_net
from rosefast.sources import load_tokenizer, tiny_random
from tests.paged import max_abs_diff, run_hf, run_ours
from tests.test_engine import make_engine
from tests.test_model_runner import load_hf_model, runner_for

GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
PROMPTS = [[17, 923, 4410, 88, 1024, 3], [5000, 5001, 77, 12, 9], list(range(300, 340)), [31000, 2, 9, 401, 8],
           list(range(900, 921)), [44, 45]]


def _rule_inputs(n, heads, dk, dv, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.nn.functional.normalize(torch.randn(n, heads, dk, generator=gen), dim=-1) for _ in range(2))
    v = torch.randn(n, heads, dv, generator=gen)
    g, beta = -torch.rand(n, heads, generator=gen) * 2, torch.rand(n, heads, generator=gen)
    return q, k, v, g, beta


@pytest.mark.parametrize("n", [1, 5, 63, 64, 65, 150])
def test_the_chunked_rule_is_the_token_by_token_rule(n):
    """From a state already holding a past, n tokens in the twin's chunks of 64 (a chunk's triangular solve) give
    the outputs and the final state that n one-token steps do."""
    twin = layer_ops.reference
    q, k, v, g, beta = _rule_inputs(n, 4, 8, 12, n)
    start = torch.randn(1, 4, 8, 12)
    state = start[0].clone()
    chunked = twin.delta_sequence(state, q, k, v, g, beta)
    pool, slots = start.clone(), torch.zeros(1, dtype=torch.long)
    steps = torch.cat([twin.delta_step(pool, slots, q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1], beta[t:t + 1])
                       for t in range(n)])
    torch.testing.assert_close(chunked, steps, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state, pool[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rows, heads, dk, dv", [(1, 4, 8, 12), (5, 32, 128, 128), (3, 2, 16, 1000)])
def test_the_compiled_delta_step_is_the_twins(rows, heads, dk, dv):
    """The C step (two passes over each head's state) against the torch twin: the outputs, every row's state in its
    slot, and the slots no row names left as they were (slots out of order, one row past the others)."""
    from rosefast.kernels import _layer_ops_c

    gen = torch.Generator().manual_seed(rows)
    pool = torch.randn(rows + 3, heads, dk, dv, generator=gen) * 0.3
    slots = torch.randperm(rows + 3, generator=gen)[:rows]
    q, k, v, g, beta = _rule_inputs(rows, heads, dk, dv, rows)
    want_pool = pool.clone()
    want = layer_ops.reference.delta_step(want_pool, slots, q, k, v, g, beta)
    got = _layer_ops_c.delta_step(pool, slots, q, k, v, g, beta)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pool, want_pool, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="shapes"):
        _layer_ops_c.delta_step(pool, slots, q, k, v[:, :1], g, beta)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows, k_heads, v_heads, dk, dv, tiled", [(1, 2, 4, 8, 12, False), (5, 2, 4, 8, 12, True),
                                                                   (3, 16, 32, 128, 128, True), (4, 3, 3, 16, 40, False)])
def test_the_compiled_decode_step_is_the_twins(rows, k_heads, v_heads, dk, dv, tiled, dtype):
    """A DeltaNet's whole decode step after its projections in one C call (the conv's step over each row's tail, the
    q/k norms of each v head's k head — grouped or tiled —, the gates, the rule, the gated norm) against the twin's
    torch ops: the outputs, every row's state and tail in its slot, the slots no row names untouched; the
    projections are column slices of wider outputs (their rows apart), as the layer's split gives them."""
    from rosefast.kernels import _layer_ops_c

    gen = torch.Generator().manual_seed(rows)
    channels, width = 2 * k_heads * dk + v_heads * dv, 4
    pool = torch.randn(rows + 3, v_heads, dk, dv, generator=gen) * 0.3
    tails = (torch.randn(rows + 3, width - 1, channels, generator=gen)).to(dtype)
    slots = torch.randperm(rows + 3, generator=gen)[:rows]
    proj = torch.randn(rows, channels + v_heads * dv + 5, generator=gen).to(dtype)[:, 2:-3]
    ba = torch.randn(rows, 2 * v_heads + 1, generator=gen).to(dtype)[:, 1:]
    conv = (torch.randn(channels, width, generator=gen) * 0.5).to(dtype)
    A_log, dt_bias = (torch.randn(v_heads, generator=gen).to(dtype) for _ in range(2))
    norm = torch.rand(dv, generator=gen).add(0.5).to(dtype)
    weights = (conv, A_log, dt_bias, norm, 1e-6, k_heads, tiled)
    want_pool, want_tails = pool.clone(), tails.clone()
    want = layer_ops.reference.delta_decode(proj, ba, weights[0], want_tails, want_pool, slots, *weights[1:])
    got = _layer_ops_c.delta_decode(proj, ba, weights[0], tails, pool, slots, *weights[1:])
    loose = dtype == torch.bfloat16   # (the twin rounds to bf16 between its ops; C once, at the end)
    torch.testing.assert_close(got.float(), want.float(), atol=3e-2 if loose else 1e-5, rtol=3e-2 if loose else 1e-5)
    torch.testing.assert_close(pool, want_pool, atol=2e-2 if loose else 1e-5, rtol=2e-2 if loose else 1e-5)
    assert torch.equal(tails, want_tails)
    with pytest.raises(ValueError, match="do not fit"):
        _layer_ops_c.delta_decode(proj, ba, conv[1:], tails, pool, slots, *weights[1:])


@pytest.mark.parametrize("n, heads, dk, dv", [(1, 4, 8, 12), (150, 4, 16, 24), (70, 32, 128, 128)])
def test_the_compiled_delta_sequence_is_the_twins_chunked_form(n, heads, dk, dv):
    """A prefill's rule in C (each head's tokens in order) against the twin's chunks: outputs and final state."""
    from rosefast.kernels import _layer_ops_c

    q, k, v, g, beta = _rule_inputs(n, heads, dk, dv, n)
    state = torch.randn(heads, dk, dv, generator=torch.Generator().manual_seed(1)) * 0.3
    want_state = state.clone()
    want = layer_ops.reference.delta_sequence(want_state, q, k, v, g, beta)
    got = _layer_ops_c.delta_sequence(state, q, k, v, g, beta)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(state, want_state, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="shapes"):
        _layer_ops_c.delta_sequence(state[:1], q, k, v, g, beta)


@pytest.fixture(scope="module")
def next_model(default_model):
    return tiny_random("qwen3_next")


@pytest.mark.parametrize("flavour", ["compiled", "twin"])
def test_a_prefill_cut_anywhere_gives_the_uncut_logits(next_model, monkeypatch, flavour):
    """The prompt's prefill cut at every position (the state and conv tail carried in the slot across the two
    steps; the twin's delta rule in chunks of 4, so that cuts fall at every place in a chunk): every position's
    logits as one prefill gives (to fp32 rounding: ~1e-5 here, a matmul's rows summed in another order for another
    row count)."""
    monkeypatch.setattr(layer_ops.reference, "DELTA_CHUNK", 4)
    if flavour == "twin":
        monkeypatch.setattr(layer_ops, "impl", layer_ops.reference)
    runner = runner_for(next_model, block_size=4)
    prompt = PROMPTS[4][:11]
    table = list(range(-(-len(prompt) // 4)))
    whole = runner.forward([SeqInput(prompt, 0, table, state_slot=0)], True, all_logits=True)
    for cut in range(1, len(prompt)):
        first = runner.forward([SeqInput(prompt[:cut], 0, table, state_slot=1)], True, all_logits=True)
        rest = runner.forward([SeqInput(prompt[cut:], cut, table, state_slot=1)], True, all_logits=True)
        torch.testing.assert_close(torch.cat((first, rest)), whole, atol=1e-4, rtol=0, msg=f"cut at {cut}")


def test_a_long_prompt_across_chunks_gives_hugging_faces_logits(default_model, monkeypatch):
    """150 tokens in one prefill, run 64 at a time through the conv and the rule (the C kernels' recurrence;
    tests/test_model_runner.py's runs are short), then decode steps, as Hugging Face computes them (its chunked
    form)."""
    monkeypatch.setattr(delta_net, "PIECE", 64)
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
    bm = engine.block_manager
    bm.states.check([s.state_slot for s in engine.seqs.values() if s.state_slot is not None])
    assert bm.states.num_free == bm.states.num_slots and bm.num_used_blocks == 0
    if bm.checkpoints is not None:   # every saved-state slot free or holding one saved state
        first = bm.states.num_slots + 1
        assert sorted(bm.checkpoints.free + list(bm.checkpoints.by_hash.values())) == \
            list(range(first, first + engine.runner.kv.state_checkpoints))


def test_batched_and_chunked_schedules_give_each_sequence_its_own_tokens(next_model, solo):
    """Prompts arriving over the steps, prefilled 8 tokens a step (a 40-token prompt over five steps) beside
    neighbours decoding: each sequence's tokens are the ones it gets alone."""
    engine = make_engine(next_model, max_num_batched_tokens=8)
    got = _drive(engine, {0: PROMPTS[:2], 2: PROMPTS[2:4], 5: PROMPTS[4:]})
    assert got == solo
    _all_slots_back(engine)
    assert engine.block_manager.enable_prefix_cache and not engine.speculator.enabled
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


@pytest.mark.parametrize("chunk", [2048, 8])
def test_a_prompt_sharing_a_prefix_starts_from_the_saved_state(next_model, chunk):
    """States saved every 16 tokens: a second prompt sharing the first one's 100-token prefix hits the cache up to
    the last saved state inside it (96 tokens: 24 blocks of 4), starts from a copy of that state, and gives the
    tokens it gets on an engine without the cache — prefilled in one step or 8 tokens a step."""
    shared = [(13 * i + 500) % 40000 for i in range(100)]
    first, second = shared + [7, 8, 9, 10, 11], shared + [40, 41, 42]
    cold = make_engine(next_model, enable_prefix_cache=False)
    want = [cold.generate([p], GREEDY, use_tqdm=False)[0]["token_ids"] for p in (first, second)]
    engine = make_engine(next_model, state_checkpoint_tokens=16, max_num_batched_tokens=chunk)
    assert engine.generate([first], GREEDY, use_tqdm=False)[0]["token_ids"] == want[0]
    stats = engine.stats()
    assert stats["state_checkpoints_saved"] == len(first) // 16 and stats["state_checkpoint_hits"] == 0
    hits = engine.block_manager.hits
    rid = engine.add_request(second, GREEDY)
    got = []
    while engine.has_unfinished():
        got += [t for o in engine.step().outputs for t in o.new_token_ids]
    assert got == want[1]
    assert engine.stats()["state_checkpoint_hits"] == 1 and engine.block_manager.hits - hits == 96 // 4
    _all_slots_back(engine)
    assert rid not in engine.seqs


def test_saved_states_past_their_number_are_dropped_least_recently_used(next_model, solo):
    """Two saved-state slots for prompts that save many: the oldest are dropped, every slot stays accounted for,
    and every prompt (a repeat of one among them) gets its own tokens."""
    engine = make_engine(next_model, state_checkpoint_tokens=8, state_checkpoints=2)
    got = [engine.generate([p], GREEDY, use_tqdm=False)[0]["token_ids"] for p in PROMPTS + PROMPTS[4:5]]
    assert got == solo + solo[4:5]
    assert len(engine.block_manager.checkpoints.by_hash) == 2 and engine.stats()["state_checkpoints_saved"] > 2
    # the 40-token prompt's saved states were dropped for the 21-token one's (at 8 and 16): its repeat starts at 16
    assert engine.stats()["state_checkpoint_hits"] == 1 and engine.seqs == {}
    _all_slots_back(engine)


def test_a_multimodal_checkpoint_is_served_as_its_text_model(default_model, caplog):
    """Qwen3.5 as published (its text model under model.language_model., a vision tower beside it): the vision
    tower's tensors are left out with a log line, and the text model is what runs (its logits: TINY_VARIANTS)."""
    import logging

    model = tiny_random("qwen3_5")
    with caplog.at_level(logging.INFO, logger="rosefast.engine"):
        runner = runner_for(model)
    assert any("vision tower left out" in r.getMessage() for r in caplog.records)
    assert runner.args.family == "qwen3_5_text" and runner.args.linear_layers == (0, 1, 2)


@pytest.mark.parametrize("family, mode", [("qwen3_next", "int8"), ("qwen3_5_text", "int8"), ("qwen3_5_text", "int4")])
def test_a_hybrid_directory_quantized_at_load_stays_near_hugging_face(family, mode):
    """int8 / int4 at load quantize every linear the block kernels run — the DeltaNet's q|k|v|z and output (its b|a
    rows stay dense), the gated attention's q|k|v, o and gate, the MLP or the experts — and the prompt's
    loglikelihoods stay near Hugging Face's fp32 ones (int8: tests/test_quant.py's 0.03 nats a token; int4 moves
    these tiny hybrids' numbers by ~0.1, their gated norms amplifying rounding)."""
    from rosefast.models.quantized import _TiledLinear
    from tests.test_hybrid_gguf import _scored
    from tests.test_quant import TEXT

    model = tiny_random(family)
    engine = make_engine(model, quantization=mode)
    served = engine.runner.model
    deltanet, attention = served.layers[0], served.layers[3]
    assert all(isinstance(x, _TiledLinear) for x in (deltanet.linear_attn.qkvz, deltanet.linear_attn.out,
                                                     attention.qkv, attention.o, attention.attn_gate))
    assert not isinstance(deltanet.linear_attn.ba, _TiledLinear)
    ids = load_tokenizer(model)(TEXT).input_ids
    with torch.no_grad():
        logits = load_hf_model(model)(torch.tensor([ids])).logits[0]
    want = torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    assert abs((_scored(engine, ids) - want).mean()) < (0.03 if mode == "int8" else 0.2)
