"""Speculative decoding by prompt lookup: the same tokens as without it (greedy and seeded), the target
distribution kept (chi-square), blocks exact after rollback, and everything a request asks for held."""
from dataclasses import replace

import numpy as np
import pytest
import torch

from rosefast.engine.llm_engine import LLMEngine
from rosefast.engine.sampling_params import SamplingParams
from rosefast.engine.sequence import Sequence, SequenceStatus
from rosefast.engine.speculation import PRIOR_ROW_SHARE, NgramIndex, StepCost, Speculator
from rosefast.sources import load_tokenizer
from tests.test_sampler import ALPHA, chi_square_p

GREEDY = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)


def make_engine(model, mode, **kw):
    kw.setdefault("kv_cache_tokens", 4096)
    kw.setdefault("block_size", 4)
    kw.setdefault("dtype", "float32")
    return LLMEngine(model=model, speculative=mode, **kw)


@pytest.fixture(scope="module")
def tok(tiny_llama):
    return load_tokenizer(tiny_llama)


@pytest.fixture(scope="module")
def prompts(tok):
    """Copy-heavy prompts (a phrase repeated: the lookup finds what follows) and ones that do not repeat."""
    texts = ["The quick brown fox jumps over the lazy dog. " * 5, "one two three four five six seven " * 4,
             "Once upon a time in a land far away there lived a", "def f(x):\n    return x + 1\n" * 3, "Why?"]
    return [tok(t).input_ids for t in texts] + [list(range(200, 230)) * 3]


def drive(engine, arrivals, params, check=None):
    """arrivals: {step: [prompt, ...]}; {request id: tokens} (and `check(engine)` after every step)."""
    out, step = {}, 0
    while step <= max(arrivals) or engine.has_unfinished():
        for p in arrivals.get(step, []):
            out[engine.add_request(p, params)] = []
        result = engine.step()
        assert result.error is None, result.error
        for o in result.outputs:
            out[o.request_id] += o.new_token_ids
        if check is not None:
            check(engine)
        step += 1
    return [out[i] for i in sorted(out)]


def blocks_exact(engine):
    """Every running sequence holds blocks for its computed tokens and none past its newest token (the blocks of
    rejected proposals' rows were given back)."""
    bm = engine.block_manager
    bm.check()
    for seq in engine.scheduler.running:
        assert bm.blocks_for(seq.num_cached) <= len(seq.block_table) <= bm.blocks_for(seq.num_tokens), seq


def test_the_index_proposes_what_followed_the_latest_longest_match():
    index = NgramIndex()
    tokens = [1, 2, 3, 4, 9, 2, 3, 5, 7, 1, 2, 3]
    assert index.propose(tokens, 3) == [4, 9, 2]          # (2, 3) last seen at 5..6, (1, 2, 3) at 0..2: longest wins
    assert index.propose(tokens, 3) == [4, 9, 2]          # again, nothing re-indexed
    assert NgramIndex().propose([1, 2, 3, 4, 9, 2, 3, 5, 7, 8, 2, 3], 3) == [5, 7, 8]   # the latest (2, 3)
    assert NgramIndex().propose([1, 2, 3, 4], 4) == []     # no earlier occurrence of any suffix
    assert NgramIndex().propose([5, 5, 5], 4) == [5]        # the suffix itself is never its own match
    grown = NgramIndex()
    seq = [7, 8, 1, 2]
    assert grown.propose(seq, 2) == []
    seq += [7, 8]                                           # grows with the tokens: the new positions indexed
    assert grown.propose(seq, 2) == [1, 2]


