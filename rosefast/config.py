"""Settings: one flat dataclass per concern. Fields are validated where they are made.

Every ROSEFAST_* variable is defined in this module: EngineConfig's fields (the server's ServerConfig adds its
own, server/config.py), and PROCESS_VARIABLES, the few read where they are used (at import, in library use and
in the tests, before or without a config object).
"""
import functools
import os
from dataclasses import dataclass, fields

# name -> (default, what it does): read by process_setting, listed in the README's table with the fields
PROCESS_VARIABLES = {
    "ROSEFAST_CACHE": ("~/.cache/rosefast", "where converted models are kept"),
    "ROSEFAST_TRITON": ("1", "CUDA: decode attention by the Triton kernel when Triton imports; 0: the torch twin's"),
    "ROSEFAST_NO_EXTENSIONS": ("0", "1: build and use the pure-Python twins of the compiled modules only"),
}

#: the variables the build, the test suite and the benchmarks read (never the server): known, so not refused
TOOL_VARIABLES = ("ROSEFAST_BUILD_MODULES", "ROSEFAST_DEBUG_BUILD", "ROSEFAST_REQUIRE_EXTENSIONS", "ROSEFAST_TEST_CACHE",
                  "ROSEFAST_TEST_LOCKS", "ROSEFAST_ARTIFACTS", "ROSEFAST_LLAMA_SERVER", "ROSEFAST_SOAK_SECONDS")


def process_setting(name):
    """A PROCESS_VARIABLES setting as the environment has it now: the flags ("0"/"1" defaults) as bool, the
    cache as a path with ~ expanded; a ValueError naming the variable for a flag that is not one."""
    default, _ = PROCESS_VARIABLES[name]
    raw = os.environ.get(name, "").strip() or default
    if default in ("0", "1"):
        if raw.lower() not in ("0", "1", "true", "false", "yes", "no", "on", "off"):
            raise ValueError(f"{name}={raw!r} is not a flag: expected 1 or 0")
        return raw.lower() in ("1", "true", "yes", "on")
    return os.path.expanduser(raw)


@functools.cache
def forced_cpu_kernels():
    """The kernels ROSEFAST_CPU_KERNELS forces on the whole process ("auto" when unset), read once here for every
    kernel that keeps to it (the block kernels' tier, the decode attention's ISA)."""
    return os.environ.get("ROSEFAST_CPU_KERNELS", "").strip() or "auto"


QUANTIZATION_MODES = ("auto", "none", "int8", "int4")
SPECULATIVE_MODES = ("auto", "off", "ngram")
# the quantized linears' kernels (rosefast.kernels.quant_ops): the best tier this CPU runs, one tier, or torch's ops
CPU_KERNELS = ("auto", "amx", "avx512vnni", "avxvnni", "avx2", "neon", "scalar", "torch")
# the block kernels' activations -> their int8 digits per 32 inputs: two (finer than bf16) or one (llama.cpp's Q8
# activations: half the integer products; docs/cpu-kernels.md measures what each costs)
ACTIVATIONS = {"two-digit": 2, "one-digit": 1}
HEAD_ALIASES = {"false": "none", "0": "none", "no": "none", "off": "none", "1": "true", "yes": "true", "on": "true"}


