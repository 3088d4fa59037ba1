"""SchedulerManager: async tokenization, admission, streams, detokenization, faults, timestamps, shutdown."""
import ast
import gc
import random
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from rosefast.engine.llm_engine import LLMEngine
from rosefast.engine.sampling_params import SamplingParams
from rosefast.errors import EngineError, OverloadedError, ShutdownError
from rosefast.serving import manager as manager_module
from rosefast.serving.manager import SchedulerManager
from rosefast.sources import load_tokenizer

WORDS = ["apple", "river", "quantum", "violet", "castle", "engine", "meadow", "signal", "harbor", "pixel"]


def make_manager(model, **kw):
    kw.setdefault("kv_cache_tokens", 8192)
    kw.setdefault("block_size", 8)
    return SchedulerManager(model=model, dtype="float32", **kw)


def collect(manager, rid):
    ids, text, reason = [], [], None
    for chunk in manager.stream(rid):
        ids += chunk.token_ids
        text.append(chunk.text)
        reason = chunk.finish_reason
    return ids, "".join(text), reason


@pytest.fixture(scope="module")
def manager(tiny_llama):
    m = make_manager(tiny_llama, record_token_timestamps=True)
    yield m
    m.close()


class GatedTokenizer:
    """The real tokenizer, whose encode waits for a gate: shows add_request does not wait for it."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.gate = threading.Event()
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        self.gate.wait(10)
        return self._tokenizer(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


def test_add_request_returns_before_encode_with_workers(tiny_llama):
    gated = GatedTokenizer(load_tokenizer(tiny_llama))
    m = make_manager(tiny_llama, tokenize_workers=1, tokenizer=gated)
    try:
        rid = m.add_request("a prompt the worker has to encode", max_tokens=5, temperature=0, ignore_eos=True)
        done = []
        consumer = threading.Thread(target=lambda: done.append(collect(m, rid)))
        consumer.start()
        consumer.join(0.3)
        assert not done and gated.calls <= 1   # encode is blocked (or not even called yet)
        gated.gate.set()
        consumer.join(10)
        ids, _, reason = done[0]
        assert len(ids) == 5 and reason == "length"
        pretok = m.add_request(prompt_token_ids=gated("a prompt the worker has to encode")["input_ids"],
                               max_tokens=5, temperature=0, ignore_eos=True)
        assert collect(m, pretok)[0] == ids
    finally:
        gated.gate.set()
        m.close()


def test_workers_encode_through_the_rust_backend_with_the_same_ids(tiny_llama):
    from rosefast.serving.tokenize_pool import batch_encoder

    tok = load_tokenizer(tiny_llama)
    prompts = ["hello " * 256, "Héllo 世界 🙂 <|im_start|>user\nhi<|im_end|>", " leading space", "a\n\nb\tc"]
    assert batch_encoder(tok)(prompts) == [tok(p)["input_ids"] for p in prompts]
    gated = GatedTokenizer(tok)
    gated.gate.set()
    assert batch_encoder(gated)(prompts) == [tok(p)["input_ids"] for p in prompts]
    assert gated.calls == 1   # a wrapper is honoured: its __call__ runs, not the backend behind it


def test_inflight_limit_refuses_then_accepts_again(tiny_llama):
    m = make_manager(tiny_llama, max_inflight_requests=1)
    try:
        first = m.add_request("hello", max_tokens=4, temperature=0, ignore_eos=True)
        with pytest.raises(OverloadedError, match="max_inflight_requests=1"):
            m.add_request("again", max_tokens=4)
        assert m.admission.rejected_total == 1 and m.tokenized_total == 1   # the refused one was not encoded
        collect(m, first)
        second = m.add_request("hello", max_tokens=50, temperature=0, ignore_eos=True)
        with pytest.raises(OverloadedError):
            m.add_request("again", max_tokens=4)
        m.abort(second)
        m.abort(second)   # twice: the slot is still released once
        assert m.inflight == 0
        third = m.add_request("hello", max_tokens=2)
        collect(m, third)
        assert m.inflight == 0 and m.admission.accepted_total == 3
    finally:
        m.close()


def test_bad_requests_raise_and_keep_no_slot(manager):
    before = manager.inflight
    with pytest.raises(ValueError, match="max_tokens"):
        manager.add_request("hi", max_tokens=0)
    with pytest.raises(ValueError, match="exactly one of prompt or prompt_token_ids"):
        manager.add_request("hi", prompt_token_ids=[1, 2])
    with pytest.raises(ValueError, match="non-empty string"):
        manager.add_request("")
    with pytest.raises(ValueError, match="context length"):
        manager.add_request(prompt_token_ids=list(range(5000)))
    with pytest.raises(TypeError):
        manager.add_request("hi", temprature=0.5)
    assert manager.inflight == before


def test_200_concurrent_requests_from_8_threads_equal_offline(tiny_llama):
    rng = random.Random(0)
    jobs = [(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40))), rng.randint(1, 24)) for _ in range(200)]
    offline = LLMEngine(model=tiny_llama, dtype="float32", kv_cache_tokens=8192, block_size=8)
    want = offline.generate([p for p, _ in jobs], [SamplingParams(max_tokens=n, temperature=0) for _, n in jobs],
                            use_tqdm=False)
    m = make_manager(tiny_llama, tokenize_workers=2, max_batch_size=32)
    results = {}

    def client(indices):
        for i in indices:
            prompt, n = jobs[i]
            results[i] = collect(m, m.add_request(prompt, max_tokens=n, temperature=0))

    try:
        threads = [threading.Thread(target=client, args=(range(k, 200, 8),)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert len(results) == 200
        for i, w in enumerate(want):
            ids, text, reason = results[i]
            assert ids == w["token_ids"] and reason == w["finish_reason"]
        assert m.inflight == 0 and len(m.requests) == 0
    finally:
        m.close()


def test_streamed_text_equals_full_decode(manager):
    tok = manager.tokenizer
    for seed in range(6):
        rid = manager.add_request("Once upon a time", max_tokens=30, temperature=1.0, seed=seed, ignore_eos=True)
        ids, text, _ = collect(manager, rid)
        full = tok.decode(ids, skip_special_tokens=True)
        if "\ufffd" not in full:        # a random model may end on half a character: held back, not garbled
            assert text == full


def test_stop_strings_cut_exactly_through_the_manager(manager):
    rid = manager.add_request("The story begins", max_tokens=40, temperature=0, ignore_eos=True)
    _, full, _ = collect(manager, rid)
    stop = full[12:16]
    cut = full.index(stop)
    _, text, reason = collect(manager, manager.add_request("The story begins", max_tokens=40, temperature=0,
                                                           ignore_eos=True, stop=[stop]))
    assert (text, reason) == (full[:cut], "stop")
    _, text, _ = collect(manager, manager.add_request("The story begins", max_tokens=40, temperature=0,
                                                      ignore_eos=True, stop=stop,
                                                      include_stop_str_in_output=True))
    assert text == full[:cut + len(stop)]


def test_pretokenized_equals_text_path(manager):
    prompt = "pre-tokenized prompts skip the tokenizer"
    by_text = collect(manager, manager.add_request(prompt, max_tokens=10, temperature=0))
    ids = manager.tokenizer(prompt)["input_ids"]
    assert collect(manager, manager.add_request(prompt_token_ids=ids, max_tokens=10, temperature=0)) == by_text


def test_timestamps_are_ordered_and_forgotten_with_the_record(manager):
    rid = manager.add_request("timing", max_tokens=6, temperature=0, ignore_eos=True)
    t = manager.timing(rid)
    collect(manager, rid)
    assert t.submit == t.tokenized   # inline encode: the ids are ready when add_request returns
    assert t.tokenized <= t.scheduled <= t.first_token == t.token_times[0]
    assert len(t.token_times) == 6 and t.token_times == sorted(t.token_times)
    assert manager.timing(rid) is None and manager.requests.get(rid) is None


def test_timestamps_with_workers_follow_the_stages(tiny_llama):
    with make_manager(tiny_llama, tokenize_workers=1, record_token_timestamps=True) as m:
        rid = m.add_request("timing through a worker", max_tokens=3, temperature=0, ignore_eos=True)
        t = m.timing(rid)
        lengths = {chunk.prompt_tokens for chunk in m.stream(rid)}
        assert t.submit <= t.tokenized <= t.scheduled <= t.first_token == t.token_times[0]
        assert lengths == {len(m.tokenizer("timing through a worker")["input_ids"])}


def test_no_timestamps_kept_when_off(tiny_llama):
    m = make_manager(tiny_llama)
    try:
        rid = m.add_request("x", max_tokens=2)
        assert m.timing(rid) is None
        collect(m, rid)
    finally:
        m.close()


def test_engine_fault_fails_that_step_and_serves_the_next(tiny_llama):
    boom = {"step": None}

    def before_step(n, request_ids):
        if n == boom["step"]:
            raise RuntimeError(f"injected fault in step {n} of {request_ids}")

    m = make_manager(tiny_llama, before_step=before_step)
    try:
        victim = m.add_request("victim", max_tokens=1000, temperature=0, ignore_eos=True)
        stream = m.stream(victim)
        next(stream)
        boom["step"] = m.engine.steps + 2
        with pytest.raises(EngineError, match=rf"injected fault in step {boom['step']} of \[{victim}\]"):
            for _ in stream:
                pass
        ids, _, reason = collect(m, m.add_request("survivor", max_tokens=5, temperature=0, ignore_eos=True))
        assert len(ids) == 5 and reason == "length"
        assert m.inflight == 0 and m.engine.block_manager.num_used_blocks == 0
    finally:
        m.close()


def test_a_fatal_device_error_ends_the_engine_and_every_open_request(tiny_llama):
    """A sticky CUDA error (what torch raises after an illegal memory access: no later step can succeed) is not
    one failed step: every open request ends with it, new ones are refused (503), on_dead hears of it."""
    from server.faults import device_fault

    boom, died = {"step": None}, []

    def before_step(n, request_ids):
        if n == boom["step"]:
            raise device_fault(n)

    m = make_manager(tiny_llama, before_step=before_step, on_dead=died.append, max_inflight_requests=8)
    try:
        streams = [m.stream(m.add_request(f"victim {i}", max_tokens=1000, temperature=0, ignore_eos=True))
                   for i in range(3)]
        for stream in streams:
            next(stream)
        boom["step"] = m.engine.steps + 2
        for stream in streams:
            with pytest.raises(EngineError, match="the device failed: CUDA error: an illegal memory access.*"
                                                  "this worker restarts"):
                for _ in stream:
                    pass
        assert len(died) == 1 and m.dead is died[0]
        with pytest.raises(ShutdownError, match="the device failed"):
            m.add_request("after", max_tokens=2)
        assert m.inflight == 0
    finally:
        m.close()


def test_closing_a_stream_early_aborts_and_frees(manager):
    rid = manager.add_request("abandon me", max_tokens=500, temperature=0, ignore_eos=True)
    stream = manager.stream(rid)
    next(stream)
    stream.close()
    assert manager.inflight == 0
    manager.add_request("flush", max_tokens=1)
    for _ in range(200):
        if manager.engine.block_manager.num_used_blocks == 0 and not manager.engine.seqs:
            break
        threading.Event().wait(0.01)
    assert not manager.engine.seqs or list(manager.engine.seqs) == [rid + 1]


def test_shutdown_fails_open_requests(tiny_llama):
    m = make_manager(tiny_llama, tokenize_workers=1)
    rid = m.add_request("long one", max_tokens=1000, temperature=0, ignore_eos=True)
    stream = m.stream(rid)
    next(stream)
    m.close()
    with pytest.raises(ShutdownError):
        for _ in stream:
            pass
    assert m.inflight == 0
    with pytest.raises(ShutdownError):
        m.add_request("after close")


def test_startup_objects_frozen_while_serving(manager, tiny_llama):
    """The loaded model and libraries are out of the collector's reach while a manager serves; the
    last one to close gives them back; freeze_gc=False leaves the collector alone."""
    assert manager.engine is not None and gc.get_freeze_count() > 0    # the module's manager froze them
    with make_manager(tiny_llama, freeze_gc=False) as plain:
        assert plain.wait_ready(60)
        assert id(plain) not in manager_module._gc_frozen_by
    with make_manager(tiny_llama) as m:
        assert m.wait_ready(60)
        model = m.engine.runner.model
        assert not any(o is model for o in gc.get_objects())   # frozen: in no generation a collection scans
        assert id(m) in manager_module._gc_frozen_by
    assert gc.get_freeze_count() > 0                   # the module's manager still holds the freeze
    others = set(manager_module._gc_frozen_by)
    manager_module._gc_frozen_by.clear()               # as if the module's manager were the last one...
    try:
        with make_manager(tiny_llama) as last:
            assert last.wait_ready(60)
            model = last.engine.runner.model
            assert gc.get_freeze_count() > 0
        assert gc.get_freeze_count() == 0              # ...its close unfreezes
        assert any(o is model for o in gc.get_objects())
    finally:
        manager_module._gc_frozen_by.update(others)
        gc.freeze()


def test_engine_runs_in_a_native_thread_under_gevent(tiny_llama):
    """Under monkey-patching the engine steps on a native thread of its own, and the hub keeps running
    greenlets while it does: a ticker greenlet advances between the engine's steps (it could not, were the
    engine loop a greenlet: it does not yield while it has work)."""
    code = textwrap.dedent(f"""
        from gevent import monkey; monkey.patch_all()
        import sys, gevent
        sys.setswitchinterval(0.0005)
        native_id = monkey.get_original("_thread", "get_native_id")
        from rosefast.serving.manager import SchedulerManager
        ticks, seen = [0], []
        def before_step(n, request_ids):   # on the engine thread
            seen.append((native_id(), ticks[0]))
        m = SchedulerManager(model={str(tiny_llama.path)!r}, dtype="float32", kv_cache_tokens=4096, waker="gevent",
                             tokenize_workers=1, before_step=before_step)
        def ticker():
            while True:
                ticks[0] += 1
                gevent.sleep(0.001)
        t = gevent.spawn(ticker)
        def client(i):
            rid = m.add_request("hello gevent %d" % i, max_tokens=40, temperature=0, ignore_eos=True)
            return sum(len(c.token_ids) for c in m.stream(rid))
        jobs = [gevent.spawn(client, i) for i in range(8)]
        gevent.joinall(jobs, timeout=60)
        t.kill()
        print(repr(([j.value for j in jobs], native_id(), seen, m.waker.wakes, m.engine.steps)))
        m.close()
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    values, hub_thread, seen, wakes, steps = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    assert values == [40] * 8
    engine_threads = {thread for thread, _ in seen}
    assert len(engine_threads) == 1 and hub_thread not in engine_threads   # one native thread ran every step
    assert seen[-1][1] > seen[0][1]   # the hub ran greenlets while the engine was busy stepping
    assert wakes <= steps             # at most one wakeup per engine step


