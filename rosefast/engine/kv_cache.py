"""The paged KV cache.

Logically each layer has a K and a V block pool [num_blocks, block_size, n_kv_heads, head_dim].
Physically a pool is stored head-major, [n_kv_heads, num_blocks, block_size, head_dim]:
gathering a batch's blocks then yields [n_kv_heads, B, context, head_dim] with every (head, sequence)
context contiguous, which is what the attention matmuls want — no transpose copy per layer.

The extra last block is scratch: padded slots and padded block-table entries point there, so a padded
batch (CUDA graphs) never writes into a real sequence's blocks.

A model with sliding-window layers may keep theirs in a second, smaller pool (`window_blocks`; its tables:
rosefast.engine.window_blocks), with a scratch block of its own.

A model's linear-attention layers (rosefast.models.delta_net) keep no K/V: a recurrent state and a conv tail per
sequence instead, in pools of `state_slots` slots and a scratch one (a sequence's slot: rosefast.engine.state_slots).
"""
import logging
import os

import torch

from rosefast.engine.window_blocks import pool_blocks

log = logging.getLogger("rosefast.engine")


def layer_bytes_per_token(args, dtype):
    """One layer's K and V of one token."""
    return 2 * args.num_kv_heads * args.head_dim * torch.empty((), dtype=dtype).element_size()


def windowed_layers(args):
    return [i for i in range(args.num_layers) if args.layer_window(i) and not args.is_linear_layer(i)]


def kv_layers(args):
    """The layers that hold K/V (every one but the linear-attention ones)."""
    return args.num_layers - len(args.linear_layers)


def state_bytes(args, dtype):
    """One sequence's recurrent states (fp32) and conv tails, every linear-attention layer."""
    from rosefast.models.delta_net import state_shapes

    (recurrent, tail) = state_shapes(args)
    one = 4 * recurrent[0] * recurrent[1] * recurrent[2] + torch.empty((), dtype=dtype).element_size() * tail[0] * tail[1]
    return one * len(args.linear_layers)


