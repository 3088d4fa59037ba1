"""server.keepalive.IdleConnections on real socket pairs: the limit shuts the longest idle connection, a
connection that became busy is not shut, and after a drain's close_idle every connection that goes idle is shut."""
import socket

from server.keepalive import IdleConnections, idle_limit


def _pairs(n):
    return [socket.socketpair() for _ in range(n)]


def _shut(pair):
    """Whether the server side (pair[0]) was shut: its peer reads the end of the stream."""
    pair[1].settimeout(0.2)
    try:
        return pair[1].recv(1) == b""
    except TimeoutError:
        return False


def test_past_the_limit_the_longest_idle_connection_is_shut():
    pairs = _pairs(4)
    conns = IdleConnections(limit=2)
    conns.idle(pairs[0][0])
    conns.idle(pairs[1][0])
    conns.busy(pairs[1][0])     # its next request: no longer idle
    conns.idle(pairs[2][0])
    conns.idle(pairs[0][0])     # answered again: now the most recently idle (2, then 0)
    conns.idle(pairs[3][0])     # three idle: the longest idle, 2, goes
    assert [_shut(p) for p in pairs] == [False, False, True, False]
    assert len(conns) == 2 and conns.reclaimed == 1


def test_after_close_idle_every_connection_that_goes_idle_is_shut():
    pairs = _pairs(3)
    conns = IdleConnections()
    conns.idle(pairs[0][0])
    conns.busy(pairs[1][0])
    assert conns.close_idle() == 1
    conns.idle(pairs[1][0])     # its answer went out during the drain
    assert [_shut(p) for p in pairs] == [True, True, False] and len(conns) == 0


def test_idle_connections_take_half_of_what_the_requests_in_flight_leave():
    assert idle_limit(1000, 256) == 372
    assert idle_limit(8, 0) == 4        # nothing bounds the requests in flight: half of them all
    assert idle_limit(100, 200) == 1    # a worker smaller than its requests in flight still keeps one
