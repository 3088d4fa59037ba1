"""ServerConfig: every setting from an environment variable named after its field (ROSEFAST_<FIELD>).

Host and port are gunicorn's (`--bind`, or gunicorn.conf.py). A bad value stops the start-up with a
message naming the variable.
"""
import difflib
import os
from dataclasses import dataclass, fields

from rosefast.config import PROCESS_VARIABLES, TOOL_VARIABLES, EngineConfig

PREFIX = "ROSEFAST_"


class ConfigError(ValueError):
    """A ROSEFAST_* variable with a value that cannot be used."""


def _check_integers(config, spec):
    """A ValueError naming the first of `spec`'s (field, lowest) integers out of range."""
    for name, low in spec:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def _check_numbers(config, spec):
    """A ValueError naming the first of `spec`'s (field, lowest, highest) numbers out of range."""
    for name, low, high in spec:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise ValueError(f"{name} must be a number in [{low}, {high}], got {value!r}")


@dataclass
class ServingSettings:
    """The serving core's: admission and the tokenize workers (rosefast.serving)."""
    max_inflight_requests: int = 256     # past this, 429 at once (0: unlimited)
    tokenize_workers: int = 2            # native threads encoding prompts off the request path
    worker_index: int = 0                # this worker's number, 0..N-1 (set per worker by gunicorn.conf.py, per
                                         # replica by deploy/replicas.py); "{worker}" in ROSEFAST_DEVICE becomes it

    def __post_init__(self):
        getattr(super(), "__post_init__", lambda: None)()
        _check_integers(self, (("max_inflight_requests", 0), ("tokenize_workers", 0), ("worker_index", 0)))


@dataclass
class HTTPSettings:
    """The HTTP layer's: bodies, limits, timeouts, the key, the page, the logs, structured output's compiles."""
    served_model_name: str = ""          # the name in /v1/models and responses (default: the model spec)
    max_body_bytes: int = 1 << 20        # larger request bodies get 413
    max_tokens_cap: int = 4096           # the largest max_tokens a request may ask for
    max_output_entries: int = 1 << 20    # what one request may make, at most: prompts x n x (echoed + max_tokens)
                                         # tokens, each token 1 entry, 2 + k with logprobs (k alternatives)
    default_max_tokens: int = 256        # when a request gives none
    retry_after_seconds: int = 1         # the Retry-After of a 429
    body_timeout_s: float = 30.0         # a request body must arrive in full within this; else 408, connection closed
    send_timeout_s: float = 60.0         # a client that takes longer to accept one write (an SSE event, a body) has
                                         # its stream ended and its request aborted (it stopped reading)
    api_key: str = ""                    # when set, /v1/* needs "Authorization: Bearer <key>" or "x-api-key: <key>";
                                         # several keys, comma-separated: each caller's stored responses its own
    ui: bool = True                      # the playground page at / (a chat, and what the server is doing)
    log_text: bool = False               # log prompts and completions (off: never)
    switch_interval_ms: float = 5.0      # the GIL switch interval in the worker (Python's default): 0.5 forced
                                         # the hub and the engine thread to trade the GIL 10x as often, for
                                         # no better 429 latency and ~10% less throughput (README)
    grammar_timeout_s: float = 10.0      # structured output: a grammar that takes longer to compile is a 400
    grammar_threads: int = 2             # native threads that compile grammars (identical compiles merged)
    generation_config: str = "model"     # model: the model's generation defaults fill what a request omits; none
    responses_store_entries: int = 10000   # the Responses API's stored responses: at most this many (0: none kept,
                                           # `store` then defaults to false), least recently used out first,
    responses_store_bytes: int = 64 << 20  # in at most this many bytes of JSON,
    responses_store_ttl_s: float = 86400.0  # each for at most this long after it was made
    responses_store_dir: str = ""          # also a file each here: kept over a restart, shared by the workers and
                                           # replicas given the same directory ("": the worker's memory only)

    def __post_init__(self):
        getattr(super(), "__post_init__", lambda: None)()
        _check_integers(self, (("max_body_bytes", 1), ("max_tokens_cap", 1), ("default_max_tokens", 1),
                               ("retry_after_seconds", 0), ("max_output_entries", 1), ("grammar_threads", 1),
                               ("responses_store_entries", 0), ("responses_store_bytes", 1)))
        _check_numbers(self, (("switch_interval_ms", 0.05, 100), ("grammar_timeout_s", 0.01, 600),
                              ("body_timeout_s", 0.1, 3600), ("send_timeout_s", 0.1, 3600),
                              ("responses_store_ttl_s", 1, 10 ** 9)))
        if self.generation_config not in ("model", "none"):
            raise ValueError(f"generation_config must be model or none, got {self.generation_config!r}")


