"""Fault tolerance through HTTP with the official openai client, against a real `raypd serve`
(2 prefill + 2 decode nodes over NIXL, Conductor routing): the failures are caused for real -
SIGKILL of a node's, the Conductor's or the node pool replica's process, an injected engine-thread
crash, a node frozen by SIGSTOP - and every test asserts what the client saw (outputs equal to a
fault-free run of the same request) and that every surviving block is accounted for afterwards; a
mid-stream kill also shows as one replay for the killed node in the ingress's log, counted in the
metrics Ray exports.

One server for the module; each test leaves it with every node live again. It serves the tiny
random-weight model (tests/tiny_model.py): what is checked is what a failure does to the streams
and the nodes, whatever the weights, and a node on it restarts in a fraction of the 135 M model's
time. Where a test needs a node busy for a while, the node's `hold_steps` chaos hook keeps it from
stepping (a slow node, on any model) instead of a prompt long enough to take that while.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import threading
import time
import warnings
from typing import NamedTuple

import pytest
import ray

from tests.serve.conftest import METRICS_ENV, ServerProcess, free_port_below_10002, request, wait_nodes_idle
from tests.serve.test_metrics import scrape, total

pytestmark = pytest.mark.cluster  # starts Ray, a server or other processes

MODEL = "tiny-llama"
PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."
# A stream long enough on the tiny model that a fault caused after its 4th chunk lands mid-stream.
TOKENS = 400
LONG_PROMPT = " ".join(f"Item {i}: the quick brown fox jumps over the lazy dog." for i in range(60))
RECOVER_S = 120  # bound on waiting for a restarted node to be live again
POLL_S = 0.1     # how often a wait looks again (each look is one local HTTP or Ray call)
# Ray's metrics export interval for this server (Ray's own setting, RAY_metrics_report_interval_ms):
# a counter change shows on the Prometheus endpoint within one interval.
EXPORT_S = 0.5
NODE_POOL = "ServeReplica:raypd:NodePool"  # Ray's class name of the app's NodePool replica actor


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir):
    log_path = tmp_path_factory.mktemp("fault") / "raypd-serve.log"
    srv = ServerProcess.start(log_path, "--model", tiny_model_dir, "--served-model-name", MODEL, "--prefill-nodes", "2", "--decode-nodes", "2", "--cpus-per-node", "0.5",
                              "--no-dashboard", "--max-node-restarts", "50", "--num-blocks", "512", "--chaos-hooks",
                              # Its local Ray without token auth, so this process can join it by address;
                              # Ray's Prometheus endpoint, to count the ingress's replays.
                              metrics_port=free_port_below_10002(),
                              env={**METRICS_ENV, "RAY_metrics_report_interval_ms": str(int(EXPORT_S * 1000)),
                                   "RAY_AUTH_MODE": "disabled"})
    try:
        srv.wait_ready()
        srv.remember_descendants()
        gcs = re.search(r"Ray cluster: (\S+)", srv.log()).group(1)
        ray.init(address=gcs, namespace="raypd-tests", log_to_driver=False)
    except BaseException:
        srv.kill()
        raise
    try:
        yield srv
    finally:
        ray.shutdown()
        srv.stop(signal.SIGINT)


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused", max_retries=0, timeout=300)


def health(server) -> tuple[int, dict]:
    status, _, body = request(server.port, "GET", "/health/ready")
    return status, json.loads(body) if body else {}


def states(server) -> dict[str, tuple[str, int]]:
    _, body = health(server)
    return {n["name"]: (n["state"], n["incarnation"]) for n in body["nodes"]}


def wait_all_live(server, timeout_s: float = RECOVER_S) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        status, body = health(server)
        if status == 200 and all(n["state"] == "live" for n in body["nodes"]) \
                and body["conductor"]["state"] == "live":
            return body
        if time.monotonic() > deadline:
            raise AssertionError(f"not every node live again within {timeout_s}s: {body}")
        time.sleep(POLL_S)


def wait_restarted(server, name: str, incarnation: int, timeout_s: float = RECOVER_S) -> None:
    """Until `name` is live again as a later incarnation than `incarnation` (the pool replaced it)."""
    deadline = time.monotonic() + timeout_s
    while not (states(server)[name][0] == "live" and states(server)[name][1] > incarnation):
        assert time.monotonic() < deadline, f"{name} not replaced within {timeout_s}s: {states(server)}"
        time.sleep(POLL_S)
    assert states(server)[name][1] == incarnation + 1


def holder(server, role: str, timeout_s: float = 60.0) -> dict:
    """The node of `role` that holds a request now (polling /admin/nodes)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _, _, body = request(server.port, "GET", "/admin/nodes")
        for n in json.loads(body)["nodes"]:
            if n["role"] == role and "held" in n and n["held"].get("requests", 0) + n["held"].get("rooms", 0) > 0:
                return n
        time.sleep(0.05)
    raise AssertionError(f"no {role} node held the request within {timeout_s}s")


