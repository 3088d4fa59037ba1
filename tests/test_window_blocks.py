"""The sliding-window layers' own KV pool (rosefast.engine.window_blocks): a sequence keeps only the blocks its
window still sees there, the output stays Hugging Face's, and no block leaks."""
import pytest
import torch

from benches.window_kv import GEMMA3_1B
from rosefast.config import EngineConfig
from rosefast.engine.kv_cache import layer_bytes_per_token, split_budget
from rosefast.engine.llm_engine import LLMEngine
from rosefast.engine.sampling_params import SamplingParams
from rosefast.engine.window_blocks import pool_blocks
from rosefast.sources import load_hf_model, load_tokenizer, tiny_random
from rosefast.models.args import model_args_from_config

TEXT = ("The tiny model says that the window is short, and then it goes on and on about the window, the blocks "
        "and the cache, for a while longer than the window")


def hf_greedy(model, prompt, n):
    tok = load_tokenizer(model)
    with torch.inference_mode():
        return load_hf_model(model).generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                                             pad_token_id=tok.pad_token_id, eos_token_id=None)[0, len(prompt):].tolist()


def window_engine(model, held, **kw):
    """An engine on 4-token blocks whose window pool's use is recorded before each step (after the last)."""
    engine = None

    def record(step, rids):
        held.append(engine.block_manager.window.num_used_blocks)

    kw = {"kv_cache_tokens": 2048, "block_size": 4, "max_batch_size": 4, **kw}
    engine = LLMEngine(model=model, dtype="float32", before_step=record, **kw)
    return engine


@pytest.mark.parametrize("family", ["mistral", "gemma3_text"])
def test_a_long_sequence_keeps_only_its_window_blocks_and_generates_as_hugging_face(default_model, family):
    """A window of 8 positions (Mistral: every layer's; Gemma 3: its local layer's) on 4-token blocks, a prompt of
    ~30 tokens prefilled in chunks of 7, then 40 tokens: between steps the window pool holds at most the 3
    blocks the next query can see (its main pool: all 20 of the sequence's), the tokens are Hugging Face's
    greedy ones, then again from the prefix cache (the window's blocks before the hit were kept there), and
    again once other prompts evicted those window blocks but not the main pool's."""
    model = tiny_random(family, sliding_window=8)
    prompt = load_tokenizer(model)(TEXT).input_ids
    assert len(prompt) > 24
    want = hf_greedy(model, prompt, 40)
    held = []
    engine = window_engine(model, held, max_num_batched_tokens=7)
    bm = engine.block_manager
    assert engine.runner.kv.window_blocks == bm.window.num_blocks < bm.num_blocks
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    assert engine.generate([prompt], params, use_tqdm=False)[0]["token_ids"] == want
    assert max(held) == 3 and len(held) > 20
    hits = bm.hits
    held.clear()
    assert engine.generate([prompt], params, use_tqdm=False)[0]["token_ids"] == want
    assert bm.hits > hits and max(held) == 3
    # other prompts take every window block (46 here) but few of the main pool's: the prompt's window blocks are
    # evicted, its main blocks are not; a hit there ends where the window pool still has the blocks before it
    tok = load_tokenizer(model)
    engine.generate([tok(f"{i} {TEXT[::-1]}").input_ids for i in range(4)], params, use_tqdm=False)
    assert bm.window.evictions > 0 and bm.evictions == 0
    misses = bm.misses
    assert engine.generate([prompt], params, use_tqdm=False)[0]["token_ids"] == want
    assert bm.misses > misses
    assert bm.num_used_blocks == bm.window.num_used_blocks == 0
    bm.check()


@pytest.mark.parametrize("speculative", ["off", "ngram"])
def test_forks_and_speculation_cross_the_window_with_nothing_leaked(default_model, speculative):
    """n = 3 choices of a prompt that repeats itself (the proposals find their n-grams), greedy: each choice is
    Hugging Face's tokens; every block of both pools is back once the request ends."""
    model = tiny_random("mistral", sliding_window=8)
    text = load_tokenizer(model)(TEXT).input_ids
    prompt = text[:12] * 3 + text[:1]   # 37 tokens, a partial last block: each choice copies it
    want = hf_greedy(model, prompt, 30)
    held = []
    engine = window_engine(model, held, speculative=speculative)
    rid = engine.add_request(prompt, SamplingParams(max_tokens=30, temperature=0, ignore_eos=True),
                             fork_ids=["b", "c"])
    got = {rid: [], "b": [], "c": []}
    while engine.has_unfinished():
        for out in engine.step().outputs:
            got[out.request_id] += out.new_token_ids
        engine.block_manager.check()
    assert all(tokens == want for tokens in got.values())
    assert max(held) <= 3 * (3 + (4 if speculative == "ngram" else 0))   # 3 choices' windows (+ proposals)
    if speculative == "ngram":
        assert engine.speculator.stats()["spec_accepted"] > 0
    assert engine.block_manager.num_used_blocks == engine.block_manager.window.num_used_blocks == 0


