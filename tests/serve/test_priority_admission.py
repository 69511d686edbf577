"""Priority at the ingress (cluster/serve/admission.py, cluster/openai/api_keys.py), without Ray: the
gate's line ordered by priority then arrival, a full line that refuses the least urgent (a waiter
displaced by a more urgent newcomer gets the 429), API keys that name a tenant and a default
priority, and through the real app: the order in which waiting requests reach the nodes and the
priority and tenant each one carries there (its field, else its key's default; its key's tenant)."""
from __future__ import annotations

import asyncio
import json

import pytest

from raypd.cluster.openai.api_errors import RateLimited
from raypd.cluster.openai.api_keys import ANONYMOUS, Caller, KeyRing, KeysFileError
from raypd.cluster.serve.admission import AdmissionGate, requested_priority
from raypd.cluster.serve.app import build_app
from raypd.cluster.serve.config import ServeConfig, ServeConfigError
from raypd.cluster.serve.generation import Generator
from raypd.cluster.serve.service import OpenAIService
from raypd.protocol.messages import TokenChunk
from tests.serve.test_admission import HeldDriver, post
from tests.serve.test_failover import RecordingRouter
from tests.serve.test_ingress_app import LIMITS, MODEL, tokens


# -- the gate ------------------------------------------------------------------------------------------
def test_waiters_get_slots_most_urgent_first_then_in_arrival_order():
    async def run():
        gate = AdmissionGate(max_ongoing=1, max_queued=5, max_burst=0)
        await gate.acquire()
        order: list[str] = []

        async def wait(name: str, priority: int):
            await gate.acquire(priority)
            order.append(name)
        waiters = [asyncio.ensure_future(wait(n, p)) for n, p in
                   [("batch", 5), ("a", 0), ("urgent", -1), ("b", 0), ("later-batch", 5)]]
        await asyncio.sleep(0)
        for _ in waiters:
            gate.release()
            await asyncio.sleep(0)
        await asyncio.gather(*waiters)
        assert order == ["urgent", "a", "b", "batch", "later-batch"]
        gate.release()
        assert (gate.ongoing, gate.queued) == (0, 0)
    asyncio.run(run())


def test_a_full_line_refuses_the_least_urgent_newest_of_it_and_the_newcomer():
    async def run():
        gate = AdmissionGate(max_ongoing=1, max_queued=2, max_burst=0)
        await gate.acquire()
        old_batch = asyncio.ensure_future(gate.acquire(5))
        new_batch = asyncio.ensure_future(gate.acquire(5))
        await asyncio.sleep(0)
        with pytest.raises(RateLimited):          # as urgent as the least urgent waiter: the newcomer goes
            await gate.acquire(5)
        urgent = asyncio.ensure_future(gate.acquire(-1))   # more urgent: the newest batch waiter goes
        await asyncio.sleep(0)
        with pytest.raises(RateLimited) as e:
            await new_batch
        assert e.value.code == "ingress_queue_full" and "more urgent" in str(e.value)
        assert gate.state()["refused"] == 2 and gate.state()["displaced"] == 1 and gate.queued == 2
        gate.release()
        await urgent                              # the urgent newcomer is served before the older batch one
        assert not old_batch.done()
        gate.release()
        await old_batch
        gate.release()
        assert (gate.ongoing, gate.queued) == (0, 0)
    asyncio.run(run())


def test_the_priority_read_from_a_body_falls_back_to_the_default():
    assert requested_priority(b'{"model": "m", "priority": -7}', 3) == -7
    for body in (b'{"model": "m"}', b'{"priority": "high"}', b'{"priority": true}', b'{"priority": 1e3}',
                 b'{"priority": 4294967296}', b'[1, 2]', b"not json", b""):
        assert requested_priority(body, 3) == 3, body


# -- API keys ------------------------------------------------------------------------------------------
def test_a_keys_file_names_each_keys_tenant_and_default_priority(tmp_path):
    path = tmp_path / "keys.yaml"
    path.write_text("keys:\n  - key: sk-web\n    tenant: web\n    priority: -1\n  - key: sk-batch\n    priority: 10\n")
    ring = KeyRing.from_file(path)
    assert ring.caller(b"sk-web") == Caller("web", -1)
    assert ring.caller(b"sk-batch") == Caller("key-1", 10)
    assert ring.caller(b"sk-we") is None and ring.caller(b"") is None
    assert "sk-" not in repr(ring) and "web" in repr(ring)
    both = KeyRing.single("sk-one").merged(ring)
    assert len(both) == 3 and both.caller(b"sk-one") == Caller("default", 0)


