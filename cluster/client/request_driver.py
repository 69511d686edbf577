"""RequestDriver: drives one request through the nodes chosen for it and streams its tokens back.

PD: mint the room id, start the prefill (its result carries the prefill-side timings), call the
decode node's generate(), and relay its tokens until the final chunk; the first token comes from the
prefill node as soon as it is sampled (NodeRequest.early_first_token), and the decode node's copy of
it is dropped. Mixed: the same with a mixed
node's generate(); local (a decode node prefills the prompt itself): the same with the decode node's
generate() and NodeRequest.local_prefill. Tokens come over pyzmq to the driver's one TokenReceiver
(one message per engine step per caller: the measured cheap path, see node/streams.py); the request's end and a node's
death come over Ray, as the generate() call's return or error. Whatever happens - a node dies,
nothing comes within chunk_timeout_s, tokens get lost, the caller stops reading - the caller gets a
final chunk, and both nodes are told to abort a request that did not end there (also the prefill
side when the decode side failed: nothing waits for heartbeats to free it). An error final names
the node held responsible (TokenChunk.failed_node), which the caller's retries avoid. A node that
refuses the request for want of capacity ends it with finish_reason OVERLOADED (a prefill node's
refusal comes back as PrefillResult.overloaded: the decode side is aborted at once and the final
chunk says OVERLOADED, naming the prefill node). A prefill node may also refuse a request later, while
it waits in its queue, for a newcomer that ranks before it (prefill_node/prefill_duty.py): its room
fails, so the decode side may end first, with a transfer error, before the refusal arrives. Whatever
the decode side said, a request whose prefill result is overloaded before any token ends as refused.
Callers pass the nodes their Router chose (client/router.py); the driver itself never picks one.
"""
from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from dataclasses import replace

import ray

from raypd.cluster.client.fire import fire
from raypd.cluster.client.node_handles import NodeHandle
from raypd.cluster.client.token_receiver import TokenReceiver, TokenStream
from raypd.kvtransfer.identity import DataPlaneIdentity
from raypd.metrics.task_events import untracked
from raypd.protocol.messages import OVERLOADED, NodeRequest, PrefillResult, TokenChunk
from raypd.protocol.roles import Role
from raypd.protocol.sampling_params import SamplingParams

log = logging.getLogger(__name__)
ABORT_S = 30  # a best-effort abort: the request is already over for the caller


