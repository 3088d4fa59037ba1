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


def available_memory(device):
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return free
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def plan_blocks(config, args, dtype, device):
    """Number of blocks from `kv_cache_tokens`, or from `kv_memory_fraction` of the free memory."""
    per_token = bytes_per_token(args, dtype)
    if config.kv_cache_tokens:
        tokens = config.kv_cache_tokens
    else:
        tokens = int(available_memory(device) * config.kv_memory_fraction) // per_token
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