@dataclass
class EngineConfig:
    model: str = "smollm2-135m"        # smollm2-135m, a directory, a .gguf path, a hub name (owner/repo:Q4_K_M), stand-in
    device: str = "auto"               # auto (cuda when present, else cpu), cpu, cuda, cuda:N
    dtype: str = "auto"                # auto, float32, bfloat16, float16
    block_size: int = 16               # tokens per KV cache block
    kv_cache_tokens: int = 0           # KV budget in tokens; 0: from the memory settings below
    kv_memory_fraction: float = 0.10   # CPU: the KV cache takes this share of the available RAM
    gpu_memory_utilization: float = 0.85   # CUDA: this share of the GPU's total memory holds everything
                                           # (weights, activations, graphs); the KV cache gets what is left
    max_model_len: int = 0             # 0: the model's context length
    max_batch_size: int = 64           # decode batch (max running requests)
    max_active_requests: int = 0       # sequences running at once, at most max_batch_size; 0: max_batch_size
    prefill_max_batch_size: int = 16   # sequences per prefill step
    max_num_batched_tokens: int = 2048 # tokens per prefill step (longer prompts are prefilled in chunks)
    enable_prefix_cache: bool = True
    state_checkpoint_tokens: int = 64  # linear-attention models: their recurrent state saved every this many tokens
                                       # of a prefill (a multiple of block_size; 0: none), so that a later prompt
                                       # sharing a prefix starts from the nearest (rosefast.engine.state_slots)
    state_checkpoints: int = 16        # how many such saved states are kept (least recently used dropped first)
    cuda_graph: bool = True            # capture decode steps as CUDA graphs (CUDA only)
    seed: int = 0                      # for requests without their own seed
    num_threads: int = 0               # torch intra-op threads on CPU; 0: torch's default
    stand_in_step_ms: float = 0.0      # model "stand-in" (no forward pass): how long each step takes
    stand_in_token_ms: float = 0.0     # and how much longer a prefill step takes per prompt token it computes
    itl_target_ms: float = 0.0         # the gap a decoding stream may see while prompts prefill beside it: each
                                       # prefill step's tokens sized to it from the steps' measured costs
                                       # (rosefast.engine.step_budget); 0: three times a decode step's
    quantization: str = "auto"         # auto: a GGUF's own blocks on CPU (Q4_0/Q4_1, Q5_0/Q5_1, Q8_0, Q4_K,
                                       # Q5_K, Q6_K, any mix; the embedded default model's int4), else none;
                                       # none, int8, int4: weight-only linear layers on CPU (rosefast.models.quantized)
                                       # (one default for the library, the CLI and the server)
    quantize_lm_head: str = "auto"     # the lm_head's: none, int8, int4; true: as the linears; auto: int8 when
                                       # the linears are quantized, else none (rosefast.models.quantized.head_mode)
    cpu_kernels: str = "auto"          # the quantized linears' kernels: auto (the best tier this CPU runs),
                                       # amx, avx512vnni, avxvnni, avx2, neon, scalar (portable C), torch (torch's ops)
    activations: str = "two-digit"     # the block kernels' activations: two-digit (two int8 digits per 32 inputs,
                                       # finer than bf16), one-digit (llama.cpp's Q8: half the integer products)
    speculative: str = "auto"          # speculative decoding by prompt lookup (rosefast.engine.speculation): auto
                                       # (where it pays: small batches, sequences whose guesses are kept), ngram
                                       # (wherever a guess is found), off
    speculative_tokens: int = 8        # the most tokens a sequence proposes per step
    scheduling: str = "priority"       # which waiting request runs first: priority (a request's `priority`, lower
                                       # first, then arrival; a running one of a worse priority preempted for a
                                       # better one that waits; every request at 0 is first come first served),
                                       # fcfs (arrival alone: `priority` is ignored)
    priority_aging_s: float = 10.0     # priority scheduling: a request's priority counts one better for every
                                       # this many seconds since it arrived, so none waits for ever (0: never)

    def __post_init__(self):
        for name in ("block_size", "max_batch_size", "prefill_max_batch_size", "max_num_batched_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("kv_cache_tokens", "max_model_len", "num_threads", "max_active_requests", "speculative_tokens",
                     "state_checkpoint_tokens", "state_checkpoints"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if self.state_checkpoint_tokens % self.block_size:
            raise ValueError(f"state_checkpoint_tokens must be a multiple of block_size ({self.block_size}): a saved "
                             f"state is found by its last block's hash; got {self.state_checkpoint_tokens}")
        if self.max_active_requests > self.max_batch_size:   # it can only lower the running batch
            raise ValueError(f"max_active_requests must be at most max_batch_size ({self.max_batch_size}): it caps "
                             f"the sequences running at once below the decode batch; got {self.max_active_requests}")
        for name in ("stand_in_token_ms", "itl_target_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 60_000:
                raise ValueError(f"{name} must be a number of milliseconds in [0, 60000], got {value!r}")
        if isinstance(self.stand_in_step_ms, bool) or not isinstance(self.stand_in_step_ms, (int, float)) \
                or not 0 <= self.stand_in_step_ms <= 60_000:
            raise ValueError(f"stand_in_step_ms must be a number of milliseconds in [0, 60000], "
                             f"got {self.stand_in_step_ms!r}")
        if not 0 < self.kv_memory_fraction <= 0.95:
            raise ValueError(f"kv_memory_fraction must be in (0, 0.95], got {self.kv_memory_fraction!r}")
        if isinstance(self.gpu_memory_utilization, bool) or not isinstance(self.gpu_memory_utilization, (int, float)) \
                or not 0 < self.gpu_memory_utilization <= 0.98:
            raise ValueError(f"gpu_memory_utilization must be in (0, 0.98], got {self.gpu_memory_utilization!r}")
        if isinstance(self.quantize_lm_head, bool):
            self.quantize_lm_head = "true" if self.quantize_lm_head else "none"
        self.quantize_lm_head = HEAD_ALIASES.get(str(self.quantize_lm_head).strip().lower(),
                                                 str(self.quantize_lm_head).strip().lower())
        if self.quantize_lm_head not in ("none", "int8", "int4", "auto", "true"):
            raise ValueError(f"quantize_lm_head must be one of none, int8, int4, auto, true; "
                             f"got {self.quantize_lm_head!r}")
        if self.quantization not in QUANTIZATION_MODES:
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATION_MODES)}; got {self.quantization!r}")
        if self.cpu_kernels not in CPU_KERNELS:
            raise ValueError(f"cpu_kernels must be one of {', '.join(CPU_KERNELS)}; got {self.cpu_kernels!r}")
        if self.activations not in ACTIVATIONS:
            raise ValueError(f"activations must be one of {', '.join(ACTIVATIONS)}; got {self.activations!r}")
        if self.speculative not in SPECULATIVE_MODES:
            raise ValueError(f"speculative must be one of {', '.join(SPECULATIVE_MODES)}; got {self.speculative!r}")
        if self.scheduling not in ("priority", "fcfs"):
            raise ValueError(f"scheduling must be priority or fcfs; got {self.scheduling!r}")
        if isinstance(self.priority_aging_s, bool) or not isinstance(self.priority_aging_s, (int, float)) \
                or not 0 <= self.priority_aging_s <= 1e9:
            raise ValueError(f"priority_aging_s must be a number of seconds >= 0, got {self.priority_aging_s!r}")
        if self.speculative_tokens > 64:
            raise ValueError(f"speculative_tokens must be at most 64, got {self.speculative_tokens!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be one of auto, float32, bfloat16, float16; got {self.dtype!r}")
        if not (self.device in ("auto", "cpu", "cuda") or
                (self.device.startswith("cuda:") and self.device[5:].isdigit())):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N; got {self.device!r}")

    @classmethod
    def from_kwargs(cls, **kwargs):
        """Build from keyword arguments, keeping only the ones that are fields (nano-vllm style)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in kwargs.items() if k in names})
