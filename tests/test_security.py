"""API key, model selection by the operator only, and what the logs may contain."""
import openai
import pytest
import requests

from tests.serving import Server, tiny_env

KEY = "sk-test-7f3a9c1e"
SECRET_PROMPT = "my-secret-prompt-0xC0FFEE"


@pytest.fixture(scope="module")
def keyed(tiny_llama):
    s = Server(tiny_env(tiny_llama, api_key=KEY))
    yield s
    s.stop()


@pytest.mark.parametrize("path, method", [("/v1/models", "get"), ("/v1/completions", "post"),
                                          ("/v1/chat/completions", "post"), ("/v1/responses", "post"),
                                          ("/v1/messages", "post"), ("/v1/messages/count_tokens", "post"),
                                          ("/tokenize", "post"), ("/detokenize", "post"), ("/tokenizer_info", "get")])
@pytest.mark.parametrize("header", [None, "Bearer wrong-key", f"Basic {KEY}", f"Bearer {KEY}x", "x-api-key wrong",
                                    f"x-api-key {KEY}x", f"x-api-key Bearer {KEY}"])
def test_v1_needs_the_key(keyed, path, method, header):
    name, _, value = (header or "").partition(" ")
    headers = {} if not header else {"x-api-key": value} if name == "x-api-key" else {"Authorization": header}
    r = getattr(requests, method)(keyed.url + path, json={"prompt": "x", "max_tokens": 1}, headers=headers)
    assert r.status_code == 401
    body = r.json()
    err = body["error"]
    assert err["type"] == "authentication_error" and "API key" in err["message"]
    assert (body.get("type") == "error") == path.startswith("/v1/messages")   # Anthropic's shape on its routes


def test_anthropics_clients_key_works_as_x_api_key_or_bearer(keyed):
    import anthropic

    body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}
    r = requests.post(keyed.url + "/v1/messages", json=body, headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"})
    assert r.status_code == 200 and r.json()["usage"]["output_tokens"] == 2   # as Anthropic's docs and older SDKs send it
    c = anthropic.Anthropic(base_url=keyed.url, api_key=KEY, max_retries=0)   # (this SDK sends a bearer token)
    done = c.messages.create(model="tiny", max_tokens=2, messages=[{"role": "user", "content": "x"}])
    assert done.usage.output_tokens == 2
    with pytest.raises(anthropic.AuthenticationError) as e:
        anthropic.Anthropic(base_url=keyed.url, api_key="nope", max_retries=0).messages.count_tokens(
            model="tiny", messages=[{"role": "user", "content": "x"}])
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "authentication_error"


def test_right_key_works_and_health_stays_open(keyed):
    assert requests.get(keyed.url + "/health").status_code == 200
    c = openai.OpenAI(base_url=keyed.url + "/v1", api_key=KEY, max_retries=0)
    assert c.completions.create(model="tiny", prompt=SECRET_PROMPT, max_tokens=3).usage.completion_tokens >= 1
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed.url + "/v1", api_key="nope", max_retries=0).models.list()


def test_logs_have_an_access_line_but_never_the_key_or_the_text(keyed):
    c = openai.OpenAI(base_url=keyed.url + "/v1", api_key=KEY, max_retries=0)
    done = c.completions.create(model="tiny", prompt=SECRET_PROMPT, max_tokens=4)
    log = keyed.log()
    line = next(l for l in log.splitlines() if done.id in l)
    assert "status=200" in line and "completion_tokens=" in line and "prompt_tokens=" in line and "e2e_ms=" in line
    assert KEY not in log and SECRET_PROMPT not in log and done.choices[0].text not in log.replace(line, "")


def test_the_model_field_cannot_load_anything(keyed, default_model):
    c = openai.OpenAI(base_url=keyed.url + "/v1", api_key=KEY, max_retries=0)
    for name in (str(default_model.path), "smollm2-135m", "../../etc/passwd", "gpt-4"):
        with pytest.raises(openai.NotFoundError) as e:
            c.completions.create(model=name, prompt="x", max_tokens=1)
        assert e.value.status_code == 404 and e.value.body["type"] == "not_found_error"
    assert [m.id for m in c.models.list().data] == ["tiny"]


def test_text_is_logged_only_when_the_operator_asks(tiny_llama):
    s = Server(tiny_env(tiny_llama, log_text=1))
    try:
        requests.post(s.url + "/v1/completions", json={"prompt": SECRET_PROMPT, "max_tokens": 2})
        assert SECRET_PROMPT in s.log()
    finally:
        s.stop()


