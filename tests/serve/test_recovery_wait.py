"""A cluster with one decode node (the default `raypd serve`) through its node's failure, without Ray:
the real round-robin router over a NodeSet whose membership the test moves as the node pool would
(LIVE -> RESTARTING -> LIVE with a new incarnation), and a driver double that plays one script per
attempt. A request that finds no node waits for the restarting one instead of answering 503; a
failed node is usable again once it restarted, or as a last resort while it stays live; a node dead
for good is a 503 at once. Retries, replays and waits are counted by reason. (The same with a real
node SIGKILLed: tests/serve/test_restart_of_the_decode_node.py.)"""
from __future__ import annotations

import asyncio
import json
from dataclasses import replace

from raypd.cluster.client.membership import Member, Membership, MemberState
from raypd.cluster.client.node_handles import NodeHandle
from raypd.cluster.client.node_set import NodeSet
from raypd.cluster.client.router import RoundRobinRouter
from raypd.cluster.openai.metrics import FailoverMetrics
from raypd.protocol.messages import HostInfo, TokenChunk
from raypd.protocol.roles import Role
from tests.fake_metrics import FakeMetricsAPI
from tests.serve.test_ingress_app import MODEL, app_for, call, tokens

HOST = HostInfo("n0", "127.0.0.1", "localhost", 0)
PREFILL = NodeHandle("raypd-prefill-0", Role.PREFILL, None, HOST, 64)
DECODE = NodeHandle("raypd-decode-0", Role.DECODE, None, HOST, 64)
DIED = TokenChunk("", (), finished=True, error="node raypd-decode-0 failed: ActorDiedError",
                  failed_node=DECODE.name)
POLL_S = 0.02


def membership(version: int, decode_state: MemberState, incarnation: int = 0) -> Membership:
    return Membership(version, (Member(PREFILL), Member(DECODE, decode_state, incarnation)))


class Cluster:
    """The membership an ingress replica sees, moved by the test as the pool's supervisor would."""

    def __init__(self):
        self.nodes = NodeSet(membership(0, MemberState.LIVE))

    def set(self, decode_state: MemberState, incarnation: int = 0) -> None:
        self.nodes.membership = membership(self.nodes.membership.version + 1, decode_state, incarnation)

    def restart_later(self, delay_s: float, incarnation: int = 1) -> None:
        """The decode node is restarting now and live again (a new incarnation) after delay_s."""
        self.set(MemberState.RESTARTING, incarnation - 1)
        asyncio.get_running_loop().call_later(delay_s, self.set, MemberState.LIVE, incarnation)


class ScriptedDriver:
    """Plays scripts[i] for the i-th attempt (before it, on_attempt[i](), if any); records the route."""

    def __init__(self, scripts, on_failure=None):
        self.scripts = scripts
        self.on_failure = on_failure
        self.routes: list[tuple[str, str | None]] = []

    async def generate(self, request_id, prompt_token_ids, params, prefill, decode=None):
        script = self.scripts[len(self.routes)]
        self.routes.append((prefill.name, decode.name if decode is not None else None))
        for c in script:
            await asyncio.sleep(0)
            if c.error and self.on_failure is not None:
                self.on_failure()
            yield replace(c, request_id=request_id)


def body(**extra) -> bytes:
    return json.dumps({"model": MODEL, "prompt": "Hello", "max_tokens": 8, "temperature": 0, **extra}).encode()


def run(tokenizer, driver, cluster: Cluster, **options) -> tuple[int, dict, FakeMetricsAPI]:
    api = FakeMetricsAPI()

    async def go():
        app = app_for(tokenizer, driver, RoundRobinRouter(cluster.nodes), nodes=cluster.nodes,
                      recovery_poll_s=POLL_S, metrics=FailoverMetrics(api), **options)
        return await call(app, body())
    status, raw = asyncio.run(go())
    return status, json.loads(raw), api


def counted(api: FakeMetricsAPI, name: str, **tags: str) -> float:
    metric = api.made.get(f"raypd_ingress_{name}")
    return metric.value(**tags) if metric is not None else 0.0


