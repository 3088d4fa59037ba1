"""Models by their hub name (rosefast.sources.hub), through the real `huggingface_hub` client against a hub on
loopback (tests/hub_server.py: there is no network here) serving tiny random models made here: a safetensors
checkpoint, and a repository of GGUFs (a Q8_0 file, a Q4_0 split in three parts, a vision projector). Fetched
into the standard cache, resumed after a cut, checked against the hub's hash, served offline from the cache, each
error naming what to do; what is fetched generates as the same model loaded from its local path."""
import json
import os
import threading
import time

import pytest
import requests
from gguf import GGMLQuantizationType as T

from rosefast.errors import ModelError
from rosefast.sources import load_tokenizer, tiny_random
from rosefast.sources.hub_files import HubName, pick_files, quant_of
from rosefast.sources.resolve import resolve_model
from tests.gguf_writer import write_gguf
from tests.hub_server import LocalHub

PROMPT = "The tiny model says"


def _checkpoint_files(model):
    return {f.name: f for f in model.path.iterdir() if f.is_file() and f.name != "rosefast-source.json"}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """{"checkpoint": (tiny model, its files), "gguf": {name: path}} — the repositories' contents."""
    model = tiny_random("llama", num_hidden_layers=2)
    g = tmp_path_factory.mktemp("ggufs")
    write_gguf(g / "tiny-Q8_0.gguf", model, lambda name: T.Q8_0)
    write_gguf(g / "tiny-Q4_0.gguf", model, lambda name: T.Q4_0, split_max_tensors=8)   # three parts
    write_gguf(g / "mmproj-tiny-F16.gguf", model, lambda name: T.F16)   # a vision projector: never fetched
    junk = g / "README.md"
    junk.write_text("# tiny\n")
    ggufs = {f.name: f for f in g.iterdir()}
    assert sorted(n for n in ggufs if "Q4_0" in n) == [f"tiny-Q4_0-0000{k}-of-00003.gguf" for k in (1, 2, 3)]
    return {"model": model, "checkpoint": {**_checkpoint_files(model), "README.md": junk, "onnx/model.onnx": junk},
            "gguf": ggufs}


