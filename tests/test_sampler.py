"""The batched sampler: distributions against the analytic ones, penalties against their formulas, bans,
seeds that ignore the batch, logprobs against Hugging Face, one host copy, bad parameters named."""
import math
import traceback
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rosefast.engine import _sample_ops_py, sample_ops
from rosefast.engine.llm_engine import LLMEngine
from rosefast.engine.sampler import Sampler, seeded_uniform
from rosefast.engine.sampling_params import SamplingParams
from rosefast.engine.sequence import Sequence
from tests.conftest import REQUIRE_EXTENSIONS

ALPHA = 1e-3   # significance of each chi-square test (the draws are seeded: each run gives the same verdict)
DRAWS = 20_000


@pytest.fixture(params=["c", "py"])
def ops(request, monkeypatch):
    """Run the test on the compiled sampling kernels and on their torch twin."""
    if request.param == "py":
        monkeypatch.setattr(sample_ops, "impl", _sample_ops_py)
    elif sample_ops.impl is _sample_ops_py:
        if REQUIRE_EXTENSIONS:
            raise AssertionError("the compiled sampling kernels are not built")
        pytest.skip("compiled sampling kernels not built")
    return request.param


@dataclass
class Row:
    """What the sampler reads of a sequence, without a prompt to build."""
    params: SamplingParams
    seed: int = 0
    num_tokens: int = 10
    request_id: object = None
    token_ids: list = field(default_factory=list)
    num_prompt_tokens: int = 0
    stop_ids: frozenset = frozenset()

    @property
    def num_output_tokens(self):
        return len(self.token_ids) - self.num_prompt_tokens


