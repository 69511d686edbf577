"""/health read during the run (benchmarks/autoscale/health.py, run.py's settle): nodes per role per
state, the optional autoscale key kept raw (its orders gathered once each), bodies of another shape
counted as unreadable, and the wait for the pool at its minimum, against a small aiohttp server on
127.0.0.1 in the test's own event loop."""
from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web

from raypd.benchmarks.autoscale.health import HealthSampler, parse_health
from raypd.benchmarks.autoscale.run import settle
from tests.bench_tenants.fake_server import client_session, serve


def node(name: str, state: str, role: str = "mixed") -> dict:
    return {"name": name, "role": role, "state": state, "incarnation": 0, "restarts": 0}


AUTOSCALE = {"roles": {"mixed": {"live": 2, "starting": 1, "draining": 0, "least": 1, "most": 3}},
             "slo": {"ttft_attainment": 0.5, "tpot_attainment": 1.0, "samples": 40},
             "orders": [{"role": "mixed", "delta": 1, "reason": "ttft", "at": 12.5}]}


def test_nodes_are_counted_per_role_and_state():
    body = {"status": "ok", "nodes": [node("m0", "live"), node("m1", "live"), node("m2", "draining"),
                                      node("p0", "restarting", "prefill")], "conductor": {"state": "live"}, "model": "x"}
    s = parse_health(3.5, 200, body)
    assert (s.t_s, s.http_status, s.status) == (3.5, 200, "ok")
    assert s.roles == {"mixed": {"draining": 1, "live": 2}, "prefill": {"restarting": 1}}
    assert s.count("mixed", "live") == 2 and s.count("mixed", "dead") == 0 and s.count("decode", "live") == 0
    assert s.autoscale is None and s.orders == [] and s.starting("mixed") == 0
    assert "autoscale" not in s.as_json()


def test_the_autoscale_key_is_kept_raw_without_its_orders():
    s = parse_health(1.0, 200, {"status": "ok", "nodes": [node("m0", "live")], "autoscale": AUTOSCALE})
    assert s.autoscale == {"roles": AUTOSCALE["roles"], "slo": AUTOSCALE["slo"]}
    assert s.orders == AUTOSCALE["orders"]
    assert s.starting("mixed") == 1 and s.starting("decode") == 0
    assert s.as_json()["autoscale"] == s.autoscale
    odd = parse_health(1.0, 200, {"status": "ok", "nodes": [], "autoscale": {"roles": "?", "orders": "?"}})
    assert odd.autoscale == {"roles": "?"} and odd.orders == [] and odd.starting("mixed") == 0


def test_an_unavailable_pool_is_a_sample_too():
    s = parse_health(2.0, 503, {"status": "unavailable", "nodes": [node("m0", "dead")]})
    assert s.http_status == 503 and s.status == "unavailable" and s.roles == {"mixed": {"dead": 1}}


@pytest.mark.parametrize("body", [None, [], {"status": "ok"}, {"nodes": "x"}, {"nodes": [{"name": "m0"}]},
                                  {"nodes": [{"role": "mixed", "state": 3}]}])
def test_a_body_of_another_shape_is_refused(body):
    with pytest.raises(ValueError):
        parse_health(0.0, 200, body)


def health_app(bodies: list) -> web.Application:
    """Each GET /health answers the next of `bodies` ((status, body or raw bytes)), then the last again."""
    calls = [0]

    async def health(request: web.Request) -> web.Response:
        status, body = bodies[min(calls[0], len(bodies) - 1)]
        calls[0] += 1
        if isinstance(body, bytes):
            return web.Response(body=body, status=status)
        return web.json_response(body, status=status)
    app = web.Application()
    app.router.add_get("/health", health)
    return app


def test_the_sampler_keeps_each_reading_gathers_each_order_once_and_counts_what_it_cannot_read():
    later = {**AUTOSCALE, "orders": AUTOSCALE["orders"] + [{"role": "mixed", "delta": -1, "reason": "idle", "at": 90}]}
    bodies = [(200, {"status": "ok", "nodes": [node("m0", "live")], "autoscale": AUTOSCALE}),
              (200, b"not json"),
              (503, {"status": "unavailable", "nodes": [node("m0", "dead")]}),
              (500, {"detail": "boom"}),
              (200, {"status": "ok", "nodes": [node("m0", "live"), node("m1", "draining")], "autoscale": later})]

    async def run():
        async with serve(health_app(bodies)) as base, client_session() as http:
            sampler = HealthSampler(http, base, time.perf_counter(), interval_s=0.01)
            for _ in bodies:
                await sampler.read_once()
            return sampler
    sampler = asyncio.run(run())
    assert [(s.http_status, s.roles) for s in sampler.samples] == [
        (200, {"mixed": {"live": 1}}), (503, {"mixed": {"dead": 1}}), (200, {"mixed": {"draining": 1, "live": 1}})]
    assert sampler.unreadable == 2
    assert sampler.orders == later["orders"]
    assert sampler.autoscale_seen
    assert all(0 <= s.t_s < 30 for s in sampler.samples)


def test_the_sampler_runs_until_stopped():
    async def run():
        async with serve(health_app([(200, {"status": "ok", "nodes": [node("m0", "live")]})])) as base, \
                client_session() as http:
            sampler, stop = HealthSampler(http, base, time.perf_counter(), interval_s=0.05), asyncio.Event()
            task = asyncio.create_task(sampler.run(stop))
            while len(sampler.samples) < 3:
                await asyncio.sleep(0.01)
            stop.set()
            await asyncio.wait_for(task, 5)
            return sampler
    sampler = asyncio.run(run())
    assert len(sampler.samples) >= 3 and not sampler.autoscale_seen
    assert [s.t_s for s in sampler.samples] == sorted(s.t_s for s in sampler.samples)


def test_the_wait_before_the_step_ends_when_the_pool_is_at_its_minimum_and_ok():
    grown = {"status": "ok", "nodes": [node("m0", "live"), node("m1", "draining")]}
    starting = {"status": "ok", "nodes": [node("m0", "live")],
                "autoscale": {"roles": {"mixed": {"live": 1, "starting": 1, "draining": 0}}}}
    at_min = {"status": "ok", "nodes": [node("m0", "live")]}
    bodies = [(503, {"status": "unavailable", "nodes": []}), (200, grown), (200, starting), (200, at_min)]

    async def run(timeout_s: float, answers: list):
        async with serve(health_app(answers)) as base, client_session() as http:
            return await settle(HealthSampler(http, base, time.perf_counter(), interval_s=0.01), {"mixed": 1},
                                timeout_s)
    done = asyncio.run(run(30.0, bodies))
    assert done["at_min"] and done["pool"] == {"mixed": {"live": 1}} and done["waited_s"] < 30
    late = asyncio.run(run(0.2, bodies[:2]))                      # never at the minimum: bounded
    assert not late["at_min"] and late["pool"] == {"mixed": {"draining": 1, "live": 1}}
