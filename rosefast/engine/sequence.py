"""Sequence: one request inside the engine — its tokens, sampling params, state and block table."""
from enum import Enum


class SequenceStatus(Enum):
    WAITING = "waiting"      # not admitted yet, or preempted (its KV freed, to be recomputed)
    RUNNING = "running"      # admitted: prefilling (maybe in chunks) or decoding
    FINISHED = "finished"


class Sequence:
    __slots__ = ("request_id", "token_ids", "num_prompt_tokens", "params", "status", "block_table",
                 "window_table", "state_slot", "state_restore", "state_saves", "num_cached", "num_hashed_blocks",
                 "last_hash", "finish_reason", "stop_ids",
                 "scheduled_at", "seed", "prompt_logprobs", "fork_ids", "matcher", "cached_prompt_tokens",
                 "cache_salt", "speculation", "arrival", "pooled")

    def __init__(self, request_id, prompt_token_ids, params, eos_token_ids=(), seed=0, fork_ids=()):
        self.request_id = request_id
        self.token_ids = list(prompt_token_ids)   # prompt, then outputs
        self.num_prompt_tokens = len(self.token_ids)
        self.params = params
        self.status = SequenceStatus.WAITING
        self.block_table = []
        self.window_table = []       # the sliding-window layers' blocks, when they have a pool (window_blocks)
        self.state_slot = None       # its recurrent state's slot, in a model with linear attention (state_slots)
        self.state_restore = None    # a checkpoint slot its state starts from (a prefix hit), until copied
        self.state_saves = []        # (position, checkpoint slot): states this step's prefill saves for it
        self.num_cached = 0          # tokens whose K/V are in the cache (prefix hits included)
        self.num_hashed_blocks = 0   # leading full blocks registered in the prefix cache
        self.last_hash = None        # the chain hash of the last of them (the next block's chain goes on from it)
        self.finish_reason = None
        self.scheduled_at = None     # perf_counter() when it was first scheduled (prefill start)
        self.arrival = None          # perf_counter() when the scheduler first took it (priority's tie and its aging)
        self.pooled = None           # embeddings: its final hidden states pooled so far (params.pooling)
        self.cached_prompt_tokens = None   # its prompt tokens the prefix cache served, at its first allocation
        self.cache_salt = None       # starts its blocks' hash chain: K/V that equal tokens do not give (long-RoPE)
        self.seed = params.seed if params.seed is not None else seed   # keys its draws, with the position
        # asked for: one entry per prompt token (the first has none), filled during prefill, given out with
        # the first output token
        self.prompt_logprobs = [None] if params.prompt_logprobs is not None else None
        self.fork_ids = tuple(fork_ids)   # the other choices of an n > 1 request: forked after its prefill
        # structured output: its own grammar matcher, which takes each token it samples
        self.matcher = params.grammar.matcher() if params.grammar is not None else None
        self.speculation = None      # speculative decoding's state for it (engine.speculation), made when it decodes
        stop = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop.update(eos_token_ids)
        self.stop_ids = frozenset(stop)

    @property
    def num_tokens(self):
        return len(self.token_ids)

    @property
    def num_output_tokens(self):
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def in_prefill(self):
        """Still has more than the last token to compute (a fresh, chunked or preempted sequence)."""
        return self.num_cached < self.num_tokens - 1

    @property
    def wants_prompt_logprobs(self):
        """Its prompt's logprobs are still to be computed (a prefill must cover every prompt position)."""
        return self.prompt_logprobs is not None and self.num_output_tokens == 0

    @property
    def computes_every_position(self):
        """No prompt position may come from the prefix cache: its prompt logprobs, or a pooling over positions."""
        return self.wants_prompt_logprobs or self.params.pooling in ("mean", "cls")

    @property
    def finished(self):
        return self.status is SequenceStatus.FINISHED

    def __repr__(self):
        return (f"Sequence({self.request_id!r}, {self.status.value}, tokens={self.num_tokens}, "
                f"cached={self.num_cached}, blocks={len(self.block_table)})")