def named_actor(name: str):
    """A node actor or the Conductor of the server's app, by name, in whatever namespace it lives."""
    found = [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"] == name]
    assert len(found) == 1, found
    return ray.get_actor(name, namespace=found[0]["namespace"])


def chat(client, prompt: str = PROMPT, max_tokens: int = 48, **sampling) -> str:
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                       max_tokens=max_tokens, extra_body={"ignore_eos": True}, **sampling)
    return r.choices[0].message.content


class Streamed(NamedTuple):
    text: str
    usage: object
    request_id: str   # the completion's id, which the ingress's log lines start with


def stream_with_fault(client, fault, after_chunks: int = 4, prompt: str = PROMPT, max_tokens: int = 48,
                      **sampling) -> Streamed:
    """Stream a chat completion; after `after_chunks` text chunks call fault() once (in this thread,
    while the stream is open)."""
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}, **sampling)
    parts, usage, seen, request_id = [], None, 0, ""
    for chunk in stream:
        request_id = chunk.id
        if chunk.usage is not None:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
            seen += 1
            if seen == after_chunks:
                fault()
    return Streamed("".join(parts), usage, request_id)


def replays(server) -> float:
    """Streams the ingress replayed after their decode node failed, as Ray exports the counter."""
    return total(scrape(server.metrics_port), "ray_raypd_ingress_replays_total", reason="decode_node_failed")


def replay_log(request_id: str) -> list[str]:
    """The ingress's log lines for the replays of `request_id`'s choices, from this server's Ray
    session (the ingress logs one line per replay, where it counts one)."""
    logs = pathlib.Path(ray._private.worker.global_worker.node.get_logs_dir_path())
    return [line for f in sorted(logs.glob("worker-*.err"))
            for line in f.read_text(errors="replace").splitlines()
            if line.startswith(f"{request_id}-") and "replaying" in line]


def replayed_after_kill(server, before: float, request_id: str, killed: str) -> None:
    """The stream was replayed once for the node killed under it, and the exported counter counts
    exactly the replays the ingress made (the export runs every EXPORT_S). A node that looked hung
    under load (a probe past its timeout) may add a replay of its own: that one is reported."""
    deadline = time.monotonic() + 30
    while replays(server) < before + 1:
        assert time.monotonic() < deadline, f"no replay counted: {replays(server)} (before: {before})"
        time.sleep(POLL_S)
    time.sleep(2 * EXPORT_S)
    lines = replay_log(request_id)
    assert replays(server) == before + len(lines), lines
    # The kill reaches the ingress first either as the stream's failure ("node X failed") or as the
    # membership's verdict ("node X is restarting"): whichever comes first replays the stream.
    for_kill = re.compile(rf"node {re.escape(killed)} (failed|is (restarting|dead|unresponsive))")
    assert lines and for_kill.search(lines[0]), lines                       # the first replay: the kill's
    assert sum(bool(for_kill.search(line)) for line in lines) == 1, lines   # and only one for it
    if len(lines) > 1:
        warnings.warn(f"{len(lines) - 1} replay(s) besides the killed node's: {lines[1:]}", stacklevel=2)


def sigkill(pid: int) -> None:
    assert pid != os.getpid() and pid > 1
    os.kill(pid, signal.SIGKILL)


def settle(server) -> None:
    """Every node live again and nothing held anywhere (block accounting checked on every poll)."""
    wait_all_live(server)
    wait_nodes_idle(server.port, timeout_s=60)


@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 0.9, "seed": 1234}],
                         ids=["greedy", "seeded"])
