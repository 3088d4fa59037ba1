"""LLMEngine: continuous batching, prefix cache, preemption, chunked prefill, abort, finishing, validation."""
import pytest

from rosefast.engine.block_manager import BlockManager
from rosefast.engine.llm_engine import LLMEngine
from rosefast.engine.sampling_params import SamplingParams
from rosefast.sources import load_tokenizer

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


def make_engine(model, **kw):
    kw.setdefault("kv_cache_tokens", 4096)
    kw.setdefault("block_size", 4)
    return LLMEngine(model=model, dtype="float32", **kw)


@pytest.fixture(scope="module")
def prompts(tiny_llama):
    tok = load_tokenizer(tiny_llama)
    texts = ["Hello there", "The capital of France is a city that", "def f(x):", "one two three four five six",
             "Once upon a time in a land far away there lived a", "1 2 3", "The quick brown fox", "Why?"]
    return [tok(t).input_ids for t in texts]


@pytest.fixture(scope="module")
def solo(tiny_llama, prompts):
    """Each prompt run alone, greedy: the reference every batched schedule must reproduce."""
    engine = make_engine(tiny_llama)
    return [engine.generate([p], GREEDY, use_tqdm=False)[0]["token_ids"] for p in prompts]


def drive(engine, arrivals, params=GREEDY):
    """arrivals: {step_number: [prompt, ...]}; returns {request_id: token ids} and the step log."""
    out, log, step = {}, [], 0
    while step <= max(arrivals) or engine.has_unfinished():
        for p in arrivals.get(step, []):
            out[engine.add_request(p, params)] = []
        for o in engine.step().outputs:
            out[o.request_id] += o.new_token_ids
            log.append((step, o.request_id, len(o.new_token_ids), o.finished))
        step += 1
    return out, log


def test_continuous_batching_equals_each_alone(tiny_llama, prompts, solo):
    engine = make_engine(tiny_llama)
    arrivals = {0: prompts[:3], 2: prompts[3:5], 5: prompts[5:7], 9: prompts[7:]}
    out, _ = drive(engine, arrivals)
    assert [out[i] for i in range(len(prompts))] == solo
    assert engine.block_manager.num_used_blocks == 0


def test_prefix_cache_reuses_blocks_with_identical_output(tiny_llama, prompts):
    shared = list(range(1000, 1040))              # a 40-token prefix: 10 blocks of 4
    a, b = shared + prompts[0], shared + prompts[1]
    cold = make_engine(tiny_llama, enable_prefix_cache=False)
    want = [cold.generate([p], GREEDY, use_tqdm=False)[0]["token_ids"] for p in (a, b)]
    engine = make_engine(tiny_llama)
    assert engine.generate([a], GREEDY, use_tqdm=False)[0]["token_ids"] == want[0]
    hits = engine.block_manager.hits
    assert engine.generate([b], GREEDY, use_tqdm=False)[0]["token_ids"] == want[1]
    assert engine.block_manager.hits - hits == 10
    engine.block_manager.check()


def test_forced_hash_collision_is_caught_by_token_comparison(tiny_llama, prompts):
    engine = make_engine(tiny_llama)
    engine.block_manager = BlockManager(engine.block_manager.num_blocks, 4, hash_fn=lambda prev, tokens: 0)
    engine.scheduler.block_manager = engine.block_manager
    cold = make_engine(tiny_llama, enable_prefix_cache=False)
    x, y = list(range(2000, 2024)), list(range(3000, 3024))
    for p in (x, y):
        assert (engine.generate([p], GREEDY, use_tqdm=False)[0]["token_ids"]
                == cold.generate([p], GREEDY, use_tqdm=False)[0]["token_ids"])
    assert engine.block_manager.misses >= 1 and engine.block_manager.hits == 0


def test_a_block_after_one_left_unregistered_is_cached_under_its_own_chain(tiny_llama):
    """Two equal prompts prefilled in one step: the second's blocks find their hashes taken (by the first's
    equal blocks) and stay unregistered. The block each then fills while decoding must still be registered
    under its chain from the prompt, not as if it began a sequence: a prompt that starts with that block's
    tokens gets no hit there (its K/V were computed at other positions) and is computed as on a cold engine."""
    engine = make_engine(tiny_llama)
    prompt = list(range(700, 708))   # two full blocks of 4
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    first, second = engine.generate([prompt, prompt], params, use_tqdm=False)
    assert first["token_ids"] == second["token_ids"]
    later = first["token_ids"][:4] + [9]   # starts with the tokens of the first decoded block (positions 8-11)
    hits = engine.block_manager.hits
    got = engine.generate([later], params, use_tqdm=False)[0]["token_ids"]
    assert engine.block_manager.hits == hits, "a block computed at positions 8-11 served as positions 0-3"
    assert got == make_engine(tiny_llama, enable_prefix_cache=False).generate([later], params,
                                                                             use_tqdm=False)[0]["token_ids"]
    engine.block_manager.check()


def test_small_kv_budget_forces_preemption_with_identical_output(tiny_llama, prompts, solo):
    engine = make_engine(tiny_llama, kv_cache_tokens=64, enable_prefix_cache=False)
    out, _ = drive(engine, {0: prompts})
    assert engine.scheduler.preemptions > 0
    assert [out[i] for i in range(len(prompts))] == solo
    assert engine.block_manager.num_used_blocks == 0


def test_seeded_sampling_survives_preemption(tiny_llama, prompts):
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=5, ignore_eos=True)
    roomy = make_engine(tiny_llama)
    want, _ = drive(roomy, {0: prompts}, params)
    tight = make_engine(tiny_llama, kv_cache_tokens=64, enable_prefix_cache=False)
    got, _ = drive(tight, {0: prompts}, params)
    assert tight.scheduler.preemptions > 0 and got == want