def test_preemption_recomputes_a_windowed_sequence_exactly(default_model):
    """A main pool too small for four long sequences at once: some are preempted and recomputed (their window
    blocks given back and taken again); every output is what the sequence gives alone."""
    model = tiny_random("gemma3_text", sliding_window=8)
    tok = load_tokenizer(model)
    prompts = [tok(f"{i} {TEXT}").input_ids[:20 + 3 * i] for i in range(4)]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    alone = [window_engine(model, []).generate([p], params, use_tqdm=False)[0]["token_ids"] for p in prompts]
    held = []
    tight = window_engine(model, held, kv_cache_tokens=128, enable_prefix_cache=False)
    assert [r["token_ids"] for r in tight.generate(prompts, params, use_tqdm=False)] == alone
    assert tight.scheduler.preemptions > 0
    assert tight.block_manager.window.num_used_blocks == 0


def test_a_window_wider_than_the_context_served_is_sized_as_that_context(default_model):
    """A 512-position window on a server of 64 tokens a sequence: its pool is sized for 64-token windows, and
    never above what admission can use (two sequences of 4 blocks)."""
    engine = LLMEngine(model=tiny_random("mistral", sliding_window=512), dtype="float32", kv_cache_tokens=4096,
                       max_model_len=64, max_batch_size=2)
    assert engine.runner.kv.window_blocks == min(pool_blocks(engine.config, 64), 2 * 4)
    assert pool_blocks(engine.config, 64) < pool_blocks(engine.config, 512) and not engine.block_manager.window.counted


def test_a_hit_ends_where_the_window_pool_still_holds_the_blocks_before_it():
    """Six full blocks of 4 found in the other pool; this pool (a window of 8) still caches blocks 0, 1, 3 and 4:
    a hit of all six would need blocks 4 and 5 (positions 17-23) and of five blocks 3 and 4, so five it is; of
    the first three, two (block 2 is gone). The hit's window blocks are taken back, the ones before it not."""
    from rosefast.engine.block_manager import chain_hash
    from rosefast.engine.sequence import Sequence
    from rosefast.engine.window_blocks import WindowBlocks

    seq = Sequence("a", list(range(100, 124)), SamplingParams())
    blocks = [tuple(seq.token_ids[i:i + 4]) for i in range(0, 24, 4)]
    hashes = [chain_hash(None, blocks[0])]
    for tokens in blocks[1:]:
        hashes.append(chain_hash(hashes[-1], tokens))
    pool, cached = WindowBlocks(8, 4, 8), {}
    for i in (0, 1, 3, 4):
        cached[i] = pool._take_free()
        pool._register(cached[i], hashes[i], blocks[i])
        pool._release(cached[i])
    assert pool.cached_prefix(seq, hashes) == 5
    assert pool.cached_prefix(seq, hashes[:3]) == 2
    pool.allocate(seq, hashes[:5])
    assert seq.window_table == [pool.released] * 3 + [cached[3], cached[4]]
    assert [pool.ref_counts[cached[i]] for i in (0, 1, 3, 4)] == [0, 0, 1, 1]
    pool.free(seq)
    pool.check()


