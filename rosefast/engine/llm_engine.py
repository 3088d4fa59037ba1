"""LLMEngine: the engine the serving layer drives, one `step()` at a time; `generate()` for offline use."""
import itertools
import logging
import random
import time
from dataclasses import dataclass, field

import torch

from rosefast.build import STAND_IN, decoding, load_tokenizer, resolve_model
from rosefast.config import EngineConfig
from rosefast.engine.block_manager import BlockManager
from rosefast.device import is_fatal_device_error, upload
from rosefast.engine.grammar import GrammarError, GrammarMasks, Grammars, panic_error
from rosefast.engine.model_runner import ModelRunner, SeqInput
from rosefast.engine.sampling_params import SamplingParams
from rosefast.engine.scheduler import Scheduler
from rosefast.engine.sequence import Sequence, SequenceStatus
from rosefast.engine.speculation import Speculator
from rosefast.engine.state_slots import StateCheckpoints, StateSlots
from rosefast.engine.stand_in import StandInRunner
from rosefast.engine.window_blocks import WindowBlocks
from rosefast.errors import EngineDeadError
from rosefast.models.layers import long_rope_switch

log = logging.getLogger("rosefast.engine")
SEED_SPAN = 2**63
LONG_ROPE = "long-rope"   # the prefix-cache salt of a long-RoPE sequence past its switch (Sequence.cache_salt)


@dataclass(slots=True)
class StepOutput:
    request_id: object
    new_token_ids: list
    finished: bool
    finish_reason: str = None   # "stop" (EOS or a stop token), "length" (max_tokens or context), "abort"
    scheduled_at: float = None  # with a request's first token: when its prefill was first scheduled
    logprobs: list = None       # when asked: per new token, (its logprob, [(token, logprob)] top k) (raw model)
    prompt_logprobs: list = None  # when asked, with the first token: per prompt token the same (the first: None)
    cached_tokens: int = None     # with the first token: its prompt tokens the prefix cache served
    embedding: list = None        # an embeddings request's vector (params.pooling; not normalized), with its end


@dataclass
class StepResult:
    """What one step did: an output for every request that got a token or ended (those the scheduler cut
    short for lack of KV room included, finished with "length"), and the requests the step failed."""
    outputs: list = field(default_factory=list)
    failed: list = field(default_factory=list)   # request ids, already out of the engine
    error: BaseException = None                  # why they failed
    errors: dict = field(default_factory=dict)   # request id -> its own error, where a row failed alone


