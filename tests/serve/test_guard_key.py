"""The ingress gate's API key (cluster/openai/guard.py) on its own: the probe paths the Helm chart
uses answer without the key, every other path needs it; the key never shows in the config's repr."""
from __future__ import annotations

import asyncio

import pytest

from raypd.cluster.openai.guard import GuardMiddleware
from raypd.cluster.serve.config import ServeConfig

KEY = "s3cret-key"


async def reached_app(scope, receive, send):  # what the gate lets through answers 200
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def status(path: str, key: str | None) -> int:
    sent: list[dict] = []
    headers = [(b"authorization", f"Bearer {key}".encode())] if key else []
    scope = {"type": "http", "method": "GET", "path": path, "headers": headers}

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(GuardMiddleware(reached_app, KEY, 1 << 20)(scope, receive, send))
    return next(m["status"] for m in sent if m["type"] == "http.response.start")


@pytest.mark.parametrize("path", ["/health", "/health/ready", "/health/live"])
def test_probe_paths_answer_without_the_key(path):
    assert status(path, None) == 200


@pytest.mark.parametrize("path", ["/v1/models", "/admin/nodes", "/health/readyz", "/metrics"])
def test_every_other_path_needs_the_key(path):
    assert status(path, None) == 401
    assert status(path, "wrong") == 401
    assert status(path, KEY) == 200


def test_the_key_is_not_in_the_config_repr():
    assert KEY not in repr(ServeConfig(api_key=KEY))