@pytest.mark.parametrize("dtype,quantization", [("float32", "none"), ("bfloat16", "none"), ("float32", "int4")])
def test_greedy_tokens_equal_decoding_without_speculation(tiny_llama, prompts, dtype, quantization):
    """Batch 1: the proposals' rows beside the sequence's own (on the block kernels too, with int4)."""
    want = [make_engine(tiny_llama, "off", dtype=dtype, quantization=quantization)
            .generate([p], GREEDY, use_tqdm=False)[0]["token_ids"] for p in prompts]
    engine = make_engine(tiny_llama, "ngram", dtype=dtype, quantization=quantization)
    got = [drive(engine, {0: [p]}, GREEDY, check=blocks_exact)[0] for p in prompts]   # batch 1
    assert got == want
    stats = engine.stats()
    assert stats["spec_accepted"] > 0 and stats["spec_proposed"] > stats["spec_accepted"]   # kept and rejected
    assert engine.steps < sum(len(w) for w in want)   # fewer steps than tokens
    assert engine.block_manager.num_used_blocks == 0
    engine.block_manager.check()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_verification_step_computes_each_row_as_its_sequences_decode_step(tiny_llama, prompts, dtype):
    """Three sequences with four proposals each are 15 rows: on the AMX kernel tier that many rows would take the
    tiles (on the AVX2 tier its fp32 FMAs), whose last bits differ from the integer kernels' that three sequences'
    plain decode step runs. The verification step takes its sequences' path (quant_ops.decoding), so each row's
    logits are bit for bit what a plain decode computes (and greedy tokens the same as without speculation, at any
    batch)."""
    from rosefast.engine.model_runner import SeqInput
    from rosefast.kernels import quant_ops

    engine = make_engine(tiny_llama, "off", dtype=dtype, quantization="int4")
    for p in prompts[:3]:
        engine.add_request(p, GREEDY)
    for _ in range(3):   # the prompts' prefill, then decode steps
        engine.step()
    seqs = list(engine.scheduler.running)
    assert len(seqs) == 3 and all(s.num_output_tokens > 0 for s in seqs)
    bm = engine.block_manager
    base = [SeqInput(s.token_ids[-1:], s.num_cached, s.block_table) for s in seqs]
    rows = []
    for s, b in zip(seqs, base):
        bm.reserve(s, s.num_tokens + 4)
        rows += [b] + [SeqInput([s.token_ids[-1]], s.num_cached + 1 + j, s.block_table) for j in range(4)]
    with quant_ops.decoding(len(seqs)):
        verified = engine.runner.forward(rows, False)
    on_rows = engine.runner.forward(rows, False)   # the same rows, the path picked by their count
    plain = engine.runner.forward(base, False)
    for s in seqs:
        bm.trim(s)
    firsts = torch.arange(0, 15, 5)
    assert torch.equal(verified[firsts], plain)
    kernels = engine.runner.model.layers[0].down.kernels
    own = kernels.own_numbers_from(getattr(torch, dtype)) if kernels is not None else None
    if own is not None:   # the AMX or AVX2 tier here: 3 rows on one path, 15 on the other
        assert len(seqs) < own <= len(rows)
        assert not torch.equal(on_rows[firsts], plain)   # what the verification step would otherwise compute


def test_the_engine_verifies_what_its_proposer_gives_and_keeps_the_greedy_tokens(tiny_llama, prompts):
    """The proposer is the speculator's (room for a draft model): one that knows the greedy continuation
    (benches/speculative_ceiling.py's) has every token kept, one that is always wrong none — the tokens are the
    same either way, batched, and the blocks exact."""
    from benches.speculative_ceiling import RecordedContinuation

    off = make_engine(tiny_llama, "off")
    want = drive(off, {0: prompts[:3], 1: prompts[3:]}, GREEDY)
    for proposer, all_kept in ((RecordedContinuation(prompts, want), True),
                               (lambda seq, k: [(seq.token_ids[-1] + 1 + j) % 97 for j in range(k)], False)):
        engine = make_engine(tiny_llama, "ngram")
        engine.speculator.proposer = proposer
        assert drive(engine, {0: prompts[:3], 1: prompts[3:]}, GREEDY, check=blocks_exact) == want
        stats = engine.stats()
        if all_kept:   # 8 proposed a step (speculative_tokens), all kept: 9 tokens a decode step
            assert stats["spec_accepted"] == stats["spec_proposed"] >= 0.7 * sum(map(len, want))
            assert engine.steps * 4 < off.steps
        else:
            assert stats["spec_proposed"] > 0 and stats["spec_accepted"] < 0.1 * stats["spec_proposed"]
        assert engine.block_manager.num_used_blocks == 0


