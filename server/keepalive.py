"""The connections a worker holds open between requests (HTTP keep-alive): a draining worker closes them once
its last request has ended. gunicorn's graceful exit waits for every connection's handler, and an idle one
only ends when its keep-alive timeout does (5 s), so each stop or restart otherwise waited that long."""
import socket
import weakref


class IdleConnections:
    """Sockets between two requests: `idle` when an answer is out (gunicorn's post_request), `busy` when the
    next request starts; `close_idle` shuts the idle ones (their handlers read end-of-stream and end)."""

    def __init__(self):
        self._idle = weakref.WeakSet()   # a socket closed by its client is forgotten with it

    def busy(self, sock):
        if sock is not None:
            self._idle.discard(sock)

    def idle(self, sock):
        if sock is not None:
            self._idle.add(sock)

    def close_idle(self):
        """Shut every idle connection; how many."""
        closed = 0
        for sock in list(self._idle):
            try:
                _shut(sock)
                closed += 1
            except OSError:   # already closed
                pass
        self._idle.clear()
        return closed


def _shut(sock):
    """Shut the connection through a second descriptor of it: its handler's read then sees the end of the stream,
    as when a client leaves (gevent's own shutdown would cancel the handler's wait with an error instead)."""
    twin = socket.fromfd(sock.fileno(), sock.family, sock.type)
    try:
        twin.shutdown(socket.SHUT_RDWR)
    finally:
        twin.close()
