"""The chaos run's requests: a seeded list of short streaming chat and completion requests, half
greedy (temperature 0) and half seeded sampling (temperature > 0 with `seed`), so both kinds of
output can be compared exactly with a fault-free run of the same list.

Request i is chat when i is even, greedy when (i // 2) is even: every four consecutive requests
cover the four combinations. Prompts are a few sentences of benchmarks/workloads.py's English text;
max_tokens is small (24-48 by default) so a 2-core CPU box keeps up with the load.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from raypd.benchmarks.workloads import english_text

Endpoint = Literal["chat", "completion"]
Sampling = Literal["greedy", "seeded"]
SAMPLING_TEMPERATURE = 0.8
SAMPLING_TOP_P = 0.95


@dataclass(frozen=True, slots=True)
class ChaosRequest:
    index: int
    endpoint: Endpoint
    text: str              # the user message (chat) or the prompt (completion)
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None       # set exactly when temperature > 0

    @property
    def sampling(self) -> Sampling:
        return "greedy" if self.temperature == 0 else "seeded"

    def create_kwargs(self, model: str) -> dict:
        """Keyword arguments for the openai client's `create` (chat or completions), streaming with usage."""
        kw: dict = {"model": model, "max_tokens": self.max_tokens, "temperature": self.temperature,
                    "stream": True, "stream_options": {"include_usage": True}}
        if self.top_p != 1.0:
            kw["top_p"] = self.top_p
        if self.seed is not None:
            kw["seed"] = self.seed
        if self.endpoint == "chat":
            kw["messages"] = [{"role": "user", "content": self.text}]
        else:
            kw["prompt"] = self.text
        return kw


def build_requests(num_requests: int, seed: int = 0, max_tokens: tuple[int, int] = (24, 48),
                   prompt_words: tuple[int, int] = (12, 40)) -> list[ChaosRequest]:
    """`num_requests` requests, the same list for the same arguments."""
    if num_requests < 1:
        raise ValueError("the workload needs at least one request")
    rng = random.Random(seed)
    out = []
    for i in range(num_requests):
        endpoint: Endpoint = "chat" if i % 2 == 0 else "completion"
        greedy = (i // 2) % 2 == 0
        text = english_text(rng, min_words=rng.randint(*prompt_words))
        if endpoint == "chat":
            text = f"Continue this text with a few more sentences: {text}"
        out.append(ChaosRequest(
            index=i, endpoint=endpoint, text=text, max_tokens=rng.randint(*max_tokens),
            temperature=0.0 if greedy else SAMPLING_TEMPERATURE, top_p=1.0 if greedy else SAMPLING_TOP_P,
            seed=None if greedy else rng.randrange(1 << 31)))
    return out
