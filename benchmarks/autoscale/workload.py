"""What every request sends: one short chat message (a few sentences of benchmarks/workloads.py's
English text, `prompt_words` words, a different start per request) asking for exactly `output_len`
tokens (bench serve's client sets `ignore_eos`), streamed, so each request's TTFT and TPOT are
measured at the client. One shape for the capacity probe and the load step alike, so the base rate
in fractions of the probe's capacity means what it says. No tokenizer is needed.
"""
from __future__ import annotations

import random

from raypd.benchmarks.serve.datasets import Request
from raypd.benchmarks.workloads import english_text


def build_requests(count: int, prompt_words: int, output_len: int, seed: int) -> list[Request]:
    """`count` chat requests, the same list for the same arguments."""
    rng = random.Random(seed)
    return [Request(max_tokens=output_len, messages=[
        {"role": "user", "content": "Continue this text with a few more sentences: "
                                    + english_text(rng, min_words=prompt_words)}]) for _ in range(max(0, count))]
