"""Our torch forward on the paged KV cache against Hugging Face's own forward."""
import pytest
import torch

from rosefast.config import EngineConfig
from rosefast.engine.model_runner import ModelRunner, SeqInput
from rosefast.sources import load_hf_model, load_tokenizer, tiny_random
from tests.paged import max_abs_diff, run_hf, run_ours

TEXTS = [
    "Hello there, how are you doing today my friend?",
    "The capital of France is",
    "def fib(n):\n    return",
    "A B C D E F G H I J K L M N O P Q R S T U V W X Y Z a b c d e f g",
]
GEN_TEXTS = TEXTS + ["Once upon a time", "1, 2, 3, 4,", "The best way to learn Python is",
                     "Translate to French: good morning"]


def runner_for(model, dtype="float32", **kw):
    kw.setdefault("quantization", "none")   # the weights as Hugging Face runs them (auto: a GGUF's int4 blocks)
    return ModelRunner(EngineConfig(model=model, dtype=dtype, kv_cache_tokens=kw.pop("kv_cache_tokens", 8192), **kw))


def check_against_hf(model, steps=16, tol=1e-4):
    tok = load_tokenizer(model)
    prompts = [tok(t).input_ids for t in TEXTS]
    assert len({len(p) for p in prompts}) == 4  # four different lengths, packed in one prefill
    hf = load_hf_model(model)
    ref = [run_hf(hf, p, steps) for p in prompts]
    ours = run_ours(runner_for(model), prompts, steps, next_tokens=[fed for _, fed in ref])
    diff = max_abs_diff([r for r, _ in ref], ours)
    assert diff < tol, f"max abs logit difference {diff:.2e}"
    return diff


TINY_VARIANTS = {
    "llama": ("llama", {}),
    "gpt2": ("gpt2", {}),
    "qwen2-bias-untied": ("qwen2", {}),
    "qwen3-qk-norm-head-dim": ("qwen3", {}),
    "mistral-window-head-dim": ("mistral", {}),
    "phi3-fused": ("phi3", {}),
    "gemma3-local-global": ("gemma3_text", {}),
    # mixtures of experts (8, top-2): renormalized, with a dense layer; a shared expert, not renormalized;
    # Mixtral's softmax of the top k; OLMoE's q/k norms over their whole width
    "qwen3_moe-dense-layer": ("qwen3_moe", {}),
    "qwen2_moe-shared-expert": ("qwen2_moe", {}),
    "mixtral-window": ("mixtral", {}),
    "olmoe-width-qk-norm": ("olmoe", {}),
    # hybrid attention (3 Gated DeltaNet layers : 1 gated full attention, RoPE on a quarter of each head): Qwen3-Next
    # (its interleaved projections, experts and a shared one), Qwen3.5 (dense), Qwen3.5-MoE
    "qwen3_next-hybrid-moe": ("qwen3_next", {}),
    "qwen3_5-hybrid-dense": ("qwen3_5_text", {}),
    "qwen3_5_moe-hybrid": ("qwen3_5_moe_text", {}),
    # as published: the text model inside a multimodal checkpoint (its vision tower left out), untied head
    "qwen3_5-multimodal-checkpoint": ("qwen3_5", {}),
    "qwen3_5_moe-multimodal-checkpoint": ("qwen3_5_moe", {}),
    # windows the prompts and decode steps cross (attention over each layer's last 8 positions)
    "mistral-window-binds": ("mistral", {"sliding_window": 8}),
    "phi3-partial-rotary": ("phi3", {"partial_rotary_factor": 0.5}),
    # Phi-4-mini's RoPE: on 3/4 of each head, long-RoPE's short factors and attention factor (served to 64 here)
    "phi3-longrope-partial": ("phi3", {"partial_rotary_factor": 0.75, "original_max_position_embeddings": 64,
                                       "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                                                           "short_factor": [1.0, 1.5, 2.0, 3.0, 5.0, 8.0],
                                                           "long_factor": [4.0] * 6}}),
    "gemma3-local-window-binds": ("gemma3_text", {"sliding_window": 8}),
    "llama-untied-linear-rope": ("llama", {"tie_word_embeddings": False,
                                           "rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    "llama-mha-llama3-rope": ("llama", {"num_key_value_heads": 4, "rope_parameters": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64, "rope_theta": 500000.0}}),
}


@pytest.mark.parametrize("variant", TINY_VARIANTS)
def test_tiny_logits_match_hf(variant, default_model):
    arch, overrides = TINY_VARIANTS[variant]
    check_against_hf(tiny_random(arch, **overrides))


@pytest.mark.slow
def test_smollm2_logits_match_hf(default_model):
    # fp32 logits of magnitude ~20 over 30 layers: the prefill's fused (flash) SDPA rounds its blocked softmax
    # differently from HF's math path — 1.02e-4 here, 0.94e-4 with the 3-D math path before it
    check_against_hf(default_model, tol=2e-4)


@pytest.mark.slow
def test_batched_greedy_equals_hf_generate_alone(default_model):
    tok = load_tokenizer(default_model)
    hf = load_hf_model(default_model)
    prompts = [tok(t).input_ids for t in GEN_TEXTS]
    steps = 20
    ours = run_ours(runner_for(default_model), prompts, steps)
    for prompt, logits in zip(prompts, ours):
        ours_tokens = [int(logits[0][-1].argmax())] + [int(step[-1].argmax()) for step in logits[1:-1]]
        with torch.inference_mode():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=steps, do_sample=False,
                              pad_token_id=tok.pad_token_id, eos_token_id=None)[0, len(prompt):].tolist()
        assert ours_tokens == ref, tok.decode(prompt)


