"""Back-pressure without Ray: the ingress replica's AdmissionGate (slots, a FIFO line, refusals,
cancelled waiters), its 429s through the real app, the mapping of every "retry later" to 429 with
Retry-After, a node's refusal (finish_reason OVERLOADED) in the Generator, and the Conductor's SLO
rejection applying to new requests only. (A real flood runs in tests/cluster/test_bounded_ingress.py.)"""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from raypd.cluster.client.breaker import CircuitBreaker
from raypd.cluster.client.conductor_router import ConductorRouter
from raypd.cluster.client.node_set import NodeSet
from raypd.cluster.openai.api_errors import RETRY_AFTER_S, RateLimited, api_error
from raypd.cluster.serve.admission import AdmissionGate
from raypd.cluster.serve.app import build_app
from raypd.cluster.serve.config import ServeConfig, ServeConfigError
from raypd.cluster.serve.generation import Generator
from raypd.cluster.serve.service import OpenAIService
from raypd.conductor.errors import AdmissionRejected
from raypd.protocol.errors import OverloadedError
from raypd.protocol.messages import OVERLOADED, TokenChunk
from tests.serve.test_failover import AttemptDriver, RecordingRouter, body, sse_texts
from tests.serve.test_ingress_app import LIMITS, ScriptedDriver, app_for, tokens
from tests.serve.test_membership import membership

FULL = TokenChunk("", (), finished=True, finish_reason=OVERLOADED, failed_node="raypd-decode-0",
                  error="decode node raypd-decode-0 is full: 2 requests already wait for KV memory")


# -- the gate ------------------------------------------------------------------------------------------
def test_gate_takes_slots_then_queues_then_refuses():
    async def run():
        gate = AdmissionGate(max_ongoing=2, max_queued=1, max_burst=0)
        await gate.acquire()
        await gate.acquire()
        waiter = asyncio.ensure_future(gate.acquire())
        await asyncio.sleep(0)
        assert gate.state() == {"ongoing": 2, "queued": 1, "max_ongoing": 2, "max_queued": 1, "max_burst": 0, "burst": 0, "refused": 0,
                                "displaced": 0}
        with pytest.raises(RateLimited) as e:
            await gate.acquire()
        assert e.value.code == "ingress_queue_full" and e.value.headers == {"retry-after": str(RETRY_AFTER_S)}
        gate.release()                      # the slot is handed to the waiter, not returned
        await waiter
        assert (gate.ongoing, gate.queued, gate.num_refused) == (2, 0, 1)
        gate.release()
        gate.release()
        assert (gate.ongoing, gate.queued) == (0, 0)
    asyncio.run(run())


def test_gate_serves_its_line_in_order_and_skips_cancelled_waiters():
    async def run():
        gate = AdmissionGate(max_ongoing=1, max_queued=3, max_burst=0)
        await gate.acquire()
        order: list[str] = []

        async def wait(name: str):
            await gate.acquire()
            order.append(name)
        a, b, c = (asyncio.ensure_future(wait(n)) for n in "abc")
        await asyncio.sleep(0)
        b.cancel()                          # a client that left while waiting
        await asyncio.sleep(0)
        assert gate.queued == 2
        gate.release()
        await a
        gate.release()
        await c
        assert order == ["a", "c"] and b.cancelled()
        gate.release()
        assert (gate.ongoing, gate.queued) == (0, 0)
    asyncio.run(run())


def test_a_waiter_cancelled_as_it_is_handed_a_slot_passes_it_on():
    async def run():
        gate = AdmissionGate(max_ongoing=1, max_queued=2, max_burst=0)
        await gate.acquire()
        first = asyncio.ensure_future(gate.acquire())
        second = asyncio.ensure_future(gate.acquire())
        await asyncio.sleep(0)
        gate.release()                      # hands the slot to `first` ...
        first.cancel()                      # ... which is cancelled before it runs again
        await asyncio.gather(first, return_exceptions=True)
        await second                        # so the slot went on to `second`
        assert (gate.ongoing, gate.queued) == (1, 0)
        gate.release()
        assert gate.ongoing == 0
    asyncio.run(run())


