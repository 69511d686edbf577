"""Overlap scheduling: the host schedules and launches decode step N+1 while the GPU still runs step N
(SGLang's overlap event loop, vLLM's async scheduling). Without it the GPU idles through every step's
host work (schedule, rows, sampling, outputs): 1-3 ms a step at a few hundred sequences, as long as
the GPU's own part of a small model's step.

One LLMEngine.step() call with a decode step N in flight:

    schedule N+1          the requests of N already carry a PENDING token where N's goes, so the
                          scheduler counts it (positions, blocks) without knowing it
    launch N+1            decode-only, greedy, a CUDA graph: rows whose input is N's token take it
                          from N's tokens on the device (no host round trip); argmax on the device;
                          the tokens' copy to pinned host memory starts
    collect N             wait for N's copy (the call's one synchronisation), put each token in
                          place of its PENDING, check stops, emit outputs, finish requests
    -> N+1 is in flight

A step N+1 that cannot launch this way (a prefill chunk in it, a sampled or penalized request, a
batch or context past the graphs) first collects N, drops the items of requests that N ended, and
runs as the plain step does; so does every step before which a request of N ends by length (its
next token must not be computed). Greedy output is the plain step's: the same forward, the same
argmax, the tokens only travel differently.

What the one step of lookahead costs, and why it is safe:
- a request that N ends with a stop token was already launched in N+1: that row's token is dropped,
  and its K/V write (the stop token's, a real token of the sequence) lands in blocks it holds until
  the finish releases them; every later use of those blocks is stream-ordered after N+1.
- a request aborted or retracted while N is in flight gives its blocks back at once: N and N+1 run
  on one CUDA stream, so any later step that reuses them runs after both. Its token from N is
  dropped (aborted) or kept in place of its PENDING (retracted: recomputed later from it).
- outputs leave one call later than the plain step returns them, but a call is shorter by the
  host work the GPU now hides.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from raypd.engine.scheduler import ScheduledRequest

PENDING = -1  # in a request's token_ids: the token of the step in flight, not known on the host yet


@dataclass(slots=True)
class LaunchedDecode:
    """A decode step launched and not yet collected: row i is items[i]."""
    items: list[ScheduledRequest]
    tokens: torch.Tensor                 # [n] int64 greedy tokens on the device
    host: torch.Tensor                   # [n] int64 (pinned on CUDA): their copy, complete after `done`
    done: torch.cuda.Event | None        # recorded after the copy (None on the CPU: already complete)

    def row_of(self) -> dict[int, int]:
        """id(request) -> its row: where the next step's input for it is."""
        return {id(x.request): i for i, x in enumerate(self.items)}