def test_batches_prefix_cache_chunked_prefill_and_preemption_cross_speculative_steps(tiny_llama, prompts):
    arrivals = {0: prompts[:3], 2: prompts[3:], 5: prompts[:2]}   # the last two hit the prefix cache
    off = make_engine(tiny_llama, "off", max_num_batched_tokens=24, kv_cache_tokens=160)
    want = drive(off, arrivals, GREEDY)
    engine = make_engine(tiny_llama, "ngram", max_num_batched_tokens=24, kv_cache_tokens=160)
    assert drive(engine, arrivals, GREEDY, check=blocks_exact) == want
    stats = engine.stats()
    assert stats["preemptions"] > 0 and stats["prefix_cache_hits"] > 0 and stats["spec_accepted"] > 0
    assert engine.block_manager.num_used_blocks == 0


def test_seeded_sampling_gives_the_same_tokens_with_penalties_bias_and_logprobs(tiny_llama, prompts):
    params = [SamplingParams(max_tokens=30, temperature=0.8, top_k=8, seed=s, ignore_eos=True, logprobs=3,
                             repetition_penalty=1.1, frequency_penalty=0.2, presence_penalty=0.1,
                             logit_bias={100: 2.0}, min_tokens=5) for s in range(len(prompts))]
    greedy_low = [SamplingParams(max_tokens=30, temperature=0.05, top_k=2, seed=s, ignore_eos=True, logprobs=2)
                  for s in range(len(prompts))]
    for plist in (params, greedy_low):
        want = make_engine(tiny_llama, "off").generate(prompts, plist, use_tqdm=False)
        engine = make_engine(tiny_llama, "ngram")
        got = engine.generate(prompts, plist, use_tqdm=False)
        assert [g["token_ids"] for g in got] == [w["token_ids"] for w in want]
        for g, w in zip(got, want):   # the same entries, their values within the rounding any batching gives
            assert [[t for t, _ in top] for _, top in g["logprobs"]] == [[t for t, _ in top] for _, top in w["logprobs"]]
            assert np.allclose([lp for lp, _ in g["logprobs"]], [lp for lp, _ in w["logprobs"]], atol=1e-4)
    assert engine.stats()["spec_accepted"] > 0


def test_a_grammar_takes_only_kept_tokens_and_no_forbidden_proposal(tiny_llama):
    engine = make_engine(tiny_llama, "ngram")
    off = make_engine(tiny_llama, "off")
    grammar = engine.grammars.compile("regex", "(ab ){3,12}end")
    prompt = engine.tokenizer("ab ab ab ab ab ab ab ab").input_ids
    params = SamplingParams(max_tokens=40, temperature=0, grammar=grammar)
    got = engine.generate([prompt], params, use_tqdm=False)[0]
    want = off.generate([prompt], SamplingParams(max_tokens=40, temperature=0,
                                                 grammar=off.grammars.compile("regex", "(ab ){3,12}end")),
                        use_tqdm=False)[0]
    assert got["token_ids"] == want["token_ids"] and got["finish_reason"] == want["finish_reason"]
    assert engine.stats()["spec_accepted"] > 0


