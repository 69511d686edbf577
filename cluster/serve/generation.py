"""One request's generations as a single stream of text events, whatever n and the prompt count.

Each choice is routed, driven through the RequestDriver, detokenized incrementally and cut at stop
strings; the choices of a request run concurrently and their events interleave in one stream.
Closing that stream early (the client went away, a stop string was found, another choice failed)
closes every driver iterator still open, and the driver then aborts the request on both nodes.

    for each choice:  route -> driver.generate -> detokenize -> stop strings -> ChoiceEvent ...
                                                                               (last one: finish_reason)
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass

from raypd.cluster.client.request_driver import RequestDriver
from raypd.cluster.client.router import Router
from raypd.cluster.openai.api_errors import ServiceUnavailable
from raypd.cluster.openai.detokenizer import IncrementalDetokenizer
from raypd.cluster.openai.params import ChoiceJob, PreparedRequest
from raypd.cluster.openai.response_schema import FinishReason
from raypd.cluster.openai.stop import StopMatcher


@dataclass(frozen=True, slots=True)
class ChoiceEvent:
    index: int
    text: str
    finish_reason: FinishReason | None = None  # set on the choice's last event only
    completion_tokens: int = 0        # last event: tokens the nodes generated for this choice
    cached_tokens: int = 0            # last event: prompt tokens served from a prefix cache


ChoiceStream = AsyncGenerator[ChoiceEvent, None]


class Generator:
    """What a request needs from the replica: the driver, the routing seam and the tokenizer."""

    def __init__(self, driver: RequestDriver, router: Router, hf_tokenizer):
        self.driver = driver
        self.router = router
        self.hf_tokenizer = hf_tokenizer

    def run(self, request_id: str, prepared: PreparedRequest,
            echo: list[str] | None = None) -> ChoiceStream:
        """Events of every choice, interleaved; `echo` gives each prompt's text to repeat first."""
        streams = [self.choice(f"{request_id}-{job.index}", prepared.prompts[job.prompt_index], job,
                               prepared.stops, echo[job.prompt_index] if echo else "")
                   for job in prepared.jobs]
        return streams[0] if len(streams) == 1 else _interleave(streams)

    async def choice(self, request_id: str, prompt_ids: list[int], job: ChoiceJob, stops: tuple[str, ...],
                     echo: str = "") -> ChoiceStream:
        route = await self.router.route(request_id, prompt_ids)
        detok = IncrementalDetokenizer(self.hf_tokenizer)
        matcher = StopMatcher(stops)
        if echo:
            yield ChoiceEvent(job.index, echo)
        generated = 0
        cached = 0
        stream = self.driver.generate(request_id, prompt_ids, job.params, route.prefill, route.decode)
        # Leaving early closes the driver's stream, which aborts the request on both nodes.
        async with aclosing(stream):
            async for chunk in stream:
                generated += len(chunk.token_ids)
                cached = chunk.num_cached_tokens or cached
                if chunk.finished and not chunk.error:
                    await self.router.delivered(request_id, chunk.num_cached_tokens)
                if chunk.finished and (chunk.error or chunk.finish_reason not in ("stop", "length")):
                    raise ServiceUnavailable(f"the request failed on the cluster: "
                                             f"{chunk.error or chunk.finish_reason}", code="node_failure")
                ids = chunk.token_ids
                if chunk.finished and chunk.finish_reason == "stop" and ids:
                    ids = ids[:-1]  # the stop token (EOS or a stop_token_id) is not part of the text
                text = detok.add(ids) + (detok.flush() if chunk.finished else "")
                released = matcher.feed(text)
                if matcher.stopped:
                    yield ChoiceEvent(job.index, released, "stop", generated, cached)
                    return
                if chunk.finished:
                    reason: FinishReason = "stop" if chunk.finish_reason == "stop" else "length"
                    yield ChoiceEvent(job.index, released + matcher.flush(), reason, generated, cached)
                    return
                if released:
                    yield ChoiceEvent(job.index, released)
        raise ServiceUnavailable("the cluster ended the request without a final message", code="node_failure")


async def _interleave(streams: list[ChoiceStream]) -> ChoiceStream:
    """Events of all streams as they come. The first failure ends everything: the other streams'
    tasks are cancelled, which closes their driver streams (abort on the nodes)."""
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(stream: ChoiceStream) -> None:
        try:
            async with aclosing(stream):
                async for event in stream:
                    await queue.put(event)
        except Exception as e:  # noqa: BLE001 - handed to the reader, which raises it
            await queue.put(e)
        finally:
            queue.put_nowait(done)

    tasks = [asyncio.ensure_future(pump(s)) for s in streams]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is done:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
