"""Turn a pytest-benchmark JSON (--benchmark-json) into the README's tables: ns per item and ratios.

    python -m benches.report .benchmarks/latest.json
"""
import json
import sys
from collections import defaultdict


def per_item(bench):
    info = bench["extra_info"]
    items = info.get("merges") or info.get("tokens") or info.get("ops")
    return bench["stats"]["median"] * 1e9 / items


def tables(data):
    rows = defaultdict(dict)
    for b in data["benchmarks"]:
        name, info = b["name"].split("[")[0], b["extra_info"]
        if name == "test_sampler":   # its own table, below
            continue
        key = {"test_merge": "depth", "test_merge_floor": "depth", "test_fanout": "batch",
               "test_collapse": "lag"}.get(name)
        rows[(name.replace("_floor", ""), info.get(key))][info.get("flavour")] = per_item(b)
    out = []
    merge = sorted(k for k in rows if k[0] == "test_merge")
    if merge:
        out += ["| depth | compiled ns/merge | pure ns/merge | quadratic ns/merge | floor ns/item "
                "| compiled/floor | pure/compiled | quadratic/compiled |", "|---|---|---|---|---|---|---|---|"]
        for k in merge:
            r = rows[k]
            out.append(f"| {k[1]} | {r.get('c', 0):.1f} | {r.get('py', 0):.1f} | {r.get('quadratic', 0):.1f} | "
                       f"{r.get('floor', 0):.1f} | {r.get('c', 0) / r.get('floor', 1):.2f}x | "
                       f"{r.get('py', 0) / r.get('c', 1):.2f}x | {r.get('quadratic', 0) / r.get('c', 1):.1f}x |")
        out.append("")
    fan = sorted(k for k in rows if k[0] == "test_fanout")
    if fan:
        out += ["| fan-out batch | compiled ns/token | pure ns/token | pure/compiled |", "|---|---|---|---|"]
        for k in fan:
            r = rows[k]
            out.append(f"| {k[1]} | {r.get('c', 0):.1f} | {r.get('py', 0):.1f} | {r.get('py', 0) / r.get('c', 1):.2f}x |")
        out.append("")
    adm = rows.get(("test_admission", None))
    if adm:
        out += ["| admission | compiled ns/op | pure ns/op | pure/compiled |", "|---|---|---|---|",
                f"| acquire+release | {adm.get('c', 0):.1f} | {adm.get('py', 0):.1f} | "
                f"{adm.get('py', 0) / adm.get('c', 1):.2f}x |", ""]
    col = sorted(k for k in rows if k[0] == "test_collapse")
    if col:
        out += ["| consumer lag (steps) | compiled Mtok/s | quadratic Mtok/s | compiled/quadratic |",
                "|---|---|---|---|"]
        for k in col:
            r = rows[k]
            out.append(f"| {k[1]} | {1e3 / r.get('c', 1):.2f} | {1e3 / r.get('quadratic', 1):.2f} | "
                       f"{r.get('quadratic', 0) / r.get('c', 1):.1f}x |")
    samp = defaultdict(dict)
    for b in data["benchmarks"]:
        if b["name"].startswith("test_sampler["):
            info = b["extra_info"]
            samp[(info["mode"], info["batch"])][info["impl"]] = b["stats"]["median"] * 1e6
    if samp:
        out += ["", "| mode | batch | batched us/step | per-row loop us/step | loop/batched |", "|---|---|---|---|---|"]
        for (mode, batch), r in sorted(samp.items(), key=lambda kv: (list(MODES_ORDER).index(kv[0][0]), kv[0][1])):
            ours, loop = r["batched"], r.get("row_loop")
            loop_cells = "- | -" if loop is None else f"{loop:.0f} | {loop / ours:.1f}x"
            out.append(f"| {mode} | {batch} | {ours:.0f} | {loop_cells} |")
    return "\n".join(out)


MODES_ORDER = ("greedy", "temperature", "top_p", "penalties", "logprobs")


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(tables(json.load(f)))
