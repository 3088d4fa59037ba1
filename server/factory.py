"""The Flask app factory: configuration from ROSEFAST_*, the model loaded in the worker, the routes."""
import atexit
import logging
import os
import sys
import time

from flask import Flask, g, request
from werkzeug.exceptions import HTTPException

from rosefast import flavour_warning
from rosefast._native import native_rlock
from rosefast.serving.manager import SchedulerManager
from server.auth import authorized
from server.config import server_config_from_env
from server.errors import APIError
from server.faults import fault_hooks
from server.grammar_pool import GrammarPool
from server.keepalive import IdleConnections
from server.logprobs import TokenStrings
from server.metrics import ENDPOINTS, Metrics, count_request
from server.offhub import OffHub
from server.response_store import ResponseStore

log = logging.getLogger("rosefast.server")
ANTHROPIC_PATHS = "/v1/messages"   # the routes whose errors go out in Anthropic's shape
WORKER_BOOT_ERROR = 3   # gunicorn's code for a worker that failed to boot: the arbiter stops the server on it


def load_failure(error):
    """A failed load in words, with what to do where it is a known transient (the device out of memory)."""
    text = f"{type(error).__name__}: {error}"
    if "out of memory" in str(error).lower():
        text += (" -- the device is out of memory at start-up (another process holds it, or the model does not "
                 "fit): free it, or lower ROSEFAST_GPU_MEMORY_UTILIZATION / ROSEFAST_KV_CACHE_TOKENS")
    return text


def _gevent_patched():
    monkey = sys.modules.get("gevent.monkey")
    return monkey is not None and monkey.is_module_patched("socket")


class State:
    """What the routes share: the config, the manager (None until started), the metrics."""

    def __init__(self, config):
        self.config = config
        self.manager = None
        self.metrics = Metrics(self)
        self.grammar_pool = GrammarPool(config.grammar_threads)
        self.responses = ResponseStore(config.responses_store_entries, config.responses_store_bytes,
                                       config.responses_store_ttl_s, config.responses_store_dir or None)
        self.off_hub = OffHub(max(1, config.tokenize_workers))   # template rendering and encoding for the routes
        self.started = time.time()
        self.draining = False
        self.connections = IdleConnections()   # keep-alive connections between requests (closed on drain)
        self.restart_worker = None   # set by gunicorn.conf.py: how the worker ends itself when its engine dies
        self.exit_worker = None      # set by gunicorn.conf.py: exit(code) ends the worker at once (a failed load)
        self._token_strings = None
        self._generation_defaults = None

    @property
    def generation_defaults(self):
        """What fills the sampling fields a request leaves out (ROSEFAST_GENERATION_CONFIG=model), once loaded."""
        if self._generation_defaults is None:
            from rosefast.serving.values import load_generation_defaults

            self._generation_defaults = (load_generation_defaults(self.manager.model)
                                         if self.config.generation_config == "model" else {})
            log.info("generation defaults for requests that leave them out: %s", self._generation_defaults or "none")
        return self._generation_defaults

    @property
    def token_strings(self):
        """Token texts and bytes for logprobs (made once the tokenizer is loaded)."""
        if self._token_strings is None:
            self._token_strings = TokenStrings(self.manager.tokenizer)
        return self._token_strings

    @property
    def model_name(self):
        return self.config.served_model_name or self.config.model

    def start(self):
        """Start the manager; the model loads on its engine thread while the app already answers /health."""
        gevent = _gevent_patched()
        c = self.config
        log.info("worker %d (pid %d): device %s, max %d requests in flight", c.worker_index, os.getpid(), c.device,
                 c.max_inflight_requests)
        pure = flavour_warning()
        if pure:
            log.warning("%s", pure)
        if gevent:   # how soon the engine thread's Python work yields the GIL to the hub (see ServerConfig)
            sys.setswitchinterval(c.switch_interval_ms / 1000.0)
        self.manager = SchedulerManager(c.engine_config(), max_inflight_requests=c.max_inflight_requests or None,
                                        tokenize_workers=c.tokenize_workers, waker="gevent" if gevent else "thread",
                                        wait=False, on_dead=self._engine_died, on_load_error=self._load_failed,
                                        **fault_hooks(c))

    def _load_failed(self, error):
        """On the engine thread when the model cannot load: say why at ERROR and, under gunicorn, end the worker
        with the boot-error code, so gunicorn stops with this message instead of a worker answering 503."""
        reason = load_failure(error)
        log.error("the model failed to load (ROSEFAST_MODEL=%s): %s", self.config.model, reason,
                  exc_info=not isinstance(error, (ValueError, FileNotFoundError)))
        if self.exit_worker is not None:
            log.error("stopping: the worker exits with gunicorn's boot-error code %d", WORKER_BOOT_ERROR)
            self.exit_worker(WORKER_BOOT_ERROR)

    def _engine_died(self, error):
        """On the engine thread, after a fatal device error failed every open request: /health says 503 and
        the worker ends (gunicorn starts a fresh one, with a fresh CUDA context)."""
        log.critical("the engine is dead (%s): %s", error, "restarting the worker" if self.restart_worker else
                     "no worker to restart (not under gunicorn)")
        if self.restart_worker is not None:
            self.restart_worker()

    def drain(self, done, timeout):
        """Stop taking requests (503 from now on); call `done()` when the in-flight ones have finished
        or `timeout` seconds have passed. Runs as a greenlet in the gevent worker."""
        import gevent

        self.draining = True
        log.info("draining: %d requests in flight", self.manager.inflight if self.manager else 0)

        def wait():
            deadline = time.monotonic() + timeout
            while self.manager is not None and self.manager.inflight and time.monotonic() < deadline:
                gevent.sleep(0.05)
            closed = self.connections.close_idle()
            log.info("drained (%d left in flight; %d idle connections closed)",
                     self.manager.inflight if self.manager else 0, closed)
            done()

        return gevent.spawn(wait)

    def close(self):
        if self.manager is not None:
            self.manager.close()