@dataclass
class FaultSettings:
    """Fault injection, for reliability tests and drills (off by default; server.faults)."""
    fault_steps: str = ""                # engine steps (comma-separated numbers) that raise
    fault_tokenize_marker: str = ""      # prompts containing this text make the tokenizer raise
    fault_device_step: int = 0           # this engine step raises a sticky CUDA error (the engine dies)
    fault_grammar_delay_s: float = 0.0   # a grammar compile that is not cached takes at least this long (a drill
                                         # for the grammar pool's merging and timeouts)
    fault_loop_step: int = 0             # the engine thread's own loop raises after this step (the engine dies)
    fault_subprocess_step: int = 0       # the engine thread starts processes at load and in this step, as
                                         # Triton and ctypes.util do (a drill for gevent's subprocess)

    def __post_init__(self):
        getattr(super(), "__post_init__", lambda: None)()
        _check_integers(self, (("fault_device_step", 0), ("fault_loop_step", 0), ("fault_subprocess_step", 0)))
        _check_numbers(self, (("fault_grammar_delay_s", 0, 600),))
        try:
            self.fault_step_numbers()
        except ValueError:
            raise ValueError(f"fault_steps must be comma-separated integers, got {self.fault_steps!r}") from None

    def fault_step_numbers(self):
        return {int(x) for x in self.fault_steps.split(",") if x.strip()}


@dataclass
class ServerConfig(FaultSettings, HTTPSettings, ServingSettings, EngineConfig):
    """Every setting of a server, one dataclass per concern joined here: the engine's (EngineConfig), the serving
    core's, the HTTP layer's, the faults' — each with its defaults and its own checks, so a ServerConfig built in
    code is refused as one built from the environment is (a ValueError that starts with the field's name). Its
    fields, in that order, are the ROSEFAST_<FIELD> variables."""

    def engine_config(self):
        return EngineConfig(**{f.name: getattr(self, f.name) for f in fields(EngineConfig)})


def _parse(field, raw):
    name = PREFIX + field.name.upper()
    kind = field.type if isinstance(field.type, type) else type(field.default)
    try:
        if kind is bool:
            value = raw.strip().lower()
            if value in ("1", "true", "yes", "on"):
                return True
            if value in ("0", "false", "no", "off"):
                return False
            raise ValueError("expected one of 1, 0, true, false, yes, no, on, off")
        if kind is int:
            return int(raw)
        if kind is float:
            return float(raw)
        return raw
    except ValueError as e:
        raise ConfigError(f"{name}={raw!r} is not a valid {kind.__name__}: {e}") from None


def known_variables():
    """Every ROSEFAST_* name something here reads: the settings, the process variables, the tools'."""
    return {PREFIX + f.name.upper() for f in fields(ServerConfig)} | set(PROCESS_VARIABLES) | set(TOOL_VARIABLES)


def _refuse_unknown(environ):
    """ConfigError for a ROSEFAST_* variable nothing reads (a typo, or a setting that does not exist), naming the
    nearest known one: a setting that silently does nothing is worse than a start that stops."""
    known = known_variables()
    unknown = sorted(name for name in environ if name.startswith(PREFIX) and name not in known)
    if unknown:
        name = unknown[0]
        near = difflib.get_close_matches(name[len(PREFIX):], sorted(k[len(PREFIX):] for k in known), n=1, cutoff=0.6)
        hint = f"; did you mean {PREFIX}{near[0]}?" if near else ""
        raise ConfigError(f"{name} is not a rosefast setting{hint} (every setting: docs/server.md#configuration)")


def server_config_from_env(environ=None):
    """ServerConfig from ROSEFAST_* variables; raises ConfigError naming the variable that is wrong."""
    environ = os.environ if environ is None else environ
    _refuse_unknown(environ)
    values = {}
    for f in fields(ServerConfig):
        raw = environ.get(PREFIX + f.name.upper())
        if raw is not None:
            values[f.name] = _parse(f, raw)
    if "{worker}" in values.get("device", ""):   # one GPU per worker: ROSEFAST_DEVICE=cuda:{worker}
        values["device"] = values["device"].replace("{worker}", str(values.get("worker_index", 0)))
    try:
        return ServerConfig(**values)
    except ValueError as e:   # the checks name the field first
        field = str(e).split(" ", 1)[0]
        raise ConfigError(f"{PREFIX}{field.upper()}: {e}") from None


def documented_variables():
    """(variable, default) for the README: every field, then the variables read where they are used."""
    return [(PREFIX + f.name.upper(), f.default) for f in fields(ServerConfig)] + \
        [(name, default) for name, (default, _) in PROCESS_VARIABLES.items()]
