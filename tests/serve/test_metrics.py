"""The metrics as an operator scrapes them: a few requests through the package's server, then the
Prometheus text Ray exports on the server's metrics port must show them (names with Ray's `ray_`
prefix and `_total` on counters, as docs/grafana/raypd-dashboard.json queries them).

Ingress, node (each node's load report) and Conductor (routing decisions) metrics must all be there,
with values that match what the requests and the nodes' own reports say.
"""
from __future__ import annotations

import json
import time
import urllib.request
from collections import defaultdict

import pytest

from raypd.cluster.openai.metrics import TTFT_S
from tests.serve.conftest import MODEL, node_report, request

pytestmark = pytest.mark.cluster  # starts Ray, a server or other processes

# Long enough to fill whole 16-token blocks, so the repeats are served from the prefix cache.
CONDUCTOR_DECISIONS = "ray_raypd_conductor_decisions_total"
PROMPT = ("Here is a list of the planets of the solar system in order from the sun: Mercury, Venus, Earth, "
          "Mars, Jupiter, Saturn, Uranus and Neptune. The largest of them is")


def scrape(port: int) -> dict[str, list]:
    """Sample name -> samples, from Ray's Prometheus endpoint."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    samples: dict[str, list] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[s.name].append(s)
    return samples


def total(samples: dict, name: str, **labels: str) -> float:
    """Sum over every sample of `name` whose labels include `labels` (Ray adds WorkerId etc.)."""
    return sum(s.value for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items()))


def test_prometheus_endpoint_shows_the_requests(server, client):
    assert server.metrics_port, "the package's server runs without --metrics-export-port"
    time.sleep(2)  # two report intervals: what earlier tests recorded is exported before the baseline
    before = scrape(server.metrics_port)

    usage = defaultdict(int)
    for _ in range(3):
        r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
        usage["prompt"] += r.usage.prompt_tokens
        usage["completion"] += r.usage.completion_tokens
        usage["cached"] += r.usage.prompt_tokens_details.cached_tokens
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hi."}],
                                            max_tokens=8, stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.usage:
            usage["prompt"] += chunk.usage.prompt_tokens
            usage["completion"] += chunk.usage.completion_tokens
    bad = {"model": MODEL, "prompt": "x", "max_tokens": -1}
    assert request(server.port, "POST", "/v1/completions", bad)[0] == 400
    assert request(server.port, "POST", "/v1/completions", bad, api_key=None)[0] == 401  # the guard's refusal
    ok_sent, errors_sent = 4, 2

    def grew(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    after = scrape(server.metrics_port)

    def arrived() -> bool:
        # Each process exports on its own clock: wait for the ingress replicas and, if it runs, the Conductor.
        return (grew("ray_raypd_ingress_requests_total", status="ok") >= ok_sent
                and grew("ray_raypd_ingress_requests_total", status="client_error") >= errors_sent
                and grew("ray_raypd_ingress_completion_tokens_total") >= usage["completion"]
                and grew(CONDUCTOR_DECISIONS) >= ok_sent
                and bool(after.get("ray_raypd_node_total_blocks")))

    deadline = time.monotonic() + 90  # Ray exports every report interval (1 s here)
    while not arrived():
        assert time.monotonic() < deadline, f"metrics did not arrive: {json.dumps(sorted(after))[:3000]}"
        time.sleep(1)
        after = scrape(server.metrics_port)

    # Requests by endpoint and status: both endpoints counted, no failure invented.
    assert grew("ray_raypd_ingress_requests_total", endpoint="completions", status="ok") >= 3
    assert grew("ray_raypd_ingress_requests_total", endpoint="chat", status="ok") >= 1
    for status in ("rejected", "unavailable", "error"):
        assert grew("ray_raypd_ingress_requests_total", status=status) == 0, status
    # Latencies: every ok request has a TTFT and an end-to-end time; 8-token answers have a TPOT.
    assert grew("ray_raypd_ingress_ttft_seconds_count") >= ok_sent
    assert grew("ray_raypd_ingress_ttft_seconds_sum") > 0
    assert grew("ray_raypd_ingress_e2e_latency_seconds_count") >= ok_sent
    assert grew("ray_raypd_ingress_e2e_latency_seconds_sum") > 0
    assert grew("ray_raypd_ingress_tpot_seconds_count") >= 1
    bounds = {float(s.labels["le"]) for s in after["ray_raypd_ingress_ttft_seconds_bucket"]} - {float("inf")}
    assert bounds == set(TTFT_S)
    # Tokens, counted as the responses' usage counts them.
    assert usage["cached"] > 0
    assert grew("ray_raypd_ingress_prompt_tokens_total") >= usage["prompt"]
    assert grew("ray_raypd_ingress_completion_tokens_total") >= usage["completion"]
    assert grew("ray_raypd_ingress_cached_tokens_total") >= usage["cached"]

    _check_node_metrics(server, after)
    _check_conductor_metrics(after, ok_sent, before)


def _check_node_metrics(server, samples: dict) -> None:
    nodes = node_report(server.port)
    assert {n["role"] for n in nodes} == {"prefill", "decode"}
    for node in nodes:
        tags = {"node": node["name"], "role": node["role"]}
        assert total(samples, "ray_raypd_node_total_blocks", **tags) == node["load"]["total_blocks"], tags
        assert 0 <= total(samples, "ray_raypd_node_free_blocks", **tags) <= node["load"]["total_blocks"], tags
        if node["role"] in ("prefill", "mixed"):  # where the repeated prompt's blocks are cached
            assert total(samples, "ray_raypd_node_cached_blocks", **tags) > 0, tags


def _check_conductor_metrics(samples: dict, routed: int, before: dict) -> None:
    assert total(samples, CONDUCTOR_DECISIONS) - total(before, CONDUCTOR_DECISIONS) >= routed
    assert total(samples, "ray_raypd_conductor_decision_latency_ms_count") >= routed
    # The prefill node's KV events reached the Conductor's index (the repeated prompt is cached there).
    assert total(samples, "ray_raypd_conductor_index_blocks") > 0
    assert total(samples, "ray_raypd_conductor_kv_events_total") > 0
    assert {s.labels["role"] for s in samples["ray_raypd_conductor_node_free_blocks"]} == {"prefill", "decode"}
