"""The Conductor actor on a local Ray cluster with fake node actors (they implement the node-side
contract of conductor/actor.py and record the calls). One Ray start for the module: it costs ~4 s."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import pytest
import ray

from raypd.conductor.config import ConductorConfig, MigrationConfig
from raypd.conductor.errors import AdmissionRejected
from raypd.protocol.block_hash import chained_block_hashes
from raypd.protocol.messages import PrefillResult
from tests.conductor.helpers import EventMaker, batch, host, load

pytestmark = pytest.mark.cluster  # starts Ray, a server or other processes

BS = 16
PROMPT = list(range(700, 900))
PREFIX = PROMPT[:160]


class FakeNode:
    """A prefill node's Conductor-facing surface: snapshot, export, import."""

    def __init__(self, name: str, tokens: list[int]):
        self.name = name
        em = EventMaker(BS)
        self.snapshot = [em.stored(tokens)] if tokens else []
        self.seq = 7                    # pretend seven events happened before the Conductor looked
        self.calls: list[tuple] = []

    def kv_snapshot(self):
        self.calls.append(("kv_snapshot",))
        return self.seq, self.snapshot

    def export_prefix(self, token_ids, room, target_node):
        self.calls.append(("export", len(token_ids), room, target_node))
        return PrefillResult(f"migrate-{room}", True)

    def import_prefix(self, token_ids, room, source_bootstrap_address):
        self.calls.append(("import", len(token_ids), room, source_bootstrap_address))
        return PrefillResult(f"migrate-{room}", True, num_cached_tokens=len(token_ids))

    def abort_migration(self, room):
        self.calls.append(("abort", room))

    def get_calls(self):
        return self.calls


@pytest.fixture(scope="module")
def ray_local():
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)  # never a `ray start` cluster
    yield
    ray.shutdown()


@contextmanager
def heartbeats(conductor, names: set[str], every_s: float = 0.1):
    """Heartbeat the nodes in `names` (the caller may remove some) from a thread until the block ends,
    as live nodes do: on a loaded machine the test's own steps can outlast the heartbeat timeout."""
    stop = threading.Event()

    def beat():
        while not stop.wait(every_s):
            ray.get([conductor.heartbeat.remote(n) for n in list(names)])
    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield names
    finally:
        stop.set()
        thread.join(10)


def wait_for(pred, timeout=10.0):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_conductor_actor_routes_resyncs_fetches_and_expires(ray_local):
    from raypd.conductor.actor import start_conductor

    cfg = ConductorConfig(block_size=BS, heartbeat_timeout_s=1.5, tick_interval_s=0.1, ttft_slo_s=30.0,
                          migration=MigrationConfig(enabled=False))
    conductor = start_conductor("raypd-conductor-test", config=cfg)
    assert ray.get_actor("raypd-conductor-test")._actor_id == conductor._actor_id
    Node = ray.remote(num_cpus=0)(FakeNode)
    p0, p1 = Node.remote("p0", PREFIX), Node.remote("p1", [])
    ray.get([conductor.register_node.remote("p0", "prefill", host("n0"), p0, "tcp://p0:1"),
             conductor.register_node.remote("p1", "prefill", host("n0"), p1, "tcp://p1:1"),
             conductor.register_node.remote("d0", "decode", host("n0"))])

    with heartbeats(conductor, {"p0", "p1", "d0"}) as beating:
        # p0's first batch says seq 8: the Conductor missed its history and pulls a snapshot
        em = EventMaker(BS)
        em.seq = 7
        late = em.stored(PROMPT[:176])
        assert ray.get(conductor.report_kv_events.remote(batch("p0", late))) is False
        assert wait_for(lambda: ray.get(conductor.status.remote())["resyncs"] == 1)
        assert ray.get(p0.get_calls.remote()) == [("kv_snapshot",)]

        d = ray.get(conductor.route.remote("r1", PROMPT))
        assert (d.prefill_node, d.decode_node, d.predicted_cached_tokens) == ("p0", "d0", 160)

        # p0 swamped: the decision fetches p0's prefix into p1 before returning
        ray.get(conductor.report_load.remote(load("p0", queued=50_000, speed=1000.0, timestamp=time.time())))
        ray.get(conductor.report_load.remote(load("p1", queued=0, speed=1000.0, timestamp=time.time())))
        d = ray.get(conductor.route.remote("r2", PROMPT))
        assert (d.branch, d.prefill_node, d.predicted_cached_tokens) == ("fetch", "p1", 160)
        exp = ray.get(p0.get_calls.remote())[-1]
        imp = ray.get(p1.get_calls.remote())[-1]
        assert exp[0] == "export" and imp[0] == "import" and exp[1] == imp[1] == 160
        assert exp[2] == imp[2] and exp[3] == "p1" and imp[3] == "tcp://p0:1"   # one room, p0's bootstrap

        # SLO admission crosses the actor boundary as the same typed error
        ray.get(conductor.report_load.remote(load("p1", queued=50_000, speed=1000.0, timestamp=time.time())))
        with pytest.raises(AdmissionRejected):
            ray.get(conductor.route.remote("r3", list(range(10_000, 10_200))))

        # only p1 and d0 keep heartbeating: p0 leaves routing once its heartbeats stop
        beating.discard("p0")
        assert wait_for(lambda: not ray.get(conductor.status.remote())["nodes"]["p0"]["alive"], timeout=30.0)
        st = ray.get(conductor.status.remote())
        assert st["nodes"]["p0"]["alive"] is False and "heartbeat" in st["nodes"]["p0"]["death_reason"]
        ray.get(conductor.report_load.remote(load("p1", queued=0, speed=1000.0, timestamp=time.time())))
        d = ray.get(conductor.route.remote("r4", PROMPT))
        assert d.prefill_node == "p1" and d.predicted_cached_tokens == 0
        assert [x.request_id for x in ray.get(conductor.recent_decisions.remote(2))] == ["r3", "r4"]
    assert chained_block_hashes(PREFIX, BS)   # the fake nodes used the engine's hashes too
