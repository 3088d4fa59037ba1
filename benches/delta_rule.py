"""A Gated DeltaNet layer's own work at a real model's shape, beside its bytes floor (rosefast.models.delta_net).

    python -m benches.delta_rule [--rows 1,8,32] [--prompt 4096] [--dtype bfloat16] [--threads 0]

Qwen3.6-35B-A3B's linear-attention layer (hidden 2048; 16 k heads and 32 v heads of 128; conv 4), its projections
left out (they are linears like any other: the block kernels' business): for a decode step of B rows, the conv
step, the delta rule's update and readout and the gated norm — on the compiled kernels (one call:
csrc/delta_decode.h) and on torch's ops (the twin) — timed against the bytes the step must move (each row's fp32 state read and written: 2 MiB
each way per layer, at the machine's read bandwidth, benches.quantized.bandwidth_gb_s); for a prompt, the same work
over its tokens: C's per-head recurrence against the twin's chunked form.
"""
import argparse
import time
from types import SimpleNamespace

import torch

from rosefast.kernels import layer_ops
from rosefast.models.delta_net import PIECE, DeltaNet

QWEN36_35B = SimpleNamespace(hidden_size=2048, linear_k_heads=16, linear_v_heads=32, linear_k_dim=128,
                             linear_v_dim=128, linear_conv=4, norm_eps=1e-6, linear_v_tiled=False)


def _net(dtype):
    torch.manual_seed(0)
    net = DeltaNet(QWEN36_35B)
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(std=0.05)
        net.A_log.uniform_(-1, 1)
    return net.to(dtype)


def _best(fn, rounds=5):
    fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def decode_step(net, rows, ops):
    """Seconds of one decode step's state work for `rows` rows (each its own slot), on the kernels `ops`: the
    layer's delta_decode after its projections (the compiled one: one call, csrc/delta_decode.h)."""
    dtype = net.norm.dtype
    recurrent = torch.randn(rows + 1, net.v_heads, net.k_dim, net.v_dim) * 0.1
    tails = torch.randn(rows + 1, QWEN36_35B.linear_conv - 1, net.conv_size).to(dtype)
    slots = torch.arange(rows)
    proj = torch.randn(rows, net.conv_size + net.value_size).to(dtype)
    ba = torch.randn(rows, 2 * net.v_heads).to(dtype)

    def step():
        ops.delta_decode(proj, ba, net.conv, tails, recurrent, slots, net.A_log, net.dt_bias, net.norm, net.eps,
                         net.k_heads, net.tiled)

    with torch.no_grad():
        return _best(step)


def prefill(net, n, ops):
    """Seconds of one n-token prompt's state work (the conv, the rule, the gated norm) on the kernels `ops`."""
    dtype = net.norm.dtype
    state = torch.zeros(net.v_heads, net.k_dim, net.v_dim)
    tail = torch.zeros(QWEN36_35B.linear_conv - 1, net.conv_size, dtype=dtype)
    mixed = torch.randn(n, net.conv_size).to(dtype)
    z = torch.randn(n, net.value_size).to(dtype)
    g, beta = -torch.rand(n, net.v_heads) * 0.1, torch.rand(n, net.v_heads).to(dtype)

    def run():   # as the layer's forward runs a prompt: PIECE tokens at a time
        for at in range(0, n, PIECE):
            rows = slice(at, min(at + PIECE, n))
            x = net._conv(mixed[rows], tail)
            layer_ops.reference.gated_rms_norm(net._sequence(x, g[rows], beta[rows], state, ops).to(dtype), z[rows],
                                               net.norm, net.eps)

    with torch.no_grad():
        return _best(run, rounds=2)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1,8,32")
    parser.add_argument("--prompt", type=int, default=4096)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from benches.quantized import bandwidth_gb_s

    bandwidth = bandwidth_gb_s() * 1e9
    net = _net(getattr(torch, args.dtype))
    state = 4 * net.v_heads * net.k_dim * net.v_dim
    print(f"Qwen3.6-35B-A3B linear-attention layer, {args.dtype}, {torch.get_num_threads()} threads; read bandwidth "
          f"{bandwidth / 1e9:.1f} GB/s; a row's state {state / 2**20:.0f} MiB (read and written each step)")
    print("| rows | step ms: compiled | torch ops | bytes floor ms | compiled x floor |")
    print("|---|---|---|---|---|")
    table = []
    for rows in (int(r) for r in args.rows.split(",")):
        took = decode_step(net, rows, layer_ops.for_tensor(net.norm))
        torch_ops = decode_step(net, rows, layer_ops.reference)
        floor = 2 * rows * state / bandwidth
        table.append((rows, took, floor))
        print(f"| {rows} | {took * 1e3:.2f} | {torch_ops * 1e3:.2f} | {floor * 1e3:.2f} | {took / floor:.2f}x |")
    n = args.prompt
    compiled = prefill(net, n, layer_ops.for_tensor(net.norm))
    chunked = prefill(net, n, layer_ops.reference)
    flops = 4 * n * net.v_heads * net.k_dim * net.v_dim   # the rule's multiply-adds, twice
    print(f"prefill of {n} tokens: compiled (each head's recurrence, state in L2) {compiled * 1e3:.0f} ms "
          f"({compiled / n * 1e6:.0f} us/token, {flops / compiled / 1e9:.0f} GFLOP/s); torch's chunked form "
          f"{chunked * 1e3:.0f} ms: {chunked / compiled:.1f}x")
    return table, compiled, chunked


if __name__ == "__main__":
    main()