def test_the_sampled_next_token_follows_the_target_distribution_when_a_proposal_is_checked(tiny_llama, tok):
    """The token drawn where a proposal is verified (the first decode step: its lookup proposes what followed the
    same bigram earlier in the prompt) follows the processed distribution; a proposal taken without the check
    (its token, whatever the draw) fails this."""
    temperature, top_k = 1.0, 4
    base = tok("Alice told Bob that the garden was full of birds and").input_ids
    off = make_engine(tiny_llama, "off")

    def next_probs(context):   # the processed next-token distribution: the top k of the raw logprobs, at T
        out = off.generate([context], SamplingParams(max_tokens=1, temperature=0, logprobs=20), use_tqdm=False)[0]
        top = out["logprobs"][0][1][:top_k]
        w = np.exp(np.array([lp for _, lp in top]) / temperature)
        return [t for t, _ in top], w / w.sum()

    # a prompt ending in `t`, that began with (t, v) followed by a token the model gives no probability there
    t = base[-1]
    candidates = next_probs(base)[0]   # tried in turn, with what each prompt made likely (the model is random)
    for v in candidates[:16]:
        rare = next(x for x in range(1000, 2000) if x not in candidates)
        prompt = [t, v, rare, rare + 1] + base
        first, p_first = next_probs(prompt)
        if v in first and p_first[first.index(v)] > 0.15:
            break
        candidates += [x for x in first if x not in candidates]
    else:
        pytest.fail("no first token likely enough for this random model")
    seeds = range(4000)
    sampled = SamplingParams(max_tokens=1, temperature=temperature, top_k=top_k, ignore_eos=True)
    outs = off.generate([prompt] * len(seeds), [replace(sampled, seed=s) for s in seeds], use_tqdm=False)
    seeds = [s for s, o in zip(seeds, outs) if o["token_ids"] == [v]][:800]   # the first token is v for these
    engine = make_engine(tiny_llama, "ngram", kv_cache_tokens=1 << 16)
    two = engine.generate([prompt] * len(seeds), [replace(sampled, seed=s, max_tokens=3) for s in seeds],
                          use_tqdm=False)
    assert all(o["token_ids"][0] == v for o in two)
    assert engine.stats()["spec_proposed"] >= len(seeds)   # every second token was drawn against a proposal
    support, p = next_probs(prompt + [v])
    counts = np.array([sum(o["token_ids"][1] == x for o in two) for x in support])
    assert counts.sum() == len(seeds)                       # never the proposal (outside the top k)
    assert chi_square_p(counts, p) > ALPHA


def steep(cost):
    """Steps whose every row costs what the weights' read does (t_row / t0 = 1): rows are not nearly free."""
    for rows in (1, 4, 8, 2) * 10:
        cost.observe(rows, 0.005 * (1 + rows))
    return cost


def test_the_step_cost_fit_reads_the_row_share_of_the_engines_steps():
    cost = StepCost()
    assert cost.row_share() == PRIOR_ROW_SHARE          # nothing seen
    for _ in range(20):
        cost.observe(3, 0.016)
    assert cost.row_share() == PRIOR_ROW_SHARE          # one row count: no slope to read
    for rows in (1, 2, 5, 8) * 20:
        cost.observe(rows, 0.010 + 0.002 * rows)
    assert cost.row_share() == pytest.approx(0.2, rel=0.05)
    assert steep(StepCost()).row_share() == pytest.approx(1.0, rel=0.05)
    measured = StepCost()                               # the counts seen decide, where they are known
    for rows, seconds in ((1, 0.010), (2, 0.011), (4, 0.013), (5, 0.0165)) * 3:
        measured.observe(rows, seconds)
    assert measured.threshold(1, 1) == pytest.approx(0.1)          # a second row: a tenth of the step's token
    assert measured.threshold(4, 4) == pytest.approx(0.0035 * 4 / 0.013)   # a fifth row: more than a token's time
    share = 3 * measured.row_share()
    assert measured.threshold(3, 6) == pytest.approx(share / (1 + share))   # not seen: the fit


def test_auto_speculates_only_where_it_pays(tiny_llama, prompts):
    engine = make_engine(tiny_llama, "auto")
    steep(engine.speculator.cost)
    engine.generate([prompts[0]] * 9, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True), use_tqdm=False)
    assert engine.stats()["spec_proposed"] == 0   # 9 rows a step, each as dear as the weights' read: nothing pays
    engine.speculator.cost = StepCost()
    engine.generate(prompts[:1], GREEDY, use_tqdm=False)
    assert engine.stats()["spec_accepted"] > 0    # one sequence, rows at the prior's share: it speculates