def test_decode_killed_mid_stream_continues_the_same_stream(server, client, sampling):
    reference = chat(client, max_tokens=TOKENS, **sampling)
    before = states(server)
    time.sleep(2 * EXPORT_S)  # two export intervals: what came before is in the baseline
    replays_before = replays(server)
    killed = {}

    def kill_decode():
        n = holder(server, "decode")
        killed["name"] = n["name"]
        sigkill(n["pid"])

    text, usage, request_id = stream_with_fault(client, kill_decode, max_tokens=TOKENS, **sampling)
    assert text == reference                 # no gap, no duplicate, no lost token; the same seeded stream
    assert usage.completion_tokens == TOKENS
    replayed_after_kill(server, replays_before, request_id, killed["name"])   # a replay, not a stream that never broke
    wait_restarted(server, killed["name"], before[killed["name"]][1])   # the pool's replacement is live
    settle(server)


def test_decode_frozen_mid_stream_is_replayed_long_before_the_chunk_timeout(server, client):
    """SIGSTOP of the decode node serving a stream: the pool's probe times out (5 s), the node is
    `unresponsive`, and the ingress ends the node's streams and replays them elsewhere; the client,
    whose timeout (90 s) is below the driver's chunk timeout (120 s), gets the whole stream."""
    reference = chat(client, max_tokens=TOKENS, temperature=0.0)
    frozen = {}

    def freeze_decode():
        n = holder(server, "decode")
        frozen.update(n)
        os.kill(n["pid"], signal.SIGSTOP)

    try:
        text, usage, _ = stream_with_fault(client.with_options(timeout=90), freeze_decode, max_tokens=TOKENS,
                                           temperature=0.0)
        assert text == reference and usage.completion_tokens == TOKENS
        assert states(server)[frozen["name"]][0] == "unresponsive"
    finally:
        if frozen:
            os.kill(frozen["pid"], signal.SIGCONT)  # it wakes, finds its stream aborted, frees it
    settle(server)


def test_engine_crash_mid_stream_is_replayed_and_the_node_restarts(server, client):
    reference = chat(client, max_tokens=TOKENS, temperature=0.0)
    crashed = {}

    def crash_decode():
        n = holder(server, "decode")
        crashed["name"] = n["name"]
        ray.get(named_actor(n["name"]).crash_engine.remote(), timeout=30)

    before = states(server)
    text, _, _ = stream_with_fault(client, crash_decode, max_tokens=TOKENS, temperature=0.0)
    assert text == reference
    wait_restarted(server, crashed["name"], before[crashed["name"]][1])
    settle(server)


def in_background(fn) -> tuple[threading.Thread, dict]:
    """Run fn() in a thread; its result or exception lands in the returned dict."""
    result: dict = {}

    def run():
        try:
            result["value"] = fn()
        except Exception as e:  # noqa: BLE001 - the test asserts on it
            result["error"] = e
    t = threading.Thread(target=run)
    t.start()
    return t, result


def hold_prefill_steps(seconds: float, but: str | None = None) -> None:
    """Every prefill node (`but` one) runs no step for `seconds` (0 ends the hold); the nodes stay up."""
    names = [f"raypd-prefill-{i}" for i in range(2) if f"raypd-prefill-{i}" != but]
    ray.get([named_actor(name).hold_steps.remote(seconds) for name in names], timeout=30)


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_node_killed_before_the_first_token_is_retried(server, client, role):
    """The prefill nodes held (a slow prefill): kill the prefill node holding the prompt, or the decode
    node waiting for its KV (prealloc / transfer), before any token reached the client."""
    prompt = f"Cold {role} prompt. " + LONG_PROMPT
    hold_prefill_steps(120)
    killed = None
    try:
        t, result = in_background(lambda: chat(client, prompt=prompt, max_tokens=8, temperature=0.0))
        victim = holder(server, role)
        sigkill(victim["pid"])
        killed = victim["name"]
    finally:
        hold_prefill_steps(0, but=killed)   # a killed node's replacement starts without a hold
    t.join(300)
    assert "error" not in result, result.get("error")
    settle(server)
    assert result["value"] == chat(client, prompt=prompt, max_tokens=8, temperature=0.0)  # a fault-free run