@pytest.mark.parametrize("config, windowed", [(GEMMA3_1B, 22), ({**GEMMA3_1B, "model_type": "mistral"}, 26)])
def test_a_budget_holds_more_context_when_the_window_layers_keep_only_their_windows(config, windowed):
    """Gemma 3 1B's shape (22 of its 26 layers local on a 512-position window) and the same shape as Mistral
    (every layer windowed), with the budget that holds 64 sequences of 8k tokens in one pool: the window pool is
    what 64 running sequences' windows need, the budget is never exceeded, and the other layers' pool holds
    several times the context (Mistral: its context is bounded by admission alone, no memory behind it)."""
    args = model_args_from_config(config)
    assert sum(1 for i in range(args.num_layers) if args.layer_window(i)) == windowed
    engine = EngineConfig(model="unused", block_size=16, max_batch_size=64)
    layer_block = layer_bytes_per_token(args, torch.bfloat16) * 16
    budget = 64 * 8192 // 16 * layer_block * args.num_layers
    need = pool_blocks(engine, args.sliding_window)
    blocks, window, counted = split_budget(budget, layer_block, args.num_layers, windowed, need, 64 * 2048)
    assert window == need < 64 * 8192 // 16 // 8 and not counted
    if windowed == args.num_layers:
        assert blocks == 64 * 2048 and window * layer_block * windowed <= budget
    else:
        assert blocks * layer_block * (args.num_layers - windowed) + window * layer_block * windowed <= budget
        assert blocks >= 3 * 64 * 8192 // 16
    # a budget smaller than the windows' need: one count for both pools, the whole model's (every layer windowed
    # and holding one sequence's window and a prefill step's: all of it the window pool's, counted by the scheduler)
    one = pool_blocks(engine, args.sliding_window, running=1)
    assert split_budget(need * layer_block, layer_block, args.num_layers, windowed, need, 64 * 2048, one) == \
        (need // args.num_layers,) * 2 + (False,)
    tight = split_budget(need * layer_block * windowed // 2, layer_block, args.num_layers, windowed, need, 64 * 2048,
                         one)
    if windowed == args.num_layers:
        assert tight == (64 * 2048, need // 2, True)
    else:
        assert tight[2] is False and tight[0] == tight[1]


@pytest.mark.parametrize("speculative", ["off", "ngram"])
def test_a_counted_window_pool_runs_more_sequences_than_its_tokens_would_hold(default_model, speculative):
    """Mistral on a window of 8 (every layer windowed): 11 blocks of memory — one sequence's window with a step's
    proposals and a prefill step's, fewer than four sequences' need (32) —, so the scheduler counts the pool.
    Four sequences of ~50 tokens each are 200 tokens of context, over four times the 44 tokens the memory holds
    as whole contexts (the count the pools kept before); each holds only its window, so they run side by side,
    preempted where the pool runs short, and every output is Hugging Face's greedy tokens."""
    model = tiny_random("mistral", sliding_window=8)
    tok = load_tokenizer(model)
    prompts = [tok(f"{i} {TEXT}").input_ids[:20 + 3 * i] for i in range(4)]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    want = [hf_greedy(model, p, 24) for p in prompts]
    running, engine = [], None

    def record(step, rids):
        running.append(len(rids))
        engine.block_manager.check()

    engine = LLMEngine(model=model, dtype="float32", kv_cache_tokens=44, block_size=4, max_batch_size=4,
                       max_num_batched_tokens=8, prefill_max_batch_size=2, speculative=speculative,
                       before_step=record)
    window = engine.block_manager.window
    assert window.counted and window.num_blocks == 11 < pool_blocks(engine.config, 8)
    assert [r["token_ids"] for r in engine.generate(prompts, params, use_tqdm=False)] == want
    assert max(running) == 4 and sum(len(p) + 24 for p in prompts) > 4 * 44 and engine.scheduler.preemptions > 0
    assert engine.block_manager.num_used_blocks == window.num_used_blocks == 0


def test_a_counted_window_pool_whose_sequences_are_all_stuck_in_prefill_preempts_the_newest():
    """Two long prompts mid-prefill hold the whole counted pool between them (a window of 16 positions: each
    keeps its last 4 blocks) and nothing decodes: neither can go on, and no other sequence will give a block
    back. The scheduler preempts the newest, and the oldest goes on with its chunk."""
    from rosefast.engine.block_manager import BlockManager
    from rosefast.engine.scheduler import Scheduler
    from rosefast.engine.sequence import Sequence
    from rosefast.engine.window_blocks import WindowBlocks

    config = EngineConfig(model="unused", block_size=4, max_batch_size=4, max_num_batched_tokens=8,
                          prefill_max_batch_size=2, speculative="off")
    window = WindowBlocks(8, 4, 16, counted=True)
    bm = BlockManager(100, 4, enable_prefix_cache=False, window=window)
    scheduler = Scheduler(config, bm)
    params = SamplingParams(max_tokens=4)
    a, b = Sequence("a", list(range(100, 160)), params), Sequence("b", list(range(200, 260)), params)
    for seq in (a, b):   # admitted, and 16 tokens of each prefilled
        bm.allocate(seq, bm.lookup(seq))
        scheduler.add_running(seq)
        bm.prepare(seq, 16)
        seq.num_cached = 16
        bm.commit(seq)
    assert window.num_free_blocks == 0 and window.room(a) == window.room(b) == 0
    step = scheduler.schedule()
    assert step.is_prefill and step.seqs == [a] and step.chunks == [8]
    assert list(scheduler.waiting) == [b] and scheduler.preemptions == 1 and window.num_free_blocks == 2