def test_chunked_prefill_interleaves_with_decodes(tiny_llama, prompts):
    long_prompt = list(range(100, 300))   # 200 tokens, 32 per prefill step
    engine = make_engine(tiny_llama, max_num_batched_tokens=32)
    out, log = drive(engine, {0: [prompts[0]], 2: [long_prompt]})
    short_id, long_id = 0, 1
    first_long = min(s for s, r, n, _ in log if r == long_id and n)
    short_steps = [s for s, r, n, _ in log if r == short_id and n and 2 <= s < first_long]
    assert first_long >= 2 + 200 // 32       # the long prompt took several bounded prefill steps
    assert len(short_steps) >= 5             # and the running request kept decoding in between
    alone = make_engine(tiny_llama).generate([long_prompt], GREEDY, use_tqdm=False)[0]["token_ids"]
    assert out[long_id] == alone


def test_abort_in_every_state_frees_every_block(tiny_llama, prompts):
    engine = make_engine(tiny_llama, max_num_batched_tokens=16, max_batch_size=2)
    bm = engine.block_manager
    decoding = engine.add_request(prompts[0], GREEDY)
    engine.step()                                            # prefilled, now decoding
    prefilling = engine.add_request(list(range(100, 180)), GREEDY)
    waiting = engine.add_request(prompts[1], GREEDY)         # max_batch_size 2: stays waiting
    engine.step()                                            # decode step
    engine.step()                                            # first 16-token chunk of the long prompt
    seqs = engine.seqs
    assert seqs[prefilling].in_prefill and seqs[prefilling].block_table
    assert not seqs[decoding].in_prefill and not seqs[waiting].block_table
    assert bm.num_used_blocks > 0
    for rid in (waiting, prefilling, decoding):
        assert engine.abort(rid)
    assert not engine.abort(decoding)
    assert bm.num_used_blocks == 0 and not engine.has_unfinished()
    bm.check()


def test_finish_reasons(tiny_llama, prompts):
    engine = make_engine(tiny_llama, max_model_len=24)
    r = engine.generate([prompts[0]], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True), use_tqdm=False)
    assert r[0]["finish_reason"] == "length" and len(r[0]["token_ids"]) == 5
    first = r[0]["token_ids"][0]
    r = engine.generate([prompts[0]], SamplingParams(max_tokens=5, temperature=0, stop_token_ids=[first]),
                        use_tqdm=False)
    assert r[0] == {"token_ids": [first], "finish_reason": "stop", "text": r[0]["text"]}
    r = engine.generate([prompts[0]], SamplingParams(max_tokens=100, temperature=0, ignore_eos=True), use_tqdm=False)
    assert r[0]["finish_reason"] == "length" and len(prompts[0]) + len(r[0]["token_ids"]) == 24


def test_eos_stops_unless_ignored(tiny_llama, prompts):
    engine = make_engine(tiny_llama)
    eos = engine.args.eos_token_ids[0]
    # make EOS the greedy choice by using it as a stop token's twin: check the stop set
    seq_params = SamplingParams(max_tokens=4, temperature=0)
    rid = engine.add_request(prompts[0], seq_params)
    assert eos in engine.seqs[rid].stop_ids
    engine.abort(rid)
    rid = engine.add_request(prompts[0], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    assert eos not in engine.seqs[rid].stop_ids


@pytest.mark.parametrize("prompt, params, message", [
    ([], None, "prompt is empty"),
    (list(range(2000)), None, "prompt has 2000 tokens; the model's context length is 1024"),
    ([1, 2, -3], None, "prompt token ids must be integers"),
    ([1, 2, 3], "greedy", "params must be SamplingParams"),
])
def test_bad_requests_raise_a_clear_error(tiny_llama, prompt, params, message):
    engine = make_engine(tiny_llama)
    with pytest.raises((ValueError, TypeError), match=message):
        engine.add_request(prompt, params)
    assert not engine.has_unfinished()


def test_generate_strings_with_progress(tiny_llama, capsys):
    engine = make_engine(tiny_llama)
    results = engine.generate(["Hello", "World"], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    assert [len(r["token_ids"]) for r in results] == [3, 3]
    assert all(isinstance(r["text"], str) for r in results)
    assert "rosefast generate" in capsys.readouterr().err


def test_the_stand_in_takes_what_the_real_engine_takes(default_model):
    """The stand-in engine (no forward pass) behind the same LLMEngine: n > 1 (forked choices select logits
    rows), echo with prompt logprobs, and a chunked prefill beside decodes all run to the end."""
    engine = LLMEngine(model="stand-in", max_num_batched_tokens=32, kv_cache_tokens=4096)
    long_prompt = list(range(100, 200))                       # chunked: 100 tokens, 32 a step
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=5, ignore_eos=True), request_id="fork",
                       fork_ids=["fork-1", "fork-2"])
    engine.add_request([4, 5, 6, 7], SamplingParams(max_tokens=3, ignore_eos=True, logprobs=1, prompt_logprobs=1),
                       request_id="echo")
    engine.add_request(long_prompt, SamplingParams(max_tokens=4, ignore_eos=True), request_id="long")
    tokens, prompt_logprobs = {}, {}
    for _ in range(100):
        if not engine.has_unfinished():
            break
        result = engine.step()
        assert not result.failed, result.errors
        for out in result.outputs:
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.prompt_logprobs is not None:
                prompt_logprobs[out.request_id] = out.prompt_logprobs
    assert {r: len(t) for r, t in tokens.items()} == {"fork": 5, "fork-1": 5, "fork-2": 5, "echo": 3, "long": 4}
    assert len(prompt_logprobs["echo"]) == 4   # the first prompt token's entry has no logprob
