"""Turn a request's ChoiceEvents into the OpenAI response: one JSON body, or Server-Sent Events
(`data: {chunk}` per event, `data: [DONE]` at the end) for stream: true.

Usage counts each prompt once (prompt_tokens, and cached_tokens as the best any of its choices
got) and every choice's generated tokens (completion_tokens, stop tokens included).
"""
from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Literal

from raypd.cluster.openai.api_errors import api_error
from raypd.cluster.openai.response_schema import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    Completion,
    CompletionChoice,
    FinishReason,
    PromptTokensDetails,
    Usage,
)
from raypd.cluster.serve.generation import ChoiceEvent, ChoiceStream

Kind = Literal["chat", "completion"]


class Renderer:
    def __init__(self, kind: Kind, response_id: str, model: str, created: int, prompt_lens: list[int], n: int,
                 include_usage: bool = False):
        self.kind = kind
        self.id = response_id
        self.model = model
        self.created = created
        self.prompt_lens = prompt_lens
        self.n = n
        self.include_usage = include_usage
        self._tokens: dict[int, int] = {}
        self._cached: dict[int, int] = {}

    # -- whole response ---------------------------------------------------------------------------------
    async def collect(self, events: ChoiceStream) -> dict:
        texts: dict[int, list[str]] = {i: [] for i in range(len(self.prompt_lens) * self.n)}
        reasons: dict[int, FinishReason] = {}
        async with aclosing(events):
            async for e in events:
                texts[e.index].append(e.text)
                if e.finish_reason:
                    reasons[e.index] = e.finish_reason
                    self._count(e)
        if self.kind == "chat":
            return ChatCompletion(id=self.id, created=self.created, model=self.model, usage=self.usage(), choices=[
                ChatChoice(index=i, message=AssistantMessage(content="".join(t)), finish_reason=reasons[i])
                for i, t in texts.items()]).model_dump(mode="json")
        return Completion(id=self.id, created=self.created, model=self.model, usage=self.usage(), choices=[
            CompletionChoice(index=i, text="".join(t), finish_reason=reasons[i])
            for i, t in texts.items()]).model_dump(mode="json")

    # -- stream ----------------------------------------------------------------------------------------
    async def sse(self, first: ChoiceEvent, events: ChoiceStream) -> AsyncIterator[str]:
        """SSE lines: `first` (already read, to answer errors before the stream began with a status)
        and the rest. A failure after the first byte can only be an error event in the stream."""
        async with aclosing(events):
            try:
                if self.kind == "chat":
                    for i in range(len(self.prompt_lens) * self.n):
                        yield self._chat_chunk(i, ChatDelta(role="assistant", content=""))
                for line in self._event_lines(first):
                    yield line
                async for e in events:
                    for line in self._event_lines(e):
                        yield line
                if self.include_usage:
                    yield self._usage_chunk()
            except Exception as e:  # noqa: BLE001 - every failure becomes an OpenAI error event
                yield _data(api_error(e).body())
            yield "data: [DONE]\n\n"

    def _event_lines(self, e: ChoiceEvent) -> list[str]:
        lines = []
        if self.kind == "chat":
            if e.text:
                lines.append(self._chat_chunk(e.index, ChatDelta(content=e.text)))
            if e.finish_reason:
                self._count(e)
                lines.append(self._chat_chunk(e.index, ChatDelta(), e.finish_reason))
        elif e.text or e.finish_reason:
            if e.finish_reason:
                self._count(e)
            lines.append(self._dump(Completion(id=self.id, created=self.created, model=self.model, choices=[
                CompletionChoice(index=e.index, text=e.text, finish_reason=e.finish_reason)])))
        return lines

    def _chat_chunk(self, index: int, delta: ChatDelta, finish_reason: FinishReason | None = None) -> str:
        return self._dump(ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=[
            ChatChunkChoice(index=index, delta=delta, finish_reason=finish_reason)]))

    def _usage_chunk(self) -> str:
        cls = ChatCompletionChunk if self.kind == "chat" else Completion
        return self._dump(cls(id=self.id, created=self.created, model=self.model, choices=[], usage=self.usage()))

    def _dump(self, chunk: ChatCompletionChunk | Completion) -> str:
        body = chunk.model_dump(mode="json", exclude_none=True)
        for choice in body["choices"]:  # the API spells an unfinished choice's reason as null
            choice.setdefault("finish_reason", None)
        if self.include_usage:  # with include_usage every chunk carries the key, null until the last
            body.setdefault("usage", None)
        return _data(body)

    # -- usage ------------------------------------------------------------------------------------------
    def _count(self, e: ChoiceEvent) -> None:
        self._tokens[e.index] = e.completion_tokens
        self._cached[e.index] = e.cached_tokens

    def usage(self) -> Usage:
        prompt = sum(self.prompt_lens)
        completion = sum(self._tokens.values())
        cached = sum(max((self._cached.get(p * self.n + j, 0) for j in range(self.n)), default=0)
                     for p in range(len(self.prompt_lens)))
        return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                     prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))


def _data(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'), ensure_ascii=False)}\n\n"
