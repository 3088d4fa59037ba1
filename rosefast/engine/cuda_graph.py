"""CUDA graphs for decode: a ladder of batch sizes, largest captured first, sharing one memory pool.

A decode step of B sequences replays the graph of the smallest captured size >= B, with the inputs
copied into static buffers; padded rows write into the KV cache's scratch block and are ignored.
Imported only when the runner is on CUDA.
"""
import torch


def ladder(max_batch):
    sizes = [1, 2, 4, 8] + list(range(16, max_batch + 1, 16))
    return sorted({s for s in sizes if s <= max_batch} | {max_batch})


class DecodeGraphs:
    def __init__(self, runner, max_batch):
        self.runner = runner
        self.sizes = ladder(max_batch)
        width = runner.max_blocks_per_seq
        dev = runner.device
        n = self.sizes[-1]
        self.input_ids = torch.zeros(n, dtype=torch.long, device=dev)
        self.positions = torch.zeros(n, dtype=torch.long, device=dev)
        self.slot_mapping = torch.full((n,), runner.kv.scratch_slot, dtype=torch.long, device=dev)
        self.block_tables = torch.full((n, width), runner.kv.scratch_block, dtype=torch.long, device=dev)
        self.context_lens = torch.ones(n, dtype=torch.long, device=dev)
        self.graphs, self.outputs = {}, {}
        pool = torch.cuda.graph_pool_handle()
        with torch.inference_mode():
            for size in reversed(self.sizes):   # largest first: the smaller ones fit in its pool
                args = self._inputs(size)
                runner.decode_forward(*args)     # warm up (allocator, kernels) outside the capture
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.outputs[size] = runner.decode_forward(*args)
                self.graphs[size] = graph
        torch.cuda.synchronize()

    def _inputs(self, size):
        return (self.input_ids[:size], self.positions[:size], self.slot_mapping[:size], self.block_tables[:size],
                self.context_lens[:size])

    def fits(self, batch):
        return batch <= self.sizes[-1]

    def run(self, seqs):
        b = len(seqs)
        size = next(s for s in self.sizes if s >= b)
        ids, pos, slots, tables, ctx = self.runner.decode_tensors(seqs, self.block_tables.shape[1])
        self.input_ids[:b].copy_(ids)
        self.positions[:b].copy_(pos)
        self.slot_mapping[:b].copy_(slots)
        self.slot_mapping[b:size].fill_(self.runner.kv.scratch_slot)
        self.block_tables[:b].copy_(tables)
        self.block_tables[b:size].fill_(self.runner.kv.scratch_block)
        self.context_lens[:b].copy_(ctx)
        self.context_lens[b:size].fill_(1)
        self.graphs[size].replay()
        return self.outputs[size][:b]