@pytest.fixture
def hub(files, tmp_path, monkeypatch):
    """A hub with the two repositories (and a gated copy of the checkpoint); the cache a fresh HF_HOME."""
    h = LocalHub()
    h.add("tiny/llama", files["checkpoint"])
    h.add("tiny/llama-GGUF", files["gguf"])
    h.add("tiny/gated", files["checkpoint"], gated=True)
    monkeypatch.setenv("HF_ENDPOINT", h.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield h
    h.stop()


def _fetched(hub, since=0):
    """The files the hub sent (their GETs) from its request `since` on, by name."""
    return sorted({path.split("/resolve/", 1)[1].split("/", 1)[1] for method, path, _ in hub.requests[since:]
                   if method == "GET" and "/resolve/" in path})


def _greedy(model):
    from rosefast.engine.llm_engine import LLMEngine
    from rosefast.engine.sampling_params import SamplingParams

    prompt = load_tokenizer(model)(PROMPT).input_ids
    engine = LLMEngine(model=model, dtype="float32", kv_cache_tokens=1024, quantization="auto")
    return engine.generate([prompt], SamplingParams(max_tokens=10, temperature=0, ignore_eos=True),
                           use_tqdm=False)[0]["token_ids"]


def test_names_parse_as_the_peers_write_them_and_pick_the_files_a_model_needs():
    assert HubName.parse("Qwen/Qwen3-0.6B") == HubName("Qwen/Qwen3-0.6B")
    assert HubName.parse("unsloth/Qwen3-4B-GGUF:q4_k_m") == HubName("unsloth/Qwen3-4B-GGUF", "Q4_K_M")
    assert HubName.parse("o/r:Q8_0@v1.0") == HubName.parse("o/r@v1.0:q8_0") == HubName("o/r", "Q8_0", "v1.0")
    for not_a_name in ("./models/x", "/abs/path", "model.gguf", "smollm2-135m", "a/b/c", "o/r:Q8_0:Q4_0", "~/m"):
        assert HubName.parse(not_a_name) is None, not_a_name
    assert [quant_of(f) for f in ("Qwen3-4B-Q4_K_M.gguf", "Q8_0/m-Q8_0-00001-of-00002.gguf", "m-UD-Q4_K_XL.gguf",
                                  "gpt-oss-20b-MXFP4.gguf", "Llama-3.2-1B-Instruct-f16.gguf")] == \
        ["Q4_K_M", "Q8_0", "UD-Q4_K_XL", "MXFP4", "F16"]
    repo = {"README.md": 1, "m-Q8_0.gguf": 8, "m-Q4_K_M.gguf": 4, "mmproj-m-F16.gguf": 2,
            "BF16/m-BF16-00001-of-00002.gguf": 9, "BF16/m-BF16-00002-of-00002.gguf": 9}
    assert pick_files(HubName("o/r"), repo).files == ("m-Q4_K_M.gguf",)             # llama.cpp's default
    assert pick_files(HubName("o/r", "Q8_0"), repo).files == ("m-Q8_0.gguf",)
    split = pick_files(HubName("o/r", "BF16"), repo)
    assert split.files == ("BF16/m-BF16-00001-of-00002.gguf", "BF16/m-BF16-00002-of-00002.gguf")
    assert split.model == split.files[0] and split.kind == "gguf"
    with pytest.raises(ModelError, match="no GGUF of quantization 'Q2_K': it has BF16, Q4_K_M, Q8_0"):
        pick_files(HubName("o/r", "Q2_K"), repo)
    with pytest.raises(ModelError, match="00002-of-00002.gguf is not in the repository"):
        pick_files(HubName("o/r", "BF16"), {"BF16/m-BF16-00001-of-00002.gguf": 9})
    with pytest.raises(ModelError, match="GGUFs of Q4_0, Q8_0 and no Q4_K_M: name one"):
        pick_files(HubName("o/r"), {"m-Q8_0.gguf": 8, "m-Q4_0.gguf": 4})
    assert pick_files(HubName("o/r"), {"only-Q5_K_M.gguf": 5}).files == ("only-Q5_K_M.gguf",)
    checkpoint = {"config.json": 1, "model-00001-of-00002.safetensors": 5, "model-00002-of-00002.safetensors": 5,
                  "model.safetensors.index.json": 1, "tokenizer.json": 1, "onnx/model.onnx": 9, "m-Q8_0.gguf": 8,
                  "original/consolidated.00.pth": 9, "README.md": 1}
    pick = pick_files(HubName("o/r"), checkpoint)   # the checkpoint without a tag, the GGUF with one
    assert pick.kind == "checkpoint" and set(pick.files) == {
        "config.json", "tokenizer.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors"}
    assert pick_files(HubName("o/r", "Q8_0"), checkpoint).files == ("m-Q8_0.gguf",)
    with pytest.raises(ModelError, match="holds no model rosefast serves"):
        pick_files(HubName("o/r"), {"README.md": 1})


def test_a_checkpoint_by_name_is_fetched_into_the_cache_resumed_after_a_cut_and_served_as_the_local_model(
        hub, files, tmp_path, monkeypatch):
    """Only the checkpoint's files are fetched (no README, no onnx/), into HF_HOME's hub cache; the weights'
    transfer cut halfway is resumed from where it stopped (a ranged GET for the rest, not the whole again); the
    model generates exactly as the same model from its local directory; a second start fetches nothing."""
    import huggingface_hub.constants

    # the client reads 10 MB before it writes: a tiny file cut before its first write would restart from byte 0
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 1 << 16)
    hub.cut.add("model.safetensors")
    resolved = resolve_model("tiny/llama")
    assert resolved.name == "tiny/llama" and resolved.source == "directory"
    assert str(resolved.path).startswith(str(tmp_path / "hf" / "hub" / "models--tiny--llama" / "snapshots"))
    assert _fetched(hub) == sorted(n for n in files["checkpoint"] if n not in ("README.md", "onnx/model.onnx"))
    size = files["checkpoint"]["model.safetensors"].stat().st_size
    gets = [r for m, p, r in hub.requests if m == "GET" and p.endswith("/model.safetensors")]
    assert len(gets) == 2 and gets[0] is None, gets
    resumed_at = int(gets[1].split("=")[1].rstrip("-"))
    assert 0 < resumed_at <= size // 2   # the rest asked for, from a byte the first transfer had sent
    assert (resolved.path / "model.safetensors").read_bytes() == files["checkpoint"]["model.safetensors"].read_bytes()
    before = len(hub.requests)
    assert resolve_model("tiny/llama").path == resolved.path
    assert not [r for r in hub.requests[before:] if r[0] == "GET" and "/resolve/" in r[1]]   # cached
    assert _greedy(resolved) == _greedy(files["model"])


