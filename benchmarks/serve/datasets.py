"""Workloads for `raypd bench serve`: what is sent, built once from a seed so every system gets the
same requests.

A workload is a list of sessions. A session is one request, or (multiturn) a conversation whose
turns go one after another, each resending the whole history as a chat client does. Prompt and
history text is the seeded English of benchmarks/workloads.py, cut to exact token counts with the
model's tokenizer. Assistant turns in a history are fixed text of the turn's output length, not the
server's answer, so every system sees the same prompts.

    random      one completion prompt per request, input/output lengths uniform in [len*(1-r), len]
    gsp         generated shared prefix: groups x questions; a long system prompt per group
    multiturn   conversations of --turns turns (TTFT reported for first and returning turns apart;
                main.py's KV tier command sizes one that outgrows the pools)
    file        jsonl lines with `prompt` or `messages`, `max_tokens`, optional `timestamp` (ms)
The Mooncake trace is in trace.py.
"""
from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from raypd.benchmarks.workloads import english_text


@dataclass(frozen=True, slots=True)
class Request:
    """One HTTP request: `prompt` goes to /v1/completions, `messages` to /v1/chat/completions."""
    max_tokens: int
    prompt: str | None = None
    messages: list[dict] | None = None
    prompt_len: int = 0  # tokens, as built (the chat template adds a few): sizes llama.cpp's slots

    @property
    def chat(self) -> bool:
        return self.messages is not None


@dataclass(frozen=True, slots=True)
class Session:
    """Requests sent in order, each after the previous one ends; `timestamp_s` is its own arrival
    time (trace, file) or None (the arrival process decides)."""
    requests: tuple[Request, ...]
    timestamp_s: float | None = None


@dataclass(frozen=True)
class Workload:
    name: str
    sessions: list[Session]
    params: dict = field(default_factory=dict)

    @property
    def num_requests(self) -> int:
        return sum(len(s.requests) for s in self.sessions)

    @property
    def timed(self) -> bool:
        return bool(self.sessions) and all(s.timestamp_s is not None for s in self.sessions)

    def max_request_tokens(self) -> int:
        return max((r.prompt_len + r.max_tokens for s in self.sessions for r in s.requests), default=0)


class TextSource:
    """Seeded English cut to exact token counts: `text(rng, n)` re-tokenizes to about n tokens."""

    def __init__(self, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str]):
        self.encode, self.decode = encode, decode

    def text(self, rng: random.Random, n: int) -> str:
        ids = self.encode(english_text(rng, min_words=max(n, 4)))  # a word is >= 1 token
        return self.decode(ids[:n])


def random_dataset(src: TextSource, num_prompts: int, input_len: int, output_len: int, range_ratio: float,
                   seed: int) -> Workload:
    rng = random.Random(seed)
    sessions = []
    for _ in range(num_prompts):
        n = rng.randint(max(1, int(input_len * (1 - range_ratio))), input_len)
        m = rng.randint(max(1, int(output_len * (1 - range_ratio))), output_len)
        sessions.append(Session((Request(m, prompt=src.text(rng, n), prompt_len=n),)))
    return Workload("random", sessions, {"num_prompts": num_prompts, "input_len": input_len,
                                         "output_len": output_len, "range_ratio": range_ratio, "seed": seed})


def gsp_dataset(src: TextSource, groups: int, questions: int, system_len: int, question_len: int, output_len: int,
                seed: int) -> Workload:
    """groups x questions chat requests; the questions of a group share its system prompt. Shuffled,
    so a group's questions arrive spread over the run, as in SGLang's generated-shared-prefix set."""
    rng = random.Random(seed)
    sessions = []
    for _ in range(groups):
        system = src.text(rng, system_len)
        for _ in range(questions):
            msgs = [{"role": "system", "content": system}, {"role": "user", "content": src.text(rng, question_len)}]
            sessions.append(Session((Request(output_len, messages=msgs, prompt_len=system_len + question_len),)))
    rng.shuffle(sessions)
    return Workload("gsp", sessions, {"groups": groups, "questions": questions, "system_len": system_len,
                                      "question_len": question_len, "output_len": output_len, "seed": seed})


def multiturn_dataset(src: TextSource, conversations: int, turns: int, user_len: int, output_len: int,
                      system_len: int, seed: int) -> Workload:
    """Each turn's messages are the whole conversation so far plus a new user message."""
    rng = random.Random(seed)
    sessions = []
    for _ in range(conversations):
        history: list[dict] = [{"role": "system", "content": src.text(rng, system_len)}] if system_len else []
        length = system_len
        reqs = []
        for _ in range(turns):
            history = [*history, {"role": "user", "content": src.text(rng, user_len)}]
            length += user_len
            reqs.append(Request(output_len, messages=history, prompt_len=length))
            history = [*history, {"role": "assistant", "content": src.text(rng, output_len)}]
            length += output_len
        sessions.append(Session(tuple(reqs)))
    return Workload("multiturn", sessions, {"conversations": conversations, "turns": turns, "user_len": user_len,
                                            "output_len": output_len, "system_len": system_len, "seed": seed})


def file_dataset(path: Path, encode: Callable[[str], list[int]] | None, default_max_tokens: int,
                 num_prompts: int | None = None) -> Workload:
    """jsonl: {"prompt": str} or {"messages": [...]}, optional "max_tokens" and "timestamp" (ms)."""
    sessions = []
    for i, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row, dict) or ("prompt" in row) == ("messages" in row):
            raise ValueError(f"{path}:{i + 1}: needs exactly one of 'prompt' or 'messages'")
        max_tokens = int(row.get("max_tokens", default_max_tokens))
        text = row["prompt"] if "prompt" in row else " ".join(str(m.get("content", "")) for m in row["messages"])
        n = len(encode(text)) if encode else len(text) // 3
        req = Request(max_tokens, prompt=row.get("prompt"), messages=row.get("messages"), prompt_len=n)
        ts = row.get("timestamp")
        sessions.append(Session((req,), None if ts is None else float(ts) / 1000.0))
        if num_prompts and len(sessions) >= num_prompts:
            break
    return Workload("file", sessions, {"path": path.name, "num_prompts": len(sessions)})
