"""The playground at `/` in a real browser (headless Chromium driven by selenium) against a real gunicorn: the
page loads without a console error, a reply streams into it token by token, stop frees the server's slot, a
429 is shown with its retry hint, model text is shown as text (no HTML it writes runs), the API key is asked
for and never in the page, and ROSEFAST_UI=0 turns it off. A screenshot after a reply is kept in artifacts/."""
import json
import os
import shutil
import time
from pathlib import Path

import openai
import pytest
import requests

from server.config import ServerConfig
from server.factory import create_app
from tests.serving import ROOT, Server, one_slot, tiny_env  # noqa: F401 - one_slot: a shared fixture

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
try:
    from selenium import webdriver
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:   # the test extra not installed
    webdriver = None

NO_BROWSER = ("needs chromium and chromedriver (Debian's chromium and chromium-driver: make test installs them "
              "where apt runs as root) and selenium (the test extra)")
ARTIFACTS = Path(os.environ.get("ROSEFAST_ARTIFACTS", ROOT / "artifacts"))
KEY = "sk-playground-5c2e"


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and DRIVER and webdriver):
        pytest.skip(NO_BROWSER)
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,900"):
        options.add_argument(arg)
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=DRIVER))
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def tiny(tiny_llama):
    s = Server(tiny_env(tiny_llama))
    yield s
    s.stop()


def _open(browser, server, **settings):
    """The page, fresh (its storage cleared), loaded and ready, with these settings typed in."""
    browser.get(server.url + "/")
    browser.execute_script("localStorage.clear(); sessionStorage.clear();")
    browser.get(server.url + "/")
    _wait(browser, lambda: browser.find_element(By.ID, "status").text in ("ready", "this server needs its API key: "
                                                                              "enter it under Settings"))
    for name, value in settings.items():
        _set(browser, name, value)
    return browser


def _set(browser, element_id, value):
    browser.execute_script("const el = document.getElementById(arguments[0]); el.value = arguments[1];"
                           "el.dispatchEvent(new Event('change'));", element_id, str(value))


def _wait(browser, condition, timeout=60):
    WebDriverWait(browser, timeout, poll_frequency=0.05).until(lambda _: condition())


def _say(browser, text):
    browser.find_element(By.ID, "prompt").send_keys(text)
    browser.find_element(By.ID, "send").click()


def _idle(browser):
    return browser.find_element(By.ID, "send").is_enabled() and not browser.find_element(By.ID, "stop").is_enabled()


def _stored_reply(browser):
    conversations = json.loads(browser.execute_script("return localStorage.getItem('rosefast.conversations')"))
    return conversations[0]["messages"][-1]


def _errors(browser):
    return [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def _count_updates(page):
    page.execute_script("window.updates = 0; new MutationObserver(() => window.updates++).observe("
                        "document.getElementById('messages'), {childList: true, subtree: true, characterData: true});")


def test_a_reply_comes_whole_and_exact_with_its_numbers(browser, tiny):
    page = _open(browser, tiny, temperature=0, max_tokens=24, seed=5)
    assert page.find_element(By.ID, "model").text.startswith("tiny")
    assert _errors(page) == []                                   # the page loaded cleanly
    assert page.find_element(By.ID, "temperature").get_attribute("value") == "0"
    _count_updates(page)
    _say(page, "Tell me about batching")
    _wait(page, lambda: page.find_elements(By.CSS_SELECTOR, ".message.assistant") and _idle(page))
    reply = _stored_reply(page)
    want = openai.OpenAI(base_url=tiny.url + "/v1", api_key="unused", max_retries=0).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Tell me about batching"}], temperature=0, max_tokens=24,
        seed=5).choices[0].message.content
    assert reply == {"role": "assistant", "content": want, "reasoning": ""}
    assert page.execute_script("return window.updates") >= 2     # the question, then the reply as it came
    assert page.find_element(By.ID, "tokens").text == "24"
    assert page.find_element(By.ID, "ttft").text.endswith(" ms") and page.find_element(By.ID, "itl").text != "-"
    _wait(page, lambda: page.find_element(By.ID, "inflight").text == "0")   # the panel reads /metrics
    assert _errors(page) == []
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.save_screenshot(str(ARTIFACTS / "playground.png"))
    assert (ARTIFACTS / "playground.png").stat().st_size > 10_000
    # the conversation is kept: a reload shows it again
    page.refresh()
    _wait(page, lambda: len(page.find_elements(By.CSS_SELECTOR, ".message")) == 2)