def test_conductor_killed_under_load_fails_no_request(server, client):
    prompts = [f"{PROMPT} Version {i}." for i in range(6)]
    references = [chat(client, prompt=p, max_tokens=24, temperature=0.0) for p in prompts]
    conductor = named_actor("raypd-conductor")
    pid = ray.get(conductor.status.remote(), timeout=30)["pid"]
    incarnation = health(server)[1]["conductor"]["incarnation"]
    results: list = [None] * len(prompts)

    def run(i):
        try:
            results[i] = chat(client, prompt=prompts[i], max_tokens=24, temperature=0.0)
        except Exception as e:  # noqa: BLE001 - asserted below
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    hold_prefill_steps(3)   # the requests are routed and in flight when the Conductor dies
    for t in threads:
        t.start()
    time.sleep(0.5)
    sigkill(pid)
    for t in threads:
        t.join(300)
    assert results == references
    # The pool's health may still show the killed incarnation live until its probe notices the kill.
    deadline = time.monotonic() + RECOVER_S
    while (body := wait_all_live(server))["conductor"]["incarnation"] == incarnation:
        assert time.monotonic() < deadline, f"the Conductor was not restarted: {body['conductor']}"
        time.sleep(POLL_S)
    assert body["conductor"]["incarnation"] == incarnation + 1
    # The restarted Conductor rebuilt its registry from the nodes (they re-register by themselves).
    deadline = time.monotonic() + 60
    while sum(n["alive"] for n in ray.get(conductor.status.remote(), timeout=30)["nodes"].values()) != 4:
        assert time.monotonic() < deadline, ray.get(conductor.status.remote(), timeout=30)["nodes"]
        time.sleep(POLL_S)
    assert chat(client, prompt=prompts[0], max_tokens=24, temperature=0.0) == references[0]
    settle(server)


def node_pool_pid(other_than: int = 0, timeout_s: float = RECOVER_S) -> int:
    """The pid of the app's one live NodePool replica, once it is not `other_than` (Serve's
    replacement), from the GCS's actor table: the server runs without the dashboard, which Ray's
    state API needs."""
    from ray._private.state import actors

    deadline = time.monotonic() + timeout_s
    while True:
        pids = [int(a["Pid"]) for a in actors(actor_state_name="ALIVE").values() if a["ActorClassName"] == NODE_POOL]
        if len(pids) == 1 and pids[0] != other_than:
            return pids[0]
        assert time.monotonic() < deadline, f"no NodePool replica but pid {other_than} within {timeout_s}s: {pids}"
        time.sleep(POLL_S)


def node_pids(server) -> dict[str, int]:
    return {n["name"]: n["pid"] for n in json.loads(request(server.port, "GET", "/admin/nodes")[2])["nodes"]}


def test_node_pool_replica_killed_under_streams_keeps_every_node(server, client):
    """SIGKILL of the NodePool's Serve replica while streams run. The nodes and the Conductor are
    detached, so no stream breaks (none is replayed, each ends as a fault-free run), and the replica
    Serve starts in its place adopts the same actors: the same processes, each node with the
    incarnation it had, which then serve."""
    prompts = [f"{PROMPT} Chapter {i}." for i in range(3)]
    references = [chat(client, prompt=p, max_tokens=TOKENS, temperature=0.0) for p in prompts]
    settle(server)
    before, pids = states(server), node_pids(server)
    conductor_before = health(server)[1]["conductor"]["incarnation"]
    conductor = named_actor("raypd-conductor")
    conductor_pid = ray.get(conductor.status.remote(), timeout=30)["pid"]
    time.sleep(2 * EXPORT_S)  # two export intervals: what came before is in the baseline
    replays_before = replays(server)
    pool = node_pool_pid()
    streaming = threading.Barrier(len(prompts) + 1, timeout=120)   # every stream past its 4th chunk, and the kill

    def stream(prompt: str) -> str:
        return stream_with_fault(client, streaming.wait, prompt=prompt, max_tokens=TOKENS, temperature=0.0).text

    runs = [in_background(lambda p=p: stream(p)) for p in prompts]
    streaming.wait()
    sigkill(pool)
    for t, _ in runs:
        t.join(300)
    assert [result.get("value", result.get("error")) for _, result in runs] == references
    node_pool_pid(other_than=pool)   # Serve brought the replica back ...
    # ... and it supervises the very nodes that served before, none of them restarted, listed as before,
    # as the ingress reads the pool's membership (through HTTP: a Serve handle made in this process
    # once waited out its timeout for a replica the ingress was already calling, under CI's load).
    deadline = time.monotonic() + RECOVER_S
    while (list(states(server).items()), health(server)[1]["conductor"]["incarnation"]) != \
            (list(before.items()), conductor_before):
        assert time.monotonic() < deadline, (states(server), before)
        time.sleep(POLL_S)
    assert node_pids(server) == pids
    assert ray.get(conductor.status.remote(), timeout=30)["pid"] == conductor_pid
    time.sleep(2 * EXPORT_S)
    assert replays(server) == replays_before
    assert chat(client, prompt=prompts[0], max_tokens=TOKENS, temperature=0.0) == references[0]
    settle(server)
    assert states(server) == before


