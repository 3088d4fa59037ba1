"""Priority scheduling (rosefast.engine.scheduler, rosefast.engine.waiting): the waiting admitted by priority then
arrival, a worse running sequence preempted for a better waiting one when the batch is full or blocks are short,
aging that bounds a wait, first come first served when asked; then the engine (the preempted finish whole and
equal to their run alone) and a real gunicorn (a high-priority request served while a full batch of low ones
runs, every low one whole, /metrics by priority class)."""
import threading
import time

import pytest
import requests

from rosefast.config import EngineConfig
from rosefast.engine.block_manager import BlockManager
from rosefast.engine.sampling_params import SamplingParams
from rosefast.engine.scheduler import Scheduler
from rosefast.engine.sequence import Sequence, SequenceStatus
from tests.serving import Server, tiny_env


def _scheduler(scheduling="priority", blocks=100, batch=4, prefill_batch=1, aging=0.0):
    config = EngineConfig(model="unused", block_size=4, max_batch_size=batch, prefill_max_batch_size=prefill_batch,
                          max_num_batched_tokens=64, speculative="off", scheduling=scheduling, priority_aging_s=aging)
    return Scheduler(config, BlockManager(blocks, 4, enable_prefix_cache=False))


def _seq(name, priority=0, tokens=8):
    return Sequence(name, [hash(name) % 1000 + i for i in range(tokens)], SamplingParams(max_tokens=4,
                                                                                         priority=priority))


def _admitted(scheduler, steps):
    """The names of the sequences each of `steps` prefill steps admits (decodes run between, as the engine does:
    the prefilled sequence's token is counted as computed)."""
    names = []
    for _ in range(steps):
        step = scheduler.schedule()
        if not step.is_prefill:
            step = scheduler.schedule()
        names.append([s.request_id for s in step.seqs])
        for seq, chunk in zip(step.seqs, step.chunks):
            seq.num_cached += chunk
    return names


def test_waiting_sequences_are_admitted_by_priority_then_arrival():
    scheduler = _scheduler()
    for name, priority in (("late-low", 5), ("a", 0), ("b", 0), ("urgent", -3), ("c", 0)):
        scheduler.add(_seq(name, priority))
    assert _admitted(scheduler, 4) == [["urgent"], ["a"], ["b"], ["c"]]


def test_first_come_first_served_ignores_priority():
    scheduler = _scheduler("fcfs")
    for name, priority in (("late-low", 5), ("a", 0), ("urgent", -3)):
        scheduler.add(_seq(name, priority))
    assert _admitted(scheduler, 3) == [["late-low"], ["a"], ["urgent"]]


@pytest.mark.parametrize("scheduling, preempted", [("priority", True), ("fcfs", False)])
def test_a_full_batch_gives_way_to_a_better_priority(scheduling, preempted):
    scheduler = _scheduler(scheduling, batch=2)
    low = [_seq(f"low{i}", 5) for i in range(2)]
    for seq in low:
        scheduler.add(seq)
    _admitted(scheduler, 2)
    assert len(scheduler.running) == 2
    scheduler.add(_seq("high", -1))
    step = scheduler.schedule()
    if not step.is_prefill:
        step = scheduler.schedule()
    if preempted:   # the newest of the worst gave way; it waits with its tokens kept
        assert step.is_prefill and [s.request_id for s in step.seqs] == ["high"]
        assert low[1].status is SequenceStatus.WAITING and low[1].num_cached == 0 and scheduler.preemptions == 1
        assert low[0].status is SequenceStatus.RUNNING
    else:
        assert not step.is_prefill and scheduler.preemptions == 0


def test_short_blocks_give_way_to_a_better_priority():
    scheduler = _scheduler(blocks=4, batch=8)   # 16 tokens: two 8-token prompts fill it
    low = [_seq(f"low{i}", 2) for i in range(2)]
    for seq in low:
        scheduler.add(seq)
    _admitted(scheduler, 2)
    scheduler.add(_seq("high", 0))
    assert _admitted(scheduler, 1) == [["high"]] and scheduler.preemptions == 1
    assert [s.request_id for s in scheduler.waiting] == ["low1"]


def test_equal_priorities_never_preempt_each_other():
    scheduler = _scheduler(batch=2, aging=1.0)
    for i in range(3):
        scheduler.add(_seq(f"s{i}", 0))
    _admitted(scheduler, 2)
    for _ in range(3):
        scheduler.schedule()
    assert scheduler.preemptions == 0 and [s.request_id for s in scheduler.waiting] == ["s2"]


