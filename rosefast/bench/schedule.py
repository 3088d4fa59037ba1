"""Arrival schedules. `relative` sleeps after each submit, so the real gap is add_request time + interval;
the others target absolute times t0 + offset, and how late each submit was (lag) is measured."""
import numpy as np

SCHEDULES = ("relative", "absolute", "poisson", "gamma")


def arrival_offsets(kind, n, interval_s, burstiness=1.0, seed=0):
    """Target offsets from t0 (seconds) for `n` submits; None for `relative` (it has no targets)."""
    if kind not in SCHEDULES:
        raise ValueError(f"submit schedule must be one of {', '.join(SCHEDULES)}, got {kind!r}")
    if interval_s < 0:
        raise ValueError(f"submit interval must be >= 0, got {interval_s}")
    if kind == "relative":
        return None
    if kind == "absolute" or interval_s == 0:
        return [i * interval_s for i in range(n)]
    rng = np.random.default_rng(seed)
    if kind == "poisson":
        gaps = rng.exponential(interval_s, size=max(n - 1, 0))
    else:
        if burstiness <= 0:
            raise ValueError(f"burstiness must be > 0, got {burstiness}")
        # shape k, scale interval/k: the mean gap stays `interval`, the spread grows as k shrinks (CV = 1/sqrt(k))
        gaps = rng.gamma(burstiness, interval_s / burstiness, size=max(n - 1, 0))
    return [0.0] + np.cumsum(gaps).tolist()


def lags(actual, targets):
    """How late each submit happened against its target (seconds); never negative by construction of the
    loop, and reported as measured."""
    return [a - t for a, t in zip(actual, targets)]