def test_bad_config_value_stops_startup_naming_the_variable(tiny_llama):
    with pytest.raises(RuntimeError, match="ROSEFAST_MAX_BATCH_SIZE"):
        Server(tiny_env(tiny_llama, max_batch_size="lots"), startup_timeout=60)


def _nested(depth, leaf):
    return "[" * depth + leaf + "]" * depth


def _schema_nested(depth):
    schema = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


CHAT = '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, '
ATTACKS = {   # (path, raw JSON body, the field the 400 names): each gave a 500 once
    "role-list": ("/v1/chat/completions", '{"messages": [{"role": ["user"], "content": "hi"}], "max_tokens": 1}',
                  "messages"),
    "role-object": ("/v1/chat/completions", '{"messages": [{"role": {"a": 1}, "content": "hi"}], "max_tokens": 1}',
                    "messages"),
    "tokenize-role-list": ("/tokenize", '{"messages": [{"role": ["user"], "content": "hi"}]}', "messages"),
    "tool-arguments-deep": ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}, {"role": '
                            '"assistant", "tool_calls": [{"type": "function", "function": {"name": "f", '
                            f'"arguments": "{_nested(50_000, "null")}"}}}}]}}], "max_tokens": 1}}',
                            "messages"),
    "guided-json-deep": ("/v1/completions", f'{{"prompt": "x", "max_tokens": 1, "guided_json": "{_nested(50_000, "1")}"}}',
                         "guided_json"),
    "schema-true": ("/v1/chat/completions", CHAT + '"response_format": {"type": "json_schema", "json_schema": '
                    '{"name": "t", "schema": true}}}', "response_format"),
    "structured-json-false": ("/v1/completions", '{"prompt": "x", "max_tokens": 1, "structured_outputs": '
                              '{"json": false}}', "structured_outputs"),
    "bound-1e999": ("/v1/completions", '{"prompt": "x", "max_tokens": 1, "guided_json": {"type": "number", '
                    '"maximum": 1e999}}', "guided_json"),
    "schema-200-deep": ("/v1/completions", '{"prompt": "x", "max_tokens": 1, "guided_json": '
                        + __import__("json").dumps(_schema_nested(200)) + "}", "guided_json"),
    "const-surrogate": ("/v1/completions", '{"prompt": "x", "max_tokens": 1, "guided_json": {"const": "\\ud800"}}',
                        "guided_json"),
    "regex-surrogate": ("/v1/completions", '{"prompt": "x", "max_tokens": 1, "guided_regex": "a\\ud800"}',
                        "guided_regex"),
    "grammar-surrogate": ("/v1/completions", '{"prompt": "x", "max_tokens": 1, "guided_grammar": '
                          '"start: \\"\\ud800\\""}', "guided_grammar"),
}


@pytest.mark.parametrize("name", ATTACKS)
def test_what_a_library_refuses_is_a_400_naming_the_field(keyed, name):
    path, raw, field = ATTACKS[name]
    r = requests.post(keyed.url + path, data=raw.encode(), headers={"Authorization": f"Bearer {KEY}",
                                                                       "Content-Type": "application/json"})
    assert r.status_code == 400, (r.status_code, r.text[:300])
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == field and err["message"], err


def test_a_request_that_may_make_more_than_the_output_budget_is_a_400_before_any_work(keyed):
    """n 16 x 64 prompts x ~1,000 echoed tokens x 20 logprobs would be ~20M entries built after the slots are
    given back: refused at validation, naming the budget and its setting; what evaluation clients send passes."""
    auth = {"Authorization": f"Bearer {KEY}"}
    huge = {"prompt": [list(range(1, 1001))] * 64, "n": 16, "echo": True, "logprobs": 20, "max_tokens": 1,
            "temperature": 1}
    r = requests.post(keyed.url + "/v1/completions", json=huge, headers=auth)
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["code"] == "output_budget_exceeded" and err["param"] == "max_tokens", err
    context = requests.get(keyed.url + "/v1/models", headers=auth).json()["data"][0]["max_model_len"]
    entries = 64 * min(1000 + 1, context) * 16 * (2 + 20)
    assert f"may make {entries:,} output entries" in err["message"], err
    assert "limit is 1,048,576 (ROSEFAST_MAX_OUTPUT_ENTRIES)" in err["message"], err
    assert keyed.metric("rosefast_inflight_requests") == 0
    scoring = {"prompt": ["The capital of France is Paris"] * 8, "echo": True, "logprobs": 1, "max_tokens": 0}
    ok = requests.post(keyed.url + "/v1/completions", json=scoring, headers=auth)
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 8
