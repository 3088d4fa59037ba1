"""Stored responses (server.response_store): the store's bounds (entries, bytes, time to live; the least recently
used out first; one caller's entries never another's), then the Responses API's state through the official openai
client against a real gunicorn: a chain whose second prompt holds the first, retrieve, input_items, delete then
404, background polled to completed, cancel, the bound and two API keys kept apart."""
import time

import openai
import pytest
import requests

from benches.schemas import WEATHER_TOOL
from server.response_store import ResponseStore, Stored
from tests.serving import Server, client, server, tiny_env  # noqa: F401 - the shared fixtures


def _stored(id_, owner="", text="x"):
    return Stored(owner, {"id": id_, "output": [{"type": "message", "content": [{"text": text}]}]},
                  [{"id": f"in_{id_}", "type": "message", "role": "user", "content": [{"text": text}]}])


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_store_puts_out_the_least_recently_used_past_its_entries():
    store = ResponseStore(2, 1 << 20, 60)
    for id_ in ("a", "b"):
        assert store.put(_stored(id_))
    assert store.get("", "a") is not None   # used: "b" is now the least recently used
    store.put(_stored("c"))
    assert [store.get("", i) is not None for i in "abc"] == [True, False, True]
    assert (len(store), store.evicted) == (2, 1)


def test_store_holds_its_bytes_bound_and_refuses_what_alone_exceeds_it():
    one = _stored("a", text="y" * 1000).measure()
    store = ResponseStore(100, 2 * one + 10, 60)
    for id_ in "abc":
        store.put(_stored(id_, text="y" * 1000))
    assert store.bytes <= 2 * one + 10 and store.get("", "a") is None and store.get("", "c") is not None
    assert not store.put(_stored("big", text="y" * 5000)) and store.get("", "big") is None
    assert store.bytes == sum(s.size for s in store._entries.values())


def test_store_forgets_past_its_time_to_live_and_deletes():
    clock = Clock()
    store = ResponseStore(10, 1 << 20, 60, clock=clock)
    store.put(_stored("a"))
    clock.now = 30
    store.put(_stored("b"))
    clock.now = 61
    assert store.get("", "a") is None and store.get("", "b") is not None
    assert store.delete("", "b") and not store.delete("", "b") and store.bytes == 0


def test_store_keeps_callers_apart():
    store = ResponseStore(10, 1 << 20, 60)
    store.put(_stored("a", owner="k1"))
    assert store.get("k2", "a") is None and not store.delete("k2", "a") and store.get("k1", "a") is not None


def test_conversation_continues_earlier_turns_without_copying_them():
    first = _stored("a")
    second = Stored("", {"id": "b", "output": []}, [{"id": "in_b"}], first.conversation())
    assert [i.get("id") for i in second.conversation()] == ["in_a", None, "in_b"]
    assert second.context[0] is first.input_items[0]   # the earlier turn's items shared, not copied


# -- through the official client against a real gunicorn ------------------------------------------------------

QUESTION, FOLLOW_UP = "Name a colour.", "And another one?"
FUNCTION = WEATHER_TOOL["function"]
FLAT_TOOL = {"type": "function", "name": FUNCTION["name"], "description": FUNCTION["description"],
             "parameters": FUNCTION["parameters"]}


def _until(client, id_, done=("completed", "incomplete", "failed", "cancelled"), timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        r = client.responses.retrieve(id_)
        if r.status in done or time.monotonic() > deadline:
            return r
        time.sleep(0.05)


def test_a_chain_renders_the_first_turn_before_the_second(client):
    first = client.responses.create(model="tiny", input=QUESTION, max_output_tokens=6, temperature=0)
    assert first.store is True and first.status == "incomplete"
    second = client.responses.create(model="tiny", input=FOLLOW_UP, previous_response_id=first.id,
                                     max_output_tokens=6, temperature=0)
    history = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": first.output_text},
               {"role": "user", "content": FOLLOW_UP}]
    ref = client.chat.completions.create(model="tiny", messages=history, max_tokens=6, temperature=0)
    assert second.output_text == ref.choices[0].message.content   # the whole history, as the chat route renders it
    assert second.usage.input_tokens == ref.usage.prompt_tokens > first.usage.input_tokens
    assert second.previous_response_id == first.id
    again = client.responses.create(model="tiny", input=FOLLOW_UP, previous_response_id=first.id,
                                    max_output_tokens=6, temperature=0)
    assert again.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 16   # the prefix cache