def test_every_chunk_carries_the_prompt_length_and_the_slot_is_back_by_the_final_one(manager):
    ids = manager.tokenizer("how long was I")["input_ids"]
    for kwargs in ({"prompt": "how long was I"}, {"prompt_token_ids": ids}):
        rid = manager.add_request(**kwargs, max_tokens=3, temperature=0, ignore_eos=True)
        chunks = []
        for chunk in manager.stream(rid):
            chunks.append((chunk.prompt_tokens, chunk.finished, manager.inflight))
        assert chunks[-1] == (len(ids), True, 0)                 # released before the consumer saw the end
        assert all(p == len(ids) for p, done, _ in chunks)
        assert manager.requests.get(rid) is None                 # the record went with its stream


def test_a_discarded_request_leaves_nothing_behind(tiny_llama):
    # an answer that failed before its stream was read (server.routes): the request must not stay anywhere
    m = make_manager(tiny_llama)
    try:
        for n in (1, 3):
            rid = m.add_request("never read", max_tokens=200, temperature=0, ignore_eos=True, n=n)
            m.discard(rid)
            assert m.requests.get(rid) is None and m.inflight == 0
        collect(m, m.add_request(prompt_token_ids=[1, 2, 3], max_tokens=2, temperature=0))
        deadline = time.monotonic() + 10
        while m.bookkeeping() != dict.fromkeys(m.bookkeeping(), 0) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert m.bookkeeping() == dict.fromkeys(m.bookkeeping(), 0)
    finally:
        m.close()


