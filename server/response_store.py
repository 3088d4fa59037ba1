"""The Responses API's stored responses (`store`, `previous_response_id`, `background`, retrieve, delete,
input_items, cancel): bounded in entries and in bytes of JSON, the least recently used out first, each kept at most
its time to live, under the caller that made it (server.auth.caller: with several API keys, one key never reads
another's). In the worker's memory; with a directory (server.response_files) also in a file each, which a restart
and every other worker pointed at it read (docs/serving.md#stored-responses).

Every use is in the worker's hub (greenlets), so nothing here locks."""
import collections
import time

from server.json_text import dumps
from server.response_files import ResponseFiles

_REF = 8   # what one shared reference to an earlier turn's item costs here, in bytes


class Stored:
    """One stored response: `response`, the response object as answered (its status and output updated while a
    background one runs); `input_items`, this turn's input as items with ids; `context`, the conversation before
    it (earlier turns' input and output items) that a following turn renders first; `run`, a background
    response's Run while it runs (cancel and delete abort it)."""
    __slots__ = ("owner", "response", "input_items", "context", "run", "cancelled", "deleted", "made", "size")

    def __init__(self, owner, response, input_items, context=()):
        self.owner, self.response, self.input_items, self.context = owner, response, input_items, tuple(context)
        self.run, self.cancelled, self.deleted, self.made, self.size = None, False, False, None, 0

    @property
    def id(self):
        return self.response["id"]

    def conversation(self):
        """Every item of the conversation up to and with this response: what `previous_response_id` continues."""
        return self.context + tuple(self.input_items) + tuple(self.response["output"])

    def measure(self):
        """Its size: its own JSON (the earlier turns' items are shared with their own entries: a reference each)."""
        self.size = len(dumps(self.response)) + len(dumps(self.input_items)) + _REF * len(self.context)
        return self.size


class ResponseStore:
    def __init__(self, max_entries, max_bytes, ttl_s, directory=None, clock=time.time):
        self.max_entries, self.max_bytes, self.ttl_s, self.clock = max_entries, max_bytes, ttl_s, clock
        self._entries = collections.OrderedDict()   # (owner, id) -> Stored, least recently used first
        self.bytes = 0
        self.evicted = 0   # entries put out for room (not the expired, not the deleted)
        self.files = ResponseFiles(directory) if directory and self.enabled else None
        if self.files is not None:
            self.files.sweep(clock(), ttl_s, max_entries, max_bytes)

    def __len__(self):
        return len(self._entries)

    @property
    def enabled(self):
        return self.max_entries > 0

    def put(self, stored):
        """Keep `stored` (again, after a change: its size measured anew), putting out the least recently used for
        room; False where it alone is larger than the whole store (then it is not kept)."""
        key = (stored.owner, stored.id)
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old.size
        if not self.enabled or stored.measure() > self.max_bytes:
            return False
        now = self.clock()
        if stored.made is None:
            stored.made = now
        while self._entries:   # the expired at the front (the least recently used) go first
            head = next(iter(self._entries.values()))
            if now - head.made <= self.ttl_s:
                break
            self._drop((head.owner, head.id))
        self._hold(key, stored)
        if self.files is not None:
            self.files.write(stored)
        return True

    def _hold(self, key, stored):
        self._entries[key] = stored
        self.bytes += stored.size
        while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
            (owner, id_), out = self._entries.popitem(last=False)
            self.bytes -= out.size
            self.evicted += 1
            if self.files is not None:
                self.files.remove(owner, id_)

    def get(self, owner, id_):
        """The caller's stored response by its id, or None (never made, another caller's, deleted, put out for
        room, or past its time to live)."""
        key = (owner, id_)
        stored = self._entries.get(key)
        if self.files is not None and (stored is None or stored.run is None):   # the file says what it is now
            stored = self._read(key, stored)
        if stored is None:
            return None
        if self.clock() - stored.made > self.ttl_s:
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return stored

    def delete(self, owner, id_):
        """Forget the caller's response; whether it was there."""
        if self.get(owner, id_) is None:
            return False
        self._drop((owner, id_))
        return True

    def _read(self, key, held):
        """The response as its file has it (another worker may have finished, deleted or put it out), held in
        memory as this worker's; None where there is no file."""
        found = self.files.read(*key)
        if held is not None:
            self.bytes -= self._entries.pop(key).size
        if found is None:
            return None
        made, response, input_items, context = found
        stored = Stored(key[0], response, input_items, context)
        stored.made = made
        if stored.measure() <= self.max_bytes:
            self._hold(key, stored)
        return stored

    def _drop(self, key):
        self.bytes -= self._entries.pop(key).size
        if self.files is not None:
            self.files.remove(*key)