class LLMEngine:
    """The engine the serving layer drives, one `step()` at a time, on one thread.

    `before_step(step_number, request_ids)`, when given, runs after scheduling and before the forward
    pass (fault injection, profiler ranges); an exception from it fails that step's requests. `runner`: one
    the caller built (the FakeTensorMode checks of the CUDA path), instead of loading the config's model.
    `tokenizer`: the one the caller already has for this model (the serving core's: one per worker), else the
    model's own, loaded on first use.
    """

    def __init__(self, config=None, *, before_step=None, runner=None, tokenizer=None, **kwargs):
        self.config = config or EngineConfig.from_kwargs(**kwargs)
        self.model = resolve_model(self.config.model)   # the config keeps the spec it was given
        self.runner = runner or (StandInRunner(self.config, self.model) if self.model.source == STAND_IN
                                 else ModelRunner(self.config, self.model))
        self.args = self.runner.args
        self.max_model_len = self.runner.max_model_len
        kv = self.runner.kv
        window = WindowBlocks(kv.window_blocks, self.config.block_size, self.args.sliding_window,
                              kv.window_counted) if kv.window_blocks else None
        # a model with linear attention: a state slot per sequence; prefix-cache hits only where a saved state
        # follows the hit (rosefast.engine.state_slots), and no speculation (a rejected proposal would stay in the
        # state)
        hybrid = bool(getattr(kv, "states", None))
        saved = StateCheckpoints(kv.state_slots + 1, kv.state_checkpoints, self.config.state_checkpoint_tokens) \
            if hybrid and kv.state_checkpoints else None
        if hybrid:
            log.info("linear-attention layers keep a recurrent state per sequence: prefix-cache hits %s; speculative "
                     "decoding off", f"from states saved every {self.config.state_checkpoint_tokens} tokens"
                     if saved is not None else "off (no saved states)")
        self.block_manager = BlockManager(kv.num_blocks, self.config.block_size,
                                          self.config.enable_prefix_cache and (not hybrid or saved is not None),
                                          window=window, states=StateSlots(kv.state_slots) if hybrid else None,
                                          checkpoints=saved)
        self.scheduler = Scheduler(self.config, self.block_manager)
        self.seqs = {}
        self._before_step = before_step
        self._ids = itertools.count()
        self._seeds = random.Random(self.config.seed)   # the seed of each request that brings none
        self.forks = 0   # choices forked from another's prefill
        self._tokenizer = tokenizer
        self._grammars = None
        self._masks = GrammarMasks(self.args.vocab_size)   # llguidance's threads start with the first grammar
        self._row_errors = {}   # request id -> the error its row failed with alone this step (its grammar refused
                                # a token, its sampling or commit raised)
        self._forked = []       # the choices forked in this step (they fail with it if it fails)
        self._long_rope = long_rope_switch(self.args)   # a long-RoPE model's switch (None: another model)
        # (the stand-in gives one token a step, as its sizing promises: it never speculates)
        self.speculator = Speculator("off" if self.model.source == STAND_IN or hybrid else self.config.speculative,
                                     self.config.speculative_tokens, self.config.block_size, self.config.max_batch_size)
        self.steps = 0

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.model)
        return self._tokenizer

    @property
    def grammars(self):
        """Structured output's grammar compiler and cache for this model's tokenizer (compile from any thread)."""
        if self._grammars is None:
            self._grammars = Grammars(self.tokenizer, self.args.vocab_size, self.args.eos_token_ids)
        return self._grammars

    # -- requests ------------------------------------------------------------------------------------

    def check_prompt(self, prompt_token_ids, choices=1):
        """Raise ValueError for a prompt the engine cannot run (with this many choices of it)."""
        if not isinstance(prompt_token_ids, (list, tuple)) or not prompt_token_ids:
            raise ValueError("prompt is empty: give at least one token")
        n = len(prompt_token_ids)
        if n >= self.max_model_len:
            raise ValueError(f"prompt has {n} tokens; the model's context length is {self.max_model_len}, "
                             "which leaves no room for a completion")
        vocab = self.args.vocab_size
        if not all(isinstance(t, int) and 0 <= t < vocab for t in prompt_token_ids):
            raise ValueError(f"prompt token ids must be integers in [0, {vocab})")
        if self.block_manager.blocks_for(n + 1) + choices - 1 > self.block_manager.num_blocks:
            raise ValueError(f"prompt has {n} tokens; the KV cache holds only "
                             f"{self.block_manager.num_blocks * self.config.block_size}"
                             + (f" (and {choices} choices need a block each)" if choices > 1 else ""))

    def check_params(self, params):
        """Raise TypeError / ValueError for sampling parameters this model cannot take (token ids past its
        vocabulary)."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, not {type(params).__name__}")
        vocab = self.args.vocab_size
        if params.logit_bias and not all(t < vocab for t in params.logit_bias):
            raise ValueError(f"logit_bias keys must be token ids in [0, {vocab})")
        if not all(t < vocab for t in params.stop_token_ids):
            raise ValueError(f"stop_token_ids must be token ids in [0, {vocab})")
        if params.grammar is not None and self.model.source == STAND_IN:
            raise ValueError("grammar: structured output needs a model; the stand-in engine emits a fixed text")

    def add_request(self, prompt_token_ids, params=None, request_id=None, fork_ids=()):
        """Queue a request; its id. With `fork_ids`, the ids of n - 1 more choices of the same prompt: they are
        forked from this one when its prefill is done (the prompt's blocks shared, one prefill in all), and
        each samples its own tokens (a seeded request's choice i draws with seed + i)."""
        params = params or SamplingParams()
        self.check_params(params)
        self.check_prompt(prompt_token_ids, 1 + len(fork_ids))
        request_id = next(self._ids) if request_id is None else request_id
        if request_id in self.seqs or any(f in self.seqs or f == request_id for f in fork_ids) \
                or len(set(fork_ids)) != len(fork_ids):
            raise ValueError(f"request_id {request_id!r} or one of its fork ids is already in the engine")
        seq = Sequence(request_id, prompt_token_ids, params, self.args.eos_token_ids, self._seeds.getrandbits(63),
                       fork_ids)
        if self._long_rope is not None and seq.num_tokens > self._long_rope:   # every key with the long factors:
            seq.cache_salt = LONG_ROPE                                         # its blocks are not a short prompt's
        self.seqs[request_id] = seq
        self.scheduler.add(seq)
        return request_id

    def abort(self, request_id):
        """Stop a request in whatever state; its blocks are freed at once. False if unknown."""
        seq = self.seqs.get(request_id)
        if seq is None:
            return False
        self._end(seq, "abort")
        return True

    def has_unfinished(self):
        return self.scheduler.has_work()

    def stats(self):
        """Counters and gauges for monitoring (read from any thread: plain integer reads)."""
        bm, sched = self.block_manager, self.scheduler
        window = bm.window
        return {"kv_blocks_used": bm.num_used_blocks, "kv_blocks_total": bm.num_blocks,
                "kv_window_blocks_used": window.num_used_blocks if window is not None else 0,
                "kv_window_blocks_total": window.num_blocks if window is not None else 0,
                "state_slots_used": 0 if bm.states is None else bm.states.num_slots - bm.states.num_free,
                "state_slots_total": 0 if bm.states is None else bm.states.num_slots,
                "state_checkpoints_saved": 0 if bm.checkpoints is None else bm.checkpoints.saved,
                "state_checkpoint_hits": 0 if bm.checkpoints is None else bm.checkpoints.restored,
                "prefix_cache_hits": bm.hits,
                "prefix_cache_misses": bm.misses, "prefix_cache_evictions": bm.evictions,
                "preemptions": sched.preemptions, "steps": self.steps, "running": len(sched.running),
                "prefill_budget_tokens": sched.budget.tokens, "decode_step_seconds": sched.budget.decode_s or 0.0,
                "prefill_token_seconds": (sched.budget.fit() or (0.0, 0.0))[1],
                "waiting": len(sched.waiting), "sequences": len(self.seqs), "forks": self.forks,
                **self.speculator.stats()}

    # -- the step ------------------------------------------------------------------------------------

    def step(self):
        """Run one step. A failure (the model, the sampler, a before_step hook) fails the step's requests —
        or, if it came before anything was scheduled, every open request, so that it cannot repeat forever —
        and is reported in the result; the engine goes on serving the rest."""
        scheduled, self._forked, self._row_errors = [], [], {}
        try:
            step = self.scheduler.schedule()
            outputs = [StepOutput(rid, [], True, s.finish_reason) for s in step.cut_short
                       for rid in (s.request_id, *s.fork_ids)]   # choices it had not forked yet end with it
            for seq in step.cut_short:
                self._end(seq, seq.finish_reason)
            if not step.seqs:
                return StepResult(outputs)
            self.steps += 1
            scheduled = step.seqs
            if self._before_step is not None:
                self._before_step(self.steps, [s.request_id for s in scheduled])
            start = time.perf_counter()
            outputs += self._run(step)
            self.scheduler.budget.observe(step.is_prefill, sum(step.chunks), time.perf_counter() - start)
            errors = self._row_errors   # rows that failed alone; the rest go on
            if errors:
                return StepResult(outputs, list(errors), next(iter(errors.values())), errors)
            return StepResult(outputs)
        except Exception as e:  # noqa: BLE001 - fail these requests, keep serving the rest
            if is_fatal_device_error(e):   # no later step can succeed: the engine thread ends the engine
                log.critical("engine step %d: the device failed: %r", self.steps, e, exc_info=True)
                raise EngineDeadError(f"the device failed: {e}") from e
            log.error("engine step %d failed: %r", self.steps, e, exc_info=True)
            failed = [s.request_id for s in scheduled] or list(self.seqs)
            failed += [f for rid in failed if rid in self.seqs for f in self.seqs[rid].fork_ids]
            failed += [rid for rid in self._forked if rid in self.seqs]   # choices forked in this step run with it
            for rid in failed:
                self.abort(rid)
            return StepResult([], failed, e)

    def _run(self, step):
        """The step's outputs: a decode step may verify proposals (speculation), else a plain step."""
        if not step.is_prefill and self.speculator.enabled:   # a decode step: timed, for the speculator's cost fit
            start = time.perf_counter()
            plan = self.speculator.plan(step.seqs, self.max_model_len, self.block_manager.spare_blocks())
            outputs = self._run_speculative(step, plan) if plan else self._run_step(step)
            self.speculator.cost.observe(len(step.seqs) + sum(map(len, plan.values())), time.perf_counter() - start)
            return outputs
        return self._run_step(step)

    def _run_step(self, step):
        """Forward, sample, commit: the outputs of the sequences that sampled a token."""
        if self.block_manager.window is not None:
            for seq, n in zip(step.seqs, step.chunks):
                self.block_manager.prepare(seq, seq.num_cached + n)
        saves = self._state_saves(step) if step.is_prefill and self.block_manager.checkpoints is not None \
            else [()] * len(step.seqs)
        inputs = [SeqInput(seq.token_ids[seq.num_cached:seq.num_cached + n], seq.num_cached, seq.block_table,
                           seq.cache_salt is LONG_ROPE, seq.window_table, seq.state_slot, save)
                  for seq, n, save in zip(step.seqs, step.chunks, saves)]
        if step.is_prefill and step.seqs[0].params.pooling is not None:   # embeddings: pooled, nothing sampled
            return self._pooled(step, self.runner.pool(inputs, [s.params.pooling for s in step.seqs]))
        sampling = [i for i in range(len(step.seqs)) if step.completes(i)] if step.is_prefill \
            else range(len(step.seqs))   # every decoding sequence samples
        full = {i for i, s in enumerate(step.seqs) if s.wants_prompt_logprobs} if step.is_prefill else None
        masks = self._masks.start(step.seqs if not step.is_prefill else [step.seqs[i] for i in sampling])
        # (filled while the model runs; None when no row is constrained)
        logits = self.runner.forward(inputs, step.is_prefill, all_logits=full)
        if full:
            logits = self._prompt_logprobs(step, full, logits)
        for seq, n in zip(step.seqs, step.chunks):
            seq.num_cached += n
            self.block_manager.commit(seq)
            if seq.state_saves:   # (a save no committed block took)
                self.block_manager.release_saves(seq)
        if not sampling:
            return []
        if len(sampling) < len(step.seqs):   # a chunked prefill in the step: only the finished rows sample
            logits = self._rows(logits, sampling)
        seqs = [step.seqs[i] for i in sampling]
        rows = list(range(len(seqs)))        # a forking sequence's logits row serves its choices too
        for j, seq in enumerate(list(seqs)):
            if seq.fork_ids:
                children = self._fork(seq)
                rows += [j] * len(children)
                seqs += children
        if len(rows) > len(sampling):
            logits = self._rows(logits, rows)
        allowed = self._allowed(masks, rows) if masks is not None else None
        tokens, logprobs = self._sample(logits, seqs, allowed)
        outputs = [self._commit_row(seq, token, lp) for seq, token, lp in zip(seqs, tokens, logprobs)]
        return [out for out in outputs if out is not None]

    def _pooled(self, step, pieces):
        """An embeddings prefill step: each sequence's pooled states gathered; one whose whole prompt is computed
        ends with its vector (a mean's sum divided by its length)."""
        outputs = []
        for seq, n, piece in zip(step.seqs, step.chunks, pieces):
            seq.num_cached += n
            self.block_manager.commit(seq)
            if seq.state_saves:
                self.block_manager.release_saves(seq)
            mode = seq.params.pooling
            if mode == "mean":
                seq.pooled = piece if seq.pooled is None else seq.pooled + piece
            elif mode == "last" or seq.pooled is None:   # (cls: the first chunk's)
                seq.pooled = piece
            if seq.num_cached < seq.num_tokens:
                continue
            vector = seq.pooled / seq.num_tokens if mode == "mean" else seq.pooled
            outputs.append(StepOutput(seq.request_id, [], True, "stop", scheduled_at=seq.scheduled_at,
                                      cached_tokens=seq.cached_prompt_tokens, embedding=vector.tolist()))
            self._end(seq, "stop")
        return outputs

    def _state_saves(self, step):
        """A prefill step of a model whose linear-attention states are saved: each sequence's state copied in from
        the saved one its prefix hit ends at (before the step runs), and slots reserved for the states this step
        reaches at every `every`-th token; per sequence the SeqInput's (offset in its new tokens, slot) saves."""
        kv, saved = self.runner.kv, self.block_manager.checkpoints
        for seq in step.seqs:
            if seq.state_restore is not None:
                kv.copy_state(seq.state_restore, seq.state_slot)
                seq.state_restore = None
        out = []
        for seq, n in zip(step.seqs, step.chunks):
            start = seq.num_cached
            for at in range((start // saved.every + 1) * saved.every, start + n + 1, saved.every):
                slot = saved.reserve()
                if slot is None:
                    break
                seq.state_saves.append((at, slot))
            out.append([(at - start, slot) for at, slot in seq.state_saves])
        return out

    def _commit_row(self, seq, token, lp):
        """_commit for one row of a step: None where the row failed (alone) or its token was refused."""
        if seq.request_id in self._row_errors:
            return None
        try:
            return self._commit(seq, token, lp)
        except Exception as e:  # noqa: BLE001 - this row's fault fails this row alone
            if is_fatal_device_error(e):
                raise
            self._fail_row(seq, e)
            return None

    def _run_speculative(self, step, plan):
        """A decode step that also verifies proposals (`plan`: {i: proposed ids} for step.seqs[i]; see
        rosefast.engine.speculation): each sequence's last token and its proposals take a row each, at their own
        positions, in one forward pass. Then depth by depth, each sequence still going samples its row at that
        depth exactly as a decode step would (its penalties, grammar, seed and position as of the tokens kept so
        far) and commits the token; it goes on to the next row while the token equals its proposal there. The
        blocks reserved for rows that were not kept are given back."""
        bm, seqs = self.block_manager, step.seqs
        inputs, first = [], []
        for i, seq in enumerate(seqs):
            first.append(len(inputs))
            long, base = seq.cache_salt is LONG_ROPE, seq.num_cached
            proposal = plan.get(i)
            if proposal:
                bm.reserve(seq, seq.num_tokens + len(proposal))
            else:
                bm.prepare(seq, seq.num_tokens)
            inputs.append(SeqInput(seq.token_ids[-1:], base, seq.block_table, long, seq.window_table))
            if proposal:
                inputs += [SeqInput([t], base + 1 + j, seq.block_table, long, seq.window_table)
                           for j, t in enumerate(proposal)]
        masks = self._masks.start(seqs)
        with decoding(len(seqs)):
            logits = self.runner.forward(inputs, False)
        self.speculator.steps += 1
        sampler = self.runner.sampler   # plain greedy rows (the common case): every row's argmax in one pass
        greedy = sampler.greedy(logits) if masks is None and sampler.plain(seqs) else None
        outputs, going, depth = {}, list(range(len(seqs))), 0
        kept = dict.fromkeys(plan, 0)
        try:
            while going:
                batch = [seqs[i] for i in going]
                for seq in batch:   # the K/V of the row at this depth are of a kept token
                    seq.num_cached += 1
                    bm.commit(seq)
                if depth:
                    masks = self._masks.start(batch)
                rows = [first[i] + depth for i in going]
                if greedy is not None:
                    tokens, logprobs = [greedy[r] for r in rows], [None] * len(rows)
                else:
                    allowed = self._allowed(masks, range(len(batch))) if masks is not None else None
                    tokens, logprobs = self._sample(self._rows(logits, rows), batch, allowed)
                nxt = []
                for i, seq, token, lp in zip(going, batch, tokens, logprobs):
                    out = self._commit_row(seq, token, lp)
                    if out is None:
                        continue
                    outputs[seq.request_id] = self._merged(outputs[seq.request_id], out) \
                        if seq.request_id in outputs else out
                    proposal = plan.get(i, ())
                    if depth < len(proposal) and token == proposal[depth]:
                        kept[i] += 1
                        if seq.status is SequenceStatus.RUNNING:   # not finished, nor preempted by long-RoPE
                            nxt.append(i)
                going, depth = nxt, depth + 1
        finally:   # the proposals' fate, and the blocks of rows not kept back, whatever happened in the step
            for i, proposal in plan.items():
                seq = seqs[i]
                if seq.status is SequenceStatus.RUNNING:
                    bm.trim(seq)
                self.speculator.record(seq, len(proposal), kept[i])
        return list(outputs.values())

    @staticmethod
    def _merged(first, later):
        """One step's outputs of one sequence as one: its tokens (and their logprobs) in order, the last finish."""
        first.new_token_ids += later.new_token_ids
        if first.logprobs is not None:
            first.logprobs += later.logprobs
        first.finished, first.finish_reason = later.finished, later.finish_reason
        return first

    def _sample(self, logits, seqs, allowed):
        """The step's tokens and logprobs. When the batched sampler fails, it runs again row by row: a row whose
        settings (or a fault nobody foresaw) fail it fails alone, and every other row gets the token it would have
        had in the batch (a row's draw depends on its own seed and position only)."""
        try:
            sampled = self.runner.sampler(logits, seqs, allowed)
            return sampled.token_ids, sampled.logprobs or [None] * len(seqs)
        except Exception as e:  # noqa: BLE001 - find the row that fails
            if is_fatal_device_error(e):
                raise
            log.warning("engine step %d: the sampler failed for the batch (%r); sampling row by row", self.steps, e)
        tokens, logprobs = [], []
        for i, seq in enumerate(seqs):
            try:
                one = self.runner.sampler(logits[i:i + 1], [seq], self._allowed_row(allowed, i))
                tokens.append(one.token_ids[0])
                logprobs.append(one.logprobs[0] if one.logprobs else None)
            except Exception as e:  # noqa: BLE001 - this row's settings fail the sampler: it fails alone
                if is_fatal_device_error(e):
                    raise
                self._fail_row(seq, e)
                tokens.append(None)
                logprobs.append(None)
        return tokens, logprobs

    @staticmethod
    def _allowed_row(allowed, i):
        """Row i's part of the sampler's (rows, bitmask), as a one-row batch's; None when it is not masked."""
        if allowed is None:
            return None
        rows, bitmask = allowed
        hit = (rows == i).nonzero().flatten()
        return None if hit.numel() == 0 else (torch.zeros(1, dtype=torch.long), bitmask[hit[:1]])

    def _fail_row(self, seq, error):
        """One row failed alone: the sequence ends (its blocks freed), reported failed with its own error."""
        log.error("engine step %d: request %r failed alone: %r", self.steps, seq.request_id, error,
                  exc_info=error if error.__traceback__ is not None else None)
        self._row_errors[seq.request_id] = error
        self._end(seq, "abort")

    def _commit(self, seq, token, lp):
        """A row's sampled token into its sequence: its finish, its grammar, its output (None if refused)."""
        seq.token_ids.append(token)
        reason = self._finish_reason(seq, token)
        if seq.matcher is not None and reason is None:
            reason = self._advance(seq, token)
            if reason == "refused":
                return None
        if reason is not None:
            self._end(seq, reason)
        elif self._long_rope is not None and seq.cache_salt is None and seq.num_tokens > self._long_rope:
            # past long-RoPE's switch: every key again with the long factors, as Hugging Face recomputes its cache
            seq.cache_salt = LONG_ROPE
            self.scheduler.preempt(seq)
        if len(seq.token_ids) - seq.num_prompt_tokens == 1:   # its first token
            return StepOutput(seq.request_id, [token], reason is not None, reason, seq.scheduled_at,
                              None if lp is None else [lp], seq.prompt_logprobs, seq.cached_prompt_tokens or 0)
        return StepOutput(seq.request_id, [token], reason is not None, reason, None, None if lp is None else [lp])

    def _allowed(self, masks, rows):
        """The sampler's (rows, bitmask) for this step's rows: a forked choice starts where its parent does, so
        it takes its parent's mask row (`rows` maps each sampling row to the logits row it came from)."""
        masked, bitmask = GrammarMasks.result(masks)
        where = {r: j for j, r in enumerate(masked)}
        pick = [(i, where[r]) for i, r in enumerate(rows) if r in where]
        if len(pick) != len(masked) or any(i != j for i, j in pick):
            bitmask = bitmask[[j for _, j in pick]]
        return torch.tensor([i for i, _ in pick], dtype=torch.long), bitmask

    def _advance(self, seq, token):
        """The constrained sequence's matcher takes its token: "stop" once the grammar is complete; "refused"
        (the sequence ended, to be reported failed) if the matcher will not take it (it has hit one of
        llguidance's limits: the sampler only draws allowed tokens)."""
        try:
            if seq.matcher.consume_token(token):
                return "stop" if seq.matcher.is_stopped() else None
            error = (seq.matcher.get_error() or "").strip().splitlines()   # its first line: the rest dumps its state
            error = GrammarError(f"the grammar failed while generating: {error[0] if error else '?'}")
        except BaseException as e:   # a panic inside llguidance fails this row alone
            error = panic_error(e)
        self._fail_row(seq, error)
        return "refused"

    def _prompt_logprobs(self, step, full, logits):
        """Fill the prompt logprobs of the sequences in `full` from their rows of this prefill's logits (each
        row predicts the next prompt token); return one row per sequence, its last, for sampling."""
        last, rows, targets, start = [], [], [], 0
        for i, (seq, n) in enumerate(zip(step.seqs, step.chunks)):
            count = n if i in full else 1
            if i in full:   # rows for positions num_cached .. num_cached + n - 1; the next token is a prompt one
                for j in range(n):
                    pos = seq.num_cached + j + 1
                    if pos < seq.num_prompt_tokens:
                        rows.append(start + j)
                        targets.append(seq.token_ids[pos])
            last.append(start + count - 1)
            start += count
        if rows:
            k = max(step.seqs[i].params.prompt_logprobs for i in full)
            entries = iter(self.runner.sampler.prompt_logprobs(self._rows(logits, rows), targets, k))
            for i in sorted(full):
                seq = step.seqs[i]
                n = min(step.chunks[i], seq.num_prompt_tokens - 1 - seq.num_cached)
                want = seq.params.prompt_logprobs
                for _ in range(max(n, 0)):
                    chosen, top = next(entries)
                    seq.prompt_logprobs.append((chosen, top[:want]))
        return self._rows(logits, last)

    @staticmethod
    def _rows(logits, rows):
        """These rows of the logits (indices go to the device in one pinned copy, not as a list's implicit one)."""
        return logits.index_select(0, upload(rows, torch.long, logits.device))

    def _fork(self, parent):
        """The parent's other choices, as running sequences sharing its prompt's blocks (a choice that gets no
        block for its copy of the partial last block waits, to be prefilled again from the prefix cache)."""
        children = []
        for k, rid in enumerate(parent.fork_ids, start=1):
            child = Sequence(rid, parent.token_ids, parent.params, seed=self._seeds.getrandbits(63))
            child.stop_ids, child.scheduled_at, child.prompt_logprobs = parent.stop_ids, parent.scheduled_at, None
            child.cached_prompt_tokens, child.cache_salt = parent.cached_prompt_tokens, parent.cache_salt
            if parent.params.seed is not None:   # choice k draws with seed + k (mod 2**63: seeds are int64)
                child.seed = (parent.params.seed + k) % SEED_SPAN
            self.seqs[rid] = child
            copy = self.block_manager.fork(parent, child) if self.scheduler.has_room() else False
            if copy is False:
                self.scheduler.add(child)
                continue
            if copy is not None:
                self.runner.kv.copy_blocks(copy)
            self.scheduler.add_running(child)
            children.append(child)
            self._forked.append(rid)
        self.forks += len(parent.fork_ids)
        parent.fork_ids = ()
        return children

    def _end(self, seq, reason):
        """A sequence is done (finished, aborted or cut short): out of the scheduler, the sampler, the index."""
        if not seq.finished:
            self.scheduler.finish(seq, reason)
        self.runner.sampler.release(seq.request_id)
        self.seqs.pop(seq.request_id, None)

    def _finish_reason(self, seq, token):
        if token in seq.stop_ids:
            return "stop"
        n = len(seq.token_ids)
        if n - seq.num_prompt_tokens >= seq.params.max_tokens or n >= self.max_model_len:
            return "length"
        return None

    # -- offline -------------------------------------------------------------------------------------

    def generate(self, prompts, params=None, use_tqdm=True):
        """Run prompts (strings or token id lists) to completion: a dict per prompt with `token_ids`, `text`,
        `finish_reason` and (for params that ask) `logprobs`, in the order given."""
        from tqdm import tqdm

        params = params or SamplingParams()
        plist = params if isinstance(params, list) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"{len(plist)} SamplingParams for {len(prompts)} prompts")
        ids = [self.add_request(self.tokenizer(p).input_ids if isinstance(p, str) else list(p), sp)
               for p, sp in zip(prompts, plist)]
        results = {rid: {"token_ids": [], "finish_reason": None} for rid in ids}
        for rid, sp in zip(ids, plist):
            if sp.logprobs is not None:
                results[rid]["logprobs"] = []
            if sp.prompt_logprobs is not None:
                results[rid]["prompt_logprobs"] = None
        with tqdm(total=len(ids), desc="rosefast generate", disable=not use_tqdm, unit="req") as bar:
            while any(results[r]["finish_reason"] is None for r in ids):
                result = self.step()
                if result.error is not None:
                    raise RuntimeError(f"engine step failed: {result.error!r}") from result.error
                for out in result.outputs:
                    if out.request_id in results:
                        results[out.request_id]["token_ids"] += out.new_token_ids
                        if out.logprobs:
                            results[out.request_id]["logprobs"] += out.logprobs
                        if out.prompt_logprobs is not None:
                            results[out.request_id]["prompt_logprobs"] = out.prompt_logprobs
                        if out.finished:
                            results[out.request_id]["finish_reason"] = out.finish_reason
                            bar.update()
        for r in results.values():
            r["text"] = self.tokenizer.decode(r["token_ids"], skip_special_tokens=True)
        return [results[r] for r in ids]