# -- the gate in the app ---------------------------------------------------------------------------------
async def post(app, raw: bytes, path: str = "/v1/completions", key: str | None = None,
               headers: tuple[tuple[bytes, bytes], ...] = ()) -> tuple[int, dict, bytes]:
    """One POST through the ASGI interface, with `key` as its bearer key and `headers` besides:
    (status, headers, body)."""
    sent: list[dict] = []
    done = False

    async def receive():
        nonlocal done
        if not done:
            done = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await asyncio.Event().wait()

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), *headers]
             + ([(b"authorization", f"Bearer {key}".encode())] if key else []),
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    await asyncio.wait_for(app(scope, receive, send), 30)
    start = next(m for m in sent if m["type"] == "http.response.start")
    headers = {k.decode().lower(): v.decode() for k, v in start.get("headers", [])}
    return start["status"], headers, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


class HeldDriver(ScriptedDriver):
    """Plays its chunks once `go` is set: requests stay in progress until the test lets them finish."""

    def __init__(self, chunks: list[TokenChunk]):
        super().__init__(chunks)
        self.go = asyncio.Event()

    async def generate(self, request_id, prompt_token_ids, params, prefill, decode=None):
        await self.go.wait()
        async for chunk in super().generate(request_id, prompt_token_ids, params, prefill, decode):
            yield chunk


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_full_replica_answers_429_with_retry_after_and_serves_what_it_admitted(tokenizer, stream):
    gate = AdmissionGate(max_ongoing=2, max_queued=1)

    async def run():
        driver = HeldDriver([TokenChunk("", tokens(tokenizer, " Paris")),
                             TokenChunk("", (), finished=True, finish_reason="length")])
        service = OpenAIService(tokenizer, LIMITS, Generator(driver, RecordingRouter(), tokenizer.hf), [])
        app = build_app(service, api_key=None, max_body_bytes=1 << 20, gate=gate)
        calls = [asyncio.ensure_future(post(app, body(stream))) for _ in range(6)]
        async def three_refused():           # 2 in progress + 1 waiting; the other 3 refused at once
            while gate.num_refused < 3:
                await asyncio.sleep(0.001)
        await asyncio.wait_for(three_refused(), 20)
        assert (gate.ongoing, gate.queued) == (2, 1)
        driver.go.set()
        return await asyncio.gather(*calls), driver
    results, driver = asyncio.run(run())
    statuses = sorted(status for status, _, _ in results)
    assert statuses == [200, 200, 200, 429, 429, 429]  # 2 in progress + 1 waiting; nothing else waits
    for status, headers, raw in results:
        if status == 429:
            assert headers["retry-after"] == str(RETRY_AFTER_S)
            err = json.loads(raw)["error"]
            assert (err["type"], err["code"]) == ("rate_limit_error", "ingress_queue_full")
        else:
            text = "".join(sse_texts(raw)) if stream else json.loads(raw)["choices"][0]["text"]
            assert text == " Paris"
    assert (gate.ongoing, gate.queued, gate.num_refused) == (0, 0, 3)
    assert len(driver.closed) == 3


def test_only_generation_posts_pass_the_gate(tokenizer):
    gate = AdmissionGate(max_ongoing=1, max_queued=0)
    service = OpenAIService(tokenizer, LIMITS, Generator(ScriptedDriver([]), RecordingRouter(), tokenizer.hf), [])
    app = build_app(service, api_key=None, max_body_bytes=1 << 20, gate=gate)

    async def run():
        await gate.acquire()                # the replica is full
        full = await post(app, body(False))
        other = await post(app, b"{}", path="/v1/models")  # not gated: 405, not 429
        return full, other
    (status, _, _), (other, _, _) = asyncio.run(run())
    assert status == 429 and other == 405


# -- "retry later" is 429 with Retry-After, whoever says it ---------------------------------------------
@pytest.mark.parametrize("exc,code", [
    (AdmissionRejected("r", "ttft", 3.0, 1.0), "slo_rejected"),
    (OverloadedError("prefill node raypd-prefill-0 is full", "raypd-prefill-0"), "node_queue_full"),
], ids=["slo", "node"])
def test_retry_later_errors_are_429_with_retry_after(exc, code):
    response = api_error(exc).response()
    assert response.status_code == 429 and response.headers["retry-after"] == str(RETRY_AFTER_S)
    err = json.loads(response.body)["error"]
    assert (err["type"], err["code"]) == ("rate_limit_error", code)