def test_auto_sizes_a_proposal_by_the_sequences_acceptance_and_pauses_one_that_fails():
    spec = Speculator("auto", 8, block_size=4)
    seq = Sequence("a", [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4], SamplingParams(max_tokens=50))
    seq.status, seq.block_table = SequenceStatus.RUNNING, [0, 1, 2, 3]
    # at the prior (0.6) and one stream (row share 0.4, threshold 0.29): 2 tokens; its 4-token match would reach 8
    assert spec.plan([seq], 1000, free_blocks=8) == {0: [5, 6]}
    for _ in range(6):
        spec.record(seq, 3, 3)                    # all kept, again and again: the proposals grow to 8
    assert seq.speculation.acceptance > 0.9 and spec.plan([seq], 1000, free_blocks=8) == {0: [5, 6, 7, 8, 9, 1, 2, 3]}
    lengths = []
    for _ in range(5):
        spec.record(seq, 3, 0)                    # nothing kept: no pause (copying resumes after a change), but
        lengths.append(len(spec.plan([seq], 1000, free_blocks=8).get(0, ())))   # its proposals shrink
    assert lengths == [8, 5, 3, 2, 1] and seq.speculation.pause == 0
    spec.record(seq, 3, 2)
    assert spec.stats() == {"spec_proposed": 36, "spec_accepted": 20, "spec_steps": 0}
    for _ in range(12):
        seq.speculation.verified(4, 0)            # acceptance far below the threshold: a pause, then one token
    seq.speculation.pause, seq.speculation.backoff = 0, 2
    assert spec.plan([seq], 1000, free_blocks=8) == {} and seq.speculation.pause == 2
    assert spec.plan([seq], 1000, free_blocks=8) == spec.plan([seq], 1000, free_blocks=8) == {}
    assert spec.plan([seq], 1000, free_blocks=8) == {0: [5]}
    spec.record(seq, 1, 0)                        # the probe failed: a longer pause
    assert spec.plan([seq], 1000, free_blocks=8) == {} and seq.speculation.pause == 4


def test_proposals_never_run_past_the_blocks_the_context_or_max_tokens():
    seq = Sequence("a", [1, 2, 3, 1, 2, 3, 1, 2], SamplingParams(max_tokens=50))
    seq.status, seq.block_table = SequenceStatus.RUNNING, [0, 1]
    ngram = Speculator("ngram", 4, block_size=4)
    assert ngram.plan([seq], 1000, free_blocks=8) == {0: [3, 1, 2]}   # what followed (2, 3, 1, 2) last time
    assert ngram.plan([seq], 1000, free_blocks=0) == {}         # its rows need a block past its two: none free
    assert ngram.plan([seq], 10, free_blocks=8) == {0: [3]}     # the context ends at 10 tokens
    assert Speculator("ngram", 4, 4, max_rows=3).plan([seq], 1000, free_blocks=8) == {0: [3, 1]}   # 3 rows a step
    assert Speculator("ngram", 4, 4, max_rows=2).plan([seq, seq], 1000, free_blocks=8) == {}
    seq.params = SamplingParams(max_tokens=1)
    assert ngram.plan([seq], 1000, free_blocks=8) == {}         # max_tokens: no room past the next token
    assert Speculator("off", 4, 4).enabled is False


def test_speculative_settings_are_checked():
    from rosefast.config import EngineConfig

    with pytest.raises(ValueError, match="speculative must be one of auto, off, ngram"):
        EngineConfig(speculative="eagle")
    with pytest.raises(ValueError, match="speculative_tokens"):
        EngineConfig(speculative_tokens=-1)


