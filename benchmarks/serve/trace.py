"""The Mooncake trace format as a workload: jsonl lines of `timestamp` (ms), `input_length`,
`output_length` and `hash_ids` (one id per 512-token block of the prompt; equal ids = equal blocks).

Each hash id becomes a fixed block of seeded English text of `block_tokens` tokens (512 x
`length_scale`), so requests that share ids share a text prefix; the last block is cut to the
scaled input length. Output lengths are scaled the same way (at least `min_output`). Requests that
would not fit `max_model_len` are cut to it. `salt` changes every block's text, so a sweep's steps
do not hit each other's caches.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from raypd.benchmarks.serve.datasets import Request, Session, TextSource, Workload

MOONCAKE_BLOCK = 512


def trace_dataset(path: Path, src: TextSource, length_scale: float, num_prompts: int | None, max_model_len: int,
                  min_output: int = 1, salt: int = 0, start_index: int = 0) -> Workload:
    block_tokens = max(1, round(MOONCAKE_BLOCK * length_scale))
    blocks: dict[int, str] = {}
    sessions = []
    lines = path.read_text().splitlines()
    first_ts = None
    for line in lines[start_index:]:
        if not line.strip():
            continue
        row = json.loads(line)
        out = max(min_output, round(row["output_length"] * length_scale))
        n_in = max(1, round(row["input_length"] * length_scale))
        n_in = min(n_in, max_model_len - out - 64)  # 64: room for special tokens and the tokenizer's drift
        parts, have = [], 0
        for h in row["hash_ids"]:
            if have >= n_in:
                break
            if h not in blocks:
                blocks[h] = src.text(random.Random(f"{salt}:{h}"), block_tokens)
            take = min(block_tokens, n_in - have)
            parts.append(blocks[h] if take == block_tokens else src.decode(src.encode(blocks[h])[:take]))
            have += take
        ts = float(row["timestamp"]) / 1000.0
        first_ts = ts if first_ts is None else first_ts
        sessions.append(Session((Request(out, prompt="".join(parts), prompt_len=have),), ts - first_ts))
        if num_prompts and len(sessions) >= num_prompts:
            break
    return Workload("trace", sessions, {"path": path.name, "length_scale": length_scale, "block_tokens": block_tokens,
                                        "num_prompts": len(sessions), "start_index": start_index, "salt": salt})
