"""The streaming benchmark's two drivers behind one arrival loop: in-process (a SchedulerManager, every
stage known) and over HTTP/SSE (any OpenAI-compatible server). The schedule, the submit times and the
lag are taken the same way for both; only `submit` differs."""
import _queue
import asyncio
import json
import threading
import time
from dataclasses import dataclass, field

from rosefast.bench.priority import submitter_priority
from rosefast.bench.schedule import arrival_offsets


@dataclass
class Sample:
    index: int
    target: float = None        # absolute target time (absolute/poisson/gamma), perf_counter seconds
    t_call: float = None        # submit started
    t_return: float = None      # add_request returned (in-process) / response headers arrived (--url)
    rejected: bool = False
    error: str = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tokenized: float = None     # the rest: in-process only
    scheduled: float = None
    first_token: float = None
    token_times: list = field(default_factory=list)
    first_recv: float = None    # client side: first chunk with tokens / text
    last_recv: float = None
    event_times: list = field(default_factory=list)
    texts: list = field(default_factory=list)   # --url: the text of each event, in order

    def received(self, now):
        """A chunk with tokens (in-process) or an SSE event with text (--url) arrived at `now` (one event:
        a merged one carries several tokens)."""
        self.first_recv = self.first_recv or now
        self.last_recv = now
        self.event_times.append(now)


def _wait_until(target, spin):
    """Sleep until `target`; `spin`: the last 2 ms in sleep(0) turns (a normal thread's wake may be late by
    its timer slack; a real-time one's timer has none, and a real-time spin would hold a core)."""
    while True:
        left = target - time.perf_counter()
        if left <= 0:
            return
        time.sleep(left if left > 0.002 or not spin else 0)


def run_arrivals(args, prompts, submit):
    """Call `submit(prompt, sample)` for each prompt on the schedule: absolute / poisson / gamma target
    t0 + offset_i (the lag is t_call - target); relative sleeps the interval after each submit, so its real
    gap is the submit's own time plus the interval. The loop runs at `args.submitter_priority` (priority.py:
    "realtime" or "normal"; normal where the args have none). Returns the samples."""
    samples = [Sample(i) for i in range(len(prompts))]
    interval = args.submit_interval_ms / 1e3
    offsets = arrival_offsets(args.submit_schedule, len(prompts), interval, args.burstiness, args.seed)
    effective = getattr(args, "submitter_priority", "normal")
    with submitter_priority(effective):
        t0 = time.perf_counter()
        for prompt, s in zip(prompts, samples):
            if offsets is not None:
                s.target = t0 + offsets[s.index]
                _wait_until(s.target, spin=effective != "realtime")
            s.t_call = time.perf_counter()
            submit(prompt, s)
            if offsets is None and interval:
                time.sleep(interval)
    return samples


# -- in-process --------------------------------------------------------------------------------------

def run_inprocess(manager, hub, args, prompts, progress=None):
    """Each stream is read by a greenlet on the hub's thread (HubConsumers: the manager's waker is its
    GeventWaker, as the server's SSE greenlets are woken); the arrival loop only admits and hands over."""
    from rosefast.engine.sampling_params import SamplingParams
    from rosefast.errors import OverloadedError

    params = SamplingParams(max_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                            ignore_eos=args.no_stop_on_eos)
    ended = _queue.SimpleQueue()
    spawned = []

    def consume(rid, s):
        t = manager.timing(rid)
        try:
            for chunk in manager.stream(rid):
                s.prompt_tokens = chunk.prompt_tokens or 0
                if chunk.token_ids:
                    s.received(time.perf_counter())
                    s.completion_tokens += len(chunk.token_ids)
        except Exception as e:  # noqa: BLE001 - counted, not crashed on
            s.error = repr(e)
        finally:
            if t is not None:
                s.tokenized, s.scheduled, s.first_token = t.tokenized, t.scheduled, t.first_token
                s.token_times = t.token_times
            if progress is not None:
                progress.update()
            ended.put(s)

    def submit(prompt, s):
        try:
            if isinstance(prompt, list):
                rid = manager.add_request(prompt_token_ids=prompt, params=params)
            else:
                rid = manager.add_request(prompt, params=params)
            s.t_return = time.perf_counter()
            spawned.append(s)
            hub.spawn(consume, rid, s)
        except OverloadedError:
            s.t_return = time.perf_counter()
            s.rejected = True
            if progress is not None:
                progress.update()

    samples = run_arrivals(args, prompts, submit)
    for _ in spawned:
        ended.get()
    return samples


# -- over HTTP ---------------------------------------------------------------------------------------

