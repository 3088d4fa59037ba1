"""StepBudget: how many prompt tokens a prefill step may take while streams are decoding, from what the engine's
own steps cost.

The scheduler runs a decode step after every prefill step, so a decoding stream's gap is one decode step (d)
plus the prefill step between (a + n x b: a fixed part and a cost per token, fitted from the prefill steps
seen). The ITL target T (`itl_target_ms`; 0: 3 x d, the gap at most three times the idle one) gives the chunk
n = (T - d - a) / b. A long prompt then runs its prefill for n x b of every d + a + n x b: at least half its
alone speed is kept by taking n >= (d + a) / b where that is more (the prompt's floor wins over the target on
a model whose fixed step cost is as large as its decode step). Never below one block, never above
`max_num_batched_tokens`; with nothing measured yet, `max_num_batched_tokens` (as before the budget)."""

AUTO_FACTOR = 3.0    # the auto target: a decoding stream's gap at most this many idle gaps
SPEED_FLOOR = 0.5    # a chunked prompt's prefill at least this share of its alone speed


class StepBudget:
    def __init__(self, max_tokens, target_ms=0.0, min_tokens=16, decay=0.95):
        self.max_tokens, self.min_tokens = max_tokens, min(min_tokens, max_tokens)
        self.target_s = target_ms / 1000.0
        self.decay = decay
        self.decode_s = None                        # a decode step's recent seconds (each new step a tenth)
        self.w = self.n = self.nn = self.t = self.nt = 0.0   # the prefill steps' decayed sums, for the fit
        self.tokens = max_tokens                    # what a prefill step beside decodes may take now

    def observe(self, is_prefill, tokens, seconds):
        """One step's cost; the budget follows."""
        if not is_prefill:
            self.decode_s = seconds if self.decode_s is None else 0.9 * self.decode_s + 0.1 * seconds
        else:
            d = self.decay
            self.w, self.n, self.nn = d * self.w + 1, d * self.n + tokens, d * self.nn + tokens * tokens
            self.t, self.nt = d * self.t + seconds, d * self.nt + tokens * seconds
        self.tokens = self._tokens()

    def fit(self):
        """(a, b): a prefill step of n tokens takes a + n x b seconds; None until its token counts varied."""
        w = self.w
        if not w:
            return None
        var = self.nn / w - (self.n / w) ** 2
        if var < 1.0:   # one chunk size so far: no slope to read; the mean cost per token, nothing fixed
            return 0.0, self.t / max(self.n, 1.0)
        b = (self.nt / w - self.n / w * self.t / w) / var
        a = self.t / w - b * self.n / w
        if b <= 0:   # noise: the mean cost per token
            return 0.0, self.t / max(self.n, 1.0)
        return max(a, 0.0), b

    def _tokens(self):
        fit, d = self.fit(), self.decode_s
        if fit is None or d is None:
            return self.max_tokens
        a, b = fit
        target = self.target_s or AUTO_FACTOR * d
        by_target = (target - d - a) / b
        floor = SPEED_FLOOR / (1 - SPEED_FLOOR) * (d + a) / b   # n x b >= (d + a) at a floor of one half
        return int(min(max(by_target, floor, self.min_tokens), self.max_tokens) + 1e-6)   # (180, not 179.99..)

    def gap_s(self, tokens):
        """The gap a decoding stream sees beside a prefill step of `tokens` (None until measured)."""
        fit = self.fit()
        if fit is None or self.decode_s is None:
            return None
        return self.decode_s + fit[0] + tokens * fit[1]
