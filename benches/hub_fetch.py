"""A model fetched by its hub name beside huggingface_hub's own download of the same file, from one hub on
loopback (tests/hub_server.py), each into a fresh cache: what rosefast's way (a partial file that outlives the
process, the hub's sha256 checked before the file enters the cache) costs over the client a user would otherwise
run (`hf download`, `hf_hub_download`: no hash check).

    python -m benches.hub_fetch --size-mb 2048            # a file of that many random MB
    python -m benches.hub_fetch --file model-Q4_K_M.gguf  # a file of yours (its name must carry a quantization)
"""
import argparse
import json
import os
import tempfile
import time
from pathlib import Path


def run(size_mb=256, file=None, repeats=2):
    """{"bytes", "rosefast_s", "huggingface_hub_s", "ratio", "rosefast_mb_s", "huggingface_hub_mb_s"}: the best
    of `repeats` fetches each."""
    import subprocess
    import sys

    from huggingface_hub import hf_hub_download

    from rosefast.sources.hub import fetch
    from rosefast.sources.hub_files import HubName

    work = Path(tempfile.mkdtemp(prefix="hub-fetch-"))
    if file is None:
        file = work / "bench-Q8_0.gguf"
        with open(file, "wb") as f:
            for _ in range(size_mb):
                f.write(os.urandom(1 << 20))
    file = Path(file)
    size = file.stat().st_size
    # the hub in a process of its own (as a remote one is: not sharing this process's GIL)
    hub = subprocess.Popen([sys.executable, "-c", HUB.format(name=file.name, path=str(file))], stdout=subprocess.PIPE,
                           text=True, cwd=Path(__file__).resolve().parent.parent)
    url = hub.stdout.readline().strip()
    saved = {k: os.environ.get(k) for k in ("HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE")}
    times = {"rosefast": [], "huggingface_hub": []}
    try:
        os.environ["HF_ENDPOINT"] = url
        for k in ("HF_HUB_CACHE", "HF_HUB_OFFLINE"):
            os.environ.pop(k, None)
        for i in range(repeats):
            for way in times:
                home = work / f"{way}-{i}"
                os.environ["HF_HOME"] = str(home)
                t0 = time.perf_counter()
                if way == "rosefast":
                    fetch(HubName("bench/model", tag=None))
                else:
                    hf_hub_download("bench/model", file.name, cache_dir=str(home / "hub"), endpoint=url)
                times[way].append(time.perf_counter() - t0)
                _remove(home)
    finally:
        hub.kill()
        hub.wait()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _remove(work)
    ours, theirs = min(times["rosefast"]), min(times["huggingface_hub"])
    return {"bytes": size, "rosefast_s": round(ours, 3), "huggingface_hub_s": round(theirs, 3),
            "ratio": round(ours / theirs, 3), "rosefast_mb_s": round(size / 1e6 / ours, 1),
            "huggingface_hub_mb_s": round(size / 1e6 / theirs, 1)}


HUB = """
import time
from pathlib import Path
from tests.hub_server import LocalHub
hub = LocalHub()
hub.add("bench/model", {{{name!r}: Path({path!r})}})
print(hub.url, flush=True)
time.sleep(86400)
"""


def _remove(path):
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=int, default=256)
    p.add_argument("--file", default=None)
    p.add_argument("--repeats", type=int, default=2)
    a = p.parse_args(argv)
    result = run(a.size_mb, a.file, a.repeats)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