def test_a_replacement_takes_traffic(server, client):
    """Kill prefill-0, wait for its replacement, then kill prefill-1: only the replacement can serve."""
    before = states(server)
    sigkill(json.loads(request(server.port, "GET", "/admin/nodes")[2])["nodes"][0]["pid"])
    wait_restarted(server, "raypd-prefill-0", before["raypd-prefill-0"][1])
    p1 = next(n for n in json.loads(request(server.port, "GET", "/admin/nodes")[2])["nodes"]
              if n["name"] == "raypd-prefill-1")
    sigkill(p1["pid"])
    assert chat(client, max_tokens=8, temperature=0.0)
    assert chat(client, prompt="Another question entirely.", max_tokens=8, temperature=0.0)
    settle(server)


def test_a_node_that_keeps_failing_leaves_routing(server, client):
    """decode-0 stays up and answers its probes but fails every request: each one that reaches it is
    retried on decode-1, and after 3 (the breaker's threshold) this replica keeps decode-0 out until
    its cool-down (10 s) has passed, so at most 3 more can reach it per cool-down."""
    decode0 = named_actor("raypd-decode-0")
    ray.get(decode0.fail_requests.remote(1000), timeout=30)
    t0 = time.monotonic()
    try:
        for i in range(12):  # one at a time: each outcome is known to the breaker before the next route
            assert chat(client, prompt=f"Breaker question {i}.", max_tokens=4, temperature=0.0)
        report = {n["name"]: n for n in json.loads(request(server.port, "GET", "/admin/nodes")[2])["nodes"]}
    finally:
        reached = ray.get(decode0.fail_requests.remote(0), timeout=30)
    cooldowns = int((time.monotonic() - t0) // 10)
    assert 1 <= reached <= 3 + cooldowns, (reached, cooldowns)
    assert report["raypd-decode-0"]["breaker"] in ("open", "half_open")   # it never succeeded since
    assert report["raypd-decode-1"]["breaker"] == "closed"
    settle(server)


def test_readiness_follows_the_roles_and_liveness_the_process(server, client):
    status, body = health(server)
    assert status == 200 and body["status"] == "ok"
    assert request(server.port, "GET", "/health/live")[0] == 200
    decodes = [n for n in json.loads(request(server.port, "GET", "/admin/nodes")[2])["nodes"] if n["role"] == "decode"]
    os.kill(decodes[0]["pid"], signal.SIGSTOP)       # one decode node frozen: still ready
    try:
        deadline = time.monotonic() + 60
        while states(server)[decodes[0]["name"]][0] == "live":
            assert time.monotonic() < deadline
            time.sleep(POLL_S)
        assert health(server)[0] == 200
        assert chat(client, max_tokens=8, temperature=0.0)  # served by the other decode node
        os.kill(decodes[1]["pid"], signal.SIGSTOP)   # no decode node answers: not ready, still alive
        try:
            while health(server)[0] != 503:
                assert time.monotonic() < deadline + 60
                time.sleep(POLL_S)
            assert health(server)[1]["status"] == "unavailable"
            assert request(server.port, "GET", "/health/live")[0] == 200
        finally:
            os.kill(decodes[1]["pid"], signal.SIGCONT)
    finally:
        os.kill(decodes[0]["pid"], signal.SIGCONT)
    settle(server)
