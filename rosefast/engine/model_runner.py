"""ModelRunner: turns a step's sequences into tensors, runs our model on the paged KV cache, samples.

A step is either a prefill (several sequences, each with a run of new tokens, packed) or a decode
(one new token per sequence). Every torch call happens on the thread that calls the runner.
"""
import logging
from dataclasses import dataclass

import torch

from rosefast.build import build_model
from rosefast.device import resolve_device, resolve_dtype, upload, use_device
from rosefast.engine.kv_cache import KVCache, plan_blocks, plan_state_slots
from rosefast.engine.sampler import Sampler
from rosefast.models.layers import AttentionMetadata, GatherWorkspace, long_rope_switch, rope_index

log = logging.getLogger("rosefast.engine")


@dataclass(slots=True)
class SeqInput:
    """One sequence's part of a step."""
    token_ids: list       # the new tokens to compute (a prefill chunk, or the one last token for decode)
    start: int            # tokens of this sequence already in the cache (the first new token's position)
    block_table: list     # block ids holding positions [0, start + len(token_ids))
    long_rope: bool = False   # a long-RoPE sequence past the switch: its RoPE takes the long factors (rope_index)
    window_table: list = None  # the sliding-window layers' blocks, when they have a pool of their own
    state_slot: int = None     # its linear-attention layers' state slot (None: the pools' scratch one)
    state_saves: list = ()     # (token offset in token_ids, checkpoint slot): its state after that many new tokens,
                               # saved there (rosefast.engine.state_slots.StateCheckpoints)


def served_context(max_model_len, args):
    """The context this engine serves: the setting (0: the model's), at most the model's (a sliding window
    is attention's business: each layer with one sees its last W positions; a long-RoPE model's factors,
    RoPE's: layers.rope_index)."""
    limit = args.max_position_embeddings
    return min(max_model_len or limit, limit)


