"""The pure parts of the topology lab run (benchmarks/lab/topology_run.py): joining the Conductor's
decisions with the prefill nodes' KV write times into per-request rows, and their summary; and the
prefill node's bounded log of KV write times (prefill_node/kv_write_log.py) that it reads."""
from __future__ import annotations

import pytest

from raypd.benchmarks.lab.topology_run import percentile, request_rows, summarize
from raypd.prefill_node.kv_write_log import KVWriteLog

RACK = {"10.0.0.1": 0, "10.0.0.2": 0, "10.0.1.3": 1, "10.0.1.4": 1}


def _decision(rid: str, p: str, d: str, send_s: float = 0.1, **kw) -> dict:
    return {"request_id": rid, "prefill_node": p, "decode_node": d, "prompt_tokens": 1500, "est_ttft_s": 1.0,
            "path": "split", "rejected": "", "candidates": [{"node": p, "send_s": send_s}], **kw}


def _collected() -> dict:
    return {"nodes": {"p0": {"role": "prefill", "ip": "10.0.0.1"}, "d0": {"role": "decode", "ip": "10.0.0.2"},
                      "p1": {"role": "prefill", "ip": "10.0.1.3"}, "d1": {"role": "decode", "ip": "10.0.1.4"}},
            "kv_writes": {"p0": {"recent": [["a", 0.04], ["b", 3.0]]}, "p1": {"recent": [["c", 0.05]]}},
            "decisions": [_decision("a", "p0", "d0"), _decision("b", "p0", "d1", 2.9), _decision("c", "p1", "d1"),
                          _decision("r", "p1", "d1", rejected="ttft"), _decision("l", "d1", "d1", path="local"),
                          _decision("x", "p1", "d0")]}


def test_rows_join_decisions_racks_and_kv_writes():
    rows = {r["request_id"]: r for r in request_rows(_collected(), RACK)}
    assert set(rows) == {"a", "b", "c", "x"}   # rejected and local requests move no KV between nodes
    assert rows["a"]["in_rack"] and rows["c"]["in_rack"]
    assert not rows["b"]["in_rack"] and (rows["b"]["prefill_rack"], rows["b"]["decode_rack"]) == (0, 1)
    assert rows["b"]["kv_write_s"] == 3.0 and rows["b"]["est_send_s"] == 2.9
    assert rows["x"]["kv_write_s"] is None    # the prefill node reported none for it


def test_summary_shares_and_percentiles():
    s = summarize(request_rows(_collected(), RACK), {"systems": {"run": {"completed": 4, "ttft_p50_s": 1.5,
                                                                         "ttft_p99_s": 4.0}}})
    assert (s["requests"], s["in_rack"], s["in_rack_share"]) == (4, 2, 0.5)
    assert s["kv_write"]["n"] == 3 and s["kv_write"]["p50_s"] == pytest.approx(0.05)
    assert s["kv_write_in_rack"]["max_s"] == 0.05 and s["kv_write_across"]["p99_s"] == 3.0
    assert (s["ttft_p50_s"], s["ttft_p99_s"], s["completed"]) == (1.5, 4.0, 4)
    assert s["pairs"] == {"p0->d0": 1, "p0->d1": 1, "p1->d0": 1, "p1->d1": 1}
    assert summarize([], None)["in_rack_share"] is None


def test_percentile():
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([0.0, 10.0], 99) == pytest.approx(9.9)


def test_kv_write_log_is_bounded_and_skips_requests_without_a_write():
    log = KVWriteLog(recent=2)
    log.record("a", {"kv_write_s": 0.5, "prefill_s": 1.0})
    log.record("failed", {"prefill_s": 1.0})
    log.record("b", {"kv_write_s": 0.25})
    log.record("c", {"kv_write_s": 1.0})
    st = log.stats()
    assert (st["count"], st["total_s"], st["max_s"]) == (3, 1.75, 1.0)
    assert st["recent"] == [["b", 0.25], ["c", 1.0]]


def test_a_prefill_node_reports_each_requests_kv_write_in_its_stats(sink):
    """One request through a PrefillNode and a DecodeNode in this process (fake transfer backend): the
    prefill node's stats()["kv_writes"] names it with the write time its PrefillResult carries."""
    import asyncio

    from raypd.decode_node.decode_node import DecodeNode
    from raypd.prefill_node.prefill_node import PrefillNode
    from tests.node.pd import PATIENT, prompt, request, stop_nodes

    prefill = PrefillNode("kvlog-prefill", engine_options={"num_blocks": 16}, transfer_options=PATIENT, aux_slots=2)
    decode = DecodeNode("kvlog-decode", engine_options={"num_blocks": 16}, transfer_options=PATIENT, aux_slots=2)
    try:
        req = request(prompt(20), bootstrap_address=prefill.duty.sender.bootstrap_address, reply_address=sink.address)

        async def main():
            await asyncio.gather(prefill.ready(), decode.ready())
            result, _ = await asyncio.gather(prefill.prefill(req), decode.generate(req))
            return result, await prefill.stats()
        result, stats = asyncio.run(main())
    finally:
        stop_nodes(prefill, decode)
    assert result.ok and stats["kv_writes"]["count"] == 1
    assert stats["kv_writes"]["recent"] == [[req.request_id, result.timings["kv_write_s"]]]
