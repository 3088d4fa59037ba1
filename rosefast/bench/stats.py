"""Percentiles and the summary lines of the report."""
import math

PERCENTILES = (50, 95, 99)


def percentile(values, q):
    """Linear-interpolated percentile (numpy's default method), without numpy."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summary(values, scale=1e3):
    """{'p50':..,'p95':..,'p99':..,'mean':..,'n':..} in ms (scale 1e3) of a list of seconds."""
    out = {f"p{q}": percentile(values, q) * scale for q in PERCENTILES}
    out["mean"] = (sum(values) / len(values) * scale) if values else math.nan
    out["n"] = len(values)
    return out


def fmt(s, unit="ms"):
    if not s["n"]:
        return "n/a"
    return f"p50 {s['p50']:.2f} {unit}  p95 {s['p95']:.2f} {unit}  p99 {s['p99']:.2f} {unit}  (n={s['n']})"
