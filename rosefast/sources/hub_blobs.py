"""A file of a hub repository fetched into the Hugging Face cache's blobs (sources.hub): appended to a partial
file that outlives the process, so that a cut transfer or a start after a killed one resumes with a ranged
request for the rest; hashed on the way; renamed into its blob only when whole and matching the hash the hub
lists, where huggingface_hub then links it into the snapshot as its own.

    fetch_blob(repo, filename, commit, cache, endpoint, token, (sha256, blob_id), "owner/repo:Q4_K_M")
"""
import functools
import hashlib
import logging
import os
import time
from pathlib import Path

from rosefast.errors import ModelError
from rosefast.sources.progress import DOWNLOAD

log = logging.getLogger("rosefast.engine")

REPORT_EVERY_S = 5.0


@functools.cache
def counted_tqdm():
    """A tqdm class for huggingface_hub's downloads: its bar on stderr where that is a terminal (bytes, rate,
    ETA), every byte counted in sources.progress.DOWNLOAD (what /health shows), and a log line every
    REPORT_EVERY_S seconds (a server's log is not a terminal)."""
    from huggingface_hub.utils import tqdm

    last = [time.monotonic()]

    class Counted(tqdm):
        def update(self, n=1):
            DOWNLOAD.add(n)
            if time.monotonic() - last[0] >= REPORT_EVERY_S:
                last[0] = time.monotonic()
                v = DOWNLOAD.view()
                log.info("fetching %s: %.2f of %.2f GB (%.0f%%), %.1f MB/s, %.0f s left", v["model"], v["bytes"] / 1e9,
                         v["total"] / 1e9, 100 * v["fraction"], v["rate_mb_s"], v["eta_s"])
            return super().update(n)
    return Counted


def fetch_blob(repo, filename, commit, cache, endpoint, token, listed, what):
    """Fetch `filename` of `repo` at `commit` into the cache's blob of its hub hash (its etag), where
    huggingface_hub then finds it: appended to `<etag>.rosefast-partial` (kept across processes, so that a start
    after an interrupted one resumes with a ranged request for the rest; huggingface_hub 2 keeps no partial file
    across processes), under a lock beside it (two workers never append to one file), hashed as it arrives,
    renamed into place only once whole and matching the hash the hub lists (`listed`: its LFS sha256 or None, its
    git blob id; or None); a file that does not match is deleted, never cached (ModelError naming it as part of
    `what`, the model)."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get, repo_folder_name
    from huggingface_hub.utils import WeakFileLock, build_hf_headers

    meta = get_hf_file_metadata(hf_hub_url(repo, filename, revision=commit, endpoint=endpoint), token=token,
                                endpoint=endpoint)
    blobs = Path(cache) / repo_folder_name(repo_id=repo, repo_type="model") / "blobs"
    blob = blobs / meta.etag
    blobs.mkdir(parents=True, exist_ok=True)
    partial = blob.with_name(f"{meta.etag}.rosefast-partial")
    with WeakFileLock(blob.with_name(f"{meta.etag}.rosefast-lock")):
        if blob.exists():   # another process fetched it meanwhile
            return
        have = partial.stat().st_size if partial.exists() else 0
        if meta.size is not None and have > meta.size:
            partial.unlink()
            have = 0
        out = _Hashing(_hasher(listed, meta.size), partial, have)
        if have:
            log.info("resuming %s of %s at %.1f MB of %.1f MB", filename, what, have / 1e6, (meta.size or 0) / 1e6)
            DOWNLOAD.add(have)
        try:
            with open(partial, "ab") as f:
                out.file = f
                http_get(meta.location, out, resume_size=have, headers=build_hf_headers(token=token),
                         expected_size=meta.size, displayed_filename=filename, tqdm_class=counted_tqdm())
            digest = out.digest
        finally:
            out.close()
        _verify(partial, filename, what, listed, digest)
        os.chmod(partial, 0o644)
        os.replace(partial, blob)


def _hasher(listed, size):
    """(kind, the hash the hub lists, a hashlib object to feed the file's bytes), or None where none is listed."""
    sha256, blob_id = listed or (None, None)
    if sha256:
        return "sha256", sha256, hashlib.sha256()
    if blob_id and size is not None:
        return "git blob id", blob_id, hashlib.sha1(f"blob {size}\0".encode())
    return None


class _Hashing:
    """The partial file as huggingface_hub's http_get writes it: each chunk also fed to the hash, on a thread of
    its own (hashlib lets go of the GIL: the hash runs while the next chunk is on its way, ~1.6 GB/s of sha256
    beside the transfer rather than after it), the bytes already there (a resumed file's) first. A rewind (a
    server that ignored the range: http_get starts the file again) gives the hash up (`digest` None: the file is
    read again)."""

    def __init__(self, hasher, partial, have):
        import threading
        from concurrent.futures import ThreadPoolExecutor

        self.file, self._hasher = None, hasher
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rosefast-hash") if hasher is not None else None
        self._room = threading.BoundedSemaphore(8)   # chunks waiting to be hashed (huggingface_hub's are 10 MB)
        if hasher is not None and have:
            _feed(hasher[2], partial)

    def _update(self, digest, data):
        try:
            digest.update(data)
        finally:
            self._room.release()

    @property
    def digest(self):
        """The hasher fed every byte written, or None."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        return self._hasher

    def close(self):
        """Let the hashing thread go (a transfer that failed: the partial file stays, hashed again on resume)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def write(self, data):
        if self._hasher is not None:
            self._room.acquire()
            self._pool.submit(self._update, self._hasher[2], bytes(data))
        return self.file.write(data)

    def seek(self, *args):
        self._hasher = None
        return self.file.seek(*args)

    def truncate(self, *args):
        self._hasher = None
        return self.file.truncate(*args)

    def __getattr__(self, attr):
        return getattr(self.file, attr)


def _verify(path, filename, what, listed, hashed=None):
    """ModelError, the file deleted, when what was fetched is not what the hub lists (its LFS sha256, or the git
    blob id of a small file); `hashed`: a _hasher already fed the file's bytes, else the file is read."""
    if hashed is None:
        hashed = _hasher(listed, os.path.getsize(path))
        if hashed is None:
            return
        _feed(hashed[2], path)
    kind, want, digest = hashed
    got = digest.hexdigest()
    if got != want:
        os.unlink(path)
        raise ModelError(f"{filename} of {what}, as fetched, does not match the hub's hash ({kind} {got[:16]}... "
                         f"where the hub lists {want[:16]}...): it was deleted, not cached; start again to fetch it "
                         "anew")


def _feed(digest, path):
    """Feed the bytes of the file at `path` to `digest`, 4 MB at a time."""
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
