"""The lock-free histogram behind the latency and backlog-depth metrics."""

from rosefast.serving.histogram import DEPTH_BOUNDS, Histogram


def test_histogram_counts_each_value_in_the_first_bucket_at_or_above_it():
    h = Histogram(DEPTH_BOUNDS)
    for depth in (1, 1, 2, 3, 4, 5, 9001):
        h.observe(depth)
    cumulative = dict(h.buckets())
    assert (cumulative[1], cumulative[2], cumulative[4], cumulative[8]) == (2, 3, 5, 6)
    assert cumulative[4096] == 6 and cumulative[float("inf")] == 7
    assert h.count == 7 and h.sum == 9017