def test_a_branch_is_its_own_snapshot(hub, files):
    """`@branch` fetches that branch's commit (here a one-layer model), kept apart from main's in the cache."""
    other = tiny_random("llama", num_hidden_layers=1)
    sha = hub.add("tiny/llama", _checkpoint_files(other), branch="one-layer")
    branch, main = resolve_model("tiny/llama@one-layer"), resolve_model("tiny/llama")
    assert branch.path.name == sha and main.path.name != sha
    assert json.loads((branch.path / "config.json").read_text())["num_hidden_layers"] == 1
    assert json.loads((main.path / "config.json").read_text())["num_hidden_layers"] == 2


def test_a_gguf_by_tag_or_revision_fetches_that_quantization_only_and_a_split_loads_from_its_parts(hub, files):
    """`:q8_0` fetches the Q8_0 file only; `@<commit>:Q4_0` the three parts of the Q4_0 split (never the vision
    projector), which loads from its first part with every part's tensors; each generates as its local file."""
    q8 = resolve_model("tiny/llama-GGUF:q8_0")
    assert q8.source == "gguf" and q8.name == "tiny/llama-GGUF:q8_0"
    assert _fetched(hub) == ["tiny-Q8_0.gguf"]
    commit = json.loads(requests.get(f"{hub.url}/api/models/tiny/llama-GGUF", timeout=5).text)["sha"]
    split = resolve_model(f"tiny/llama-GGUF@{commit}:Q4_0")
    assert _fetched(hub) == ["tiny-Q4_0-00001-of-00003.gguf", "tiny-Q4_0-00002-of-00003.gguf",
                             "tiny-Q4_0-00003-of-00003.gguf", "tiny-Q8_0.gguf"]
    local = files["gguf"]["tiny-Q4_0-00001-of-00003.gguf"]
    assert _greedy(split) == _greedy(resolve_model(str(local)))
    assert _greedy(q8) == _greedy(resolve_model(str(files["gguf"]["tiny-Q8_0.gguf"])))
    with pytest.raises(ModelError, match="no GGUF of quantization 'Q2_K': it has Q4_0, Q8_0"):
        resolve_model("tiny/llama-GGUF:Q2_K")
    with pytest.raises(ModelError, match="GGUFs of Q4_0, Q8_0 and no Q4_K_M: name one"):
        resolve_model("tiny/llama-GGUF")


def test_a_second_start_is_served_from_the_cache_with_the_hub_stopped(hub, monkeypatch):
    """Offline (HF_HUB_OFFLINE=1) or with the hub unreachable, a model fetched before starts from the cache by the
    name it was fetched by; one never fetched is refused, saying so."""
    first = resolve_model("tiny/llama-GGUF:Q8_0")
    checkpoint = resolve_model("tiny/llama")
    hub.stop()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_model("tiny/llama-GGUF:Q8_0").path == first.path
    assert resolve_model("tiny/llama").path == checkpoint.path
    with pytest.raises(ModelError, match="HF_HUB_OFFLINE is set: unset it to fetch it"):
        resolve_model("tiny/llama-GGUF:Q4_0")   # its repository is cached, that file not
    with pytest.raises(ModelError, match=r"tiny/gated is not in the Hugging Face cache .* HF_HUB_OFFLINE is set"):
        resolve_model("tiny/gated")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert resolve_model("tiny/llama").path == checkpoint.path   # the hub down: the cache
    with pytest.raises(ModelError, match="cannot be reached"):
        resolve_model("tiny/gated")