def test_retrieve_input_items_and_delete_then_404(client):
    first = client.responses.create(model="tiny", input=QUESTION, max_output_tokens=4, temperature=0)
    second = client.responses.create(model="tiny", input=[{"role": "user", "content": FOLLOW_UP}],
                                     previous_response_id=first.id, max_output_tokens=4, temperature=0)
    got = client.responses.retrieve(second.id)
    assert got.model_dump() == second.model_dump()
    items = client.responses.input_items.list(second.id)
    assert [i.type for i in items.data] == ["message"] * 3   # newest first: the follow-up, the answer, the question
    assert [i.role for i in items.data] == ["user", "assistant", "user"]
    assert items.data[0].content[0].text == FOLLOW_UP and items.data[2].content[0].text == QUESTION
    assert items.data[1].id == first.output[0].id
    asc = client.responses.input_items.list(second.id, order="asc", limit=1)
    assert [i.id for i in asc.data] == [items.data[2].id] and asc.has_more
    assert [i.id for i in asc.iter_pages().__next__().data] == [items.data[2].id]
    assert [i.id for i in client.responses.input_items.list(second.id, order="asc", limit=2,
                                                            after=asc.data[0].id).data] == \
        [items.data[1].id, items.data[0].id]
    client.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.retrieve(second.id)
    assert e.value.body["message"] == f"Response with id '{second.id}' not found."
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="tiny", input="x", previous_response_id=second.id, max_output_tokens=2)
    assert e.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(second.id)
    assert client.responses.retrieve(first.id).id == first.id   # the earlier turn stays


def test_a_tool_result_sent_after_its_call_by_id_is_the_whole_history(client):
    """The agent SDKs' loop: the call answered by id, only its output sent; the prompt as if all were resent."""
    first = client.responses.create(model="tiny", input=QUESTION, tools=[FLAT_TOOL], tool_choice="required",
                                    max_output_tokens=80, temperature=0)
    (call,) = first.output
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "18 C and sunny"}
    chained = client.responses.create(model="tiny", input=[result], previous_response_id=first.id, tools=[FLAT_TOOL],
                                      max_output_tokens=8, temperature=0)
    whole = client.responses.create(model="tiny", tools=[FLAT_TOOL], max_output_tokens=8, temperature=0, store=False,
                                    input=[{"role": "user", "content": QUESTION}, call.model_dump(exclude_none=True),
                                           result])
    assert chained.usage.input_tokens == whole.usage.input_tokens and chained.output_text == whole.output_text
    kinds = [i.type for i in client.responses.input_items.list(chained.id, order="asc")]
    assert kinds == ["message", "function_call", "function_call_output"]


def test_a_streamed_response_is_stored_as_its_last_event_says(client):
    events = list(client.responses.create(model="tiny", input=QUESTION, max_output_tokens=5, stream=True))
    last = events[-1].response
    assert client.responses.retrieve(last.id).model_dump() == last.model_dump()


def test_store_false_keeps_nothing(client):
    r = client.responses.create(model="tiny", input=QUESTION, max_output_tokens=2, store=False)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_background_answers_at_once_and_polls_to_completed(client):
    fore = client.responses.create(model="tiny", input=QUESTION, max_output_tokens=8, temperature=0)
    r = client.responses.create(model="tiny", input=QUESTION, max_output_tokens=8, temperature=0, background=True)
    assert r.status in ("queued", "in_progress") and r.background is True and r.output == []
    done = _until(client, r.id)
    assert done.status == fore.status and done.output_text == fore.output_text
    assert done.usage.output_tokens == fore.usage.output_tokens
    raw = requests.post(client.base_url.join("responses").__str__(), headers={"Connection": "close"}, timeout=30,
                        json={"model": "tiny", "input": QUESTION, "max_output_tokens": 200, "background": True,
                              "ignore_eos": True})   # a client that goes at once: the run goes on
    assert raw.json()["status"] == "queued"
    assert _until(client, raw.json()["id"]).usage.output_tokens == 200