# -- a node's refusal in the Generator -------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_node_refusal_before_the_first_token_is_429_at_once(tokenizer, stream):
    breaker = CircuitBreaker(failures=1)
    driver, router = AttemptDriver([[FULL]]), RecordingRouter()
    status, raw = asyncio.run(_call(app_for(tokenizer, driver, router, breaker=breaker), body(stream)))
    assert status == 429
    err = json.loads(raw)["error"]
    assert err["code"] == "node_queue_full" and "raypd-decode-0 is full" in err["message"]
    assert len(driver.attempts) == 1                 # no retry: it would only add load
    assert breaker.excluded() == frozenset()         # full is not failing


def test_a_replay_a_node_refuses_goes_elsewhere_without_counting_a_failure(tokenizer):
    breaker = CircuitBreaker(failures=1)
    first, second = tokens(tokenizer, " The capital"), tokens(tokenizer, " is Paris")
    died = TokenChunk("", (), finished=True, error="node raypd-decode-1 failed: ActorDiedError",
                      failed_node="raypd-decode-1")
    driver = AttemptDriver([[TokenChunk("", first), died], [FULL],
                            [TokenChunk("", second, finished=True, finish_reason="length")]])
    router = RecordingRouter()
    status, raw = asyncio.run(_call(app_for(tokenizer, driver, router, breaker=breaker), body(True)))
    assert status == 200 and "".join(sse_texts(raw)) == " The capital is Paris"
    assert router.excluded[-1] == frozenset({"raypd-decode-1", "raypd-decode-0"})
    assert breaker.excluded() == frozenset({"raypd-decode-1"})  # the dead node counts, the full one not


async def _call(app, raw: bytes) -> tuple[int, bytes]:
    status, _, out = await post(app, raw)
    return status, out


# -- the Conductor's SLO admission: new requests only ---------------------------------------------------
def test_slo_rejection_applies_to_new_requests_and_reroute_takes_its_decision():
    async def run():
        m, conductor = membership()
        router = ConductorRouter(conductor, NodeSet(m))
        conductor.error = AdmissionRejected("r", "ttft", 3.0, 1.0,
                                            SimpleNamespace(prefill_node="p0", decode_node="d1", path="split"))
        with pytest.raises(AdmissionRejected):
            await router.route("r", [1])
        route = await router.reroute("r-retry1", [1])   # a retry of an admitted request
        assert (route.prefill.name, route.decode.name) == ("p0", "d1") and router.num_fallbacks == 0
    asyncio.run(run())


# -- configuration ---------------------------------------------------------------------------------------
def test_admission_limits_derive_from_what_the_nodes_hold():
    assert ServeConfig().admission_limits() == (128, 128)       # 1 decode node: 64 running + 64 waiting
    cfg = ServeConfig(decode_nodes=3, prefill_nodes=1, ingress_replicas=2,
                      engine_options={"max_running_requests": 8, "max_waiting_requests": 2})
    assert cfg.admission_limits() == (15, 15)                  # 3 x (8 + 2) over 2 replicas, rounded up
    assert ServeConfig(max_ongoing_requests=4, max_queued_requests=0).admission_limits() == (4, 0)
    # Nodes on GPUs hold what the CUDA batch defaults let them (256 running + as many waiting).
    assert ServeConfig().admission_limits(cluster_gpus=8) == (512, 512)
    assert ServeConfig(engine_options={"device": "cuda"}).admission_limits() == (512, 512)
    assert ServeConfig(gpus_per_node=0).admission_limits(cluster_gpus=8) == (128, 128)
    assert ServeConfig(engine_options={"device": "cpu"}).admission_limits(cluster_gpus=8) == (128, 128)
    assert ServeConfig(ttft_slo_s=0.5).cluster_spec().conductor_options == {"ttft_slo_s": 0.5}
    assert ServeConfig().cluster_spec().conductor_options == {}


@pytest.mark.parametrize("args,match", [
    ({"max_ongoing_requests": 0}, "--max-ongoing-requests must be an integer >= 1"),
    ({"max_queued_requests": -1}, "--max-queued-requests must be an integer >= 0"),
    ({"ttft_slo_s": 0}, "--ttft-slo must be > 0"),
    ({"engine_options": {"max_waiting_requests": 0}}, "max_waiting_requests must be >= 1"),
], ids=["ongoing", "queued", "slo", "node-waiting"])
def test_bad_admission_options(args, match):
    with pytest.raises(ServeConfigError, match=match):
        ServeConfig(**args)
