"""Stored responses in a directory (ROSEFAST_RESPONSES_STORE_DIR): one JSON file a response, under its caller's
folder, so that a restart keeps them and every worker and replica pointed at the same directory reads the others'.
A file is written whole or not at all (a temporary file, then a rename); a response deleted or put out by any
worker is gone for all (its file unlinked; the others check for the file before they answer from memory)."""
import json
import logging
import os
import re
from pathlib import Path

from server.json_text import utf8

log = logging.getLogger("rosefast.server")
_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")   # what a response id may be to name a file (resp_ + hex digits)


class ResponseFiles:
    def __init__(self, directory):
        self.root = Path(directory)
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, owner, id_):
        """The file of the caller's response, or None for an id that cannot be one (nothing is read for it)."""
        if not _ID.match(id_):
            return None
        return self.root / (owner or "open") / f"{id_}.json"

    def write(self, stored):
        path = self.path(stored.owner, stored.id)
        if path is None:
            return
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        try:
            tmp.write_bytes(utf8({"owner": stored.owner, "made": stored.made, "response": stored.response,
                                  "input_items": stored.input_items, "context": list(stored.context)}))
            os.utime(tmp, (stored.made, stored.made))   # its time: what the start's sweep reads
            os.replace(tmp, path)
        except OSError as e:   # a full or read-only disk: the response stays in this worker's memory
            log.warning("could not write stored response %s: %s", stored.id, e)
            tmp.unlink(missing_ok=True)

    def read(self, owner, id_):
        """(made, response, input_items, context) from the caller's file, or None."""
        path = self.path(owner, id_)
        if path is None:
            return None
        try:
            data = json.loads(path.read_bytes())
        except (OSError, ValueError):
            return None
        return data["made"], data["response"], data["input_items"], tuple(data["context"])

    def exists(self, owner, id_):
        path = self.path(owner, id_)
        return path is not None and path.exists()

    def remove(self, owner, id_):
        path = self.path(owner, id_)
        if path is not None:
            path.unlink(missing_ok=True)

    def sweep(self, now, ttl_s, max_entries, max_bytes):
        """At start: the files past their time to live removed, then the oldest until the bounds hold."""
        files = []
        for path in self.root.glob("*/*.json"):
            try:
                st = path.stat()
            except OSError:
                continue
            if now - st.st_mtime > ttl_s:
                path.unlink(missing_ok=True)
            else:
                files.append((st.st_mtime, st.st_size, path))
        files.sort()
        total = sum(size for _, size, _ in files)
        while files and (len(files) > max_entries or total > max_bytes):
            _, size, path = files.pop(0)
            path.unlink(missing_ok=True)
            total -= size
        return len(files)