def test_a_server_that_ignores_the_range_gets_the_file_whole_and_checked(hub, files, monkeypatch):
    """A resumed transfer answered with the whole file (200, not 206) is written from the start again, and the
    hash checked on what was written, not on what was hashed on the way."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 1 << 16)
    hub.cut.add("tiny-Q8_0.gguf")
    hub.ignore_range.add("tiny-Q8_0.gguf")
    resolved = resolve_model("tiny/llama-GGUF:Q8_0")
    gets = [r for m, p, r in hub.requests if m == "GET" and p.endswith("/tiny-Q8_0.gguf")]
    assert len(gets) == 3 and gets[2] is not None and gets[2].endswith("-")   # the header, the cut one, the rest
    cache = os.path.join(os.environ["HF_HOME"], "hub")
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache("tiny/llama-GGUF", "tiny-Q8_0.gguf", cache_dir=cache)
    assert open(cached, "rb").read() == files["gguf"]["tiny-Q8_0.gguf"].read_bytes() and resolved.source == "gguf"


def test_a_start_killed_midway_resumes_where_it_stopped(hub, files):
    """A start killed while the weights are on their way (SIGKILL: nothing cleans up) leaves what it had; the
    next start asks the hub for the rest only (a ranged request from there), and the file is whole."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from tests.serving import ROOT

    hub.hold["model.safetensors"] = threading.Event()   # halfway, until the first start is gone
    script = ("import huggingface_hub.constants as c\n"
              "c.DOWNLOAD_CHUNK_SIZE = 1 << 16   # (written as it comes, not 10 MB at a time: a tiny file)\n"
              "from rosefast.sources.resolve import resolve_model\nresolve_model('tiny/llama')\n")
    first = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    blobs = Path(os.environ["HF_HOME"]) / "hub" / "models--tiny--llama" / "blobs"
    size = files["checkpoint"]["model.safetensors"].stat().st_size
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        partial = [p for p in blobs.glob("*.rosefast-partial") if p.stat().st_size >= size // 4] \
            if blobs.is_dir() else []
        if partial:
            break
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert partial, f"the first start never wrote the weights: {hub.requests[-8:]}"
    had = partial[0].stat().st_size
    hub.hold["model.safetensors"].set()
    before = len(hub.requests)
    resolved = resolve_model("tiny/llama")
    gets = [r for m, p, r in hub.requests[before:] if m == "GET" and p.endswith("/model.safetensors")]
    assert gets == [f"bytes={had}-"], (had, size, hub.requests[-12:])
    assert (resolved.path / "model.safetensors").read_bytes() == files["checkpoint"]["model.safetensors"].read_bytes()
    assert not list(blobs.glob("*.rosefast-partial"))


def test_a_corrupted_transfer_is_refused_and_not_cached(hub):
    from huggingface_hub import try_to_load_from_cache

    hub.corrupt.add("tiny-Q8_0.gguf")
    with pytest.raises(ModelError, match=r"tiny-Q8_0.gguf of tiny/llama-GGUF:Q8_0, as fetched, does not match the "
                                         r"hub's hash \(sha256 .* deleted, not cached"):
        resolve_model("tiny/llama-GGUF:Q8_0")
    cache = os.path.join(os.environ["HF_HOME"], "hub")
    assert not isinstance(try_to_load_from_cache("tiny/llama-GGUF", "tiny-Q8_0.gguf", cache_dir=cache), str)
    blobs = os.path.join(cache, "models--tiny--llama-GGUF", "blobs")
    assert not [b for b in os.listdir(blobs) if os.path.getsize(os.path.join(blobs, b)) > 1 << 20]   # nor kept
    hub.corrupt.clear()
    assert resolve_model("tiny/llama-GGUF:Q8_0").source == "gguf"   # fetched anew


def test_each_error_names_what_to_do(hub, files, tmp_path, monkeypatch):
    with pytest.raises(ModelError, match=r"'tiny/nope' is neither a local path nor a repository on the hub"):
        resolve_model("tiny/nope")
    with pytest.raises(ModelError, match=r"tiny/llama has no revision 'v9'"):
        resolve_model("tiny/llama@v9")
    with pytest.raises(ModelError, match=r"tiny/gated is a gated repository: .* set HF_TOKEN"):
        resolve_model("tiny/gated")
    hub.add("tiny/gated-GGUF", {"tiny-Q8_0.gguf": files["gguf"]["tiny-Q8_0.gguf"]}, gated=True)
    with pytest.raises(ModelError, match=r"tiny/gated-GGUF is a gated repository: .* set HF_TOKEN"):
        resolve_model("tiny/gated-GGUF:Q8_0")
    monkeypatch.setenv("HF_TOKEN", hub.token)
    assert resolve_model("tiny/gated").model_type == "llama"
    assert resolve_model("tiny/gated-GGUF:Q8_0").source == "gguf"
    unsupported = tmp_path / "config.json"
    unsupported.write_text(json.dumps({**json.loads(files["checkpoint"]["config.json"].read_text()),
                                       "model_type": "mamba"}))
    hub.add("tiny/mamba", {**files["checkpoint"], "config.json": unsupported})
    before = len(hub.requests)
    with pytest.raises(ModelError, match=r"Unsupported architecture 'mamba' in tiny/mamba's config.json"):
        resolve_model("tiny/mamba")
    assert _fetched(hub, since=before) == ["config.json"]   # refused before its weights
    import gguf
    import numpy as np

    mamba = gguf.GGUFWriter(str(tmp_path / "mamba-Q8_0.gguf"), "mamba")   # an architecture no family serves
    mamba.add_block_count(1)
    mamba.add_tensor("token_embd.weight", np.zeros((1024, 512), dtype=np.float32))   # 2 MB
    mamba.write_header_to_file()
    mamba.write_kv_data_to_file()
    mamba.write_tensors_to_file()
    mamba.close()
    hub.add("tiny/mamba-GGUF", {"mamba-Q8_0.gguf": tmp_path / "mamba-Q8_0.gguf"})
    before = len(hub.requests)
    with pytest.raises(ModelError, match=r"mamba-Q8_0.gguf is a GGUF of llama.cpp's architecture 'mamba', which "
                                         r"rosefast does not serve .*llama.*qwen3.*nothing was fetched"):
        resolve_model("tiny/mamba-GGUF:Q8_0")
    assert [r for m, p, r in hub.requests[before:] if m == "GET" and "/resolve/" in p] == ["bytes=0-262143"]
    local = tmp_path / "tiny" / "llama"   # a path that exists wins over the hub name it spells
    local.mkdir(parents=True)
    for name, path in _checkpoint_files(files["model"]).items():
        (local / name).write_bytes(path.read_bytes())
    monkeypatch.chdir(tmp_path)
    before = len(hub.requests)
    assert resolve_model("tiny/llama").source == "directory" and len(hub.requests) == before


def test_room_is_checked_before_the_first_byte(tmp_path):
    from rosefast.sources.hub import _check_room
    from rosefast.sources.hub_files import Pick

    huge = {"m-Q8_0.gguf": 1 << 50}
    with pytest.raises(ModelError, match=r"fetching o/r:Q8_0 needs 1125899.91 GB, and the disk of .* has .* GB "
                                         r"free: free space there, or set HF_HOME to a larger disk"):
        _check_room(HubName("o/r", "Q8_0"), Pick(("m-Q8_0.gguf",), "m-Q8_0.gguf", "gguf"), huge, huge,
                    str(tmp_path / "not-yet"))


def test_the_server_starts_from_a_hub_name_showing_the_download_in_health(hub, files, monkeypatch):
    """A real gunicorn with ROSEFAST_MODEL=owner/repo@revision: while the weights are on their way (held halfway
    by the hub), /health answers 503 `loading` with the bytes so far and the fraction; then /v1/models answers the
    name given, and it generates as the model from its local directory."""
    from tests.serving import Server, free_port, tiny_env

    hold = hub.hold["model.safetensors"] = threading.Event()
    port = free_port()
    seen = []

    def watch():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                r = requests.get(f"http://127.0.0.1:{port}/health", timeout=2)
                body = r.json()
                if r.status_code == 503 and body.get("download", {}).get("bytes"):
                    seen.append(body)
                    hold.set()
                    return
            except requests.RequestException:
                pass
            time.sleep(0.05)
        hold.set()

    watcher = threading.Thread(target=watch)
    watcher.start()
    env = {**tiny_env(files["model"], quantization="none"), "ROSEFAST_MODEL": "tiny/llama@main",
           "ROSEFAST_SERVED_MODEL_NAME": "", "HF_ENDPOINT": hub.url, "HF_HOME": os.environ["HF_HOME"]}
    s = Server(env, port=port)
    try:
        watcher.join()
        assert seen, "the download was never seen in /health"
        download = seen[0]["download"]
        size = sum(f.stat().st_size for n, f in files["checkpoint"].items()
                   if n not in ("README.md", "onnx/model.onnx"))
        assert seen[0]["status"] == "loading" and download["model"] == "tiny/llama@main"
        assert download["total"] == size and 0 < download["bytes"] < size and 0 < download["fraction"] < 1
        assert requests.get(s.url + "/v1/models", timeout=10).json()["data"][0]["id"] == "tiny/llama@main"
        r = requests.post(s.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 10, "temperature": 0,
                                                           "ignore_eos": True}, timeout=120)
        assert r.status_code == 200, r.text
    finally:
        s.stop()
    want = files["model"]
    assert r.json()["choices"][0]["text"] == load_tokenizer(want).decode(_greedy(want))


