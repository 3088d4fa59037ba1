"""Notice a client that went away while its request is still generating, without waiting for a write.

A greenlet waits until the client socket is readable; a zero-byte peek means the peer closed it. Any
other bytes (a pipelined request) end the watch: that connection is still alive.
"""
import socket
import sys


def watch(environ, on_disconnect):
    """Start watching the request's socket (gunicorn's gevent worker); returns a stop() callable."""
    sock = environ.get("gunicorn.socket")
    if sock is None or "gevent" not in sys.modules:
        return lambda: None
    import gevent
    from gevent.socket import wait_read

    def run():
        try:
            wait_read(sock.fileno())
            if sock.recv(1, socket.MSG_PEEK) == b"":
                on_disconnect()
        except (OSError, ValueError):
            on_disconnect()   # the socket is already closed or broken: the client is gone

    greenlet = gevent.spawn(run)
    return lambda: greenlet.kill(block=False)
