# gunicorn settings for rosefast: `gunicorn -k gevent server:app` reads this file from the working directory.
# One worker = one engine = one model copy; more throughput means more replicas behind a load balancer.
bind = "127.0.0.1:8000"
worker_class = "gevent"
workers = 1
worker_connections = 1000   # bounds the open streams of the worker
timeout = 120               # a heartbeat, not a request limit: long streams are fine while the hub runs
graceful_timeout = 30       # on SIGTERM, in-flight streams get this long to finish
keepalive = 5
preload_app = False         # the model and its threads are made in the worker, after fork
accesslog = None            # rosefast logs its own access line per request (rosefast.access)
loglevel = "info"
control_socket_disable = True   # one fixed socket path per user would clash between several servers


def post_worker_init(worker):
    """Build the app in the worker right away: the model loads while /health answers 503."""
    worker.wsgi.load()
