"""A model named by its hub repository, fetched with huggingface_hub into the standard Hugging Face cache (so a
model another tool downloaded is not fetched again) and served from there as a local one.

    path = fetch(HubName.parse("Qwen/Qwen3-0.6B"))     # the snapshot directory, or the GGUF (its first part)

The hub's settings as huggingface_hub reads them, at the time of the call: `HF_ENDPOINT`, `HF_HOME` /
`HF_HUB_CACHE`, `HF_TOKEN` (gated and private repositories), `HF_HUB_OFFLINE=1` (the cache only; a hub that
cannot be reached falls back to the cache too). Only the files the model needs are fetched, at one commit; before
the first byte, the disk (and, for a GGUF, the memory) is checked for room, and the family (a checkpoint's
config.json, a GGUF's first 256 kB); each file is fetched resumably and enters the cache only when whole and
matching the hub's hash (sources.hub_blobs).
"""
import logging
import os
import shutil
import time
from pathlib import Path

from rosefast.errors import ModelError
from rosefast.sources.hub_blobs import fetch_blob
from rosefast.sources.hub_files import pick_files
from rosefast.sources.progress import DOWNLOAD

log = logging.getLogger("rosefast.engine")


def _settings():
    """(endpoint, cache directory, token, offline), read from the environment now (huggingface_hub's constants
    are read once, at its import)."""
    from huggingface_hub import constants

    endpoint = (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
    cache = os.environ.get("HF_HUB_CACHE") or (
        os.path.join(os.path.expanduser(os.environ["HF_HOME"]), "hub") if os.environ.get("HF_HOME") else
        constants.HF_HUB_CACHE)
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    return endpoint, cache, os.environ.get("HF_TOKEN") or None, offline or constants.HF_HUB_OFFLINE


def fetch(name):
    """The local path serving hub name `name` (a HubName): its snapshot directory (a checkpoint) or its GGUF's
    first part, fetched where not cached; ModelError saying what to do where it cannot be."""
    endpoint, cache, token, offline = _settings()
    listing, commit, hashes = None, None, {}
    if not offline:
        listing, commit, hashes = _remote_listing(name, endpoint, token)
    local_only = listing is None   # offline, or the hub cannot be reached: the cache's snapshot
    if local_only:
        listing, commit = _cached_listing(name, cache, endpoint, offline)
    try:
        pick = pick_files(name, listing)
    except ModelError as e:
        if not local_only:
            raise
        raise ModelError(f"{e}, among its files in the Hugging Face cache ({cache}); {_cache_only(offline, endpoint)}"
                         ) from None
    missing = {f: listing[f] for f in pick.files if _cached(name, f, commit, cache) is None}
    fetch_one = lambda f: _download(name, f, commit, cache, endpoint, token, local_only,  # noqa: E731
                                    hashes if f in missing else None)
    if missing:
        if local_only:
            raise ModelError(f"{name} is not all in the Hugging Face cache ({cache}): {sorted(missing)[0]} is "
                             f"missing; {_cache_only(offline, endpoint)}")
        _check_room(name, pick, listing, missing, cache)
        DOWNLOAD.start(str(name), sum(missing.values()))
        log.info("fetching %s from %s: %d files, %.2f GB, into %s", name, endpoint, len(missing),
                 sum(missing.values()) / 1e9, cache)
    paths = {}
    started = time.monotonic()
    if pick.kind == "checkpoint":   # its family, before its weights
        paths["config.json"] = fetch_one("config.json")
        _check_family(paths["config.json"], name)
    elif pick.model in missing:
        _check_gguf_family(name, pick.model, commit, endpoint, token)
    paths.update({f: fetch_one(f) for f in pick.files if f not in paths})
    if missing:
        DOWNLOAD.finish()
        seconds = time.monotonic() - started
        log.info("fetched %s: %.2f GB in %.1f s (%.1f MB/s)", name, sum(missing.values()) / 1e9, seconds,
                 sum(missing.values()) / 1e6 / max(seconds, 1e-6))
    if not local_only:
        _remember(name, commit, cache)
    return Path(paths[pick.model]) if pick.kind == "gguf" else Path(paths["config.json"]).parent


def _transport_errors():
    """The HTTP client's errors for a hub that cannot be reached or stops answering (huggingface_hub 2's httpx2,
    1's httpx)."""
    try:
        import httpx2 as client
    except ImportError:
        import httpx as client
    return client.TransportError


def _error(name, e, endpoint):
    """The ModelError for huggingface_hub's error `e` fetching `name`."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    if isinstance(e, GatedRepoError):
        return ModelError(f"{name.repo} is a gated repository: accept its terms on {endpoint}/{name.repo} and set "
                          "HF_TOKEN to a token of that account (https://huggingface.co/settings/tokens)")
    if isinstance(e, RevisionNotFoundError):
        return ModelError(f"{name.repo} has no revision {name.revision!r} (a branch, tag or commit of it)")
    if isinstance(e, RepositoryNotFoundError):
        return ModelError(f"{str(name)!r} is neither a local path nor a repository on the hub ({endpoint}): check "
                          "the name (owner/repo); a private repository needs HF_TOKEN")
    return ModelError(f"fetching {name} from {endpoint} failed: {e}")


def _remote_listing(name, endpoint, token):
    """({file: size}, commit, {file: (its LFS sha256 or None, its git blob id)}) of the repository at the
    revision, or (None, None, {}) when the hub cannot be reached."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    try:
        info = HfApi(endpoint=endpoint, token=token).model_info(name.repo, revision=name.revision,
                                                                files_metadata=True)
    except (_transport_errors(), OfflineModeIsEnabled) as e:
        log.warning("the hub (%s) cannot be reached (%s): serving %s from the cache", endpoint, e, name)
        return None, None, {}
    except HfHubHTTPError as e:
        raise _error(name, e, endpoint) from None
    siblings = info.siblings or ()
    return {s.rfilename: int(s.size or 0) for s in siblings}, info.sha, \
        {s.rfilename: (s.lfs.sha256 if s.lfs else None, s.blob_id) for s in siblings}


def _cached_listing(name, cache, endpoint, offline):
    """({file: size}, commit) of the revision's snapshot in the cache; ModelError when none is there."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    revision = name.revision or "main"
    try:
        repos = scan_cache_dir(cache).repos
    except CacheNotFound:
        repos = ()
    for repo in repos:
        if repo.repo_id != name.repo or repo.repo_type != "model":
            continue
        for rev in repo.revisions:
            if rev.commit_hash == revision or revision in rev.refs:
                return {str(f.file_path.relative_to(rev.snapshot_path)): f.size_on_disk for f in rev.files}, \
                    rev.commit_hash
    raise ModelError(f"{name} is not in the Hugging Face cache ({cache}); {_cache_only(offline, endpoint)}")


def _cache_only(offline, endpoint):
    return ("HF_HUB_OFFLINE is set: unset it to fetch it" if offline else
            f"the hub ({endpoint}) cannot be reached: connect, or set HF_ENDPOINT to a mirror")


def _cached(name, filename, commit, cache):
    from huggingface_hub import try_to_load_from_cache

    if commit is None:
        return None
    found = try_to_load_from_cache(name.repo, filename, cache_dir=cache, revision=commit)
    return found if isinstance(found, str) else None


def _check_family(config_path, name):
    """ModelError naming the model_type of a checkpoint no family here serves (its config.json alone fetched)."""
    from rosefast.sources.resolve import _read_model_type, check_architecture

    check_architecture(_read_model_type(Path(config_path).parent), f"{name}'s config.json")


def _check_gguf_family(name, filename, commit, endpoint, token):
    """ModelError, before the file is fetched, when its first 256 kB (a ranged read) name a llama.cpp architecture
    no family here serves."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_backoff

    from huggingface_hub.errors import HfHubHTTPError

    from rosefast.models.registry import FAMILIES, gguf_family
    from rosefast.sources.gguf_file import architecture_in

    url = hf_hub_url(name.repo, filename, revision=commit, endpoint=endpoint)
    try:
        response = http_backoff("GET", url, headers={**build_hf_headers(token=token), "Range": "bytes=0-262143"},
                                follow_redirects=True)
        hf_raise_for_status(response)
    except HfHubHTTPError as e:
        raise _error(name, e, endpoint) from None
    except _transport_errors() as e:
        raise ModelError(f"fetching {filename} of {name} failed ({type(e).__name__}: {e}); start again") from None
    arch = architecture_in(response.content[:262144])
    if arch is not None and gguf_family(arch) is None:
        served = ", ".join(sorted({f.gguf_architecture for f in FAMILIES.values()}))
        raise ModelError(f"{name}: {filename} is a GGUF of llama.cpp's architecture {arch!r}, which rosefast does "
                         f"not serve (GGUF architectures served: {served}); nothing was fetched")


def _check_room(name, pick, listing, missing, cache):
    """ModelError, before the first byte, when the files to fetch do not fit on the cache's disk (or a GGUF in
    memory, where it is served from)."""
    from rosefast.sources.memory import check_size_fits

    need = sum(missing.values())
    where = Path(cache)
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free
    if need > free:
        raise ModelError(f"fetching {name} needs {need / 1e9:.2f} GB, and the disk of {cache} has "
                         f"{free / 1e9:.2f} GB free: free space there, or set HF_HOME to a larger disk")
    if pick.kind == "gguf":
        check_size_fits(sum(listing[f] for f in pick.files), f"{name} ({pick.model})")


def _download(name, filename, commit, cache, endpoint, token, local_only, hashes):
    """The cached path of `filename`: its blob fetched first (resumably, checked against `hashes`, the listing's)
    where it is not cached (`hashes` None: it is), then put in the snapshot by huggingface_hub."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError

    try:
        if hashes is not None and not local_only:
            fetch_blob(name.repo, filename, commit, cache, endpoint, token, hashes.get(filename), str(name))
        return hf_hub_download(name.repo, filename, revision=commit, cache_dir=cache, endpoint=endpoint,
                               token=token, local_files_only=local_only)
    except LocalEntryNotFoundError:
        raise ModelError(f"{name}'s {filename} is not in the Hugging Face cache ({cache}) and cannot be fetched "
                         "(HF_HUB_OFFLINE, or the hub cannot be reached)") from None
    except (HfHubHTTPError, EntryNotFoundError) as e:
        raise _error(name, e, endpoint) from None
    except (OSError, _transport_errors()) as e:   # a transfer that ended short or stalled past the client's
        raise ModelError(f"fetching {filename} of {name} failed ({type(e).__name__}: {e}); start again: it "
                         "resumes where it stopped") from None


def _remember(name, commit, cache):
    """Point the revision's ref at `commit` in the cache (files fetched by their commit do not), so that an
    offline start finds the snapshot by the name it was given."""
    from huggingface_hub.file_download import repo_folder_name

    if name.revision == commit:
        return
    ref = Path(cache) / repo_folder_name(repo_id=name.repo, repo_type="model") / "refs" / (name.revision or "main")
    if ref.is_file() and ref.read_text().strip() == commit:
        return
    ref.parent.mkdir(parents=True, exist_ok=True)
    tmp = ref.with_name(f".{ref.name}.{os.getpid()}")
    tmp.write_text(commit)
    os.replace(tmp, ref)