def test_aging_lets_a_long_wait_pass_better_priorities():
    scheduler = _scheduler(aging=1.0)
    old = _seq("old-low", 3)
    scheduler.add(old)
    old.arrival -= 5.0   # it has waited 5 s: 3 - 5 = -2, ahead of a fresh -1
    scheduler.add(_seq("fresh-high", -1))
    assert _admitted(scheduler, 2) == [["old-low"], ["fresh-high"]]
    scheduler = _scheduler(aging=0.0)   # no aging: strict
    old = _seq("old-low", 3)
    scheduler.add(old)
    old.arrival -= 5.0
    scheduler.add(_seq("fresh-high", -1))
    assert _admitted(scheduler, 2) == [["fresh-high"], ["old-low"]]


def test_preempted_sequences_finish_whole_and_equal_to_their_run_alone(tiny_llama):
    from rosefast.engine.llm_engine import LLMEngine

    engine = LLMEngine(model=tiny_llama, dtype="float32", kv_cache_tokens=4096, max_batch_size=2,
                       speculative="off")
    params = dict(max_tokens=24, temperature=0, ignore_eos=True)
    alone = {}
    for i in range(3):
        rid = engine.add_request([10 + i, 20, 30, 40], SamplingParams(**params))
        alone[i] = _run_out(engine)[rid]
    low = {engine.add_request([10 + i, 20, 30, 40], SamplingParams(**params, priority=1)): i for i in range(3)}
    outs = {}
    for _ in range(4):   # both rows decoding, one low one waiting
        for out in engine.step().outputs:
            outs.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert len(engine.scheduler.running) == 2 and len(engine.scheduler.waiting) == 1
    high = engine.add_request([99, 98, 97], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True,
                                                          priority=-1))
    rest, order = _run_out(engine, order=True)
    for rid, tokens in rest.items():
        outs.setdefault(rid, []).extend(tokens)
    assert engine.scheduler.preemptions >= 1
    assert order.index(high) < min(order.index(r) for r in low)   # served first, while the batch was full
    assert {low[r]: outs[r] for r in low} == alone   # nothing lost, nothing changed


def _run_out(engine, order=False):
    """Step until idle: {request id: its tokens}, and the order the requests finished in."""
    outs, done = {}, []
    while engine.has_unfinished():
        for out in engine.step().outputs:
            outs.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finished:
                done.append(out.request_id)
    return (outs, done) if order else outs


@pytest.fixture(scope="module")
def two_rows(tiny_llama):
    s = Server(tiny_env(tiny_llama, max_batch_size=2, max_inflight_requests=0, speculative="off"))
    yield s
    s.stop()


def _stream(server, priority, tokens, ends, name):
    r = requests.post(server.url + "/v1/completions", json={
        "prompt": f"stream {name}", "max_tokens": tokens, "temperature": 0, "ignore_eos": True, "stream": True,
        "priority": priority, "stream_options": {"include_usage": True}}, stream=True, timeout=120)
    lines = [line for line in r.iter_lines() if line]
    ends.append((name, lines))


def test_a_high_priority_request_is_served_beside_a_full_batch_of_low_ones(two_rows):
    ends = []
    lows = [threading.Thread(target=_stream, args=(two_rows, 3, 400, ends, f"low{i}")) for i in range(4)]
    for t in lows:
        t.start()
    for _ in range(600):   # until both rows are held by low ones and the other two wait (counts, polled)
        if two_rows.metric("rosefast_running_requests") == 2 and two_rows.metric("rosefast_waiting_requests") == 2:
            break
        time.sleep(0.05)
    _stream(two_rows, -2, 4, ends, "high")
    for t in lows:
        t.join(120)
    names = [n for n, _ in ends]
    assert names[0] == "high"   # done while both rows were held by low ones and two more waited
    for name, lines in ends:     # and every low stream whole
        assert lines[-1] == b"data: [DONE]" and b'"error"' not in b"".join(lines)
        if name != "high":
            assert b'"completion_tokens":400,' in lines[-2]
    metrics = requests.get(two_rows.url + "/metrics", timeout=10).text
    assert 'rosefast_priority_requests_total{priority_class="high"} 1.0' in metrics
    assert 'rosefast_priority_requests_total{priority_class="low"} 4.0' in metrics
    assert 'rosefast_priority_ttft_seconds_count{priority_class="high"} 1.0' in metrics
    assert two_rows.metric("rosefast_preemptions_total") >= 1


def test_a_priority_that_is_not_an_integer_is_a_400(two_rows):
    for priority in ("high", 1.5, 1 << 40):
        r = requests.post(two_rows.url + "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "x"}], "priority": priority, "max_tokens": 1}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "priority", r.text
