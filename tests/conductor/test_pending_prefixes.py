"""Blocks routed to a prefill node count as held there until its KV events report them or the entry
expires: the second request of a new prefix follows the first instead of recomputing it elsewhere,
no fetch is planned from blocks a node does not hold yet, and a dead node's entries go with it."""
from __future__ import annotations

from raypd.conductor.pending_prefixes import PendingPrefixes
from raypd.conductor.prefix_index import prompt_block_hashes
from tests.conductor.helpers import host, load
from tests.conductor.test_policies import BS, PREFIX, PROMPT, hold, loads, make_core


def test_leading_runs_per_slot_and_reference_counts():
    p = PendingPrefixes()
    chain = prompt_block_hashes(PROMPT, BS)
    p.add(0, chain, until=10.0)
    p.add(1, chain[:16], until=20.0)
    p.add(1, chain[:16], until=30.0)
    got = p.tokens_by_slot(chain, BS, 3)
    assert got.tolist() == [len(chain) * BS, 16 * BS, 0]
    # Matched to STRIDE-block precision: a run of 13 pending blocks counts as 8.
    assert p.tokens_by_slot(chain[:13] + [1, 2, 3], BS, 3).tolist() == [8 * BS, 8 * BS, 0]
    p.expire(15.0)                      # slot 0's entry ends; slot 1 still has two
    assert p.tokens_by_slot(chain, BS, 3).tolist() == [0, 16 * BS, 0]
    p.expire(25.0)
    assert p.tokens_by_slot(chain, BS, 3).tolist() == [0, 16 * BS, 0]
    p.remove_slot(1)
    assert p.tokens_by_slot(chain, BS, 3).tolist() == [0, 0, 0] and len(p) == 0
    p.expire(100.0)                      # nothing left to expire: no error


def half_way(core, node: str) -> None:
    """Half a second on: `node` has computed half of the 1000-token prompt routed to it."""
    core.clock.advance(0.5)
    for name in ("p0", "p1", "p2"):
        core.report_load(load(name, queued=500 if name == node else 0, speed=1000.0, timestamp=core.clock()))


def test_second_request_of_a_new_prefix_follows_the_first():
    core = make_core("cost", pending_prefixes=True)
    loads(core, p0=0, p1=0, p2=0)
    first = core.route("r1", PROMPT)
    assert first.predicted_cached_tokens == 0
    half_way(core, first.prefill_node)
    second = core.route("r2", PROMPT[:992] + [7] * 8)   # same 62 leading blocks, another question
    assert second.prefill_node == first.prefill_node
    assert second.predicted_cached_tokens == 992 and second.fetch is None
    # Without pending prefixes the second request recomputes the whole prefix on an idle node.
    plain = make_core("cost", pending_prefixes=False)
    loads(plain, p0=0, p1=0, p2=0)
    a = plain.route("r1", PROMPT)
    half_way(plain, a.prefill_node)
    b = plain.route("r2", PROMPT[:992] + [7] * 8)
    assert b.predicted_cached_tokens == 0 and b.prefill_node != a.prefill_node


def test_no_fetch_of_blocks_a_node_has_not_reported():
    core = make_core("cost", pending_prefixes=True)
    hold(core, "p0", PREFIX)                             # p0 really holds 960 tokens
    loads(core, p0=0, p1=50_000, p2=50_000)
    assert core.route("r1", PROMPT).prefill_node == "p0"  # pending there now: all 992 tokens
    loads(core, p0=50_000, p1=0, p2=0)                    # p0 swamped: fetch to an idle node
    d = core.route("r2", PROMPT)
    assert d.fetch is not None and d.fetch.source == "p0"
    assert d.fetch.num_tokens == 960 == d.predicted_cached_tokens  # what p0 holds, not what it will


def test_entries_expire_and_die_with_their_node():
    core = make_core("cost", pending_prefixes=True, pending_ttl_factor=1.0)
    loads(core, p0=0, p1=0, p2=0)
    first = core.route("r1", PROMPT)
    core.clock.advance(max(first.est_ttft_s, 1.0) + 0.01)   # its KV events never came (aborted)
    for name in ("p0", "p1", "p2"):
        core.report_load(load(name, queued=0, speed=1000.0, timestamp=core.clock()))
    assert core.route("r2", PROMPT).predicted_cached_tokens == 0
    node = core.route("r3", PROMPT).prefill_node            # pending again, on that node
    assert core.route("r4", PROMPT).predicted_cached_tokens == 992
    core.mark_dead(node)
    core.register_node("p9", "prefill", host("hA"))
    d = core.route("r5", PROMPT)
    assert d.predicted_cached_tokens == 0 and d.prefill_node != node
