"""RequestDriver: drives one request through the nodes chosen for it and streams its tokens back.

PD: mint the room id, start the prefill (its result carries the prefill-side timings), open the decode
node's token stream, and relay chunks until the final one. Mixed: open the mixed node's stream.
Whatever happens - a node dies, a chunk does not come within chunk_timeout_s, the caller stops
reading - the caller gets a final chunk, and both nodes are told to abort a request that did not end.
Nodes are picked round-robin until the Conductor routes.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from collections.abc import AsyncIterator, Sequence

import ray

from cluster.node_handles import NodeHandle
from engine.sampling_params import SamplingParams
from node.messages import NodeRequest, PrefillResult, TokenChunk

log = logging.getLogger(__name__)


class NoNodeError(RuntimeError):
    """No node of a needed role is available."""


class RequestDriver:
    def __init__(self, nodes: Sequence[NodeHandle], chunk_timeout_s: float = 120.0, prefill_wait_s: float = 10.0):
        self.prefill = [n for n in nodes if n.role == "prefill"]
        self.decode = [n for n in nodes if n.role == "decode"]
        self.mixed = [n for n in nodes if n.role == "mixed"]
        self.chunk_timeout_s = chunk_timeout_s
        self.prefill_wait_s = prefill_wait_s
        self._rr = {role: itertools.cycle(nodes) for role, nodes in
                    (("prefill", self.prefill), ("decode", self.decode), ("mixed", self.mixed)) if nodes}

    @property
    def mode(self) -> str:
        return "pd" if self.prefill and self.decode else "mixed"

    def pick(self, role: str) -> NodeHandle:
        if role not in self._rr:
            raise NoNodeError(f"no {role} node is running")
        return next(self._rr[role])

    async def generate(self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams,
                       prefill: NodeHandle | None = None, decode: NodeHandle | None = None) -> AsyncIterator[TokenChunk]:
        if self.mode == "mixed":
            async for chunk in self._generate_mixed(request_id, prompt_token_ids, params):
                yield chunk
            return
        prefill = prefill or self.pick("prefill")
        decode = decode or self.pick("decode")
        req = NodeRequest(request_id, secrets.randbits(63), tuple(prompt_token_ids), params,
                          bootstrap_address=prefill.bootstrap_address)
        prefill_ref = prefill.actor.prefill.remote(req)
        stream = decode.actor.generate.remote(req)
        final: TokenChunk | None = None
        try:
            async for chunk in self._relay(stream, request_id, decode.name):
                if chunk.finished:
                    final = chunk
                    break
                yield chunk
        finally:
            if final is None:  # the caller stopped reading, or we failed: abort on both nodes
                _fire(prefill.actor.abort.remote(request_id))
                _fire(decode.actor.abort.remote(request_id))
                _fire(prefill_ref)
        yield await self._with_prefill_timings(final, prefill_ref)

    async def _generate_mixed(self, request_id, prompt_token_ids, params) -> AsyncIterator[TokenChunk]:
        node = self.pick("mixed")
        req = NodeRequest(request_id, secrets.randbits(63), tuple(prompt_token_ids), params)
        stream = node.actor.generate.remote(req)
        finished = False
        try:
            async for chunk in self._relay(stream, request_id, node.name):
                finished = chunk.finished
                yield chunk
                if finished:
                    return
        finally:
            if not finished:
                _fire(node.actor.abort.remote(request_id))

    async def _relay(self, stream, request_id: str, node_name: str) -> AsyncIterator[TokenChunk]:
        """Chunks of a node's stream; a dead node or a silent one becomes a final error chunk."""
        while True:
            try:
                ref = await asyncio.wait_for(stream.__anext__(), self.chunk_timeout_s)
                chunk = await asyncio.wait_for(ref, self.chunk_timeout_s)
            except StopAsyncIteration:
                yield TokenChunk(request_id, (), finished=True, error=f"node {node_name} ended the stream early")
                return
            except asyncio.TimeoutError:
                yield TokenChunk(request_id, (), finished=True,
                                 error=f"no token from node {node_name} within {self.chunk_timeout_s:.0f}s")
                return
            except ray.exceptions.RayError as e:
                yield TokenChunk(request_id, (), finished=True, error=f"node {node_name} failed: {type(e).__name__}")
                return
            yield chunk
            if chunk.finished:
                return

    async def _with_prefill_timings(self, final: TokenChunk, prefill_ref) -> TokenChunk:
        """Merge the prefill node's phase timings into the final chunk (bounded wait: the decode side
        has already ended, so a live prefill node answers at once)."""
        try:
            result: PrefillResult = await asyncio.wait_for(prefill_ref, self.prefill_wait_s)
        except (asyncio.TimeoutError, ray.exceptions.RayError):
            return final
        timings = {**{f"prefill.{k}": v for k, v in result.timings.items()},
                   **{f"decode.{k}": v for k, v in final.timings.items()}}
        error = final.error
        if error and result.error and result.error not in error:
            error = f"{error} (prefill: {result.error})"
        return TokenChunk(final.request_id, final.token_ids, True, final.finish_reason, error,
                          final.num_cached_tokens, timings)


def _fire(ref) -> None:
    """Let a call run without awaiting it; swallow its outcome (the node may be dead)."""
    async def _await():
        try:
            await asyncio.wait_for(ref, 30)
        except Exception:  # noqa: BLE001 - best effort: the request is already over for the caller
            pass
    asyncio.ensure_future(_await())
