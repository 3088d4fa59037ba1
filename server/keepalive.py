"""The connections a worker holds open between requests (HTTP keep-alive). gunicorn.conf.py keeps an idle one
open longer than clients keep theirs pooled (so the client, not the server, ends it: the other way round a
request sent as the server closes fails), closes the longest idle one past `idle_limit` (so idle ones leave
room for a new client to be answered, or refused with its 429, at once), and a draining worker closes them once
its last request has ended (gunicorn's graceful exit waits for every connection's handler, and an idle one only
ends when its keep-alive timeout does)."""
import socket
import weakref


class IdleConnections:
    """Sockets between two requests: `idle` when an answer is out (gunicorn's post_request), `busy` when the
    next request starts; at most `limit` idle at once (past it the longest idle is shut; None: no limit);
    `close_idle` shuts the idle ones and every one that goes idle after (their handlers read end-of-stream and
    end)."""

    def __init__(self, limit=None):
        self.limit = limit
        self.reclaimed = 0   # idle connections shut to stay within the limit
        self._idle = weakref.WeakKeyDictionary()   # the longest idle first; a socket its client closed is forgotten
        self._closing = False

    def __len__(self):
        return len(self._idle)

    def busy(self, sock):
        if sock is not None:
            self._idle.pop(sock, None)

    def idle(self, sock):
        if sock is None:
            return
        if self._closing:
            _try_shut(sock)
            return
        self._idle.pop(sock, None)   # (to the end: the most recently idle)
        self._idle[sock] = None
        while self.limit is not None and len(self._idle) > self.limit:
            oldest = next(iter(self._idle))
            del self._idle[oldest]
            self.reclaimed += _try_shut(oldest)

    def close_idle(self):
        """Shut every idle connection, and from now on each one as it goes idle; how many were shut now."""
        self._closing = True
        closed = sum(_try_shut(sock) for sock in list(self._idle))
        self._idle.clear()
        return closed


def idle_limit(worker_connections, max_inflight_requests):
    """How many connections may sit idle: half of what the requests in flight leave of the worker's connections
    (half of them all where nothing bounds the requests in flight), at least one."""
    spare = worker_connections - max_inflight_requests if max_inflight_requests else worker_connections
    return max(1, spare // 2)


def _try_shut(sock):
    """Shut the connection through a second descriptor of it: its handler's read then sees the end of the stream,
    as when a client leaves (gevent's own shutdown would cancel the handler's wait with an error instead).
    1 if it was shut, 0 if it was already closed."""
    try:
        twin = socket.fromfd(sock.fileno(), sock.family, sock.type)
    except OSError:
        return 0
    try:
        twin.shutdown(socket.SHUT_RDWR)
        return 1
    except OSError:
        return 0
    finally:
        twin.close()