def plan_state_slots(config, args, dtype, device):
    """(slots, checkpoint slots, their bytes) of the linear-attention layers' state pools: a slot for each sequence
    that may run (max_batch_size, max_active_requests), on the CPU at most what half the KV budget holds (then the
    states, not the blocks, bound how many run); `state_checkpoints` saved states where they are taken
    (state_checkpoint_tokens). (0, 0, 0) for a model without such layers."""
    if not args.linear_layers:
        return 0, 0, 0
    running = min(config.max_batch_size, config.max_active_requests or config.max_batch_size)
    one = state_bytes(args, dtype)
    slots = running
    if device.type != "cuda" and not config.kv_cache_tokens:
        slots = max(1, min(running, int(available_memory() * config.kv_memory_fraction) // 2 // one))
    saved = config.state_checkpoints if config.state_checkpoint_tokens and config.enable_prefix_cache else 0
    log.info("recurrent states of the %d linear-attention layers: %d slots x %.1f MiB = %.1f MiB%s; %d saved states "
             "(every %d tokens of a prefill) %.1f MiB", len(args.linear_layers), slots, one / 2**20, slots * one / 2**20,
             f" (fewer than the {running} sequences that may run: the states bound them)" if slots < running else "",
             saved, config.state_checkpoint_tokens, saved * one / 2**20)
    return slots, saved, (slots + saved) * one


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


def all_windowed(whole, need, one, most):
    """(blocks, window blocks, counted) for a model whose every layer is windowed, `whole` blocks of memory: the
    other blocks hold no memory and only count what is admitted, `most` of them. The window pool is its `need`
    where the memory holds it (and never more than `most`); else all of the memory, counted by the scheduler,
    where that holds at least `one` sequence's window and a prefill step's; below that both pools are one size,
    the memory's (the window layers then never hold more blocks than the count admits)."""
    if need <= whole:
        return most, min(need, most), False
    if whole >= one:
        return most, whole, True
    return whole, whole, False


def split_budget(budget, layer_block, num_layers, windowed, window_need, most, window_one=None):
    """(blocks, window blocks, counted) for `budget` bytes, a layer's block taking `layer_block` of them,
    `windowed` of the `num_layers` layers on a sliding window whose pool needs at most `window_need` blocks
    (`window_one`: for one running sequence). The window pool is that need when the budget holds it and at least
    as many of the other blocks (else both pools are one size, the budget's whole-model count: the window layers
    then never hold more blocks than the others). Every layer windowed: all_windowed."""
    whole = max(1, budget // (layer_block * num_layers))
    if not windowed:
        return whole, 0, False
    if windowed == num_layers:
        return all_windowed(whole, window_need, window_need if window_one is None else window_one, most)
    rest = budget - window_need * layer_block * windowed
    blocks = rest // (layer_block * (num_layers - windowed))
    return (blocks, window_need, False) if blocks >= window_need else (whole, whole, False)


def plan_blocks(config, args, dtype, device, profile=None, max_blocks_per_seq=1, reserved=0):
    """(blocks, window blocks, counted): from `kv_cache_tokens` (the blocks; the window pool its need, at most as
    many — every layer windowed: all_windowed, those tokens its memory), else on CUDA what
    gpu_memory_utilization leaves after `profile()`'s peak, on the CPU `kv_memory_fraction` of the available RAM
    (split_budget). The window pool is 0 for a model with no sliding-window layer; `counted`: the scheduler counts
    it (WindowBlocks). `reserved`: bytes of the budget taken already (the linear-attention layers' states); only
    the layers that attend hold K/V."""
    bs, layer = config.block_size, layer_bytes_per_token(args, dtype)
    windowed = windowed_layers(args)
    # (a window wider than the context served holds that context at most)
    span = min(args.sliding_window, max_blocks_per_seq * bs)
    need, one = (pool_blocks(config, span), pool_blocks(config, span, running=1)) if windowed else (0, 0)
    most = min(config.max_batch_size, config.max_active_requests or config.max_batch_size) * max_blocks_per_seq
    if config.kv_cache_tokens:
        blocks, counted = max(1, -(-config.kv_cache_tokens // bs)), False
        if windowed and len(windowed) == args.num_layers:
            blocks, window, counted = all_windowed(blocks, need, one, most)
        else:
            window = min(blocks, need)
    else:
        if device.type == "cuda":
            budget = measure_cuda_budget(device, config.gpu_memory_utilization, profile or (lambda: None))
        else:
            budget = int(available_memory() * config.kv_memory_fraction)
        budget = max(budget - reserved, layer * bs)
        blocks, window, counted = split_budget(budget, layer * bs, kv_layers(args), len(windowed), need, most, one)
    full = kv_layers(args) - len(windowed)
    log.info("KV cache: %d blocks x %d tokens = %d tokens (%.1f MiB, %s)", blocks, bs, blocks * bs,
             blocks * bs * layer * full / 2**20, dtype)
    if windowed:
        log.info("KV cache of the %d sliding-window layers of %d (each sequence's last %d positions): %d blocks = %d "
                 "tokens (%.1f MiB)%s", len(windowed), args.num_layers, args.sliding_window, window, window * bs,
                 window * bs * layer * len(windowed) / 2**20,
                 f"; fewer than every running sequence's window ({need}): the scheduler counts them" if counted
                 else "")
    return blocks, window, counted


class KVCache:
    def __init__(self, args, num_blocks, block_size, dtype, device, window_blocks=0, window_counted=False,
                 state_slots=0, state_checkpoints=0):
        """window_blocks: the sliding-window layers' own pool (0: every layer in the one pool); window_counted:
        smaller than every running sequence's window, so the scheduler counts it (plan_blocks); state_slots: the
        linear-attention layers' state pools (plan_state_slots): that many sequences' slots, a scratch one, then
        `state_checkpoints` slots for saved states (rosefast.engine.state_slots.StateCheckpoints)."""
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.scratch_block = num_blocks
        self.num_kv_heads, self.head_dim = args.num_kv_heads, args.head_dim
        windowed = windowed_layers(args) if window_blocks else []
        linear = list(args.linear_layers)
        full = [i for i in range(args.num_layers) if i not in windowed and i not in linear]
        # [layers, K|V, Hkv, blocks + scratch, block_size, D]
        self.data = torch.zeros(len(full), 2, args.num_kv_heads, num_blocks + 1, block_size, args.head_dim,
                                dtype=dtype, device=device)
        self.window_blocks = window_blocks
        self.window_counted = window_counted
        self.window_data = torch.zeros(len(windowed), 2, args.num_kv_heads, window_blocks + 1, block_size,
                                       args.head_dim, dtype=dtype, device=device) if windowed else None
        pools = {i: (self.data[j, 0], self.data[j, 1]) for j, i in enumerate(full)}
        pools.update({i: (self.window_data[j, 0], self.window_data[j, 1]) for j, i in enumerate(windowed)})
        self.state_slots, self.state_checkpoints = state_slots, state_checkpoints
        # each linear-attention layer's recurrent states [slots + 1 + checkpoints, Hv, dk, dv] (fp32) and conv tails
        self.states = []
        if linear:
            from rosefast.models.delta_net import state_shapes

            recurrent, tail = state_shapes(args)
            for i in linear:
                n = state_slots + 1 + state_checkpoints
                pools[i] = (torch.zeros(n, *recurrent, dtype=torch.float32, device=device),
                            torch.zeros(n, *tail, dtype=dtype, device=device))
                self.states += pools[i]
        self.layers = [pools[i] for i in range(args.num_layers)]

    def copy_blocks(self, copies):
        """Copy one block's K and V, every layer and head (a forked sequence's partial last block): `copies`,
        (source, destination) in this pool and in the window pool (None: none there), and one slot's recurrent and
        conv states, every linear-attention layer (None or absent: none)."""
        for data, copy in zip((self.data, self.window_data), copies):
            if copy is not None:
                src, dst = copy
                data[:, :, :, dst].copy_(data[:, :, :, src])
        if len(copies) > 2 and copies[2] is not None:
            self.copy_state(*copies[2])

    def copy_state(self, src, dst):
        """One slot's recurrent and conv states into another, every linear-attention layer."""
        for pool in self.states:
            pool[dst].copy_(pool[src])

    @property
    def scratch_state(self):
        """The state pools' scratch slot (padding rows')."""
        return self.state_slots

    @property
    def scratch_slot(self):
        return self.scratch_block * self.block_size

    @property
    def window_scratch_slot(self):
        return self.window_blocks * self.block_size