def test_shuffled_block_tables_equal_contiguous(tiny_llama):
    tok = load_tokenizer(tiny_llama)
    prompts = [tok(t).input_ids for t in TEXTS]
    runner = runner_for(tiny_llama, block_size=4)
    contiguous = run_ours(runner, prompts, 12)
    shuffled = run_ours(runner, prompts, 12, shuffle_seed=7)
    assert max_abs_diff(contiguous, shuffled) < 1e-6


def test_chunked_prefill_equals_one_prefill(tiny_llama):
    runner = runner_for(tiny_llama, block_size=4)
    prompt = load_tokenizer(tiny_llama)(TEXTS[3]).input_ids
    table = list(range(-(-len(prompt) // 4)))
    whole = runner.forward([SeqInput(prompt, 0, table)], True, all_logits=True)
    cut = 13
    first = runner.forward([SeqInput(prompt[:cut], 0, table)], True, all_logits=True)
    second = runner.forward([SeqInput(prompt[cut:], cut, table)], True, all_logits=True)
    assert torch.allclose(torch.cat([first, second]), whole, atol=1e-5)


def test_bf16_runs_close_to_fp32(tiny_llama):
    tok = load_tokenizer(tiny_llama)
    prompts = [tok(t).input_ids for t in TEXTS]
    fp32 = run_ours(runner_for(tiny_llama), prompts, 4)
    bf16 = run_ours(runner_for(tiny_llama, dtype="bfloat16"), prompts, 4,
                    next_tokens=[[int(s[-1].argmax()) for s in seq[:-1]] for seq in fp32])
    assert max_abs_diff(fp32, bf16) < 0.25  # bf16 keeps ~3 significant digits


def test_kv_budget_from_tokens_and_memory_fraction(tiny_llama, caplog):
    caplog.set_level("INFO", logger="rosefast.engine")
    r = runner_for(tiny_llama, kv_cache_tokens=1000, block_size=16)
    assert r.kv.num_blocks == 63 and "63 blocks x 16 tokens = 1008 tokens" in caplog.text
    r = ModelRunner(EngineConfig(model=tiny_llama, dtype="float32", kv_memory_fraction=0.001))
    assert r.kv.num_blocks > 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_decode_matches_eager(tiny_llama):
    tok = load_tokenizer(tiny_llama)
    prompts = [tok(t).input_ids for t in TEXTS]
    eager = run_ours(runner_for(tiny_llama, dtype="bfloat16", device="cuda", cuda_graph=False), prompts, 8)
    graph = run_ours(runner_for(tiny_llama, dtype="bfloat16", device="cuda", cuda_graph=True), prompts, 8,
                     next_tokens=[[int(s[-1].argmax()) for s in seq[:-1]] for seq in eager])
    assert max_abs_diff(eager, graph) < 1e-2


def test_kv_goes_to_the_block_and_offset_of_the_block_table(tiny_llama):
    runner = runner_for(tiny_llama, kv_cache_tokens=64, block_size=4, cuda_graph=False)   # (a capture writes)
    args, kv = runner.args, runner.kv
    k_pool, v_pool = kv.layers[0]   # head-major: [Hkv, blocks + scratch, block_size, D]
    assert k_pool.shape == (args.num_kv_heads, kv.num_blocks + 1, 4, args.head_dim)
    runner.forward([SeqInput([5, 6, 7, 8, 9], 0, [3, 1])], True)
    # positions 0-3 went to block 3, position 4 to block 1 offset 0; nothing else was written
    for pool in (k_pool, v_pool):
        assert (pool[:, 3].abs().sum(-1) > 0).all() and (pool[:, 1, 0].abs().sum(-1) > 0).all()
        written = torch.zeros(pool.shape[1:3], dtype=torch.bool)
        written[3] = True
        written[1, 0] = True
        assert pool[:, ~written].abs().sum() == 0
