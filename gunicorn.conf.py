# gunicorn settings for rosefast: `gunicorn -k gevent server:app` reads this file from the working directory.
# One worker = one engine = one model copy; more throughput means more replicas behind a load balancer.
bind = "127.0.0.1:8000"
worker_class = "gevent"
workers = 1
worker_connections = 1000   # bounds the open connections of the worker: keep it above ROSEFAST_MAX_INFLIGHT_REQUESTS
timeout = 120               # a heartbeat, not a request limit: long streams are fine while the hub runs
graceful_timeout = 30       # on SIGTERM, in-flight streams get this long to finish
keepalive = 5
preload_app = False         # the model and its threads are made in the worker, after fork
accesslog = None            # rosefast logs its own access line per request (rosefast.access)
loglevel = "info"
control_socket_disable = True   # one fixed socket path per user would clash between several servers


def post_worker_init(worker):
    """Build the app in the worker right away (the model loads while /health answers 503), and drain on
    SIGTERM: new requests get 503 while the in-flight streams finish, then the worker exits."""
    import signal

    state = worker.wsgi.load().extensions["rosefast"]

    def on_sigterm(sig, frame):
        if not state.draining:
            state.drain(lambda: setattr(worker, "alive", False), max(worker.cfg.graceful_timeout - 2, 1))

    signal.signal(signal.SIGTERM, on_sigterm)
