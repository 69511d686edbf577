"""RunningStage: decode requests in the engine's batch, streaming a token per step.

    add(dr): engine.add_prefilled(its reservation, the prompt, the first token from the aux record)
             ─> RUNNING: the first token streamed; continuous batching (a retracted request is
                recomputed locally and goes on)
    add_local(dr): engine.add_request(the prompt) ─> RUNNING: queued, then prefilled in this engine's
             steps under its per-step prompt budget (max_prefill_tokens_per_step), then as above
        ├─ stop / length ─> pop_ready(step outputs): the request with its last output, for its final chunk
        └─ abort(), or remove() (a local one the node displaced before it started) ─> engine request
           aborted, leaves at once

Every token but a request's last goes out from here; the node sends the final chunk, whose
timings and finish reason cover the whole request.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from raypd.decode_node.decode_request import DecodePhase, DecodeRequest
from raypd.engine.errors import InvalidRequestError
from raypd.engine.outputs import StepOutput
from raypd.node.streams import TokenStreams
from raypd.protocol.messages import TokenChunk

if TYPE_CHECKING:  # torch: only a type here; a process that holds a node's handle imports this module
    from raypd.engine.engine import LLMEngine


class RunningStage:
    def __init__(self, engine: LLMEngine, streams: TokenStreams):
        self._engine = engine
        self._streams = streams
        self._requests: dict[str, DecodeRequest] = {}
        self._finished: list[tuple[DecodeRequest, StepOutput]] = []  # by add(), until pop_ready()

    def __len__(self) -> int:
        return len(self._requests)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._requests

    def add(self, dr: DecodeRequest) -> None:
        """Start decoding from the landed KV. Raises InvalidRequestError, with the reservation freed,
        when the aux record is missing or does not describe this prompt, or the engine refuses."""
        rec, n = dr.record, len(dr.req.prompt_token_ids)
        try:
            if rec is None or rec.num_prompt_tokens != n or rec.room != dr.room:
                raise InvalidRequestError(f"KV arrived without a valid aux record for room {dr.room}: {rec}", "prompt")
            out = self._engine.add_prefilled(dr.request_id, dr.req.prompt_token_ids, rec.first_token,
                                             dr.req.params, dr.request_id, rec.num_cached_tokens)
        except InvalidRequestError:
            self._engine.unreserve(dr.request_id)
            raise
        dr.blocks = []  # the engine's request owns them now
        dr.phase = DecodePhase.RUNNING
        dr.num_cached_tokens = rec.num_cached_tokens
        self._requests[dr.request_id] = dr
        self._emit(dr, out)

    def add_local(self, dr: DecodeRequest) -> None:
        """Prefill the prompt here (the Conductor's local path): the engine queues it, admits it
        when memory and its prompt budget allow, and its first output is the first token. Raises
        InvalidRequestError (nothing held) when the engine refuses the prompt."""
        self._engine.add_request(dr.req.prompt_token_ids, dr.req.params, request_id=dr.request_id)
        dr.local = True
        dr.phase = DecodePhase.RUNNING
        self._requests[dr.request_id] = dr

    def pop_ready(self, outputs: Sequence[StepOutput] = ()) -> list[tuple[DecodeRequest, StepOutput]]:
        """Stream this step's tokens; return the requests that finished (here or in add()) with
        their last output. They have left the engine and this stage."""
        for out in outputs:
            dr = self._requests.get(out.request_id)
            if dr is not None:
                self._emit(dr, out)
        finished, self._finished = self._finished, []
        return finished

    def remove(self, dr: DecodeRequest) -> None:
        """Leave at once: the engine frees the request's blocks."""
        del self._requests[dr.request_id]
        self._engine.abort(dr.request_id)

    def abort(self, dr: DecodeRequest) -> None:
        self.remove(dr)
        dr.aborting = True

    def _emit(self, dr: DecodeRequest, out: StepOutput) -> None:
        now = time.time()
        if "first_token" in dr.t:
            dr.t.setdefault("first_step", now)
        dr.t.setdefault("first_token", now)
        if dr.local:
            dr.num_cached_tokens = out.num_cached_tokens
        if out.finished:
            del self._requests[dr.request_id]
            self._finished.append((dr, out))
        else:
            self._streams.push(TokenChunk(dr.request_id, tuple(out.new_token_ids),
                                          num_cached_tokens=dr.num_cached_tokens))
