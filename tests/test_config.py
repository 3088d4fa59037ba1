"""Configuration: ROSEFAST_* variables, each refused by name when wrong; EngineConfig validation."""
import pytest

from rosefast.config import EngineConfig
from server.config import ConfigError, documented_variables, server_config_from_env


def test_variables_map_to_fields():
    c = server_config_from_env({"ROSEFAST_MODEL": "/models/x", "ROSEFAST_MAX_BATCH_SIZE": "8",
                                "ROSEFAST_ENABLE_PREFIX_CACHE": "off", "ROSEFAST_KV_MEMORY_FRACTION": "0.2",
                                "ROSEFAST_MAX_INFLIGHT_REQUESTS": "0"})
    assert (c.model, c.max_batch_size, c.enable_prefix_cache, c.kv_memory_fraction) == ("/models/x", 8, False, 0.2)
    e = c.engine_config()
    assert isinstance(e, EngineConfig) and e.max_batch_size == 8 and not e.enable_prefix_cache


@pytest.mark.parametrize("name, value, message", [
    ("ROSEFAST_MAX_BATCH_SIZE", "many", "ROSEFAST_MAX_BATCH_SIZE='many' is not a valid int"),
    ("ROSEFAST_MAX_BATCH_SIZE", "0", "ROSEFAST_MAX_BATCH_SIZE"),
    ("ROSEFAST_CUDA_GRAPH", "maybe", "ROSEFAST_CUDA_GRAPH='maybe' is not a valid bool"),
    ("ROSEFAST_KV_MEMORY_FRACTION", "2", "ROSEFAST_KV_MEMORY_FRACTION"),
    ("ROSEFAST_DTYPE", "int4", "ROSEFAST_DTYPE"),
    ("ROSEFAST_DEVICE", "tpu", "ROSEFAST_DEVICE"),
    ("ROSEFAST_TOKENIZE_WORKERS", "-1", "ROSEFAST_TOKENIZE_WORKERS: tokenize_workers must be an integer >= 0, got -1"),
    ("ROSEFAST_MAX_BODY_BYTES", "0", "ROSEFAST_MAX_BODY_BYTES: max_body_bytes must be an integer >= 1, got 0"),
    ("ROSEFAST_STAND_IN_STEP_MS", "-1", "ROSEFAST_STAND_IN_STEP_MS"),
    ("ROSEFAST_SWITCH_INTERVAL_MS", "0", "ROSEFAST_SWITCH_INTERVAL_MS: switch_interval_ms must be a number in"),
    ("ROSEFAST_SEND_TIMEOUT_S", "0", "ROSEFAST_SEND_TIMEOUT_S: send_timeout_s must be a number in"),
    ("ROSEFAST_GENERATION_CONFIG", "maybe", "ROSEFAST_GENERATION_CONFIG: generation_config must be model or none"),
    ("ROSEFAST_FAULT_STEPS", "1,x", "ROSEFAST_FAULT_STEPS: fault_steps must be comma-separated integers"),
])
def test_bad_values_name_the_variable(name, value, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        server_config_from_env({name: value})


def test_every_field_has_its_variable_and_its_readme_row_with_the_default():
    from dataclasses import fields

    from server.config import ServerConfig

    names = {f.name for f in fields(ServerConfig)}
    assert {f.name for f in fields(EngineConfig)} <= names   # the engine's settings, once, by inheritance
    readme = open("docs/server.md", encoding="utf-8").read()   # the configuration table
    missing = [f"| `{name}` | `{default if default != '' else repr('')}` |" for name, default in documented_variables()]
    missing = [row for row in missing if row not in readme]
    assert not missing


@pytest.mark.parametrize("field, value", [("max_inflight_requests", -1), ("max_output_entries", 0),
                                          ("grammar_threads", 0), ("body_timeout_s", 0.0),
                                          ("generation_config", "sometimes"), ("max_batch_size", 0),
                                          ("max_active_requests", 65)])
def test_a_config_built_in_code_is_checked_as_one_from_the_environment(field, value):
    from server.config import ServerConfig

    with pytest.raises(ValueError, match=f"^{field} must be"):
        ServerConfig(**{field: value})


@pytest.mark.parametrize("name, near", [("ROSEFAST_KV_CACHE_DTYPE", "ROSEFAST_KV_CACHE_TOKENS"),
                                        ("ROSEFAST_MAX_INFLIGHT", "ROSEFAST_MAX_INFLIGHT_REQUESTS"),
                                        ("ROSEFAST_WHATEVER", None)])
def test_an_unknown_variable_stops_the_start_with_the_nearest_known_name(name, near):
    with pytest.raises(ConfigError) as e:
        server_config_from_env({"ROSEFAST_MODEL": "stand-in", name: "q8_0"})
    assert str(e.value).startswith(f"{name} is not a rosefast setting")
    assert (f"did you mean {near}?" in str(e.value)) if near else "did you mean" not in str(e.value)


def test_the_tools_variables_and_the_process_variables_are_known():
    server_config_from_env({"ROSEFAST_TEST_CACHE": "/tmp/x", "ROSEFAST_REQUIRE_EXTENSIONS": "1",
                            "ROSEFAST_CACHE": "/tmp/y", "ROSEFAST_NO_EXTENSIONS": "1", "OTHER_VARIABLE": "1"})


def test_each_concern_is_a_dataclass_of_its_own_that_checks_its_fields_and_the_server_joins_them():
    from dataclasses import fields

    from server.config import FaultSettings, HTTPSettings, ServerConfig, ServingSettings

    concerns = (EngineConfig, ServingSettings, HTTPSettings, FaultSettings)
    names = [[f.name for f in fields(c)] for c in concerns]
    assert [f.name for f in fields(ServerConfig)] == sum(names, [])   # every field in exactly one concern
    for concern, bad in ((ServingSettings, {"tokenize_workers": -1}), (HTTPSettings, {"send_timeout_s": 0.0}),
                         (FaultSettings, {"fault_steps": "3,x"}), (EngineConfig, {"block_size": 0})):
        field = next(iter(bad))
        with pytest.raises(ValueError, match=f"^{field} "):
            concern(**bad)
        with pytest.raises(ValueError, match=f"^{field} "):   # and joined, the same check
            ServerConfig(**bad)