def create_app(config=None, start=True):
    """The WSGI app. `config` defaults to the ROSEFAST_* environment (a bad value raises ConfigError)."""
    from server import embeddings_api, responses_routes, routes, tokenizer_api, ui

    config = config or server_config_from_env()
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s [%(process)d] %(levelname)s %(name)s: %(message)s")
        # the engine thread (a native one) logs through these handlers too: a gevent lock shared with it could
        # park a greenlet for good (a stream stalled before its [DONE] while the dying engine logged)
        for handler in logging.getLogger().handlers:
            handler.lock = native_rlock()
    app = Flask("rosefast")
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    state = app.extensions["rosefast"] = State(config)
    app.register_blueprint(routes.bp)
    app.register_blueprint(responses_routes.bp)
    app.register_blueprint(embeddings_api.bp)
    app.register_blueprint(tokenizer_api.bp)
    app.register_blueprint(ui.bp)

    @app.before_request
    def _before():
        g.t0 = time.perf_counter()
        state.connections.busy(request.environ.get("gunicorn.socket"))
        if (request.path.startswith("/v1/") or request.path in tokenizer_api.PATHS) and not authorized(config):
            raise APIError(401, "invalid or missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                           "authentication_error", code="invalid_api_key")

    def _answer(e):
        """Every error response goes out here: counted once, with an OpenAI body."""
        count_request(state, request.environ, ENDPOINTS.get(request.path, "other"), str(e.status))
        return e.response(anthropic=request.path.startswith(ANTHROPIC_PATHS))

    @app.errorhandler(APIError)
    def _api_error(e):
        return _answer(e)

    @app.errorhandler(HTTPException)
    def _http_error(e):
        types = {413: "invalid_request_error", 404: "not_found_error", 405: "invalid_request_error"}
        message = {413: f"request body too large (limit {config.max_body_bytes} bytes)"}.get(e.code, e.description)
        return _answer(APIError(e.code, message, types.get(e.code, "invalid_request_error")))

    @app.errorhandler(Exception)
    def _unexpected(e):
        log.exception("unexpected error on %s", request.path)
        return _answer(APIError(500, f"internal error: {type(e).__name__}", "server_error"))

    if start:
        state.start()
        atexit.register(state.close)
    return app
