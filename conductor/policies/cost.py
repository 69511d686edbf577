"""cost (the default): Mooncake's KVCache-centric choice (arXiv 2407.00079, Algorithm 1).

For every prefill candidate i, with prompt length n, local match c_i (its pool run), t_i tokens
past it in the node's tiers below the pool (host memory, disk), and the global best pool match B
held by node h:

    local (Branch A):  TTFT_i = queue_i + prefill_i(n - c_i | c_i)
      with its tiers:  TTFT_i = queue_i + load_i(t_i) + prefill_i(n - c_i - t_i | c_i + t_i)
    fetch (Branch B):  TTFT_i = fetch(B - c_i tokens, h -> i) + queue_i + prefill_i(n - B | B)

queue_i is the node's queued prefill tokens (reported + routed since) over its measured speed;
prefill_i is estimates.PrefillTimeModel with the node's measured speed; load_i is t_i's KV bytes
over each tier's load rate the node measured (RoutingView.tier_load_s); fetch is the topology's
transfer time, and moves another node's pool blocks only. Each candidate takes the cheapest
(Mooncake gates Branch B with a hand-tuned ratio; comparing the estimates needs no tuning). The k
best candidates are then paired with a decode node - by load and distance from that prefill node -
and the KV send time joins the estimate; the pair with the smallest TTFT wins. Imbalance is judged
per request: a loaded holder loses to an idle node exactly when its queue costs more than
recomputing (or fetching) elsewhere.

Branches recorded: "cold" (no node holds any of the prompt, in any tier), "local" (served from the
chosen node's own pool), "tier" (the chosen node loads part of the prompt back from its tiers below
the pool, on top of its pool run if any), "fetch" (Branch B), "recompute" (a holder exists but is
too busy, or its tiers load slower than computing; the chosen node computes the prefix again).
"""
from __future__ import annotations

import numpy as np

from raypd.conductor.decision import CandidateEstimate, PrefixFetch, RouteDecision
from raypd.conductor.policies.base import BranchA, DecodeField, RoutingPolicy, RoutingView, register_policy, require


@register_policy
class CostPolicy(RoutingPolicy):
    name = "cost"

    def route(self, view: RoutingView) -> RouteDecision:
        cfg = self.config.cost
        ps = require(view.prefill_slots, "prefill")
        n = view.num_tokens
        model = view.prefill_model
        a = BranchA.of(view, ps)
        cached, ttft = a.cached, a.ttft

        best = view.fetchable.best_tokens
        fetch_s = np.zeros(len(ps))
        use_fetch = np.zeros(len(ps), dtype=bool)
        holder = -1
        if cfg.allow_fetch and best > 0:
            holder = self._holder(view)
            gain = best - cached
            fetch_s = view.send_s(holder, ps, np.maximum(gain, 0)) + cfg.fetch_overhead_s
            ttft_b = fetch_s + a.queue_s + model.estimate(n - best, best, a.speed)
            use_fetch = (gain > 0) & (ttft_b < ttft)
            ttft = np.where(use_fetch, ttft_b, ttft)
        use_tier = a.use_tier & ~use_fetch

        k = min(cfg.top_k_prefill, len(ps))
        top = np.argpartition(ttft, k - 1)[:k] if k < len(ps) else np.arange(len(ps))
        top = top[np.argsort(ttft[top], kind="stable")]
        # pair each of the k best with its decode node in one (k x decode) pass
        decode = DecodeField.of(view)
        pslots = ps[top]
        send = view.send_matrix(pslots, decode.slots, n)
        score = send + cfg.decode_weight * decode.tbt[None, :]
        best_d = np.argmin(score, axis=1)
        rows = np.arange(len(top))
        total = ttft[top] + send[rows, best_d]
        j = int(np.argmin(total))
        shown: list[CandidateEstimate] = []
        for r, i in enumerate(top):
            c = a.candidate(view, int(i), int(ps[i]), float(send[r, best_d[r]]), float(total[r]),
                            view.names[decode.slots[best_d[r]]], hit=best if use_fetch[i] else None)
            if use_fetch[i]:
                c.fetch_tokens, c.fetch_from, c.fetch_s = int(best - cached[i]), view.names[holder], float(fetch_s[i])
                c.tier_used = False
            shown.append(c)
        i, p = int(top[j]), int(pslots[j])
        c = shown[j]
        d, tbt = int(decode.slots[best_d[j]]), float(decode.tbt[best_d[j]])
        dshown = decode.pick(view, p)[2]    # the nearest few, for the record
        fetch = None
        if use_fetch[i]:
            branch = "fetch"
            fetch = PrefixFetch(source=view.names[holder], target=view.names[p], num_tokens=best,
                                from_tokens=int(cached[i]), est_s=c.fetch_s)
        elif use_tier[i]:
            branch = "tier"
        elif cached[i] > 0:
            branch = "local"
        else:
            branch = "recompute" if best > 0 or (cfg.use_tiers and view.match.any_tier_hit) else "cold"
        return RouteDecision(
            request_id=view.request_id, policy=self.name, branch=branch, prefill_node=view.names[p],
            decode_node=view.names[d], prompt_tokens=n,
            predicted_cached_tokens=best if fetch else int(a.hit[i]), local_cached_tokens=int(cached[i]),
            est_ttft_s=c.ttft_s, est_tbt_s=tbt, best_match_tokens=best,
            best_match_nodes=[view.names[s] for s in view.match.best_slots[:8]],
            num_prefill_candidates=len(ps), num_decode_candidates=len(view.decode_slots),
            candidates=shown, decode_candidates=dshown, fetch=fetch)

    @staticmethod
    def _holder(view: RoutingView) -> int:
        """Among the nodes holding the best match, the one with the shortest queue serves fetches
        (its egress competes with its own work least)."""
        holders = np.array(view.fetchable.best_slots)
        q = view.table.prefill_queue_tokens(holders)
        return int(holders[int(np.argmin(q))])
