"""The CUDA path checked on a CPU: one prefill and one decode step of the runner and its sampler under
FakeTensorMode on a "cuda" device (tests/fake_cuda.py): every tensor of the step on the GPU, no host sync but
the copy of the sampled ids; the width buckets of the decode graphs; the Triton decode kernel against the
torch twin under TRITON_INTERPRET=1, and its prefill kernel against the per-sequence SDPA."""
import importlib
import json
import os
import pathlib
import subprocess
import sys
import traceback

import numpy as np
import pytest
import torch
from packaging.version import Version
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from rosefast import device
from rosefast.config import EngineConfig
from rosefast.engine.cuda_graph import ladder, pick, width_ladder
from rosefast.engine.llm_engine import LLMEngine
from rosefast.engine.model_runner import ModelRunner, SeqInput
from rosefast.engine.sampler import SampleResult
from rosefast.engine.sampling_params import SamplingParams
from rosefast.engine.sequence import Sequence
from rosefast.kernels import layer_ops
from rosefast.build import load_model
from tests import fake_cuda

# building a step's host values, before their one copy in
HOST_STAGING = {"aten.lift_fresh.default", "aten.lift_fresh_copy.default", "aten.detach.default",
                "aten.detach_.default", "aten._to_copy.default"}


def _host(t):
    return isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.numel() > 1


class OpDevices(TorchDispatchMode):
    """Records each op that made a CPU tensor of more than one element beyond staging host values, and each
    that read one into a GPU result but the explicit copy in (a list index's implicit, synchronous copy)."""

    def __init__(self):
        super().__init__()
        self.cpu_ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        name = str(func)
        if name not in HOST_STAGING and any(_host(t) for t in outs):
            self.cpu_ops.append(name)
        elif name != "aten.copy_.default" and any(isinstance(t, torch.Tensor) and t.device.type == "cuda"
                                                  for t in outs):
            if any(_host(t) for t in tree_flatten((args, kwargs))[0]):
                self.cpu_ops.append(name + " (a host tensor read in)")
        return out


def as_on_a_gpu_machine(monkeypatch):
    """rosefast sees a GPU, as it does where these checks run under a CUDA torch (the device check's
    machine): the branches taken for a real GPU (pinned host buffers) meet the fake mode."""
    monkeypatch.setattr(device, "cuda_available", lambda: True)


@pytest.fixture(params=["twin", "triton"])
def cuda_flavour(request, monkeypatch):
    as_on_a_gpu_machine(monkeypatch)
    if request.param == "triton":
        pytest.importorskip("triton")
        flavour = importlib.import_module("rosefast.kernels._layer_ops_triton")
    else:
        flavour = layer_ops.reference
    monkeypatch.setattr(layer_ops, "_cuda", [flavour])
    return flavour


def fake_runner(model, mode, **kw):
    module, args = load_model(model, torch.bfloat16, "cpu")
    fake_cuda.to_fake_cuda(module, mode)
    if args.num_experts:   # as build_model plans them, on the GPU
        with mode:
            assert module.plan_experts() == {"grouped": args.num_layers - len(args.dense_layers)}
    kw.setdefault("kv_cache_tokens", 256)
    config = EngineConfig(model=model, dtype="bfloat16", device="cuda", max_batch_size=8, **kw)
    with mode:
        return ModelRunner(config, loaded=(module, args, torch.device("cuda")))


PARAMS = [SamplingParams(temperature=0),
          SamplingParams(temperature=0.8, top_k=5, top_p=0.9, min_p=0.05, seed=3, logprobs=2),
          SamplingParams(temperature=0, repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.2,
                         logit_bias={7: -100}, min_tokens=2),
          SamplingParams(temperature=1.0, top_p=0.5)]


def sample_until_the_host_copy(runner, logits, seqs, allowed=None):
    """The sampler's pass on fake tensors must get as far as its one host copy (the ids) and stop there."""
    with pytest.raises(DataDependentOutputException) as e:
        runner.sampler(logits, seqs, allowed)
    frames = [f for f in traceback.extract_tb(e.value.__traceback__) if f.filename.endswith("sampler.py")]
    assert ".tolist()" in frames[-1].line, frames[-1]


