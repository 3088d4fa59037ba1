"""CUDA graphs for decode, one per (batch size, block-table width), sharing one memory pool.

A decode step of B sequences whose longest table holds n blocks replays the graph of the smallest captured
batch size >= B and the smallest width >= n, its inputs copied into static buffers from one pinned host
buffer; padded rows write into the KV cache's scratch block (and the window pool's) and are ignored. With a decode kernel that
follows each row's context length (the Triton kernel) one width serves every step; the torch twin gathers
the whole width, so its graphs come in a ladder of widths and a step attends over at most twice its
longest context, not over `max_model_len`. Every batch size is captured at start-up at the first width;
a wider one is captured the first time a step needs it. Imported only when the runner is on CUDA.
"""
import logging
import time

import torch

from rosefast.device import copy_in, host_values
from rosefast.models.layers import for_device

log = logging.getLogger("rosefast.engine")

SMALLEST_WIDTH = 8     # blocks (128 tokens at block size 16)


def ladder(max_batch):
    sizes = [1, 2, 4, 8] + list(range(16, max_batch + 1, 16))
    return sorted({s for s in sizes if s <= max_batch} | {max_batch})


def width_ladder(max_blocks, follows_context, smallest=SMALLEST_WIDTH):
    """Table widths to capture: the whole one when the kernel stops at each context length, else doubling
    from `smallest` blocks up to `max_blocks`."""
    if follows_context:
        return [max_blocks]
    widths, w = [], smallest
    while w < max_blocks:
        widths.append(w)
        w *= 2
    return widths + [max_blocks]


class CudaCapture:
    """How a graph is made and replayed (torch.cuda's); the tests put an eager stand-in here to check the
    bookkeeping around it on a CPU."""

    def pool(self):
        return torch.cuda.graph_pool_handle()

    def synchronize(self):
        torch.cuda.synchronize()

    def capture(self, fn, pool):
        """(replay, output): `fn`'s work recorded once; replay() runs it again into the same output."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = fn()
        return graph.replay, out


def pick(ladder_values, needed):
    """The smallest entry of a sorted ladder >= needed."""
    return next(v for v in ladder_values if v >= needed)


class DecodeGraphs:
    def __init__(self, runner, max_batch, capture=None):
        self.runner = runner
        self.capture = capture or CudaCapture()
        self.sizes = ladder(max_batch)
        ops = for_device(runner.device, runner.dtype)
        self.widths = width_ladder(runner.max_blocks_per_seq, ops.FOLLOWS_CONTEXT)
        n, dev = self.sizes[-1], runner.device
        self.windowed = runner.kv.window_data is not None   # the sliding-window layers' pool: its slots and tables
        # input ids, positions, slots, context lens (and the window pool's slots)
        self.vectors = torch.zeros(5 if self.windowed else 4, n, dtype=torch.long, device=dev)
        self.block_tables = torch.zeros(n, self.widths[-1], dtype=torch.long, device=dev)
        self.window_tables = torch.zeros_like(self.block_tables) if self.windowed else None
        self.graphs, self.outputs = {}, {}
        self.pool = self.capture.pool()
        t = time.perf_counter()
        for size in reversed(self.sizes):   # largest first: the smaller ones fit in its pool
            self._capture(size, self.widths[0])
        log.info("CUDA graphs: %d batch sizes up to %d captured at width %d blocks in %.1f s (%s decode; widths %s)",
                 len(self.sizes), n, self.widths[0], time.perf_counter() - t, ops.__name__.rsplit(".", 1)[-1],
                 self.widths)

    def _inputs(self, size, width):
        v = self.vectors[:, :size]
        window = (v[4], self.window_tables[:size, :width]) if self.windowed else None
        return v[0], v[1], v[2], self.block_tables[:size, :width], v[3], window

    def _capture(self, size, width):
        """Capture one graph, its static inputs set to padding first (the warm-up run really writes the KV
        cache: only into the scratch block then)."""
        runner = self.runner
        self.vectors[:2].zero_()
        self.vectors[2].fill_(runner.kv.scratch_slot)
        self.vectors[3].fill_(1)
        self.block_tables.fill_(runner.kv.scratch_block)
        if self.windowed:
            self.vectors[4].fill_(runner.kv.window_scratch_slot)
            self.window_tables.fill_(runner.kv.window_blocks)
        args = self._inputs(size, width)
        with torch.inference_mode():
            runner.decode_forward(*args)     # warm up (allocator, kernels, Triton's compile) outside the capture
            self.capture.synchronize()
            replay, self.outputs[size, width] = self.capture.capture(lambda: runner.decode_forward(*args), self.pool)
        self.capture.synchronize()
        self.graphs[size, width] = replay
        return replay

    def fits(self, batch):
        return batch <= self.sizes[-1]

    def key(self, batch, blocks):
        """The (batch size, width) graph for `batch` rows whose longest table holds `blocks` blocks."""
        return pick(self.sizes, batch), pick(self.widths, blocks)

    def run(self, seqs):
        b = len(seqs)
        need = max(len(s.block_table) for s in seqs)
        size, width = self.key(b, need)
        replay = self.graphs.get((size, width))
        if replay is None:
            t = time.perf_counter()
            replay = self._capture(size, width)
            log.info("CUDA graph captured for batch %d x width %d blocks in %.2f s", size, width,
                     time.perf_counter() - t)
        runner = self.runner
        host = host_values(runner.decode_values(seqs, need, size), torch.long, runner.device)
        # the columns past `need` keep older block ids: valid ones, and past every row's context
        copy_in(self.vectors[:4, :size], host[:4 * size].view(4, size))
        end = 4 * size + b * need
        copy_in(self.block_tables[:b, :need], host[4 * size:end].view(b, need))
        if self.windowed:   # then the window pool's slots (padded) and tables
            copy_in(self.vectors[4, :size], host[end:end + size])
            copy_in(self.window_tables[:b, :need], host[end + size:].view(b, need))
        replay()
        return self.outputs[size, width][:b]