def fixed_row(vocab=40, seed=0):
    return torch.randn(vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2


def analytic(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """The distribution the settings define, in float64 (temperature, top_k, top_p, min_p: vLLM's order)."""
    x = logits.numpy() / temperature
    if 0 < top_k < len(x):
        x = np.where(x < np.sort(x)[-top_k], -np.inf, x)
    p = np.exp(x - x.max())
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p)
        before = np.cumsum(p[order]) - p[order]
        p[order[before >= top_p]] = 0.0
        p /= p.sum()
    if min_p > 0:
        p = np.where(p < min_p * p.max(), 0.0, p)
        p /= p.sum()
    return p


def chi_square_p(counts, probs):
    """The p-value of counts against probs, bins with an expected count under 5 merged into one."""
    expected = probs * counts.sum()
    big = expected >= 5
    obs, exp = list(counts[big]), list(expected[big])
    if expected[~big].sum() > 0:
        obs.append(counts[~big].sum())
        exp.append(expected[~big].sum())
    obs, exp = np.array(obs, dtype=np.float64), np.array(exp)
    stat = ((obs - exp) ** 2 / exp).sum()
    dof = len(obs) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


SETTINGS = [dict(temperature=0.7), dict(temperature=1.0, top_k=6), dict(temperature=1.0, top_p=0.8),
            dict(temperature=1.0, min_p=0.1), dict(temperature=1.3, top_k=12, top_p=0.9, min_p=0.02)]


@pytest.mark.parametrize("settings_", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
@pytest.mark.parametrize("streams", ["seeds", "positions"])
def test_draws_follow_the_analytic_distribution(settings_, streams, ops):
    """20,000 draws from one fixed logits row: across 20,000 seeds at one position, and along one seeded
    request's positions. Tokens the settings exclude are never drawn."""
    logits = fixed_row()
    params = SamplingParams(**settings_)
    if streams == "seeds":
        rows = [Row(params, seed=s) for s in range(DRAWS)]
    else:
        rows = [Row(params, seed=12345, num_tokens=pos) for pos in range(DRAWS)]
    tokens = Sampler(len(logits))(logits.float().expand(DRAWS, -1), rows).token_ids
    counts = np.bincount(tokens, minlength=len(logits))
    probs = analytic(logits, **settings_)
    assert counts[probs == 0].sum() == 0
    assert chi_square_p(counts, probs) > ALPHA


def test_the_chi_square_check_rejects_a_wrong_distribution(ops):
    """The check itself has power: the same draws fail against the untempered distribution."""
    logits = fixed_row()
    tokens = Sampler(len(logits))(logits.float().expand(DRAWS, -1),
                                  [Row(SamplingParams(temperature=0.7), seed=s) for s in range(DRAWS)]).token_ids
    assert chi_square_p(np.bincount(tokens, minlength=len(logits)), analytic(logits, 1.0)) < ALPHA


def test_seeded_uniforms_are_uniform_and_keyed_by_seed_and_position():
    seeds = torch.arange(DRAWS, dtype=torch.long) * 7919 + (1 << 40)
    u = seeded_uniform(seeds, torch.full((DRAWS,), 3, dtype=torch.long))
    assert (u > 0).all() and (u <= 1).all()
    counts = np.histogram(u.numpy(), bins=20, range=(0, 1))[0]
    assert chi_square_p(counts, np.full(20, 1 / 20)) > ALPHA
    again = seeded_uniform(seeds[:5], torch.full((5,), 3, dtype=torch.long))
    assert torch.equal(again, u[:5])
    assert not torch.equal(seeded_uniform(seeds[:5], torch.full((5,), 4, dtype=torch.long)), u[:5])


def penalized_reference(logits, prompt, outputs, rep, freq, pres):
    out = logits.clone()
    for t in range(len(out)):
        if t in prompt or t in outputs:
            out[t] = out[t] / rep if out[t] > 0 else out[t] * rep
        n = outputs.count(t)
        out[t] -= freq * n + pres * (n > 0)
    return out


def test_penalties_change_the_logits_as_defined_and_follow_each_new_token(ops):
    V = 30
    logits = torch.randn(V, generator=torch.Generator().manual_seed(1)) * 3
    params = SamplingParams(temperature=0, repetition_penalty=1.7, frequency_penalty=0.4, presence_penalty=0.3)
    seq = Sequence("r", [3, 5, 5, 9], params)
    seq.token_ids += [5, 7, 7, 7]                       # outputs so far (e.g. before a preemption)
    sampler = Sampler(V)
    for _ in range(4):
        prompt, outputs = seq.token_ids[:4], seq.token_ids[4:]
        x = logits[None].clone()
        sampler.process(x, [seq])
        want = penalized_reference(logits, prompt, outputs, 1.7, 0.4, 0.3)
        assert torch.allclose(x[0], want, atol=1e-6)
        token = sampler(logits[None], [seq]).token_ids[0]
        assert token == int(want.argmax())            # greedy takes the processed argmax
        seq.token_ids.append(token)                    # as the engine does; the sampler counted it already
    sampler.release("r")
    assert len(sampler.penalties) == 0 and not sampler.penalties.counts.any()


def test_logit_bias_is_uploaded_once_per_sequence_and_dropped_when_it_ends(ops):
    """Each sequence's logit_bias goes to the device once, when it first comes, and is added from there every
    step (not re-expanded into Python lists per row per step); rows in any order get their own."""
    V = 50
    sampler = Sampler(V)
    a = Row(SamplingParams(temperature=0, logit_bias={7: 100}), request_id="a")
    b = Row(SamplingParams(temperature=0, logit_bias={9: 100, 7: -100}), request_id="b")
    c = Row(SamplingParams(temperature=0), request_id="c")
    logits = torch.randn(3, V)
    plain = int(logits[2].argmax())
    assert sampler(logits, [a, b, c]).token_ids == [7, 9, plain]
    made = sampler._bias["a"]
    for _ in range(3):
        assert sampler(logits, [b, a, c]).token_ids == [9, 7, plain]
        assert sampler._bias["a"] is made and set(sampler._bias) == {"a", "b"}
    sampler.release("a")
    assert set(sampler._bias) == {"b"}


def test_logit_bias_minus_100_bans_a_token_and_min_tokens_holds_eos_off(ops):
    V = 20
    logits = torch.zeros(1, V)
    logits[0, 3] = 12.0                                 # by far the likeliest
    banned = SamplingParams(temperature=1.0, logit_bias={"3": -100})
    rows = [Row(banned, seed=s) for s in range(2000)]
    assert 3 not in Sampler(V)(logits.expand(2000, -1), rows).token_ids
    assert Sampler(V)(logits, [Row(SamplingParams(temperature=0, logit_bias={3: -100}))]).token_ids != [3]
    eos = torch.zeros(1, V)
    eos[0, 0] = 12.0                                    # EOS (id 0) is the argmax
    params = SamplingParams(temperature=0, min_tokens=2, max_tokens=5)
    picks = [Sampler(V)(eos, [Row(params, token_ids=[1] * n, stop_ids=frozenset({0}))]).token_ids[0]
             for n in range(4)]
    assert picks[0] != 0 and picks[1] != 0 and picks[2:] == [0, 0]


def test_the_allowed_token_mask_is_applied_before_sampling(ops):
    V = 70
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(2))
    allowed_ids = [[5, 40, 69], [0, 33]]
    bitmask = torch.zeros(2, (V + 31) // 32, dtype=torch.int32)
    for r, ids in enumerate(allowed_ids):
        for t in ids:
            bitmask[r, t // 32] |= torch.tensor(1 << (t % 32), dtype=torch.int64).to(torch.int32)
    rows = [Row(SamplingParams(temperature=1.0), seed=s) for s in range(3)]
    for _ in range(50):
        for r in rows:
            r.num_tokens += 1
        out = Sampler(V)(logits, rows, allowed=(torch.tensor([0, 2]), bitmask)).token_ids
        assert out[0] in allowed_ids[0] and out[2] in allowed_ids[1]


def test_a_seeded_request_gets_the_same_tokens_in_any_batch(tiny_llama, ops):
    engine = LLMEngine(model=tiny_llama, dtype="float32", kv_cache_tokens=16384, block_size=16, max_batch_size=64)
    prompt = engine.tokenizer("a seeded request").input_ids
    mine = SamplingParams(max_tokens=24, temperature=1.0, top_p=0.9, seed=7, ignore_eos=True)
    alone = engine.generate([prompt], mine, use_tqdm=False)[0]["token_ids"]
    rng = np.random.default_rng(0)
    for batch in (8, 32):
        others = [SamplingParams(max_tokens=int(rng.integers(4, 30)), temperature=float(rng.uniform(0.3, 1.5)),
                                 top_k=int(rng.integers(0, 50)), min_p=float(rng.uniform(0, 0.1)),
                                 frequency_penalty=float(rng.uniform(0, 1)), seed=int(rng.integers(0, 1000)),
                                 ignore_eos=True) for _ in range(batch - 1)]
        prompts = [engine.tokenizer(f"another prompt number {i}").input_ids for i in range(batch - 1)]
        where = batch // 2
        out = engine.generate(prompts[:where] + [prompt] + prompts[where:], others[:where] + [mine] + others[where:],
                              use_tqdm=False)
        assert out[where]["token_ids"] == alone
    assert len(set(alone)) > 3   # it does sample


def test_rows_without_a_seed_draw_from_the_engines_generator(tiny_llama):
    def run(seed):
        engine = LLMEngine(model=tiny_llama, dtype="float32", kv_cache_tokens=4096, seed=seed)
        return [r["token_ids"] for r in engine.generate(["one", "two"], SamplingParams(max_tokens=12, ignore_eos=True),
                                                        use_tqdm=False)]
    assert run(0) == run(0) and run(0) != run(1)


def test_logprobs_equal_hugging_face_log_softmax_on_the_real_model(default_model):
    from rosefast.sources import load_hf_model

    engine = LLMEngine(model=default_model, dtype="float32", kv_cache_tokens=4096, quantization="none")
    prompt = engine.tokenizer("The capital of France is").input_ids
    for params in (SamplingParams(max_tokens=5, temperature=0, logprobs=5),
                   SamplingParams(max_tokens=5, temperature=0.8, top_k=20, seed=3, logprobs=3)):
        out = engine.generate([prompt], params, use_tqdm=False)[0]
        hf = load_hf_model(default_model)
        with torch.inference_mode():
            ref = torch.log_softmax(hf(torch.tensor([prompt + out["token_ids"]])).logits[0].float(), dim=-1)
        for j, (token, (chosen, top)) in enumerate(zip(out["token_ids"], out["logprobs"])):
            row = ref[len(prompt) - 1 + j]                         # raw distribution: before any processing
            assert abs(chosen - float(row[token])) < 1e-4
            values, ids = row.topk(params.logprobs)
            assert [t for t, _ in top] == ids.tolist()
            assert max(abs(lp - float(v)) for (_, lp), v in zip(top, values)) < 1e-4


def test_the_pass_makes_one_host_copy_and_stays_on_the_logits_device():
    """On the meta device every op runs without data: the one place the pass needs values on the host is
    its final copy of the ids (and logprobs), so that is where it must stop; a CPU tensor mixed in would
    raise earlier."""
    plist = [SamplingParams(temperature=0.8, top_k=5, top_p=0.9, min_p=0.05, seed=3),
             SamplingParams(temperature=0, repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.2,
                            logit_bias={7: -100}, min_tokens=2, logprobs=3),
             SamplingParams(temperature=1.0, top_p=0.5)]
    for with_logprobs in (True, False):
        ps = plist if with_logprobs else [SamplingParams(temperature=1.0, top_p=0.5, frequency_penalty=0.1)] * 3
        seqs = [Sequence(i, [1, 2, 3], p, (0,), seed=i) for i, p in enumerate(ps)]
        with pytest.raises(NotImplementedError, match="meta") as e:
            Sampler(64, "meta")(torch.randn(3, 64, device="meta"), seqs)
        frames = [f for f in traceback.extract_tb(e.value.__traceback__) if f.filename.endswith("sampler.py")]
        assert ".tolist()" in frames[-1].line, frames[-1]


@pytest.mark.parametrize("field, value, message", [
    ("max_tokens", 0, "max_tokens must be >= 1"),
    ("top_p", 0.0, "top_p must be in"),
    ("top_p", 1.5, "top_p must be in"),
    ("temperature", -0.1, r"temperature must be in \[0.0"),
    ("temperature", float("nan"), "temperature must be a finite number"),
    ("top_k", -2, "top_k must be >= -1"),
    ("min_p", 1.5, r"min_p must be in \[0.0, 1.0\]"),
    ("min_p", -0.1, "min_p must be in"),
    ("presence_penalty", 2.5, r"presence_penalty must be in \[-2.0, 2.0\]"),
    ("frequency_penalty", -3, "frequency_penalty must be in"),
    ("repetition_penalty", 0, "repetition_penalty must be > 0"),
    ("logit_bias", {5: 101}, r"logit_bias value must be in \[-100.0, 100.0\]"),
    ("logit_bias", {"x": 1}, "logit_bias key must be an integer"),
    ("logit_bias", [1, 2], "logit_bias must be a mapping"),
    ("logit_bias", {t: 1 for t in range(1025)}, "logit_bias has 1025 entries; at most 1024 are allowed"),
    ("min_tokens", 17, "min_tokens must be <= 16"),
    ("logprobs", 21, "logprobs must be <= 20"),
    ("prompt_logprobs", -1, "prompt_logprobs must be >= 0"),
    ("seed", "abc", "seed must be an integer"),
    ("stop", [""], "stop must be a non-empty string"),
])
def test_bad_sampling_params_name_the_parameter(field, value, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**{field: value})


def test_token_ids_past_the_vocabulary_are_refused_by_the_engine(tiny_llama):
    engine = LLMEngine(model=tiny_llama, dtype="float32", kv_cache_tokens=1024)
    vocab = engine.args.vocab_size
    with pytest.raises(ValueError, match="logit_bias keys must be token ids in"):
        engine.add_request([1, 2], SamplingParams(logit_bias={vocab: 1.0}))
    with pytest.raises(ValueError, match="stop_token_ids must be token ids in"):
        engine.add_request([1, 2], SamplingParams(stop_token_ids=[vocab + 5]))


EDGES = [0, 1, -1, -2, 2, 0.0, -0.0, 1.0, 1.5, -0.1, 0.5, 2.0, 21, float("inf"), float("-inf"), float("nan")]
ANY_VALUE = st.one_of(st.sampled_from(EDGES),      # half the draws at the edges, half anything
                      st.one_of(st.none(), st.booleans(), st.integers(-3, 2**70), st.floats(), st.text(max_size=3),
                                st.lists(st.one_of(st.integers(-2, 5), st.text(max_size=2)), max_size=3),
                                st.dictionaries(st.integers(-1, 3), st.floats(-200, 200), max_size=2)))
FIELDS = ["max_tokens", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
          "repetition_penalty", "logit_bias", "min_tokens", "seed", "stop", "stop_token_ids", "logprobs",
          "prompt_logprobs"]


@settings(max_examples=1500, deadline=None)
@given(st.dictionaries(st.sampled_from(FIELDS), ANY_VALUE, max_size=3))
def test_sampling_params_fast_check_accepts_only_what_the_full_check_accepts(kwargs):
    """The submit path's one-expression check never lets through what the full validation refuses."""
    try:
        params = SamplingParams(**kwargs)
    except (ValueError, TypeError):
        return
    before = repr(params)
    params._validate()                 # raises if the fast check let a bad value through
    assert repr(params) == before      # and the full check would have normalised nothing differently
    assert math.isfinite(params.temperature)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_draws_agree_with_the_twin(dtype):
    """Row by row, the C kernels and the torch twin pick the same token for the same uniform (but for the
    rare draw that lands within rounding of a boundary, or among ties), on real-sized rows, mixed settings
    in one batch."""
    from rosefast.engine import _sample_ops_c

    S, V = 256, 49152
    logits = (torch.randn(S, V, generator=torch.Generator().manual_seed(4)) * 4).to(dtype)
    rng = np.random.default_rng(1)
    temps = [float(t) for t in rng.uniform(0.3, 1.6, S)]
    ks = [int(k) if k < 300 else 0 for k in rng.integers(1, 600, S)]
    ps = [float(p) if p < 1 else 1.0 for p in rng.uniform(0.2, 1.4, S)]
    ms = [float(m) if m < 0.2 else 0.0 for m in rng.uniform(0, 0.4, S)]
    u = seeded_uniform(torch.arange(S, dtype=torch.long), torch.full((S,), 9, dtype=torch.long))
    compiled = _sample_ops_c.sample(logits, temps, ks, ps, ms, u)
    twin = _sample_ops_py.sample(logits, temps, ks, ps, ms, u)
    # bf16 rows hold many exactly equal logits: at a top_p threshold the twin keeps a prefix of the sorted
    # ties, the kernels keep all of them, and a draw near there may differ
    assert (compiled == twin).float().mean() >= (0.995 if dtype is torch.float32 else 0.97)
    assert torch.equal(_sample_ops_c.argmax(logits), _sample_ops_py.argmax(logits))


def test_top_k_holds_for_its_rows_in_a_batch_with_rows_that_ask_none(ops):
    """A row without top_k must not switch it off for the others (the twin once took the largest k of the
    batch, V, and limited nobody)."""
    logits = fixed_row().float()
    top3 = set(logits.topk(3).indices.tolist())
    rows = [Row(SamplingParams(temperature=2.0, top_k=3 if i % 2 else 0), seed=i) for i in range(4000)]
    tokens = Sampler(len(logits))(logits.expand(len(rows), -1), rows).token_ids
    assert set(tokens[1::2]) <= top3 and not set(tokens[0::2]) <= top3


def test_prompt_logprobs_equal_hugging_face_over_the_prompt(default_model):
    """Every prompt position's logprob (the first has none) and top k, in one prefill, in chunks, and with
    the prompt's blocks already in the prefix cache (which must not skip a position whose logprob is asked)."""
    from rosefast.sources import load_hf_model

    engine = LLMEngine(model=default_model, dtype="float32", kv_cache_tokens=4096, block_size=4, quantization="none",
                       max_num_batched_tokens=7)
    prompt = engine.tokenizer("The quick brown fox jumps over the lazy dog, and then it sleeps.").input_ids
    hf = load_hf_model(default_model)
    with torch.inference_mode():
        ref = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), dim=-1)
    params = SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=3)
    plain = SamplingParams(max_tokens=2, temperature=0)
    runs = [engine.generate([prompt], params, use_tqdm=False)[0]]             # chunks of 7 tokens
    engine.generate([prompt], plain, use_tqdm=False)                          # its blocks are cached now
    hits = engine.block_manager.hits
    runs.append(engine.generate([prompt], params, use_tqdm=False)[0])
    assert engine.block_manager.hits == hits                                   # no cached block was used
    assert engine.generate([prompt], plain, use_tqdm=False)[0]["token_ids"] == runs[0]["token_ids"]
    assert engine.block_manager.hits > hits                                    # ... though there were some
    for out in runs:
        entries = out["prompt_logprobs"]
        assert len(entries) == len(prompt) and entries[0] is None
        for pos, (chosen, top) in enumerate(entries[1:], start=1):
            row = ref[pos - 1]
            assert abs(chosen - float(row[prompt[pos]])) < 1e-4
            values, ids = row.topk(3)
            assert [t for t, _ in top] == ids.tolist()
            assert max(abs(lp - float(v)) for (_, lp), v in zip(top, values)) < 1e-4


def test_the_submit_paths_fast_check_covers_every_field():
    """SamplingParams skips its full check only when every field but the usual few is at its default: the test
    of that is built from the dataclass's fields, so a new field cannot be left unchecked."""
    from dataclasses import fields

    from rosefast.engine import sampling_params as sampling

    odd = {"int": 7, "float": 0.5, "NoneType": {"x": 1}, "bool": True, "tuple": ("x",)}
    plain = SamplingParams()
    assert sampling._at_defaults(plain)
    for f in fields(SamplingParams):
        if not f.init or f.name in sampling._USUAL:
            continue
        changed = SamplingParams()
        object.__setattr__(changed, f.name, odd[type(f.default).__name__])
        assert not sampling._at_defaults(changed), f.name
    with pytest.raises(ValueError, match="ignore_eos must be a boolean"):
        SamplingParams(ignore_eos="yes")
