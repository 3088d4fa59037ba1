"""Block accounting under random add / abort / finish sequences on the real engine (tiny model)."""
import random
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rosefast.engine.llm_engine import LLMEngine
from rosefast.engine.sampling_params import SamplingParams

SHARED = list(range(500, 532))   # a common 32-token prefix, so the prefix cache is exercised


@pytest.fixture(scope="module", params=["llama", "mistral-window-8"])
def engine(request, tiny_llama):
    """A small pool: preemption, eviction and prefix reuse all happen. Mistral on a window of 8 positions: every
    layer windowed, so its memory is the layers' own pool, given back as sequences move on; 16 blocks, fewer than
    its need (51: six sequences' windows with a decode step's proposals, and a prefill step's), so the scheduler
    counts it — chunks, admissions, growth and preemptions by its free blocks."""
    if request.param == "llama":
        return LLMEngine(model=tiny_llama, dtype="float32", kv_cache_tokens=96, block_size=4, max_batch_size=6,
                         prefill_max_batch_size=3, max_num_batched_tokens=24)
    from rosefast.sources import tiny_random

    engine = LLMEngine(model=tiny_random("mistral", sliding_window=8), dtype="float32", kv_cache_tokens=64,
                       block_size=4, max_batch_size=6, prefill_max_batch_size=3, max_num_batched_tokens=24)
    window = engine.block_manager.window
    assert window.num_blocks == 16 and window.counted
    return engine


def check_pool(engine):
    bm = engine.block_manager
    bm.check()
    for pool, tables in ((bm, [seq.block_table for seq in engine.seqs.values()]),
                         (bm.window, [seq.window_table for seq in engine.seqs.values()])):
        if pool is None:
            continue
        refs = Counter(b for table in tables for b in table if b < pool.num_blocks)   # (the window's released)
        assert all(pool.ref_counts[b] == n for b, n in refs.items())
        assert sum(1 for r in pool.ref_counts if r) == len(refs)
    if bm.window is not None:   # between steps: at most the 3 blocks of 4 a window of 8 positions touches
        released = bm.window.released
        assert all(sum(b != released for b in seq.window_table) <= 3 for seq in engine.seqs.values())


def apply(engine, ops, rng):
    """Run the ops; every third add has 2 or 3 choices (its forks share the prompt's blocks: the reference
    counts must say so, and freeing one choice must not free the others' blocks)."""
    live = []
    for op, arg in ops:
        if op == "add":
            prompt = (SHARED[:arg % 33] if arg % 2 else []) + [rng.randrange(1, 40000) for _ in range(1 + arg % 23)]
            params = SamplingParams(max_tokens=1 + arg % 17, temperature=0, ignore_eos=True)
            rid = f"r{rng.getrandbits(48):012x}"
            forks = [f"{rid}-{k}" for k in range(1 + arg % 2)] if arg % 3 == 0 else []
            live.append(engine.add_request(prompt, params, request_id=rid, fork_ids=forks))
            live += forks
        elif op == "abort" and live:
            engine.abort(live.pop(arg % len(live)))
        else:
            for _ in range(1 + arg % 4):
                for out in engine.step().outputs:
                    if out.finished and out.request_id in live:
                        live.remove(out.request_id)
        check_pool(engine)
    return live


def drain_and_check(engine, live, abort_rest):
    if abort_rest:
        for rid in live:
            engine.abort(rid)
    while engine.has_unfinished():
        engine.step()
    bm = engine.block_manager
    assert not engine.seqs and bm.num_used_blocks == 0
    assert bm.num_free_blocks == bm.num_blocks
    bm.check()


OPS = st.lists(st.tuples(st.sampled_from(["add", "add", "abort", "step"]), st.integers(0, 1000)), max_size=40)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, abort_rest=st.booleans())
def test_random_add_abort_finish_leaves_the_pool_whole(engine, ops, abort_rest):
    live = apply(engine, ops, random.Random(len(ops)))
    drain_and_check(engine, live, abort_rest)


def test_a_thousand_random_operations(engine):
    rng = random.Random(1234)
    ops = [(rng.choice(["add", "add", "abort", "step", "step"]), rng.randrange(1000)) for _ in range(1000)]
    live = apply(engine, ops, rng)
    drain_and_check(engine, live, abort_rest=False)
    bm = engine.block_manager
    evictions = bm.evictions + (bm.window.evictions if bm.window is not None else 0)   # (Mistral's memory: its pool)
    assert bm.hits > 0 and evictions > 0 and engine.scheduler.preemptions > 0 and engine.forks > 0