def _request(args, model, prompt):
    """(path, body) of one streamed completion or chat request."""
    chat = args.chat and isinstance(prompt, str)
    body = {"model": model, "max_tokens": args.max_new_tokens, "temperature": args.temperature, "top_p": args.top_p,
            "stream": True, "stream_options": {"include_usage": True}}
    if args.no_stop_on_eos:
        body["ignore_eos"] = True
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    body.update(getattr(args, "extra_body", None) or {})   # a response_format, tools, guided_* ...
    return ("/v1/chat/completions" if chat else "/v1/completions"), body


def _take_event(s, event):
    """One SSE event into its sample: an error, the usage, or text (an event that carries text counts)."""
    if "error" in event:
        s.error = event["error"].get("message")
        return
    if event.get("usage"):
        s.prompt_tokens = event["usage"]["prompt_tokens"]
        s.completion_tokens = event["usage"]["completion_tokens"]
    for choice in event.get("choices") or ():
        text = choice.get("text") if "text" in choice else (choice.get("delta") or {}).get("content")
        if text:
            s.received(time.perf_counter())
            s.texts.append(text)


async def _http_one(client, args, model, prompt, s, progress):
    s.t_call = time.perf_counter()   # when the client's loop really starts it: a busy client shows as lag
    path, body = _request(args, model, prompt)
    try:
        async with client.stream("POST", path, json=body) as r:
            s.t_return = time.perf_counter()
            if r.status_code == 429:
                s.rejected = True
                await r.aread()
                return
            if r.status_code != 200:
                s.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    _take_event(s, json.loads(line[6:]))
    except Exception as e:  # noqa: BLE001
        s.error = repr(e)
    finally:
        if progress is not None:
            progress.update()


async def _raw_one(address, args, model, prompt, s, progress):
    """The same request through the lean client (sse_client), for thousands of streams."""
    from rosefast.bench.sse_client import HTTPStatusError, stream_events

    s.t_call = time.perf_counter()
    path, body = _request(args, model, prompt)

    def on_headers(status):
        s.t_return = time.perf_counter()

    try:
        await stream_events(*address, path, body, on_headers, lambda event: _take_event(s, event))
    except HTTPStatusError as e:
        if e.status == 429:
            s.rejected = True
        else:
            s.error = str(e)
    except Exception as e:  # noqa: BLE001
        s.error = repr(e)
    finally:
        if progress is not None:
            progress.update()


def run_http(args, prompts, progress=None):
    """The client's event loop runs in a thread of its own; the arrival loop hands each request to it.
    Returns (samples, the served model's name)."""
    import httpx

    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder = {}

    async def open_client():
        limits = httpx.Limits(max_connections=len(prompts) + 8, max_keepalive_connections=len(prompts) + 8)
        client = httpx.AsyncClient(base_url=args.url.rstrip("/"), limits=limits, timeout=600)
        holder["model"] = (await client.get("/v1/models")).json()["data"][0]["id"]
        return client

    thread = threading.Thread(target=lambda: (asyncio.set_event_loop(loop), ready.set(), loop.run_forever()),
                              daemon=True)
    thread.start()
    ready.wait()
    client = asyncio.run_coroutine_threadsafe(open_client(), loop).result()
    futures = []
    if getattr(args, "client", "httpx") == "raw":
        from urllib.parse import urlsplit

        url = urlsplit(args.url)
        address = (url.hostname, url.port or 80)

        def one(prompt, s):
            return _raw_one(address, args, holder["model"], prompt, s, progress)
    else:
        def one(prompt, s):
            return _http_one(client, args, holder["model"], prompt, s, progress)
    try:
        samples = run_arrivals(args, prompts, lambda prompt, s: futures.append(
            asyncio.run_coroutine_threadsafe(one(prompt, s), loop)))
        for f in futures:
            f.result()
    finally:
        asyncio.run_coroutine_threadsafe(client.aclose(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
    return samples, holder["model"]


def burst_figures(url, prompts, tokens, chat=False, temperature=0.0, extra_body=None, ignore_eos=True, samples=None):
    """The report's figures for `prompts` sent at once to an OpenAI server over the lean SSE client, greedy
    (or at `temperature`), `tokens` each (ignore_eos, or up to EOS): what the side-by-side benchmarks compare.
    `samples`: a list that gets the run's samples (their texts, for comparing outputs)."""
    from types import SimpleNamespace

    from rosefast.bench.report import figures

    args = SimpleNamespace(url=url, client="raw", chat=chat, max_new_tokens=tokens, temperature=temperature, top_p=1.0,
                           no_stop_on_eos=ignore_eos, submit_interval_ms=0.0, submit_schedule="absolute",
                           burstiness=1.0, seed=0, pretok=False, extra_body=extra_body)
    run, _ = run_http(args, prompts)
    if samples is not None:
        samples += run
    return figures(run, args, True)
