"""publish / fail, pure Python: the reference for _fanout_c.pyx."""


def check_step(keys, collectors, token_ids, texts, finished, finish_reasons, logprobs=None):
    n = len(keys)
    for name, seq in (("collectors", collectors), ("token_ids", token_ids), ("texts", texts),
                      ("finished", finished), ("finish_reasons", finish_reasons), ("logprobs", logprobs)):
        if seq is not None and len(seq) != n:
            raise ValueError(f"publish: {name} has {len(seq)} entries for {n} keys")


def publish(keys, collectors, token_ids, texts, finished=None, finish_reasons=None, logprobs=None, /):
    check_step(keys, collectors, token_ids, texts, finished, finish_reasons, logprobs)
    ready = []
    for i, key in enumerate(keys):
        if collectors[i].put(token_ids[i], texts[i], finished[i] if finished is not None else False,
                             finish_reasons[i] if finish_reasons is not None else None,
                             logprobs[i] if logprobs is not None else None):
            ready.append(key)
    return ready


def fail(keys, collectors, exc, /):
    """Put `exc` into each collector; the keys of those that became ready (both flavours)."""
    if len(collectors) != len(keys):
        raise ValueError(f"fail: collectors has {len(collectors)} entries for {len(keys)} keys")
    return [key for key, collector in zip(keys, collectors) if collector.put_error(exc)]
