"""Readiness as the harness reads it: the documented body, a server without the route, and a kill's
recovery (live again in a newer incarnation, then a probe served)."""
from __future__ import annotations

import asyncio
import threading
import time

import aiohttp
import pytest

from raypd.benchmarks.chaos.health import HealthMonitor, Member, parse_ready
from raypd.benchmarks.chaos.held_blocks import held_after_drain


def body(decode0: str = "live", inc0: int = 0, conductor: str = "live", cinc: int = 0, status: str = "ok") -> dict:
    return {"status": status,
            "nodes": [{"name": "raypd-decode-0", "role": "decode", "state": decode0, "incarnation": inc0,
                       "restarts": inc0},
                      {"name": "raypd-decode-1", "role": "decode", "state": "live", "incarnation": 0, "restarts": 0}],
            "conductor": {"state": conductor, "incarnation": cinc}}


class T:
    def __init__(self, name: str, role: str):
        self.name, self.role = name, role


TARGETS = [T("raypd-decode-0", "decode"), T("raypd-decode-1", "decode"), T("raypd-conductor", "conductor")]


def test_parse_the_documented_body():
    r = parse_ready(200, body(decode0="restarting", inc0=1, cinc=2))
    assert r.nodes["raypd-decode-0"] == Member("restarting", 1)
    assert r.member("raypd-conductor", "conductor") == Member("live", 2)
    assert r.member("raypd-prefill-9", "prefill") is None


@pytest.mark.parametrize("bad", [[], {"status": "ok"}, {"nodes": [{"state": "live"}]},
                                 {"nodes": [{"name": "a", "incarnation": "1"}]}])
def test_parse_refuses_other_shapes(bad):
    with pytest.raises(ValueError):
        parse_ready(200, bad)


def _with_monitor(server, fn):
    async def go():
        async with aiohttp.ClientSession() as http:
            return await fn(HealthMonitor(http, server.base, interval_s=0.05), http)
    return asyncio.run(go())


def test_live_names_and_incarnations(server):
    server.state["ready"] = (200, body(decode0="restarting", inc0=3))

    async def fn(m, _):
        assert await m.wait_ready(5)
        return m.live_names(TARGETS), m.incarnation("raypd-decode-0", "decode"), m.missing
    live, inc, missing = _with_monitor(server, fn)
    assert live == {"raypd-decode-1", "raypd-conductor"} and inc == 3 and missing is None


def test_a_503_with_an_error_body_is_not_ready_not_missing(server):
    server.state["ready"] = (503, {"error": {"message": "no node"}})

    async def fn(m, _):
        ready = await m.read()
        return ready.http_status, ready.status, m.missing, await m.wait_ready(0.2)
    assert _with_monitor(server, fn) == (503, "unavailable", None, False)


def test_without_the_route_readiness_is_missing_and_plain_health_decides(server):
    async def fn(m, _):
        ok = await m.wait_ready(5)
        rec = await m.recovery_s("raypd-decode-0", "decode", 0, time.monotonic(), time.monotonic() + 5, _probe_ok)
        return ok, m.missing, m.live_names(TARGETS), rec
    ok, missing, live, rec = _with_monitor(server, fn)
    assert ok and "404" in missing and live is None and rec is None


async def _probe_ok() -> bool:
    return True


def test_recovery_needs_a_newer_live_incarnation_then_a_probe(server):
    server.state["ready"] = (200, body(decode0="restarting", inc0=0))
    probes = []

    def come_back():
        time.sleep(0.3)
        server.state["ready"] = (200, body(decode0="live", inc0=0))  # live, but the old incarnation: not yet
        time.sleep(0.3)
        server.state["ready"] = (200, body(decode0="live", inc0=1))

    async def probe() -> bool:
        probes.append(time.monotonic())
        return len(probes) >= 2  # the first probe fails: recovery waits for one that is served

    async def fn(m, _):
        stop = asyncio.Event()
        poll = asyncio.create_task(m.run(stop))
        killed = time.monotonic()
        threading.Thread(target=come_back, daemon=True).start()
        rec = await m.recovery_s("raypd-decode-0", "decode", 0, killed, killed + 10, probe)
        stop.set()
        await poll
        return rec
    rec = _with_monitor(server, fn)
    assert rec is not None and 0.6 <= rec < 5 and len(probes) == 2


def test_recovery_gives_up_at_the_deadline(server):
    server.state["ready"] = (200, body(decode0="restarting", inc0=0))

    async def fn(m, _):
        stop = asyncio.Event()
        poll = asyncio.create_task(m.run(stop))
        t = time.monotonic()
        rec = await m.recovery_s("raypd-decode-0", "decode", 0, t, t + 0.4, _probe_ok)
        stop.set()
        await poll
        return rec
    assert _with_monitor(server, fn) is None


def test_held_after_drain_waits_for_idle(server):
    server.state["nodes"] = {"nodes": [{"name": "d0", "held": {"requests": 1, "streams": 1}}]}

    def free():
        time.sleep(0.3)
        server.state["nodes"] = {"nodes": [{"name": "d0", "held": {"requests": 0, "streams": 0}}]}

    async def fn(_, http):
        threading.Thread(target=free, daemon=True).start()
        return await held_after_drain(http, server.base, timeout_s=5, interval_s=0.05)
    held = _with_monitor(server, fn)
    assert held.idle and held.total == 0 and held.waited_s >= 0.25


def test_held_after_drain_is_bounded(server):
    server.state["nodes"] = {"nodes": [{"name": "d0", "held": {"requests": 2}}, {"name": "d1", "error": "dead"}]}

    async def fn(_, http):
        return await held_after_drain(http, server.base, timeout_s=0.3, interval_s=0.05)
    held = _with_monitor(server, fn)
    assert not held.idle and held.total == 2 and held.errors == {"d1": "dead"} and held.waited_s < 2


def test_a_name_listed_twice_is_a_duplicate():
    b = body()
    b["nodes"].append(dict(b["nodes"][0]))
    assert parse_ready(200, b).duplicates == ("raypd-decode-0",)
    assert parse_ready(200, body()).duplicates == ()


def test_a_hosts_nodes_back_after_a_partition_and_after_a_host_kill(server):
    server.state["ready"] = (200, body(decode0="restarting", inc0=0))

    def come_back():
        time.sleep(0.3)
        server.state["ready"] = (200, body(decode0="live", inc0=0))   # the same incarnation: back from a partition
        time.sleep(0.4)
        server.state["ready"] = (200, body(decode0="live", inc0=1))   # restarted elsewhere: back from a host kill

    async def fn(m, _):
        stop = asyncio.Event()
        poll = asyncio.create_task(m.run(stop))
        t = time.monotonic()
        threading.Thread(target=come_back, daemon=True).start()
        same, newer = await asyncio.gather(
            m.nodes_back_s({"raypd-decode-0": 0}, t, t, t + 5, _probe_ok, newer=False),
            m.nodes_back_s({"raypd-decode-0": 0}, t, t, t + 5, _probe_ok, newer=True))
        stop.set()
        await poll
        return same, newer
    same, newer = _with_monitor(server, fn)
    assert 0.3 <= same < 0.7 <= newer < 5
