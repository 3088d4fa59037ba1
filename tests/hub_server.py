"""A model hub on loopback for the tests (there is no network here): the endpoints the real `huggingface_hub`
client calls, laid out and answered as the hub answers them, serving repositories made in the test.

    hub = LocalHub()                                          # started; hub.url for HF_ENDPOINT
    hub.add("tiny/llama", {"config.json": path, ...})         # a commit on main; returns its sha
    hub.cut.add("model.safetensors")                          # its next transfer (to its end) ends halfway
    hub.corrupt.add("model.safetensors")                      # served with one byte changed, its size unchanged
    hub.hold["x.gguf"] = threading.Event()                    # a transfer of it waits halfway until set
    hub.ignore_range.add("x.gguf")                            # a ranged GET of it answered 200, the whole file
    hub.requests                                              # [(method, path, Range header)]
    hub.stop()

GET /api/models/{repo}[/revision/{rev}] (?blobs=true: sizes, git blob ids, LFS sha256s) and HEAD/GET
/{repo}/resolve/{rev}/{file} (X-Repo-Commit, ETag: the LFS sha256 of a large file or the git blob id of a small
one, ranged GETs answered 206), with the hub's error codes (X-Error-Code: RepoNotFound, RevisionNotFound,
EntryNotFound, GatedRepo: a gated repository's files need `Authorization: Bearer <token>`).
"""
import hashlib
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

LFS_SUFFIXES = (".gguf", ".safetensors", ".bin")


class _Repo:
    def __init__(self, gated):
        self.gated, self.commits, self.refs = gated, {}, {}


class LocalHub:
    def __init__(self, token="hf_test_token"):
        self.token = token
        self.repos = {}
        self.cut, self.corrupt, self.hold, self.ignore_range = set(), set(), {}, set()
        self.requests = []
        self.connections = set()
        self._lock = threading.Lock()
        hub = self

        class Handler(_Handler):
            owner = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def add(self, repo, files, branch="main", gated=False):
        """A commit of `files` ({name in the repository: local path}) on `branch` of `repo`; its sha."""
        entry = self.repos.setdefault(repo, _Repo(gated))
        listed = {}
        for name, path in files.items():
            size = Path(path).stat().st_size
            sha256, blob = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % size)
            with open(path, "rb") as f:
                while chunk := f.read(1 << 22):
                    sha256.update(chunk)
                    blob.update(chunk)
            listed[name] = {"path": Path(path), "size": size, "lfs": name.endswith(LFS_SUFFIXES),
                            "sha256": sha256.hexdigest(), "blob": blob.hexdigest()}
        sha = hashlib.sha1(json.dumps([repo, branch, len(entry.commits), sorted(listed)]).encode()).hexdigest()
        entry.commits[sha] = listed
        entry.refs[branch] = sha
        return sha

    def stop(self):
        for event in self.hold.values():
            event.set()
        self._server.shutdown()
        self._server.server_close()
        for connection in list(self.connections):   # the kept-alive ones too: the hub is gone
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def log(self, method, path, range_header):
        with self._lock:
            self.requests.append((method, path, range_header))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    owner = None

    def log_message(self, *args):
        pass

    def setup(self):
        super().setup()
        self.owner.connections.add(self.connection)

    def finish(self):
        self.owner.connections.discard(self.connection)
        super().finish()

    def _error(self, status, code, message):
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, value):
        body = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _commit(self, repo, revision):
        """(repo entry, sha, files), or None after answering the error."""
        entry = self.owner.repos.get(repo)
        if entry is None:
            self._error(404, "RepoNotFound", f"Repository not found: {repo}")
            return None
        sha = entry.refs.get(revision, revision if revision in entry.commits else None)
        if sha is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return None
        return entry, sha, entry.commits[sha]

    def do_GET(self):
        self._serve()

    def do_HEAD(self):
        self._serve()

    def _serve(self):
        try:
            self._answer()
        except (BrokenPipeError, ConnectionResetError):   # the client went away (killed, in a test)
            self.close_connection = True

    def _answer(self):
        path = urlparse(self.path).path
        self.owner.log(self.command, path, self.headers.get("Range"))
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            repo = "/".join(parts[2:4])
            revision = parts[5] if len(parts) >= 6 and parts[4] == "revision" else "main"
            found = self._commit(repo, revision)
            if found is not None:
                entry, sha, files = found
                self._json({"id": repo, "sha": sha, "private": False, "gated": "auto" if entry.gated else False,
                            "siblings": [{"rfilename": name, "size": f["size"], "blobId": f["blob"],
                                          **({"lfs": {"size": f["size"], "sha256": f["sha256"],
                                                      "pointerSize": 134}} if f["lfs"] else {})}
                                         for name, f in sorted(files.items())]})
            return
        if len(parts) >= 5 and parts[2] == "resolve":
            found = self._commit("/".join(parts[:2]), parts[3])
            if found is not None:
                self._file(found, "/".join(parts[4:]))
            return
        self._error(404, "NotFound", f"no route {path}")

    def _file(self, found, name):
        entry, sha, files = found
        if entry.gated and self.headers.get("Authorization") != f"Bearer {self.owner.token}":
            self._error(401, "GatedRepo", "Access to this model is restricted: you must have access to it and be "
                                          "authenticated to access it")
            return
        f = files.get(name)
        if f is None:
            self._error(404, "EntryNotFound", f"{name} does not exist on this revision")
            return
        etag = f["sha256"] if f["lfs"] else f["blob"]
        start, end = 0, f["size"]
        ranged = self.headers.get("Range")
        if name in self.owner.ignore_range:   # as a CDN that drops the Range header does
            ranged = None
        if ranged and self.command == "GET":   # bytes=a- or bytes=a-b
            first, last = ranged.split("=", 1)[1].split("-", 1)
            start, end = int(first), min(int(last) + 1, f["size"]) if last else f["size"]
        self.send_response(206 if ranged and self.command == "GET" else 200)
        self.send_header("X-Repo-Commit", sha)
        self.send_header("ETag", f'"{etag}"')
        if f["lfs"]:
            self.send_header("X-Linked-Etag", f'"{etag}"')
            self.send_header("X-Linked-Size", str(f["size"]))
        self.send_header("Content-Length", str(end - start))
        if ranged and self.command == "GET":
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{f['size']}")
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        if self.command == "HEAD":
            return
        body_size = end - start
        half = body_size // 2
        corrupt_at = f["size"] // 2 if name in self.owner.corrupt else -1
        asked = self.headers.get("Range")
        cut = name in self.owner.cut and (asked is None or asked.endswith("-"))   # a transfer of the file's rest:
        if cut:                                                                     # it ends halfway, once
            self.owner.cut.discard(name)
        hold = self.owner.hold.get(name)
        sent = 0
        with open(f["path"], "rb") as source:   # streamed from the file: a GB-sized one is never held whole
            source.seek(start)
            while sent < body_size:
                step = min(1 << 20, body_size - sent, half - sent if (cut or hold) and sent < half else 1 << 20)
                chunk = bytearray(source.read(step))
                if start + sent <= corrupt_at < start + sent + len(chunk):   # one byte changed, the size kept
                    chunk[corrupt_at - start - sent] ^= 0xFF
                self.wfile.write(chunk)
                sent += len(chunk)
                if sent == half and cut:
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_WR)
                    return
                if sent == half and hold is not None:
                    self.wfile.flush()
                    hold.wait(120)