class RequestDriver:
    """Run requests on the nodes callers name, from one event loop at a time; close() frees the
    token socket.

    reply_host: the address nodes send tokens to (default: this process's Ray node IP).
    identity: the token socket's data-plane identity (default: a fresh key pair; its allow-list is the
    nodes this driver sends requests to, by their NodeHandle.public_key).
    stream_tail_s: after a node's generate() returned, how long tokens it counted may still take to
    arrive before the request ends with a "lost tokens" error.
    early_first_token: PD requests ask the prefill node for the first token the moment it samples it
    (NodeRequest.early_first_token); False: it comes from the decode node once the KV landed."""

    def __init__(self, chunk_timeout_s: float = 120.0, prefill_wait_s: float = 10.0,
                 reply_host: str | None = None, stream_tail_s: float = 10.0,
                 identity: DataPlaneIdentity | None = None, early_first_token: bool = True):
        self.chunk_timeout_s = chunk_timeout_s
        self.prefill_wait_s = prefill_wait_s
        self.stream_tail_s = stream_tail_s
        self.early_first_token = early_first_token
        self.receiver = TokenReceiver(reply_host, identity)

    def close(self) -> None:
        self.receiver.close()

    def fail_node(self, node_name: str, reason: str) -> int:
        """The caller learnt `node_name` is hung or gone: end its streams now with an error final
        (blamed on it), so they are retried or replayed instead of waiting out chunk_timeout_s."""
        return self.receiver.fail_node(node_name, reason)

    def __enter__(self) -> RequestDriver:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    async def generate(self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams,
                       prefill: NodeHandle, decode: NodeHandle | None = None) -> AsyncGenerator[TokenChunk, None]:
        """The request's chunks, the last one final. `prefill` takes the prompt and hands its KV to
        `decode`; a mixed node does both, and so does a decode or flex node on the local path (it
        prefills the prompt itself): pass it as `prefill`, with no `decode`."""
        for node in (prefill, decode):  # the token socket admits the nodes it sends to, before it sends
            if node is not None:
                self.receiver.admit(node.name, node.public_key)
        if decode is None:
            if not prefill.role.serves_decode:   # a node that decodes can prefill its own prompts
                raise ValueError(f"{prefill.name} is a {prefill.role} node: it needs a decode node")
            req = NodeRequest(request_id, secrets.randbits(63), tuple(prompt_token_ids), params,
                              reply_address=self.receiver.address, local_prefill=prefill.role is not Role.MIXED)
            async with aclosing(self._relay(prefill, req, self.receiver.open(req.request_id), None)) as chunks:
                async for chunk in chunks:
                    yield replace(chunk, failed_node=prefill.name) if chunk.error else chunk
            return
        req = NodeRequest(request_id, secrets.randbits(63), tuple(prompt_token_ids), params,
                          bootstrap_address=prefill.bootstrap_address, reply_address=self.receiver.address,
                          early_first_token=self.early_first_token)
        stream = self.receiver.open(req.request_id)   # before the prefill node can send the first token
        stream.prefill_name = prefill.name
        try:
            prefill_ref = untracked(prefill.actor.prefill).remote(req)
        except BaseException:
            stream.close()
            raise
        final: TokenChunk | None = None
        # A prefill node that dies before the KV is handed over would leave the decode side waiting
        # for its heartbeat timeout: abort the decode side as soon as the prefill() call fails. The
        # same when the prefill node refused the request (full): no KV will ever come.
        watch = asyncio.ensure_future(_outcome(prefill_ref))
        prefill_died, prefill_refused, prefill_no_room = asyncio.Event(), asyncio.Event(), asyncio.Event()

        def on_prefill_end(fut: asyncio.Future) -> None:
            if fut.cancelled() or stream.received:
                return
            result = fut.result()
            if isinstance(result, ray.exceptions.RayError):
                prefill_died.set()
            elif isinstance(result, PrefillResult) and result.overloaded:
                prefill_refused.set()
            elif isinstance(result, PrefillResult) and result.no_room:
                prefill_no_room.set()
            else:
                return
            fire(untracked(decode.actor.abort).remote(req.request_id), ABORT_S)
        watch.add_done_callback(on_prefill_end)
        try:
            async with aclosing(self._relay(decode, req, stream, also_abort=(prefill, prefill_ref))) as chunks:
                async for chunk in chunks:  # closed at once if our caller stops reading: that aborts
                    if chunk.finished:
                        final = chunk
                    else:
                        yield chunk
        finally:
            watch.remove_done_callback(on_prefill_end)
        assert final is not None  # relay() always ends with a final chunk
        if prefill_died.is_set() and final.finish_reason == "abort":
            final = replace(final, finish_reason=None, error=f"prefill node {prefill.name} failed: "
                                                              f"{type(watch.result()).__name__}")
        elif prefill_no_room.is_set() and not stream.received:  # refused before a room: no KV could come
            final = replace(final, finish_reason=None,
                            error=f"prefill node {prefill.name} refused the request: {watch.result().error}")
        if final.error and not prefill_refused.is_set():  # the decode side is over: free the prefill side now
            fire(untracked(prefill.actor.abort).remote(req.request_id), ABORT_S)
        final, prefill_failed, result = await self._with_prefill_timings(final, prefill_ref,
                                                                         waited_for_kv=not stream.received)
        # Refused for capacity, at once or displaced from its queue later: no KV could come, so whatever
        # the decode side said (an abort, or a failed room when it ended before the refusal reached us:
        # prefill_refused is then unset) it was the refusal. Not with a token received: that prefill ended well.
        refusal = result.error if result is not None and result.overloaded and not stream.received else None
        if refusal is not None:
            final = replace(final, finish_reason=OVERLOADED, error=refusal)
        if final.error:
            # The node the caller learnt was lost is that one's; the stream's own failure (the decode
            # node died or fell silent) is the decode node's; an error the decode node reported is the
            # prefill node's when that one failed, refused, or stayed silent while the KV was awaited.
            if stream.lost_node:
                blame = prefill if stream.lost_node == prefill.name else decode
            elif refusal is not None or prefill_no_room.is_set() or (prefill_failed and not stream.stream_failed):
                blame = prefill
            else:
                blame = decode
            final = replace(final, failed_node=blame.name)
        yield final

    async def _relay(self, node: NodeHandle, req: NodeRequest, stream: TokenStream,
                     also_abort: tuple[NodeHandle, ray.ObjectRef] | None) -> AsyncGenerator[TokenChunk, None]:
        """The request's chunks from node.generate() through `stream` (opened for it), the last one
        final. If the request did not end on the node (the caller stopped reading, a timeout, an
        error here), abort it there and on `also_abort`, the prefill side: (node, its prefill() ref)."""
        end = untracked(node.actor.generate).remote(req)
        try:
            async with aclosing(stream.relay(end, node.name, self.chunk_timeout_s, self.stream_tail_s)) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            stream.close()
            if not stream.node_done:
                fire(untracked(node.actor.abort).remote(req.request_id), ABORT_S)
                if also_abort is not None:
                    prefill, prefill_ref = also_abort
                    fire(untracked(prefill.actor.abort).remote(req.request_id), ABORT_S)
                    fire(prefill_ref, ABORT_S)

    async def _with_prefill_timings(self, final: TokenChunk, prefill_ref,
                                    waited_for_kv: bool = False) -> tuple[TokenChunk, bool, PrefillResult | None]:
        """Merge the prefill node's phase timings into the final chunk (bounded wait: the decode side
        has already ended, so a live prefill node answers at once); whether the prefill node failed:
        its call raised (it died or its engine crashed), or, when the decode side ended with an error
        before any token (`waited_for_kv`), it stayed silent for prefill_wait_s (it is hung: the decode
        side's transfer timed out because of it); and its result, None when it gave none."""
        try:
            result: PrefillResult = await asyncio.wait_for(prefill_ref, self.prefill_wait_s)
        except asyncio.TimeoutError:
            return final, bool(final.error) and waited_for_kv, None
        except ray.exceptions.RayError:
            return final, True, None
        timings = {**{f"prefill.{k}": v for k, v in result.timings.items()},
                   **{f"decode.{k}": v for k, v in final.timings.items()}}
        error = final.error
        if error and result.error and result.error not in error:
            error = f"{error} (prefill: {result.error})"
        return replace(final, error=error, timings=timings), False, result


async def _outcome(ref):
    """The call's result, or the exception it raised (never raises)."""
    try:
        return await ref
    except BaseException as e:  # noqa: BLE001 - handed to the caller as a value
        return e
