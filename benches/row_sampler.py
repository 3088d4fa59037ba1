"""The sampler this project had before the batched one: logits copied to the host and each sampled row
drawn in a Python loop (topk, softmax, sort, multinomial per row). Kept as the reference the sampler
benchmark compares against; nothing in rosefast uses it."""
import torch


class RowSampler:
    def __init__(self, seed=0):
        self.default_generator = torch.Generator().manual_seed(seed)

    def __call__(self, logits, seqs):
        params = [s.params for s in seqs]
        greedy = logits.argmax(dim=-1).tolist()
        if all(p.greedy for p in params):
            return greedy
        logits = logits.float().cpu()
        out = greedy
        for i, p in enumerate(params):
            if p.greedy:
                continue
            row = logits[i] / p.temperature
            if 0 < p.top_k < row.shape[-1]:
                kth = torch.topk(row, p.top_k).values[-1]
                row = row.masked_fill(row < kth, float("-inf"))
            probs = torch.softmax(row, dim=-1)
            if p.top_p < 1.0:
                sorted_probs, order = probs.sort(descending=True)
                drop = sorted_probs.cumsum(-1) - sorted_probs >= p.top_p
                sorted_probs[drop] = 0.0
                probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
            out[i] = int(torch.multinomial(probs, 1, generator=self.default_generator))
        return out