@pytest.mark.parametrize("text, says", [
    ("keys: []\n", "non-empty list"),
    ("keys:\n  - tenant: web\n", "keys[0]: `key`"),
    ("keys:\n  - key: a\n  - key: a\n", "keys[1]: the same key"),
    ("keys:\n  - key: a\n    priority: high\n", "keys[0]: `priority`"),
    ("keys:\n  - key: a\n    priority: true\n", "keys[0]: `priority`"),
    ("keys:\n  - key: a\n    priority: 4294967296\n", "keys[0]: `priority`"),
    ("keys:\n  - key: a\n    tier: gold\n", "keys[0]: expected a mapping"),
    ("keys:\n  - key: ' a'\n", "surrounding spaces"),
    ("keys: [\n", "cannot read"),
])
def test_a_bad_keys_file_is_one_error_naming_the_entry(tmp_path, text, says):
    path = tmp_path / "keys.yaml"
    path.write_text(text)
    with pytest.raises(KeysFileError, match=says.replace("[", r"\[").replace("]", r"\]")):
        KeyRing.from_file(path)
    with pytest.raises(ServeConfigError, match=str(path)):  # what `raypd serve` prints before it starts
        ServeConfig(api_keys_file=str(path)).key_ring()


def test_no_key_configured_means_an_open_ingress():
    assert ServeConfig().key_ring() is None
    assert ANONYMOUS.priority == 0


# -- through the app -----------------------------------------------------------------------------------
class OrderDriver(HeldDriver):
    """Records, in the order requests reach the nodes, each one's prompt, priority and tenant."""

    def __init__(self, chunks: list[TokenChunk]):
        super().__init__(chunks)
        self.seen: list[tuple[str, int, str]] = []
        self.tokenizer = None

    async def generate(self, request_id, prompt_token_ids, params, prefill, decode=None):
        self.seen.append((self.tokenizer.hf.decode(prompt_token_ids), params.priority, params.tenant))
        async for chunk in super().generate(request_id, prompt_token_ids, params, prefill, decode):
            yield chunk


def test_waiting_requests_reach_the_nodes_by_priority_with_their_keys_defaults(tokenizer, tmp_path):
    keys = tmp_path / "keys.yaml"
    keys.write_text("keys:\n  - {key: sk-web, tenant: web, priority: -1}\n  - {key: sk-batch, tenant: batch, priority: 10}\n")
    gate = AdmissionGate(max_ongoing=1, max_queued=4, max_burst=0)

    def body(prompt: str, **extra) -> bytes:
        return json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 1, **extra}).encode()

    async def run():
        driver = OrderDriver([TokenChunk("", tokens(tokenizer, " x")), TokenChunk("", (), finished=True,
                                                                                  finish_reason="length")])
        driver.tokenizer = tokenizer
        service = OpenAIService(tokenizer, LIMITS, Generator(driver, RecordingRouter(), tokenizer.hf), [])
        app = build_app(service, api_key=KeyRing.from_file(keys), max_body_bytes=1 << 20, gate=gate)
        first = asyncio.ensure_future(post(app, body("first"), key="sk-batch"))
        while not driver.seen:
            await asyncio.sleep(0.001)
        calls = [asyncio.ensure_future(post(app, raw, key=key)) for raw, key in [
            (body("batch default"), "sk-batch"),
            (body("batch asking", priority=-5), "sk-batch"),
            (body("web default"), "sk-web"),
            (body("web asking low", priority=20), "sk-web")]]
        while gate.queued < 4:
            await asyncio.sleep(0.001)
        refused = await post(app, body("no key"))
        driver.go.set()
        return refused, await asyncio.gather(first, *calls), driver.seen
    refused, results, seen = asyncio.run(run())
    assert refused[0] == 401
    assert [status for status, _, _ in results] == [200] * 5
    assert seen == [("first", 10, "batch"), ("batch asking", -5, "batch"), ("web default", -1, "web"),
                    ("batch default", 10, "batch"), ("web asking low", 20, "web")]
    assert (gate.ongoing, gate.queued) == (0, 0)
