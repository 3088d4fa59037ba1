"""The paged KV cache.

Logically each layer has a K and a V block pool [num_blocks, block_size, n_kv_heads, head_dim].
Physically a pool is stored head-major, [n_kv_heads, num_blocks, block_size, head_dim]:
gathering a batch's blocks then yields [n_kv_heads, B, context, head_dim] with every (head, sequence)
context contiguous, which is what the attention matmuls want — no transpose copy per layer.

The extra last block is scratch: padded slots and padded block-table entries point there, so a padded
batch (CUDA graphs) never writes into a real sequence's blocks.
"""
import logging
import os

import torch

log = logging.getLogger("rosefast.engine")


def bytes_per_token(args, dtype):
    return 2 * args.num_layers * args.num_kv_heads * args.head_dim * torch.empty((), dtype=dtype).element_size()


def available_memory():
    """Available RAM in bytes (the CPU's KV budget is a share of it)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def kv_budget_bytes(total, peak, outside, utilization):
    """GPU bytes left for the KV cache: `utilization` of the `total` memory, less the `peak` torch allocated
    while the model ran its largest steps (weights included) and what CUDA holds `outside` torch's allocator
    (the context, library workspaces) — vLLM's gpu_memory_utilization."""
    budget = int(total * utilization) - peak - outside
    if budget <= 0:
        raise ValueError(f"gpu_memory_utilization {utilization} of {total / 2**30:.1f} GiB leaves no room for the KV "
                         f"cache after {peak / 2**30:.2f} GiB of weights and activations and {outside / 2**30:.2f} "
                         f"GiB outside torch: raise it, or set kv_cache_tokens")
    return budget


def measure_cuda_budget(device, utilization, profile):
    """Run `profile()` (the largest prefill and decode steps, on a one-block cache) and size the KV cache from
    the memory it peaked at."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    profile()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    outside = max(0, (total - free) - torch.cuda.memory_reserved(device))
    budget = kv_budget_bytes(total, peak, outside, utilization)
    log.info("GPU memory: %.1f GiB total, %.0f%% for this engine; weights + activations peaked at %.2f GiB, %.2f GiB "
             "outside torch: %.2f GiB for the KV cache", total / 2**30, utilization * 100, peak / 2**30,
             outside / 2**30, budget / 2**30)
    return budget


def plan_blocks(config, args, dtype, device, profile=None):
    """Number of blocks from `kv_cache_tokens`; else on CUDA what gpu_memory_utilization leaves after
    `profile()`'s peak, on the CPU `kv_memory_fraction` of the available RAM."""
    per_token = bytes_per_token(args, dtype)
    if config.kv_cache_tokens:
        tokens = config.kv_cache_tokens
    elif device.type == "cuda":
        tokens = measure_cuda_budget(device, config.gpu_memory_utilization, profile or (lambda: None)) // per_token
    else:
        tokens = int(available_memory() * config.kv_memory_fraction) // per_token
    blocks = max(1, -(-tokens // config.block_size))
    log.info("KV cache: %d blocks x %d tokens = %d tokens (%.1f MiB, %s)", blocks, config.block_size,
             blocks * config.block_size, blocks * config.block_size * per_token / 2**20, dtype)
    return blocks


class KVCache:
    def __init__(self, args, num_blocks, block_size, dtype, device):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.scratch_block = num_blocks
        self.num_kv_heads, self.head_dim = args.num_kv_heads, args.head_dim
        # [layers, K|V, Hkv, blocks + scratch, block_size, D]
        self.data = torch.zeros(args.num_layers, 2, args.num_kv_heads, num_blocks + 1, block_size, args.head_dim,
                                dtype=dtype, device=device)
        self.layers = [(self.data[i, 0], self.data[i, 1]) for i in range(args.num_layers)]

    def copy_block(self, src, dst):
        """Copy one block's K and V, every layer and head (a forked sequence's partial last block)."""
        self.data[:, :, :, dst].copy_(self.data[:, :, :, src])

    @property
    def scratch_slot(self):
        return self.scratch_block * self.block_size