def test_a_split_file_is_read_from_its_first_part_each_tensor_a_view_of_its_own_part(files, tmp_path):
    """Every part's tensors, each read from the part whose header lists it (gguf's own reader of each part);
    a later part given, or a part missing, is refused naming the first part or the missing one."""
    import gguf
    import numpy as np

    from rosefast.sources.gguf_file import GGUFError, GGUFFile

    parts = [files["gguf"][f"tiny-Q4_0-0000{k}-of-00003.gguf"] for k in (1, 2, 3)]
    ours = GGUFFile(parts[0])
    assert ours.paths == parts and ours.value("general.architecture") == "llama"
    listed = 0
    for k, path in enumerate(parts):
        for t in gguf.GGUFReader(str(path)).tensors:
            mine = ours.tensors[t.name]
            assert mine.part == k and np.array_equal(mine.data, t.data), t.name
            listed += 1
    assert listed == len(ours.tensors) == ours.value("split.tensors.count")
    with pytest.raises(GGUFError, match="is part 2 of 3 of a split GGUF: load the model from its first part"):
        GGUFFile(parts[1])
    with pytest.raises(ModelError, match="is part 3 of 3 of a split GGUF: serve it from its first part, "
                                         "tiny-Q4_0-00001-of-00003.gguf"):
        resolve_model(str(parts[2]))
    alone = tmp_path / parts[0].name
    alone.write_bytes(parts[0].read_bytes())
    (tmp_path / parts[2].name).write_bytes(parts[2].read_bytes())
    with pytest.raises(GGUFError, match="part 2, tiny-Q4_0-00002-of-00003.gguf, is not beside it"):
        GGUFFile(alone)
    with pytest.raises(ModelError, match="is not beside it"):
        resolve_model(str(alone))


def test_the_fetch_benchmark_runs():
    """benches/hub_fetch.py once, small: both ways fetch the whole file."""
    from benches.hub_fetch import run

    result = run(size_mb=4, repeats=1)
    assert result["bytes"] == 4 << 20 and result["ratio"] > 0   # (the numbers are the benchmark's to print)
