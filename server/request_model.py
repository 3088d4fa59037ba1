"""The request every API translates into (Generation) and how its choices are answered (Options): the one
model the serving path knows, whatever the wire format."""
from dataclasses import dataclass, field


@dataclass
class Options:
    """How one request's choices are run and answered (besides its SamplingParams)."""
    n: int = 1
    echo: bool = False            # completions: the prompt before each choice's text (and its logprobs)
    logprobs: int = None          # top logprobs per token (chat: top_logprobs, when logprobs is true)
    score_only: bool = False      # echo with max_tokens 0: the prompt's logprobs, no token generated
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False   # usage so far in every streamed chunk (vLLM's continuous_usage_stats)


@dataclass
class Generation:
    """One request as every API hands it over. Exactly one of `prompts` (each a str or token ids) and
    `messages` (chat messages: {role, content, tool_calls?}, rendered by the chat template) is given."""
    endpoint: str                    # the API's name in metrics and logs: chat, completions, responses, messages
    options: Options
    sampling: dict                   # the sampling fields under OpenAI's names (request_fields.sampling_params)
    prompts: list = None
    messages: list = None
    template_kwargs: dict = field(default_factory=dict)
    tools: object = None             # server.tools.Tools, or None
    grammar: tuple = None            # (kind, value, the client's field) of the structured output asked for
    model: object = None             # the model the client named (None: this server's)
    names: dict = field(default_factory=dict)   # OpenAI's field name -> the client's, for the 400s
    id_prefix: str = "chatcmpl-"     # the answer's id before its random digits
    carry: object = None             # what the API's writer needs from its translation (Responses: its Turn)
