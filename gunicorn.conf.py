# gunicorn settings for rosefast: `gunicorn -k gevent server:app` reads this file from the working directory.
# One worker = one engine = one model copy; more throughput means more replicas behind a load balancer, or on
# a multi-GPU host one worker per GPU: `ROSEFAST_DEVICE='cuda:{worker}' gunicorn -k gevent -w 4 server:app`.
bind = "127.0.0.1:8000"
worker_class = "gevent"
workers = 1
worker_connections = 1000   # bounds the open connections of the worker: keep it well above ROSEFAST_MAX_INFLIGHT_REQUESTS
timeout = 120               # a heartbeat, not a request limit: long streams are fine while the hub runs
graceful_timeout = 30       # on SIGTERM, in-flight streams get this long to finish
# An idle connection stays open longer than clients keep theirs pooled — httpx (the OpenAI and Anthropic SDKs) 5 s,
# aiohttp 15 s, nginx's upstream pool (deploy/) 60 s —, so the client ends it: where the server's timeout is the
# shorter (gunicorn's default is 5 s, httpx's expiry too), a request sent as the server closes fails with a
# connection error. Idle connections past half of what the requests in flight leave of worker_connections are closed
# longest idle first (server/keepalive.py), so a new client is answered at once. It also bounds how long a request's
# headers may take to arrive.
keepalive = 75
preload_app = False         # the model and its threads are made in the worker, after fork
accesslog = None            # rosefast logs its own access line per request (rosefast.access)
loglevel = "info"
control_socket_disable = True   # one fixed socket path per user would clash between several servers


def pre_fork(server, worker):
    """Number the worker about to be forked with the lowest index no live worker holds (0..N-1): a worker that
    dies is replaced by one with its index, so `{worker}` in ROSEFAST_DEVICE keeps one worker per GPU."""
    taken = {getattr(w, "rosefast_index", None) for w in server.WORKERS.values()}
    worker.rosefast_index = next(i for i in range(len(taken) + 1) if i not in taken)


def post_fork(server, worker):
    """In the new worker, before the app is built: its index for ServerConfig (ROSEFAST_WORKER_INDEX). An index
    given to gunicorn itself is the first worker's (deploy/replicas.py gives replica i the index i)."""
    import os

    first = int(os.environ.get("ROSEFAST_WORKER_INDEX") or 0)
    os.environ["ROSEFAST_WORKER_INDEX"] = str(first + worker.rosefast_index)


def post_worker_init(worker):
    """Build the app in the worker right away (the model loads while /health answers 503), and drain on
    SIGTERM: new requests get 503 while the in-flight streams finish, then the worker exits. A worker whose
    engine died (a fatal device error) sends itself that SIGTERM: gunicorn replaces it. A worker whose model
    cannot load exits with gunicorn's boot-error code (3): gunicorn stops, the reason logged at ERROR."""
    import os
    import signal

    from server.keepalive import idle_limit

    state = worker.rosefast_state = worker.wsgi.load().extensions["rosefast"]
    state.connections.limit = idle_limit(worker.cfg.worker_connections, state.config.max_inflight_requests)
    state.restart_worker = lambda: os.kill(os.getpid(), signal.SIGTERM)
    state.exit_worker = os._exit   # a model that cannot load: exit(3) makes gunicorn stop with its reason
    if state.manager is not None and state.manager.load_error is not None:   # it failed before this was set
        state.exit_worker(3)

    def on_sigterm(sig, frame):
        if not state.draining:
            state.drain(lambda: setattr(worker, "alive", False), max(worker.cfg.graceful_timeout - 2, 1))

    signal.signal(signal.SIGTERM, on_sigterm)


def post_request(worker, req, environ, resp):
    """The answer is out: the connection waits for its next request under gunicorn's keep-alive timeout again,
    not under the send timeout rosefast gave the socket for its writes (server.body.read_json_body), and as an
    idle connection that a drain closes (server.keepalive)."""
    sock = environ.get("gunicorn.socket")
    state = getattr(worker, "rosefast_state", None)
    if state is not None:
        state.connections.idle(sock)
    if sock is not None:
        try:
            sock.settimeout(None)
        except OSError:
            pass