def test_a_reply_streams_into_the_page_token_by_token(browser, one_slot):
    # the stand-in's 20 ms steps: each token reaches the page on its own, and is shown before the next. 100
    # tokens (2 s): the WebDriver polls that sample the text take 50 ms to a few hundred under a busy CI, so a
    # shorter reply could end between a few of them (30 tokens once gave two samples); the page's own count of
    # renders is the event-driven check
    page = _open(browser, one_slot, max_tokens=100)
    _count_updates(page)
    _say(page, "Stream it")
    seen = set()
    _wait(page, lambda: seen.add(len(page.execute_script(
        "const b = document.querySelector('.message.assistant .body'); return b ? b.textContent : ''"))) or
        (page.find_elements(By.CSS_SELECTOR, ".message.assistant") and _idle(page)))
    assert len(seen) >= 5                                         # the text grew while it streamed
    assert page.execute_script("return window.updates") >= 50     # one render per token, about
    assert page.find_element(By.ID, "tokens").text == "100"


def test_model_text_is_shown_as_text_never_run(browser, tiny):
    evil = "<script>window.pwned = 1</script><img src=x onerror=window.pwned=2>**bold**"   # (JSON: no quotes)
    page = _open(browser, tiny, temperature=0, max_tokens=80,
                 schema=json.dumps({"type": "string", "enum": [evil]}))
    _say(page, "Say it")
    _wait(page, lambda: page.find_elements(By.CSS_SELECTOR, ".message.assistant") and _idle(page))
    body = page.find_element(By.CSS_SELECTOR, ".message.assistant .body")
    assert "<script>window.pwned = 1</script><img src=x onerror=window.pwned=2>" in body.text
    assert page.execute_script("return window.pwned") is None
    assert page.find_elements(By.CSS_SELECTOR, "#messages script, #messages img") == []
    assert [e.text for e in page.find_elements(By.CSS_SELECTOR, ".message.assistant strong")] == ["bold"]


def test_stop_aborts_the_reply_and_the_server_frees_the_slot(browser, one_slot):
    page = _open(browser, one_slot, max_tokens=1000)
    _say(page, "Go on for a while")
    _wait(page, lambda: len(page.find_elements(By.CSS_SELECTOR, ".message.assistant .body p")) > 0)
    assert one_slot.metric("rosefast_inflight_requests") == 1
    page.find_element(By.ID, "stop").click()
    _wait(page, lambda: page.find_elements(By.CSS_SELECTOR, ".message.assistant .stopped") and _idle(page))
    deadline = time.monotonic() + 10
    while one_slot.metric("rosefast_inflight_requests") != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert one_slot.metric("rosefast_inflight_requests") == 0
    assert _stored_reply(page)["stopped"] is True


def test_a_full_server_is_a_message_with_its_retry_hint(browser, one_slot):
    page = _open(browser, one_slot, max_tokens=5)
    held = requests.post(one_slot.url + "/v1/completions", json={"prompt": "hold", "max_tokens": 1000,
                                                                 "stream": True}, stream=True)
    lines = held.iter_lines()
    try:
        assert next(lines).startswith(b"data: ")
        _say(page, "Anyone there?")
        _wait(page, lambda: page.find_elements(By.CSS_SELECTOR, ".message.notice"))
        notice = page.find_element(By.CSS_SELECTOR, ".message.notice .body").text
        assert "(429)" in notice and "Retry in 1 s" in notice
        assert [m["role"] for m in json.loads(page.execute_script(
            "return localStorage.getItem('rosefast.conversations')"))[0]["messages"]] == []   # nothing half-kept
    finally:
        held.close()


def test_the_key_is_asked_for_and_never_in_the_page(browser, tiny_llama):
    s = Server(tiny_env(tiny_llama, api_key=KEY))
    try:
        assert all(KEY not in requests.get(s.url + path).text for path in ("/", "/ui/playground.js"))
        page = _open(browser, s)
        assert "API key" in page.find_element(By.ID, "status").text
        _set(page, "api-key", KEY)
        _wait(page, lambda: page.find_element(By.ID, "model").text.startswith("tiny"))
        _set(page, "max_tokens", 3)
        _say(page, "hello")
        _wait(page, lambda: page.find_elements(By.CSS_SELECTOR, ".message.assistant") and _idle(page))
        assert page.find_element(By.ID, "tokens").text == "3"
    finally:
        s.stop()


def test_ui_off_is_a_404():
    on = create_app(ServerConfig(model="stand-in"), start=False).test_client()
    off = create_app(ServerConfig(model="stand-in", ui=False), start=False).test_client()
    page = on.get("/")
    assert page.status_code == 200 and "script-src 'self'" in page.headers["Content-Security-Policy"]
    assert on.get("/ui/playground.js").status_code == 200 and on.get("/ui/other.js").status_code == 404
    assert off.get("/").status_code == 404 and off.get("/ui/playground.js").status_code == 404
