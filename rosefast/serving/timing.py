"""Per-request timestamps (perf_counter seconds), recorded only when asked for."""
from dataclasses import dataclass, field


@dataclass
class RequestTiming:
    submit: float = None        # add_request returned
    tokenized: float = None     # prompt ids ready (== submit for pre-tokenized prompts / inline encode)
    scheduled: float = None     # the engine first scheduled its prefill
    first_token: float = None   # its first token left the engine step
    token_times: list = field(default_factory=list)   # one per output token
    finish_reason: str = None