def test_a_prefill_and_a_decode_step_stay_on_the_gpu_without_host_syncs(tiny_llama, cuda_flavour):
    fake_cuda.enable()
    mode = FakeTensorMode()
    runner = fake_runner(tiny_llama, mode)
    prompts = [[1, 2, 3, 4, 5], list(range(10, 40)), [7]]
    tables = [[0], [1, 2], [3]]
    seqs = [Sequence(i, p, PARAMS[i], (0,), seed=i) for i, p in enumerate(prompts)]
    with mode:   # a grammar's mask row, made on the host (outside the step)
        bitmask, masked_rows = torch.zeros(1, -(-runner.args.vocab_size // 32), dtype=torch.int32), torch.tensor([2])
    watch = OpDevices()
    with mode, watch:
        logits = runner.forward([SeqInput(p, 0, t) for p, t in zip(prompts, tables)], True)
        assert logits.device.type == "cuda" and tuple(logits.shape) == (3, runner.args.vocab_size)
        everything = runner.forward([SeqInput(p, 0, t) for p, t in zip(prompts, tables)], True,
                                    all_logits={1})
        assert tuple(everything.shape) == (1 + 30 + 1, runner.args.vocab_size)
        sample_until_the_host_copy(runner, logits, seqs, (masked_rows, bitmask))
        # a later chunk of a prompt (attends to the cached part) and a decode step of all three
        chunk = runner.forward([SeqInput(list(range(40, 50)), 30, [1, 2, 4])], True)
        assert chunk.device.type == "cuda"
        decode = [SeqInput([9], len(p), t) for p, t in zip(prompts, tables)]
        step = runner.forward(decode, False)
        assert step.device.type == "cuda" and tuple(step.shape) == (3, runner.args.vocab_size)
        sample_until_the_host_copy(runner, step, seqs)
        assert runner.kv.data.device.type == "cuda"
    assert watch.cpu_ops == [], f"ops computed on the CPU during the step: {sorted(set(watch.cpu_ops))}"


def test_a_mixture_of_experts_step_stays_on_the_gpu_without_host_syncs(cuda_flavour, default_model):
    """Routed experts on a GPU as torch's grouped matmul over their stacked weights: a packed prefill and a decode
    step of rows that pick different experts, every op on the GPU and no host sync (the decode graphs hold it)."""
    from rosefast.sources import tiny_random

    fake_cuda.enable()
    mode = FakeTensorMode()
    runner = fake_runner(tiny_random("qwen2_moe"), mode)
    assert runner.model.graph_safe
    prompts, tables = [[1, 2, 3, 4, 5], list(range(10, 40)), [7]], [[0], [1, 2], [3]]
    watch = OpDevices()
    with mode, watch:
        logits = runner.forward([SeqInput(p, 0, t) for p, t in zip(prompts, tables)], True)
        assert logits.device.type == "cuda" and tuple(logits.shape) == (3, runner.args.vocab_size)
        step = runner.forward([SeqInput([9], len(p), t) for p, t in zip(prompts, tables)], False)
        assert step.device.type == "cuda" and tuple(step.shape) == (3, runner.args.vocab_size)
    assert watch.cpu_ops == [], f"ops computed on the CPU during the step: {sorted(set(watch.cpu_ops))}"


def test_a_hybrid_attention_step_stays_on_the_gpu(cuda_flavour, default_model):
    """Gated DeltaNet layers on a GPU (torch ops; the state pools there): a packed prefill, a later chunk from its
    slot's state, and a decode step, every op on the GPU. Such a model runs without decode graphs (its prefill loops
    over the sequences)."""
    from rosefast.sources import tiny_random

    fake_cuda.enable()
    mode = FakeTensorMode()
    runner = fake_runner(tiny_random("qwen3_next"), mode)
    assert not runner.model.graph_safe and runner.graphs is None
    prompts, tables = [[1, 2, 3, 4, 5], list(range(10, 40)), [7]], [[0], [1, 2], [3]]
    watch = OpDevices()
    with mode, watch:
        logits = runner.forward([SeqInput(p, 0, t, state_slot=i) for i, (p, t) in enumerate(zip(prompts, tables))],
                                True)
        assert logits.device.type == "cuda" and tuple(logits.shape) == (3, runner.args.vocab_size)
        chunk = runner.forward([SeqInput(list(range(40, 50)), 30, [1, 2, 4], state_slot=1)], True)
        assert chunk.device.type == "cuda"
        step = runner.forward([SeqInput([9], len(p), t, state_slot=i) for i, (p, t) in enumerate(zip(prompts, tables))],
                              False)
        assert step.device.type == "cuda" and tuple(step.shape) == (3, runner.args.vocab_size)
        assert all(pool.device.type == "cuda" for pool in runner.kv.states)
    assert watch.cpu_ops == [], f"ops computed on the CPU during the step: {sorted(set(watch.cpu_ops))}"


class IdsAtTheHostCopy:
    """The runner's sampler, run until its one host copy (which fake tensors cannot make: checked to be where it
    stops), then ids of 1 so that the engine can go on to its next step."""

    def __init__(self, sampler):
        self.sampler, self.passes = sampler, 0

    def __call__(self, logits, seqs, allowed=None):
        sample_until_the_host_copy(self, logits, seqs, allowed)
        self.passes += 1
        return SampleResult([1] * len(seqs), [None if s.params.logprobs is None else (0.0, []) for s in seqs])

    def __getattr__(self, name):
        return getattr(self.sampler, name)


def test_engine_steps_prefill_chunks_forks_and_decode_on_the_gpu(tiny_llama, cuda_flavour):
    """LLMEngine.step() itself — the scheduler, a chunked prefill, n=2 forks (a KV block copy), mixed sampling
    settings, decode steps — with every tensor on the GPU and no implicit copy in."""
    fake_cuda.enable()
    mode = FakeTensorMode()
    runner = fake_runner(tiny_llama, mode, kv_cache_tokens=512, max_num_batched_tokens=32)
    runner.sampler = IdsAtTheHostCopy(runner.sampler)
    engine = LLMEngine(runner.config, runner=runner)
    engine.add_request([3, 4, 5], SamplingParams(max_tokens=3, temperature=0.7, top_p=0.9, seed=1,
                                                 ignore_eos=True), fork_ids=[100])
    engine.add_request([6, 7], SamplingParams(max_tokens=3, temperature=0, frequency_penalty=0.5, logprobs=2,
                                              ignore_eos=True))
    # two chunks: its first shares a step with the others' whole prompts, and only they sample there
    engine.add_request(list(range(5, 45)), SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    watch = OpDevices()
    with mode, watch:
        results = [engine.step() for _ in range(6)]
    assert [r.error for r in results if r.error is not None] == []
    assert runner.sampler.passes >= 4 and engine.forks == 1 and not engine.has_unfinished()
    assert watch.cpu_ops == [], f"ops computed on the CPU during the steps: {sorted(set(watch.cpu_ops))}"


def test_the_memory_profile_runs_the_largest_steps_on_the_gpu(tiny_llama, cuda_flavour):
    """On CUDA the KV budget is what gpu_memory_utilization leaves after these steps' peak: they must run there
    (on a one-block cache), and leave the real cache in place."""
    fake_cuda.enable()
    mode = FakeTensorMode()
    runner = fake_runner(tiny_llama, mode, max_num_batched_tokens=64, max_model_len=96)
    kv = runner.kv
    watch = OpDevices()
    with mode, watch:
        runner.profile()
    assert runner.kv is kv and watch.cpu_ops == []


def test_the_kv_budget_is_a_share_of_total_gpu_memory_after_the_peak():
    from rosefast.engine.kv_cache import kv_budget_bytes

    gib = 2**30
    assert kv_budget_bytes(140 * gib, 3 * gib, gib // 2, 0.85) == int(140 * gib * 0.85) - 3 * gib - gib // 2
    with pytest.raises(ValueError, match="gpu_memory_utilization 0.1 of 8.0 GiB leaves no room .* set kv_cache_tokens"):
        kv_budget_bytes(8 * gib, gib, 0, 0.1)
    with pytest.raises(ValueError, match="gpu_memory_utilization must be in"):
        EngineConfig(gpu_memory_utilization=1.5)


def test_the_check_catches_a_cpu_tensor_and_a_host_sync(tiny_llama, monkeypatch):
    """The harness itself: a step that mixes in a CPU tensor, or reads a value on the host, fails under it."""
    fake_cuda.enable()
    as_on_a_gpu_machine(monkeypatch)
    monkeypatch.setattr(layer_ops, "_cuda", [layer_ops.reference])
    mode = FakeTensorMode()
    runner = fake_runner(tiny_llama, mode)
    seqs = [SeqInput([1, 2, 3], 0, [0])]
    with mode:
        ids, positions, meta, rows = runner.prepare_prefill(seqs)
        with pytest.raises(Exception, match="device"):
            runner.model(ids.cpu(), positions, meta, runner.kv.layers)
        with pytest.raises(DataDependentOutputException):
            runner.model(ids, positions, meta, runner.kv.layers).sum().item()


# -- the decode graphs' buckets and bookkeeping (their capture itself needs a GPU) ------------------------

def test_graph_batch_and_width_ladders():
    assert ladder(40) == [1, 2, 4, 8, 16, 32, 40]
    assert ladder(3) == [1, 2, 3]
    assert width_ladder(512, follows_context=False) == [8, 16, 32, 64, 128, 256, 512]
    assert width_ladder(100, follows_context=False) == [8, 16, 32, 64, 100]
    assert width_ladder(5, follows_context=False) == [5]
    assert width_ladder(512, follows_context=True) == [512]
    widths = width_ladder(512, follows_context=False)
    for need in range(1, 513):   # a step never attends over more than twice its longest table
        w = pick(widths, need)
        assert need <= w <= max(2 * need, widths[0])
    assert pick(ladder(40), 17) == 32 and pick(ladder(40), 33) == 40


class EagerCapture:
    """A CUDA graph's stand-in on the CPU: replay runs the captured step again into the captured output (what a
    replay does to its memory), so the graphs' bookkeeping — static inputs, padding, widths, captures on first
    use, a shrinking batch leaving stale rows — is checked against eager steps."""

    def pool(self):
        return None

    def synchronize(self):
        pass

    def capture(self, fn, pool):
        out = fn()
        return (lambda: out.copy_(fn())), out


@pytest.mark.parametrize("family", ["llama", "mistral-window-8"])
def test_decode_graph_bookkeeping_matches_eager_steps(tiny_llama, monkeypatch, family):
    """Two runners on the same weights and block tables, one replaying graphs, one eager; freed blocks go to a
    new sequence, so a padded row left writing an old slot would corrupt it. Mistral on a window of 8: its
    layers' own pool's slots and tables are static inputs too (here every block of it kept)."""
    from rosefast.engine.cuda_graph import DecodeGraphs
    from rosefast.sources import tiny_random
    from tests.paged import BlockPool

    monkeypatch.setattr(layer_ops, "impl", layer_ops.reference)   # the twin, which needs a ladder of widths
    model = tiny_llama if family == "llama" else tiny_random("mistral", sliding_window=8)
    config = EngineConfig(model=model, dtype="float32", device="cpu", kv_cache_tokens=4096, max_model_len=512,
                          block_size=16, max_batch_size=8)
    eager, replayed = ModelRunner(config), ModelRunner(config)
    graphs = replayed.graphs = DecodeGraphs(replayed, 8, capture=EagerCapture())
    assert graphs.widths == [8, 16, 32] and set(graphs.graphs) == {(s, 8) for s in ladder(8)}
    assert graphs.windowed == (family != "llama")
    bs = eager.block_size
    pools = [BlockPool(eager.kv.num_blocks, shuffle_seed=3)]
    if graphs.windowed:
        pools.append(BlockPool(eager.kv.window_blocks, shuffle_seed=4))

    def inputs(tokens, starts, tables):
        return [SeqInput(t, start, tb[0], window_table=tb[1] if graphs.windowed else None)
                for t, start, tb in zip(tokens, starts, tables)]

    def grow(tables, lengths):
        for tb, n in zip(tables, lengths):
            for pool, table in zip(pools, tb):
                pool.grow(table, n, bs)

    def prefill(prompts):
        tables = [([], []) for _ in prompts]
        grow(tables, map(len, prompts))
        seqs = inputs(prompts, [0] * len(prompts), tables)
        logits = eager.forward(seqs, True)
        replayed.forward(seqs, True)
        return [p + [int(row.argmax())] for p, row in zip(prompts, logits)], tables

    tokens, tables = prefill([list(range(1, 127)), [5, 6, 7], list(range(3, 63)), list(range(9, 40))])
    for step in range(10):
        if step == 3:   # two sequences end, the last row's blocks go to a new one: 3 rows in the size-4 graph,
            for tb in (tables[1], tables[3]):     # whose 4th row last held the ended sequence's slot
                for pool, table in zip(pools, tb):
                    pool.free[:0] = table
            more, more_tables = prefill([list(range(7, 47))])
            tokens, tables = [tokens[0], tokens[2]] + more, [tables[0], tables[2]] + more_tables
        grow(tables, map(len, tokens))
        seqs = inputs([[t[-1]] for t in tokens], [len(t) - 1 for t in tokens], tables)
        want = eager.forward(seqs, False)
        got = replayed.forward(seqs, False)
        assert (got - want).abs().max().item() < 1e-5, step
        for t, row in zip(tokens, want):
            t.append(int(row.argmax()))
    # sequence 0 crossed 128 tokens (8 blocks) a step before the batch shrank: a wider graph, made on first use
    assert (4, 16) in graphs.graphs


def test_decode_values_pad_rows_to_the_scratch_block(tiny_llama):
    runner = ModelRunner(EngineConfig(model=tiny_llama, dtype="float32", device="cpu", kv_cache_tokens=256))
    seqs = [SeqInput([5], 20, [3, 7]), SeqInput([6], 3, [1])]
    flat = runner.decode_values(seqs, 3, size=4)
    scratch, sslot = runner.kv.scratch_block, runner.kv.scratch_slot
    bs = runner.block_size
    assert flat[:4] == [5, 6, 0, 0]                                  # input ids
    assert flat[4:8] == [20, 3, 0, 0]                                # positions
    assert flat[8:12] == [7 * bs + 20 - bs, 1 * bs + 3, sslot, sslot]   # where each new K/V goes
    assert flat[12:16] == [21, 4, 1, 1]                              # context lengths
    assert flat[16:] == [3, 7, scratch, 1, scratch, scratch]         # the real rows' tables at width 3
    ids, pos, slots, tables, ctx, window, states = runner.decode_tensors(seqs, 2)
    assert window is None and states is None   # (no sliding-window pool, no linear-attention states)
    assert tables.tolist() == [[3, 7], [1, scratch]] and ctx.tolist() == [21, 4] and slots.tolist() == flat[8:10]


# -- the Triton decode kernel against the twin (Triton's interpreter, on CPU tensors) ----------------------

def test_triton_decode_and_prefill_attention_equal_the_twins():
    """In a fresh interpreter: TRITON_INTERPRET must be set before Triton is first imported."""
    triton = pytest.importorskip("triton")
    if Version(triton.__version__) < Version("3.9") and Version(np.__version__) >= Version("2.5"):
        pytest.skip(f"Triton {triton.__version__}'s interpreter turns a loaded loop bound into an int with int() of "
                    f"a one-element array, which numpy {np.__version__} refuses (Triton 3.9's squeezes it first; "
                    "seen on the device check's machine, where the compiled kernels run instead)")
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-m", "tests.triton_decode_check"], env=env, capture_output=True,
                          text=True, timeout=300, cwd=pathlib.Path(__file__).parent.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    cases = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted({(c["kind"], c["dtype"]) for c in cases}) == [
        ("decode", "bfloat16"), ("decode", "float32"), ("decode-split", "bfloat16"), ("decode-split", "float32"),
        ("decode-split-window", "bfloat16"), ("decode-split-window", "float32"), ("decode-window", "bfloat16"),
        ("decode-window", "float32"), ("prefill", "bfloat16"), ("prefill", "float32")]
    assert len(cases) == 30
    for case in cases:   # |error| / (|reference| + 1); bf16: the output's own rounding (2^-8 relative)
        tol = 1e-5 if case["dtype"] == "float32" else 8e-3
        assert case["max_scaled_diff"] < tol, case


def test_the_twins_decode_scores_in_fp32_for_a_bf16_cache():
    """The CUDA fallback (no Triton) and the pure flavour: a bf16 cache's scores are not rounded to bf16 before
    the softmax — with scores of magnitude ~30 that rounding alone moves the output by several bf16 steps."""
    from rosefast.kernels import _layer_ops_py as twin
    from rosefast.models.layers import AttentionMetadata

    gen = torch.Generator().manual_seed(11)
    heads, kv_heads, D, bs = 9, 3, 64, 16
    k_cache = (torch.randn(kv_heads, 9, bs, D, generator=gen) * 2).to(torch.bfloat16)
    v_cache = torch.randn(kv_heads, 9, bs, D, generator=gen).to(torch.bfloat16)
    qkv = (torch.randn(2, (heads + 2 * kv_heads) * D, generator=gen) * 2).to(torch.bfloat16)
    tables, lens = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]]), torch.tensor([64, 50])
    meta = lambda: AttentionMetadata(False, None, tables, context_lens=lens)  # noqa: E731
    got = twin.decode_attention(qkv, heads, kv_heads, k_cache, v_cache, meta(), D ** -0.5).float()
    ref = twin.decode_attention(qkv.float(), heads, kv_heads, k_cache.float(), v_cache.float(), meta(), D ** -0.5)
    assert ((got - ref).abs() / (ref.abs() + 1)).max().item() < 8e-3   # the bf16 output's own rounding