def test_cancel_stops_a_background_response(server, client):
    r = client.responses.create(model="tiny", input=QUESTION, max_output_tokens=1000, temperature=0, background=True,
                                extra_body={"ignore_eos": True})
    _until(client, r.id, done=("in_progress",))
    cancelled = client.responses.cancel(r.id)
    assert cancelled.status == "cancelled"
    done = _until(client, r.id, done=("cancelled",))
    time.sleep(0.5)   # its run ended: what it had made is kept, still cancelled
    done = client.responses.retrieve(r.id)
    assert done.status == "cancelled" and done.usage is not None and done.usage.output_tokens < 1000
    fore = client.responses.create(model="tiny", input=QUESTION, max_output_tokens=2)   # cannot be cancelled
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(fore.id)


@pytest.fixture(scope="module")
def keyed(tiny_llama):
    s = Server(tiny_env(tiny_llama, api_key="key-one,key-two", responses_store_entries=3))
    yield s
    s.stop()


def test_two_keys_never_read_each_others_responses(keyed):
    one, two = (openai.OpenAI(base_url=keyed.url + "/v1", api_key=k, max_retries=0) for k in ("key-one", "key-two"))
    r = one.responses.create(model="tiny", input=QUESTION, max_output_tokens=2)
    assert one.responses.retrieve(r.id).id == r.id
    for call in (lambda: two.responses.retrieve(r.id), lambda: two.responses.delete(r.id),
                 lambda: two.responses.input_items.list(r.id),
                 lambda: two.responses.create(model="tiny", input="x", previous_response_id=r.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert requests.get(f"{keyed.url}/v1/responses/{r.id}", timeout=10).status_code == 401
    assert one.responses.retrieve(r.id).id == r.id


def test_the_store_bound_puts_out_the_oldest(keyed):
    one = openai.OpenAI(base_url=keyed.url + "/v1", api_key="key-one", max_retries=0)
    ids = [one.responses.create(model="tiny", input=QUESTION, max_output_tokens=2).id for _ in range(4)]
    with pytest.raises(openai.NotFoundError):
        one.responses.retrieve(ids[0])
    assert [one.responses.retrieve(i).id for i in ids[1:]] == ids[1:]


def test_a_directory_keeps_responses_over_a_restart_and_shares_them(tmp_path):
    clock = Clock()
    one = ResponseStore(10, 1 << 20, 60, directory=tmp_path, clock=clock)
    first = _stored("resp_a", owner="k1")
    one.put(first)
    two = ResponseStore(10, 1 << 20, 60, directory=tmp_path, clock=clock)   # another worker, or after a restart
    got = two.get("k1", "resp_a")
    assert got.response == first.response and got.input_items == first.input_items and got.made == first.made
    assert two.get("k2", "resp_a") is None and two.get("k1", "../resp_a") is None
    first.response["status"] = "completed"   # the first worker finishes it: the other reads the change
    one.put(first)
    assert two.get("k1", "resp_a").response["status"] == "completed"
    assert two.delete("k1", "resp_a") and one.get("k1", "resp_a") is None   # deleted for all
    for i in range(3):
        one.put(_stored(f"resp_{i}"))
    clock.now = 100   # past the time to live: a new start sweeps them out
    ResponseStore(10, 1 << 20, 60, directory=tmp_path, clock=clock)
    assert not list(tmp_path.glob("*/*.json"))


def test_servers_on_one_directory_continue_each_others_chains_and_keep_them_over_a_restart(tiny_llama, tmp_path):
    env = tiny_env(tiny_llama, responses_store_dir=str(tmp_path))
    a, b = Server(env), Server(env)
    try:
        ca, cb = (openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0) for s in (a, b))
        first = ca.responses.create(model="tiny", input=QUESTION, max_output_tokens=4, temperature=0)
        second = cb.responses.create(model="tiny", input=FOLLOW_UP, previous_response_id=first.id,
                                     max_output_tokens=4, temperature=0)
        assert second.usage.input_tokens > first.usage.input_tokens + 3   # b rendered a's first turn
        assert ca.responses.retrieve(second.id).output_text == second.output_text
        background = ca.responses.create(model="tiny", input=QUESTION, max_output_tokens=8, background=True)
        assert _until(cb, background.id).status == "incomplete"   # a ran it; b sees it end
        cb.responses.delete(first.id)
        with pytest.raises(openai.NotFoundError):
            ca.responses.retrieve(first.id)
    finally:
        a.stop()
        b.stop()
    again = Server(env)
    try:
        c = openai.OpenAI(base_url=again.url + "/v1", api_key="unused", max_retries=0)
        assert c.responses.retrieve(second.id).output_text == second.output_text
    finally:
        again.stop()