def test_proposals_are_cut_where_the_grammar_forbids_them(tiny_llama, tok):
    engine = make_engine(tiny_llama, "ngram")
    seven, eight, x = (tok(c).input_ids[0] for c in ("7", "8", "x"))
    params = SamplingParams(max_tokens=20, grammar=engine.grammars.compile("regex", "[0-9]+"))
    seq = Sequence("g", [x, eight, seven, x, x, eight], params)
    seq.status, seq.block_table = SequenceStatus.RUNNING, [0, 1]
    assert engine.speculator.plan([seq], 1000, free_blocks=8) == {0: [seven]}   # not the x after it
    seq = Sequence("h", [seven, eight, x, seven, seven, eight], params)
    seq.status, seq.block_table = SequenceStatus.RUNNING, [0, 1]
    assert engine.speculator.plan([seq], 1000, free_blocks=8) == {}             # x first: nothing to propose


def test_stop_strings_logprobs_and_usage_through_the_serving_layer_equal_decoding_without(tiny_llama):
    from rosefast.serving.manager import SchedulerManager

    def run(mode, **kw):
        m = SchedulerManager(model=tiny_llama, dtype="float32", kv_cache_tokens=8192, block_size=8, speculative=mode)
        try:
            ids, text, reason, lps = [], [], None, []
            for chunk in m.stream(m.add_request(prompt_token_ids=list(range(200, 230)) * 3, max_tokens=40,
                                                temperature=0, ignore_eos=True, logprobs=1, **kw)):
                ids += chunk.token_ids
                text.append(chunk.text)
                lps += [lp for lp, _ in chunk.logprobs or ()]
                reason = chunk.finish_reason
            return ids, "".join(text), reason, lps, m.engine_stats()
        finally:
            m.close()

    ids, full, _, _, _ = run("off")
    assert run("ngram")[:3] == (ids, full, "length")
    # a stop string that first ends at a token a speculative step gave with more after it
    engine = make_engine(tiny_llama, "ngram", block_size=8)
    engine.add_request(list(range(200, 230)) * 3, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    inner = []   # the token counts, after the first, where a step's tokens go on
    while engine.has_unfinished():
        for out in engine.step().outputs:
            inner += range(len(inner) + 1, len(inner) + len(out.new_token_ids))
            inner.append(None)
    tok = load_tokenizer(tiny_llama)
    ends = [len(tok.decode(ids[:j])) for j in inner if j]
    stop = next(full[e - n:e] for e in ends for n in range(3, e + 1) if full.index(full[e - n:e]) == e - n)
    for stop in (stop, full[len(full) // 3:len(full) // 3 + 3]):
        want = run("off", stop=[stop])
        got = run("ngram", stop=[stop])
        assert got[:3] == want[:3] and got[2] == "stop" and got[1] == full[:full.index(stop)]
        assert np.allclose(got[3], want[3], atol=1e-4) and len(got[3]) == len(got[0])
        assert got[4]["spec_accepted"] > 0


def test_over_http_the_default_server_speculates_and_gives_the_tokens_it_gives_without(tiny_llama):
    import openai

    from tests.serving import Server, tiny_env

    from rosefast.serving.manager import SchedulerManager

    prompt = list(range(200, 230)) * 3
    off = SchedulerManager(model=tiny_llama, dtype="float32", kv_cache_tokens=4096, speculative="off")
    try:
        want = "".join(off.stream_text(off.add_request(prompt_token_ids=prompt, max_tokens=40, temperature=0,
                                                       ignore_eos=True)))
    finally:
        off.close()
    server = Server(tiny_env(tiny_llama))   # speculative: auto, the default
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        got = client.completions.create(model="tiny", prompt=prompt, max_tokens=40, temperature=0,
                                        extra_body={"ignore_eos": True})
        assert got.choices[0].text == want and got.usage.completion_tokens == 40
        accepted, proposed = server.metric("rosefast_spec_accepted_tokens_total"), \
            server.metric("rosefast_spec_proposed_tokens_total")
        assert 0 < accepted <= proposed and server.metric("rosefast_spec_steps_total") > 0
        assert server.metric("rosefast_spec_acceptance_rate") == pytest.approx(accepted / proposed)
    finally:
        server.stop()
