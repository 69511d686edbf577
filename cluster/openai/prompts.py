"""A request's prompts as token ids, built off the event loop and within bounds.

Chat templates (Jinja, pure Python) and tokenization take time that grows with the input: 0.14 s for
4096 short messages, 0.8 s for a 580,000-character prompt on this machine. On the event loop that is
a pause in every stream of the replica, so they run on a small thread pool: the tokenizers library
releases the GIL while it encodes, and Jinja yields it every switch interval (5 ms), so the loop keeps
its turns. The pool is bounded twice: `workers` threads, and at most `max_pending` calls admitted
(running or queued); past that a request is refused with 429 and Retry-After instead of queueing CPU
work without end.

Before any of that, cheap checks refuse what cannot fit: a text longer than the context could hold
even if every token were the vocabulary's longest (`max_text_chars`) is refused without being
tokenized. Tokenizers here never produce fewer tokens than characters / longest token (byte-level
BPE spells each byte as one character, SentencePiece each character as itself or its bytes).
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from raypd.cluster.openai.api_errors import BadRequest, RateLimited
from raypd.cluster.openai.params import ModelLimits, chat_messages
from raypd.cluster.openai.request_schema import ChatCompletionRequest
from raypd.engine.errors import InvalidRequestError
from raypd.engine.tokenizer import Tokenizer

T = TypeVar("T")


def longest_token_chars(hf_tokenizer) -> int:
    """Characters in the vocabulary's longest token (added tokens included: a text may spell one)."""
    return max(map(len, hf_tokenizer.get_vocab()), default=1)


class PromptBuilder:
    def __init__(self, tokenizer: Tokenizer, limits: ModelLimits, workers: int = 2, max_pending: int = 32):
        self.tokenizer = tokenizer
        self.limits = limits
        # A text longer than this cannot fit the context, whatever it tokenizes to.
        self.max_text_chars = limits.context_len * longest_token_chars(tokenizer.hf)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="raypd-prompts")
        self._slots = threading.BoundedSemaphore(max_pending)  # released by the worker thread

    async def chat(self, req: ChatCompletionRequest) -> list[int]:
        """The templated conversation's token ids."""
        messages = chat_messages(req)
        self._check_text(sum(len(m["content"]) for m in messages), "messages")
        try:
            return await self._run(self.tokenizer.apply_chat_template, messages)
        except (InvalidRequestError, RateLimited):
            raise
        except Exception as e:  # noqa: BLE001 - a Jinja template may raise anything on odd messages
            raise BadRequest(f"the model's chat template rejected the messages: {e}", "messages") from e

    async def completion(self, prompts: list[str | list[int]]) -> list[list[int]]:
        """Each prompt's token ids (text prompts tokenized, id prompts as given)."""
        for p in prompts:
            if isinstance(p, str):
                self._check_text(len(p), "prompt")
        texts = [p for p in prompts if isinstance(p, str)]
        encoded = iter(await self._run(lambda: [self.tokenizer.encode(t) for t in texts]) if texts else [])
        return [next(encoded) if isinstance(p, str) else list(p) for p in prompts]

    async def decode(self, prompts: list[list[int]]) -> list[str]:
        return await self._run(lambda: [self.tokenizer.decode(ids) for ids in prompts])

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _check_text(self, chars: int, param: str) -> None:
        if chars > self.max_text_chars:
            raise BadRequest(f"This model's maximum context length is {self.limits.context_len} tokens; the "
                             f"prompt's {chars} characters are more than that many tokens can hold", param,
                             "context_length_exceeded")

    async def _run(self, fn: Callable[..., T], *args) -> T:
        if not self._slots.acquire(blocking=False):
            raise RateLimited("the ingress is busy preparing other requests' prompts; retry later",
                              code="ingress_busy", headers={"retry-after": "1"})
        try:
            future = self._pool.submit(fn, *args)
        except BaseException:
            self._slots.release()
            raise
        # Released when the work ends, not when the caller stops waiting (a deadline may cancel the
        # caller; the thread still runs to the end and keeps its slot until then).
        future.add_done_callback(lambda _: self._slots.release())
        return await asyncio.wrap_future(future)
