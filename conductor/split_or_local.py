"""Split or local, per request: after the policy chose the split path (a prefill node computes the
prompt and sends its KV to a decode node), whether a decode node should prefill the prompt itself.

The local path on decode node d, which computes at most B prompt tokens per step after its decodes
(EngineConfig.max_prefill_tokens_per_step = LocalPrefillConfig.step_budget_tokens):

    U_d        = n - cached_d                       its own prefix cache counts: a chat's next turn
                                                    finds the last turn's KV where it was decoded
    Q_d        = prompt tokens already queued there (reported + routed since) that the request waits
                 behind: those at its priority or a more urgent one (RoutingView.queued_ahead)
    ttft_d     = (ceil((Q_d + U_d) / B) + 1/2) x step_d  +  prefill(Q_d + U_d | cached_d)
                                                    the half step: the request joins at the end of the
                                                    step under way
               = prefill(Q_d + U_d | cached_d)      when d holds nothing at all: an idle decode
                 node's steps are not capped, it prefills like a prefill node (with any sequence
                 running, waiting for KV or routed to it, the capped estimate holds: it will decode
                 during the prompt's steps)
    tbt_d      = step_d + prefill(min(B, U_d))      one step of its running requests while it prefills
    cost_d     = b_d x prefill(U_d)                 the stall all b_d decoding requests take, summed:
                                                    each of them ends that much later

with b_d the sequences it decodes now (its last report's running; not those waiting for their KV
or routed since, most of which are still being prefilled elsewhere while a local prompt runs),
step_d the decode step time at b_d
(estimates.DecodeStepModel; at least one sequence's, which is what a step costs beside its chunk:
the weights are read either way) and prefill the fitted prefill time model at the prefill nodes'
measured speed (a decode node's own report counts decode tokens, not prompt tokens).

The split path's estimate (the policy's: queue, prefill, KV send) gains its handoff at the split
decode node while it decodes: it takes the landed KV in at the end of the step under way (half a
step), and it reserves the prompt's blocks at the end of the step under way when the request
arrives (measured ~0.85 of a step, messages included; one step here), which the prefill node's
write waits for when the prefill is done sooner (its prefill starts at once: early admission,
prefill_node/bootstrap_stage.py). With the first token streamed by the prefill node
(NodeRequest.early_first_token, the drivers' default) the handoff delays the request's second token
rather than its first, and so its end; it is counted all the same, as the local path has none:

    handoff    = step_s / 2 + max(0, step_s - split TTFT estimate)

(A prefill node with early admission off, or its early slots full, waits for the reservation
before computing: the handoff then understates the split path by up to a step.) The Conductor goes
local on the d minimising ttft_d + tpot_weight x cost_d when that beats the split path, the prompt
fits d's free KV, and (with a TBT SLO) tbt_d stays inside it. The same request then costs no
prefill-node queue and no KV transfer, and the decode node's running requests pay for it in their
token streams, which is what the weight prices.

Why the whole stall and not the stall spread over each running request's output tokens (the TPOT
each gains, which is smaller by the mean output length): with prefill nodes that start a prompt
before its decode side is ready the split path costs little more than the local one, and every
local prompt takes decode-node time that the running requests' completions, and so the next
requests of a loaded deployment, wait for. Priced per token, a decode node took ~25 local prompts
per minute and lost 3-10% of goodput to static PD; priced whole, it takes the few whose split path
waits behind a long prefill queue (docs/benchmarks.md, "Split or local priced as the whole stall").

Every decision records the inputs (LocalEstimate), so `path` can be explained afterwards. With no
live prefill node at all, the local path serves every request a decode node has room for (Dynamo's
decode-only fallback) instead of refusing it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from raypd.conductor.config import LocalPrefillConfig
from raypd.conductor.decision import RouteDecision
from raypd.conductor.policies.base import RoutingView


@dataclass(slots=True)
class LocalEstimate:
    """The best local candidate as the Conductor saw it, against the split path's estimate."""
    node: str
    cached_tokens: int          # of the prompt, in the decode node's own cache
    queued_tokens: float        # prompt tokens already queued on it, that the request waits behind
    running: float              # sequences it decodes now (the ones a local prefill slows down)
    steps: int                  # steps until the prompt is computed, B tokens at a time
    ttft_s: float
    tbt_s: float                # its step time while it prefills
    tpot_cost_s: float          # the stall its running sequences take, summed
    split_ttft_s: float         # the split path's estimate, its handoff included
    split_handoff_s: float = 0.0  # of which the split decode node's step boundaries
    chosen: bool = False
    why: str = ""               # why not, when the split path stayed
    queued_behind_tokens: float = 0.0   # queued on it too, less urgent than the request: left out