class ModelRunner:
    def __init__(self, config, model=None, *, loaded=None):
        """Load `model` (or config.model) on the config's device; `loaded`: a (module, ModelArgs, device) built
        by the caller instead (the FakeTensorMode checks build one on a fake CUDA device)."""
        self.config = config
        if loaded is None:
            self.device = resolve_device(config.device)
            use_device(self.device)   # this is the engine thread: every later step runs on it too
            self.dtype = resolve_dtype(config.dtype, self.device)
            self._load(config, model)
        else:
            self.model, self.args, self.device = loaded
            self.dtype = next(p.dtype for p in self.model.parameters() if p.is_floating_point())
        self.max_model_len = served_context(config.max_model_len, self.args)
        self.long_rope = long_rope_switch(self.args) is not None   # its rope tables: short | long (rope_index)
        self.block_size = config.block_size
        self.max_blocks_per_seq = -(-self.max_model_len // self.block_size)
        self.workspace = GatherWorkspace()   # the torch twin's decode gather buffers, passed in each step's metadata
        self.sampler = Sampler(self.args.vocab_size, self.device)
        slots, saved, reserved = plan_state_slots(config, self.args, self.dtype, self.device)
        blocks, window, counted = plan_blocks(config, self.args, self.dtype, self.device, self.profile,
                                              self.max_blocks_per_seq, reserved)
        self.kv = KVCache(self.args, blocks, self.block_size, self.dtype, self.device, window, counted, slots, saved)
        self.graphs = None
        if self.device.type == "cuda" and config.cuda_graph and loaded is None and getattr(self.model, "graph_safe", True):
            from rosefast.engine.cuda_graph import DecodeGraphs

            self.graphs = DecodeGraphs(self, config.max_batch_size)

    def _load(self, config, model):
        if config.num_threads and self.device.type == "cpu":
            torch.set_num_threads(config.num_threads)
        built = build_model(model or config.model, self.device, self.dtype, config.quantization,
                            quantize_lm_head=config.quantize_lm_head, cpu_kernels=config.cpu_kernels,
                            activations=config.activations,
                            batch_hint=config.max_batch_size)
        self.model, self.args = built.module, built.args

    def profile(self):
        """The largest steps the engine can take, once, on a one-block cache (every slot the scratch block's):
        a whole-budget prefill with every row's logits and their log-softmax (prompt logprobs), and a decode
        step of max_batch_size rows at the full table width, gathering as a graph would (no workspace). On
        CUDA their peak memory is what the KV cache leaves room for."""
        config, saved = self.config, getattr(self, "kv", None)   # None while the first plan measures
        self.kv = KVCache(self.args, 1, self.block_size, self.dtype, self.device, 1 if saved is None or
                          saved.window_data is not None else 0, state_slots=1)
        scratch = self.kv.scratch_block   # (the window pool's, with one block too, is the same number)
        try:
            with torch.inference_mode():
                n = min(config.max_num_batched_tokens, self.max_model_len)
                table = [scratch] * -(-n // self.block_size)
                logits = self.forward([SeqInput([0] * n, 0, table, window_table=table)], True, all_logits=True)
                torch.log_softmax(logits.float(), dim=-1)
                del logits
                table = [scratch] * self.max_blocks_per_seq
                rows = [SeqInput([0], self.max_model_len - 1, table, window_table=table)]
                self.decode_forward(*self.decode_tensors(rows * config.max_batch_size, self.max_blocks_per_seq))
        finally:
            self.kv = saved

    # -- inputs: each step's integers go to the device in one copy (pinned on a GPU), then are viewed --------

    def _slots(self, table, positions):
        bs = self.block_size
        return [table[p // bs] * bs + p % bs for p in positions]

    @staticmethod
    def _tables(tables, width, scratch):
        """The block tables as one flat list, each padded to `width` with the scratch block."""
        flat = []
        for table in tables:
            flat += table
            flat += [scratch] * (width - len(table))
        return flat

    def _window(self, seqs):
        """The sliding-window layers' tables when they have a pool (a block out of the window: the pool's
        scratch block, rosefast.engine.window_blocks), else None."""
        if self.kv.window_data is None:
            return None
        if any(s.window_table is None for s in seqs):
            raise ValueError("this model's sliding-window layers have a KV pool of their own: give each "
                             "SeqInput its window_table")
        return [s.window_table for s in seqs]

    def prepare_prefill(self, seqs, all_logits=False):
        """(input ids [T], positions [T], metadata, the hidden rows to keep [R] or None for all)."""
        ids, positions, slots, wslots, query_lens, context_lens, rows = [], [], [], [], [], [], []
        windows = self._window(seqs)
        for i, s in enumerate(seqs):
            n = len(s.token_ids)
            pos = range(s.start, s.start + n)
            if all_logits is not True:
                rows += range(len(ids), len(ids) + n) if all_logits and i in all_logits else (len(ids) + n - 1,)
            ids += s.token_ids
            positions += rope_index(self.args, pos, s.long_rope) if self.long_rope else pos
            slots += self._slots(s.block_table, pos)
            if windows:
                wslots += self._slots(windows[i], pos)
            query_lens.append(n)
            context_lens.append(s.start + n)
        width = max(len(s.block_table) for s in seqs)
        T, R, B = len(ids), len(rows), len(seqs)
        values = ids + positions + slots + rows + self._tables([s.block_table for s in seqs], width,
                                                               self.kv.scratch_block)
        if windows:
            values += wslots + self._tables(windows, width, self.kv.window_blocks)
        flat = upload(values, torch.long, self.device)
        end = 3 * T + R + B * width
        meta = AttentionMetadata(True, flat[2 * T:3 * T], flat[3 * T + R:end].view(B, width), query_lens,
                                 context_lens)
        if windows:
            meta.window = AttentionMetadata(True, flat[end:end + T], flat[end + T:].view(B, width), query_lens,
                                            context_lens)
        if self.kv.states:
            meta.state_slots = [self._state_slot(s) for s in seqs]
            meta.state_fresh = [s.start == 0 for s in seqs]
            meta.state_saves = [s.state_saves for s in seqs]
        return flat[:T], flat[T:2 * T], meta, (flat[3 * T:3 * T + R] if R else None)

    def _state_slot(self, seq):
        return self.kv.scratch_state if seq.state_slot is None else seq.state_slot

    def decode_values(self, seqs, width, size=None):
        """A decode step's integers as one flat list: input ids, positions, slots and context lengths, each
        padded to `size` rows (padding: token 0 at position 0 writing the scratch slot, context 1), then
        the sequences' block tables at `width` (then, with a window pool, its slots padded and its tables; then, with
        state pools, the state slots, padded with the scratch one)."""
        pad = (size or len(seqs)) - len(seqs)
        positions = [s.start for s in seqs]
        bs = self.block_size
        slots = [s.block_table[p // bs] * bs + p % bs for s, p in zip(seqs, positions)]
        rows = [rope_index(self.args, (p,), s.long_rope)[0] for s, p in zip(seqs, positions)] if self.long_rope \
            else positions
        values = ([s.token_ids[-1] for s in seqs] + [0] * pad + rows + [0] * pad +   # rows: the rope tables'
                  slots + [self.kv.scratch_slot] * pad + [p + 1 for p in positions] + [1] * pad +
                  self._tables([s.block_table for s in seqs], width, self.kv.scratch_block))
        windows = self._window(seqs)
        if windows:
            values += [w[p // bs] * bs + p % bs for w, p in zip(windows, positions)]
            values += [self.kv.window_scratch_slot] * pad
            values += self._tables(windows, width, self.kv.window_blocks)
        if self.kv.states:
            values += [self._state_slot(s) for s in seqs] + [self.kv.scratch_state] * pad
        return values

    def decode_tensors(self, seqs, width):
        """(input ids, positions, slots, block tables [B, width], context lengths, the window pool's (slots, tables)
        or None, the state slots [B] or None) on the device."""
        b = len(seqs)
        flat = upload(self.decode_values(seqs, width), torch.long, self.device)
        end = 4 * b + b * width
        window = states = None
        if self.kv.window_data is not None:
            window = (flat[end:end + b], flat[end + b:end + b + b * width].view(b, width))
            end += b + b * width
        if self.kv.states:
            states = flat[end:end + b]
        return (flat[:b], flat[b:2 * b], flat[2 * b:3 * b], flat[4 * b:4 * b + b * width].view(b, width),
                flat[3 * b:4 * b], window, states)

    # -- forward -----------------------------------------------------------------------------------

    def decode_forward(self, input_ids, positions, slot_mapping, block_tables, context_lens, window=None,
                       states=None, workspace=None):
        """Hidden states [B, hidden] for one decode step; everything it does is capturable in a CUDA graph
        (the graphs pass no workspace: their gather buffers come from the graph's own pool). window: the window
        pool's (slots, tables), when it has one; states: the rows' state slots, when the model has state pools."""
        meta = AttentionMetadata(False, slot_mapping, block_tables, context_lens=context_lens, workspace=workspace,
                                 state_slots=states)
        if window is not None:
            meta.window = AttentionMetadata(False, *window, context_lens=context_lens, workspace=workspace)
        return self.model(input_ids, positions, meta, self.kv.layers)

    @torch.inference_mode()
    def pool(self, seqs, modes):
        """An embeddings prefill: per sequence, its new tokens' final hidden states (after the final norm) pooled
        as float32 [hidden] — mean: their sum; last: the last one's; cls: the first one's (its first chunk's)."""
        input_ids, positions, meta, _ = self.prepare_prefill(seqs, all_logits=True)
        normed = self.model.final_norm(self.model(input_ids, positions, meta, self.kv.layers)).float()
        out, start = [], 0
        for seq, mode in zip(seqs, modes):
            rows = normed[start:start + len(seq.token_ids)]
            out.append(rows.sum(0) if mode == "mean" else rows[-1] if mode == "last" else rows[0])
            start += len(seq.token_ids)
        return out

    @torch.inference_mode()
    def forward(self, seqs, is_prefill, all_logits=False):
        """Logits for each sequence's last new token, [B, V], in the model's dtype: greedy rows take their
        argmax there (the same index as in fp32); the sampler widens only the rows it samples. In a prefill,
        `all_logits` (True, or a set of sequence indices) gives those sequences a row for every new token
        instead: the rows come in sequence order, all of a chosen sequence's, else its last one."""
        if is_prefill:
            input_ids, positions, meta, rows = self.prepare_prefill(seqs, all_logits)
            hidden = self.model(input_ids, positions, meta, self.kv.layers)
            if rows is not None:
                hidden = hidden.index_select(0, rows)
        elif self.graphs is not None and self.graphs.fits(len(seqs)):
            hidden = self.graphs.run(seqs)
        else:
            width = max(len(s.block_table) for s in seqs)
            hidden = self.decode_forward(*self.decode_tensors(seqs, width), workspace=self.workspace)
        return self.model.logits(hidden)
