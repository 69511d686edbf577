"""What the streams send: completion prompts of exactly `input_len` tokens asking for exactly
`output_len` (bench serve's random dataset with no spread, `ignore_eos` set by its client), one
shape for both tenants so that B's rate in multiples of capacity means what it says. Prompts are
seeded English (benchmarks/workloads.py) cut with the default model's tokenizer, which the tiny test
model shares.
"""
from __future__ import annotations

from raypd.benchmarks.serve.datasets import Request, TextSource, random_dataset


def text_source() -> TextSource:
    from transformers import AutoTokenizer

    from raypd.engine.model.source import resolve_model

    hf = AutoTokenizer.from_pretrained(str(resolve_model(None)))
    return TextSource(lambda text: list(hf.encode(text, add_special_tokens=False)),
                      lambda ids: str(hf.decode(ids, skip_special_tokens=True)))


def build_requests(src: TextSource, count: int, input_len: int, output_len: int, seed: int) -> list[Request]:
    if count <= 0:
        return []
    workload = random_dataset(src, count, input_len, output_len, range_ratio=0.0, seed=seed)
    return [s.requests[0] for s in workload.sessions]