def choose_path(view: RoutingView, split: RouteDecision | None, cfg: LocalPrefillConfig,
                tbt_slo_s: float | None) -> LocalEstimate | None:
    """The best local candidate against the split decision's TTFT estimate plus its handoff (None:
    no prefill node, the split path costs inf), or None when no decode node has KV room for the
    prompt; `chosen` says whether it wins."""
    slots = view.decode_slots
    table = view.table
    if not len(slots):
        return None
    handoff = split_handoff_s(view, split) if split is not None else 0.0
    split_ttft_s = split.est_ttft_s + handoff if split is not None else float("inf")
    n = view.num_tokens
    room = table.decode_room_tokens(slots) >= n
    if not room.any():
        return None
    slots = slots[room]
    cached = view.cached(slots)
    queued = view.queued_ahead(slots)
    running = table.running[slots]
    step = view.decode_model.step_time(running)
    pslots = view.prefill_slots
    speed = float(np.median(view.prefill_model.speeds(table.speed[pslots]))) if len(pslots) \
        else view.prefill_model.default_speed
    model = view.prefill_model
    new = np.maximum(n - cached, 1)
    budget = cfg.step_budget_tokens
    steps = np.ceil((queued + new) / budget)
    idle = table.decode_load(slots) == 0
    ttft = np.where(idle, 0.0, (steps + 0.5) * step) + model.estimate(queued + new, cached, speed)
    # With nothing decoding no one pays a chunk: the TBT that matters is the request's own.
    tbt = step + np.where(running > 0, model.estimate(np.minimum(budget, new), cached, speed), 0.0)
    cost = running * model.estimate(new, cached, speed)
    score = ttft + cfg.tpot_weight * cost
    i = int(np.argmin(score))
    est = LocalEstimate(view.names[int(slots[i])], int(cached[i]), float(queued[i]), float(running[i]),
                        int(steps[i]), float(ttft[i]), float(tbt[i]), float(cost[i]), split_ttft_s, handoff,
                        queued_behind_tokens=float(table.prefill_queue_tokens(slots[i:i + 1])[0] - queued[i]))
    if tbt_slo_s is not None and est.tbt_s > tbt_slo_s:
        est.why = f"its TBT while prefilling ({est.tbt_s * 1e3:.0f} ms) breaks the TBT SLO"
    elif float(score[i]) >= split_ttft_s:
        est.why = "the split path is faster" + (" once the stall its running requests take is counted" if est.tpot_cost_s else "")
    else:
        est.chosen = True
    return est


def split_handoff_s(view: RoutingView, split: RouteDecision) -> float:
    """What the split path pays at its decode node's step boundaries while it decodes (above)."""
    slot = view.names.index(split.decode_node)
    running = float(view.table.running[slot])
    if running <= 0:
        return 0.0
    step = float(view.decode_model.step_time(running))
    return step / 2 + max(0.0, step - split.est_ttft_s)


def local_decision(view: RoutingView, est: LocalEstimate, split: RouteDecision | None, policy: str) -> RouteDecision:
    """The request's decision on the local path: the decode node `est.node` serves it alone. The
    split decision it beat (None: no prefill node) stays visible through est.split_ttft_s and the
    candidates it recorded."""
    base = split if split is not None else RouteDecision(
        request_id=view.request_id, policy=policy, branch="no-prefill-node", prefill_node=est.node,
        decode_node=est.node, prompt_tokens=view.num_tokens, predicted_cached_tokens=0, local_cached_tokens=0,
        est_ttft_s=est.ttft_s, best_match_tokens=view.match.best_tokens,
        best_match_nodes=[view.names[s] for s in view.match.best_slots[:8]],
        num_decode_candidates=len(view.decode_slots))
    base.path = "local"
    if split is not None:   # the policy's arm (a fetch, a holder's cache) no longer applies
        base.branch = "local-prefill"
    base.prefill_node = base.decode_node = est.node
    base.predicted_cached_tokens = base.local_cached_tokens = est.cached_tokens
    base.fetch = None
    base.est_ttft_s, base.est_tbt_s = est.ttft_s, est.tbt_s
    base.local = est
    return base