def test_abort_while_tokenizing_never_reaches_the_engine(tiny_llama):
    gated = GatedTokenizer(load_tokenizer(tiny_llama))
    m = make_manager(tiny_llama, tokenize_workers=1, tokenizer=gated)
    try:
        rid = m.add_request("wait for me", max_tokens=50, temperature=0, ignore_eos=True)
        record = m.requests.get(rid)
        m.abort(rid)
        assert m.inflight == 0 and record.aborted
        stream = m.stream(rid)
        assert [(c.token_ids, c.finish_reason) for c in stream] == [([], "abort")]
        gated.gate.set()                       # the worker encodes it now, and drops it
        after = m.add_request(prompt_token_ids=[1, 2, 3], max_tokens=2, temperature=0, ignore_eos=True)
        collect(m, after)                      # the engine thread has handled everything queued before
        assert m.engine.stats()["sequences"] == 0 and m.engine.stats()["kv_blocks_used"] == 0
        assert m.bookkeeping() == dict.fromkeys(m.bookkeeping(), 0)
    finally:
        gated.gate.set()
        m.close()


def test_a_worker_loads_one_tokenizer_for_prompts_detokenizing_and_grammars(manager, monkeypatch):
    """The serving core, its engine and the engine's grammar compiler share the tokenizer the worker loaded."""
    import rosefast.build
    import rosefast.engine.llm_engine

    loads = []
    for module in (rosefast.build, rosefast.engine.llm_engine):   # the engine's door to the sources, and its name
        monkeypatch.setattr(module, "load_tokenizer", lambda *a, **k: loads.append(a))   # nothing loads it again
    assert manager.tokenizer is manager.engine.tokenizer
    assert manager.grammars._hf is manager.tokenizer and loads == []