def finished(tokenizer, text: str) -> list[TokenChunk]:
    return [TokenChunk("", tokens(tokenizer, text)), TokenChunk("", (), finished=True, finish_reason="length")]


def test_a_replay_waits_for_the_only_decode_node_to_restart(tokenizer):
    cluster = Cluster()
    first = tokens(tokenizer, " The capital")
    driver = ScriptedDriver([[TokenChunk("", first), DIED], finished(tokenizer, " is Paris")],
                            on_failure=lambda: cluster.restart_later(0.3))
    status, out, api = run(tokenizer, driver, cluster)
    assert status == 200 and out["choices"][0]["text"] == " The capital is Paris"
    # Both attempts on the same pair: the second on the decode node's new incarnation.
    assert driver.routes == [(PREFILL.name, DECODE.name)] * 2
    assert counted(api, "replays", reason="decode_node_failed") == 1
    assert counted(api, "retries") == 0 and counted(api, "recovery_waits") == 1


def test_a_new_request_waits_while_the_only_decode_node_restarts(tokenizer):
    cluster = Cluster()
    driver = ScriptedDriver([finished(tokenizer, " Paris")])

    async def restarting_then_run():
        cluster.restart_later(0.3)
        api = FakeMetricsAPI()
        app = app_for(tokenizer, driver, RoundRobinRouter(cluster.nodes), nodes=cluster.nodes,
                      recovery_poll_s=POLL_S, metrics=FailoverMetrics(api))
        return (*await call(app, body()), api)
    status, raw, api = asyncio.run(restarting_then_run())
    assert status == 200 and json.loads(raw)["choices"][0]["text"] == " Paris"
    assert driver.routes == [(PREFILL.name, DECODE.name)]
    assert counted(api, "recovery_waits") == 1 and counted(api, "retries") == 0


def test_the_wait_is_bounded(tokenizer):
    cluster = Cluster()
    driver = ScriptedDriver([[DIED]], on_failure=lambda: cluster.set(MemberState.RESTARTING))
    status, out, api = run(tokenizer, driver, cluster, recovery_wait_s=0.3)
    assert status == 503 and "no live node" in out["error"]["message"]
    assert counted(api, "retries", reason="decode_node_failed") == 1 and counted(api, "recovery_waits") == 1


def test_a_node_dead_for_good_is_503_at_once(tokenizer):
    cluster = Cluster()
    driver = ScriptedDriver([[DIED]], on_failure=lambda: cluster.set(MemberState.DEAD))
    status, out, api = run(tokenizer, driver, cluster, recovery_wait_s=600)
    assert status == 503 and len(driver.routes) == 1
    assert counted(api, "recovery_waits") == 0  # nothing to wait for: no waiting


def test_a_failed_node_that_stays_live_is_retried_as_a_last_resort(tokenizer):
    """It failed this request (a lost message, a timeout) but answers its probes: after the grace it
    takes the retry, since nothing else can."""
    cluster = Cluster()
    driver = ScriptedDriver([[DIED], finished(tokenizer, " Paris")])
    status, out, api = run(tokenizer, driver, cluster, fail_open_after_s=0.2)
    assert status == 200 and out["choices"][0]["text"] == " Paris"
    assert driver.routes == [(PREFILL.name, DECODE.name)] * 2
    assert counted(api, "retries", reason="decode_node_failed") == 1 and counted(api, "recovery_waits") == 1


def test_a_failed_node_stays_excluded_while_another_can_serve(tokenizer):
    """Two decode nodes: the retry goes to the other one, even after the grace, and nothing waits."""
    decode1 = replace(DECODE, name="raypd-decode-1")
    cluster = Cluster()
    cluster.nodes.membership = Membership(1, (Member(PREFILL), Member(DECODE), Member(decode1)))
    driver = ScriptedDriver([[DIED], finished(tokenizer, " Paris"), finished(tokenizer, " Paris")])
    status, _, api = run(tokenizer, driver, cluster, fail_open_after_s=0.0)
    assert status == 200
    assert driver.routes[1] == (PREFILL.name, decode1.name)
    assert counted(api, "recovery_waits") == 0
