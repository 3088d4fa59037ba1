"""Stop strings: the cost of one token's text (4 characters) on the engine thread, by stop set — none, one
short string, and the most a request may send (16 strings of 256 characters) — with the automaton the
detokenizer runs (rosefast.serving.stops) beside the scan it replaced (every stop string searched in the held text
and every prefix of each tested against its end, per token)."""
import pytest

from rosefast.serving.detok import IncrementalDetokenizer

TEXT = ("The quick brown fox jumps over the lazy dog while the answer waits for its closing tag. " * 30)
TOKENS = [TEXT[i:i + 4] for i in range(0, len(TEXT), 4)]
STOPS = {
    "one": ("</answer>",),
    "16x256": tuple(("The quick brown fox jumps over the lazy dog " * 6)[:255] + str(i % 10) + chr(65 + i)
                    for i in range(16)),
}


class ScanStops:
    """The scan the automaton replaced: its cost grows with the number and length of the stop strings."""

    def __init__(self, stops):
        self.stops, self.held, self.stopped = stops, "", False

    def step(self, text):
        buf = self.held + text
        cut = -1
        for s in self.stops:
            i = buf.find(s)
            if i >= 0 and (cut < 0 or i < cut):
                cut = i
        if cut >= 0:
            self.stopped = True
            return buf[:cut]
        keep = 0
        for s in self.stops:
            for j in range(min(len(s) - 1, len(buf)), keep, -1):
                if buf.endswith(s[:j]):
                    keep = j
                    break
        self.held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep]


def run(make):
    matcher = make()
    out = [matcher(t) for t in TOKENS]
    return "".join(out)


@pytest.mark.parametrize("stops", list(STOPS))
@pytest.mark.parametrize("impl", ["automaton", "scan"])
def test_stop_strings_per_token(benchmark, impl, stops):
    chosen = STOPS[stops]

    def automaton():
        return IncrementalDetokenizer(None, (), chosen)._apply_stop

    def scan():
        return ScanStops(chosen).step

    benchmark.group = f"stop strings {stops}, {len(TOKENS)} tokens"
    benchmark.extra_info.update(tokens=len(TOKENS), impl=impl, stops=stops)
    text = benchmark.pedantic(run, args=(automaton if impl == "automaton" else scan,), rounds=5, warmup_rounds=1)
    assert len(text) > len(TEXT) - 300   # nothing stopped it; only the trailing prefix held back
