"""ModelRunner: turns a step's sequences into tensors, runs our model on the paged KV cache, samples.

A step is either a prefill (several sequences, each with a run of new tokens, packed) or a decode
(one new token per sequence). Every torch call happens on the thread that calls the runner.
"""
import logging
from dataclasses import dataclass

import torch

from rosefast.engine.device import resolve_device, resolve_dtype, use_device
from rosefast.engine.kv_cache import KVCache, plan_blocks
from rosefast.engine.sampler import Sampler
from rosefast.models._kernels_py import GatherWorkspace
from rosefast.models.layers import AttentionMetadata
from rosefast.models.loader import load_model
from rosefast.models.packed import pack_linears
from rosefast.models.quant import check_mode, quantize_linears, weight_bytes
from rosefast.models.sources import gguf_source, resolve_model

log = logging.getLogger("rosefast.engine")


@dataclass(slots=True)
class SeqInput:
    """One sequence's part of a step."""
    token_ids: list       # the new tokens to compute (a prefill chunk, or the one last token for decode)
    start: int            # tokens of this sequence already in the cache (the first new token's position)
    block_table: list     # block ids holding positions [0, start + len(token_ids))


class ModelRunner:
    def __init__(self, config, model=None):
        self.config = config
        self.device = resolve_device(config.device)
        use_device(self.device)   # this is the engine thread: every later step runs on it too
        self.dtype = resolve_dtype(config.dtype, self.device)
        if config.num_threads and self.device.type == "cpu":
            torch.set_num_threads(config.num_threads)
        check_mode(config.quantization, self.device)
        resolved = resolve_model(model or config.model)
        with torch.inference_mode():
            self.model, self.args = load_model(resolved, self.dtype, self.device)
            quantize_linears(self.model, config.quantization, gguf_source(resolved), head=config.quantize_lm_head)
            pack_linears(self.model, batch_hint=config.max_batch_size)
            size, count = weight_bytes(self.model)
            log.info("weights: %.1f MB, %.2f bytes per weight (%s, quantization %s)", size / 1e6, size / count,
                     self.dtype, config.quantization)
        self.max_model_len = min(config.max_model_len or self.args.max_position_embeddings,
                                 self.args.max_position_embeddings)
        self.block_size = config.block_size
        self.max_blocks_per_seq = -(-self.max_model_len // self.block_size)
        self.kv = KVCache(self.args, plan_blocks(config, self.args, self.dtype, self.device), self.block_size,
                          self.dtype, self.device)
        self.workspace = GatherWorkspace()   # the torch twin's decode gather buffers, passed in each step's metadata
        self.sampler = Sampler(self.args.vocab_size, self.device)
        self.graphs = None
        if self.device.type == "cuda" and config.cuda_graph:
            from rosefast.engine.cuda_graph import DecodeGraphs

            self.graphs = DecodeGraphs(self, config.max_batch_size)

    # -- inputs ------------------------------------------------------------------------------------

    def _tensor(self, values, dtype=torch.long):
        return torch.tensor(values, dtype=dtype).to(self.device, non_blocking=True)

    def _block_tables(self, seqs, width):
        scratch = self.kv.scratch_block
        return self._tensor([s.block_table + [scratch] * (width - len(s.block_table)) for s in seqs])

    def _slots(self, seq, positions):
        bs, table = self.block_size, seq.block_table
        return [table[p // bs] * bs + p % bs for p in positions]

    def prepare_prefill(self, seqs):
        ids, positions, slots, query_lens, context_lens = [], [], [], [], []
        for s in seqs:
            pos = range(s.start, s.start + len(s.token_ids))
            ids += s.token_ids
            positions += pos
            slots += self._slots(s, pos)
            query_lens.append(len(s.token_ids))
            context_lens.append(s.start + len(s.token_ids))
        width = max(len(s.block_table) for s in seqs)
        meta = AttentionMetadata(True, self._tensor(slots), self._block_tables(seqs, width), query_lens, context_lens)
        return self._tensor(ids), self._tensor(positions), meta

    def decode_tensors(self, seqs, width):
        positions = [s.start for s in seqs]
        slots = [self._slots(s, (s.start,))[0] for s in seqs]
        return (self._tensor([s.token_ids[-1] for s in seqs]), self._tensor(positions), self._tensor(slots),
                self._block_tables(seqs, width), self._tensor([p + 1 for p in positions]))

    # -- forward -----------------------------------------------------------------------------------

    def decode_forward(self, input_ids, positions, slot_mapping, block_tables, context_lens):
        """Hidden states [B, hidden] for one decode step; everything it does is capturable in a CUDA graph."""
        meta = AttentionMetadata(False, slot_mapping, block_tables, context_lens=context_lens,
                                 workspace=self.workspace)
        return self.model(input_ids, positions, meta, self.kv.layers)

    @torch.inference_mode()
    def forward(self, seqs, is_prefill, all_logits=False):
        """Logits for each sequence's last new token, [B, V], in the model's dtype: greedy rows take their
        argmax there (the same index as in fp32); the sampler widens only the rows it samples. In a prefill,
        `all_logits` (True, or a set of sequence indices) gives those sequences a row for every new token
        instead: the rows come in sequence order, all of a chosen sequence's, else its last one."""
        if is_prefill:
            input_ids, positions, meta = self.prepare_prefill(seqs)
            hidden = self.model(input_ids, positions, meta, self.kv.layers)
            if all_logits is not True:
                rows, start = [], 0
                for i, n in enumerate(meta.query_lens):
                    rows += range(start, start + n) if all_logits and i in all_logits else (start + n - 1,)
                    start += n
                hidden = hidden.index_select(0, self._tensor(rows))
        elif self.graphs is not None and self.graphs.fits(len(seqs)):
            hidden = self.graphs.run(seqs)
        else:
            width = max(len(s.block_table) for s in seqs)
            hidden = self.decode_forward(*self.decode_tensors(seqs, width))
        return self.model.logits(hidden)
