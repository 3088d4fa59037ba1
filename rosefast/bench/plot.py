"""The benchmark's PNG: TTFT broken down per percentile (stacked), and latency CDFs."""


def plot(figures, samples, path, http):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    qs = ("p50", "p95", "p99")
    if http:
        left.bar(qs, [figures["ttft"][q] for q in qs], label="TTFT (client side)")
    else:
        bottom = [0.0] * 3
        for key, label in (("tokenize", "tokenize"), ("queue_wait", "queue wait"),
                           ("prefill_to_first_token", "prefill -> first token")):
            vals = [figures[key][q] if figures[key]["n"] else 0.0 for q in qs]
            left.bar(qs, vals, bottom=bottom, label=label)
            bottom = [b + v for b, v in zip(bottom, vals)]
        left.plot(qs, [figures["ttft"][q] for q in qs], "k_", markersize=30, label="TTFT (measured)")
    left.set_ylabel("ms")
    left.set_title("TTFT breakdown (each stage at its own percentile)")
    left.legend()
    ok = [s for s in samples if not s.rejected and s.error is None and s.first_recv is not None]
    for name, values in (("TTFT", [s.first_recv - s.t_call for s in ok]),
                         ("latency", [s.last_recv - s.t_call for s in ok])):
        xs = sorted(v * 1e3 for v in values)
        if xs:
            right.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=name)
    right.set_xlabel("ms")
    right.set_ylabel("fraction of requests")
    right.set_title("CDF")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
