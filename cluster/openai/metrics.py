"""Ingress metrics through the metrics API (metrics/ray_api.py), so they reach the Ray dashboard and
the Prometheus endpoint Ray exports. Without Ray (unit tests, a bare FastAPI app) nothing is recorded.

Exported (Ray adds the prefix `ray_`; counters also get `_total`):
  raypd_ingress_requests{endpoint,status}   status: ok | client_error | rejected | unavailable | aborted | error
  raypd_ingress_ttft_seconds{endpoint}      request arrival -> a choice's first text (histogram)
  raypd_ingress_tpot_seconds{endpoint}      per choice: (last - first event) / (completion tokens - 1)
  raypd_ingress_e2e_latency_seconds{endpoint}     arrival -> last event, requests that ended ok
  raypd_ingress_{prompt,completion,cached}_tokens{endpoint}   counted like the response's usage
  raypd_ingress_retries{reason}     attempts re-routed before any token reached the client
  raypd_ingress_replays{reason}     streams replayed elsewhere after tokens were sent
                                    reason: overloaded | <role>_node_failed | node_failed | unattributed
  raypd_ingress_recovery_waits      routings that found no node and waited for one to come back
  raypd_ingress_priority_requests{priority,status}  requests that reached generation, by priority
  raypd_ingress_priority_ttft_seconds{priority}     their TTFT, by priority (histogram)
                                    priority: the request's (its field, else its key's default) as
                                    an integer string from -10 to 10, "<-10" or ">10" beyond: a
                                    bounded set of series whatever integers clients send

Who records what, per generation request (one RequestRecord each):
  MetricsMiddleware  creates it at arrival, and counts the status from the HTTP code unless the
                     generation already did (401/413 from the guard, 400 from parsing, 500s);
                     a cancelled call (the client went away) counts as aborted
  RequestRecord.track()  wraps the choice events: first-text time, tokens, and the status of a
                     generation that started - the only way to know how a 200 stream really ended
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any, Literal

from raypd.cluster.openai.api_errors import api_error
from raypd.metrics.ray_api import NOOP, MetricsAPI, metrics_api

if TYPE_CHECKING:
    from raypd.cluster.autoscale.slo_counts import SloTally
    from raypd.cluster.openai.params import PreparedRequest

Status = Literal["ok", "client_error", "rejected", "unavailable", "aborted", "error"]
ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
STATE_KEY = "raypd_request"  # where the middleware leaves the record in the ASGI scope's state

# Seconds. Wide enough for both ends: a GPU answers in tens of ms, SmolLM2 on 2 shared CPU cores in
# seconds, and a long prompt queued behind others on CPU in minutes.
TTFT_S = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0]
TPOT_S = [0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0]
E2E_S = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0]


PRIORITY_LABEL_BOUND = 10


def priority_label(priority: int) -> str:
    if priority < -PRIORITY_LABEL_BOUND:
        return f"<-{PRIORITY_LABEL_BOUND}"
    if priority > PRIORITY_LABEL_BOUND:
        return f">{PRIORITY_LABEL_BOUND}"
    return str(priority)


def status_of(http_status: int) -> Status:
    if http_status < 400:
        return "ok"
    if http_status == 429:
        return "rejected"
    if http_status == 503:
        return "unavailable"
    return "client_error" if http_status < 500 else "error"


class IngressMetrics:
    def __init__(self, api: MetricsAPI | None = None):
        """`api`: a module with Counter, Gauge and Histogram (tests pass a fake); default: Ray's
        when Ray is initialized, else nothing is recorded."""
        api = metrics_api(api)
        self.enabled = api is not NOOP
        p, tags = "raypd_ingress_", ("endpoint",)
        self.requests = api.Counter(p + "requests", "generation requests by how they ended", ("endpoint", "status"))
        self.ttft = api.Histogram(p + "ttft_seconds", "time to first text per choice", TTFT_S, tags)
        self.tpot = api.Histogram(p + "tpot_seconds", "time per output token per choice", TPOT_S, tags)
        self.e2e = api.Histogram(p + "e2e_latency_seconds", "request latency, requests that ended ok", E2E_S, tags)
        self.prompt_tokens = api.Counter(p + "prompt_tokens", "prompt tokens (once per prompt)", tags)
        self.completion_tokens = api.Counter(p + "completion_tokens", "generated tokens", tags)
        self.cached_tokens = api.Counter(p + "cached_tokens", "prompt tokens served from a prefix cache", tags)
        self.priority_requests = api.Counter(p + "priority_requests", "requests that reached generation, by "
                                             "priority and how they ended", ("priority", "status"))
        self.priority_ttft = api.Histogram(p + "priority_ttft_seconds", "time to first text per choice, by priority",
                                           TTFT_S, ("priority",))
        self.failover = FailoverMetrics(api)
        # With autoscaling: every finished request counted against the SLO targets (the replica's
        # SloReporter sends the counts to the node pool). Works without Ray, unlike the series above.
        self.slo: SloTally | None = None

    def start(self, endpoint: str) -> RequestRecord:
        return RequestRecord(self, endpoint, time.monotonic())


class FailoverMetrics:
    """What serve/generation.py does when an attempt fails: the retries, replays and waits above."""

    def __init__(self, api: MetricsAPI | None = None):
        api = metrics_api(api)
        p = "raypd_ingress_"
        self.retries = api.Counter(p + "retries", "attempts re-routed before the first token, by reason", ("reason",))
        self.replays = api.Counter(p + "replays", "streams replayed after tokens were sent, by reason", ("reason",))
        self.recovery_waits = api.Counter(p + "recovery_waits", "routings that waited for a node to come back", ())


class RequestRecord:
    """One generation request from arrival to its status; finish() counts it once, whoever calls first."""
    __slots__ = ("metrics", "endpoint", "t0", "status", "priority", "served_tokens", "ttft_s", "tpot_s",
                 "_last_event")

    def __init__(self, metrics: IngressMetrics, endpoint: str, t0: float):
        self.metrics = metrics
        self.endpoint = endpoint
        self.t0 = t0
        self.status: Status | None = None
        self.priority: str | None = None  # its priority's label, once it reaches generation (track)
        self.served_tokens = 0  # prompt and output tokens as its usage counts them (the tenant's share)
        self.ttft_s: float | None = None   # its first choice's first text (None: none came)
        self.tpot_s: float | None = None   # its slowest choice's time per output token
        self._last_event = t0

    def finish(self, status: Status) -> None:
        if self.status is not None:
            return
        self.status = status
        m = self.metrics
        m.requests.inc(1, {"endpoint": self.endpoint, "status": status})
        if self.priority is not None:
            m.priority_requests.inc(1, {"priority": self.priority, "status": status})
        if status == "ok":
            m.e2e.observe(self._last_event - self.t0, {"endpoint": self.endpoint})
        if m.slo is not None:
            if status == "ok":
                m.slo.observe(self.ttft_s, self.tpot_s)
            elif status in ("rejected", "unavailable"):   # refused for capacity: a TTFT miss
                m.slo.observe(None, None, rejected=True)

    async def track(self, events: AsyncGenerator, prepared: PreparedRequest,
                    echo: list[str] | None = None) -> AsyncGenerator:
        """`events` (the request's ChoiceEvents) passed through while recording. Tokens count as in
        the response's usage: prompts once, cached tokens once per prompt (its best choice's). With
        `echo`, a choice's first event is its echoed prompt, not generated text.
        Errors leave as their APIError, so the layers above map nothing twice."""
        m, tags = self.metrics, {"endpoint": self.endpoint}
        self.priority = priority_label(prepared.jobs[0].params.priority if prepared.jobs else 0)
        by_priority = {"priority": self.priority}
        prompt_of = {job.index: job.prompt_index for job in prepared.jobs}
        echoed = {job.index for job in prepared.jobs if echo and echo[job.prompt_index]}
        first: dict[int, float] = {}  # choice -> time of its first generated text
        seen: set[int] = set()
        completion, cached = 0, dict.fromkeys(range(len(prepared.prompts)), 0)
        prompt_tokens = sum(map(len, prepared.prompts))
        if prompt_tokens:  # Ray counters take only positive increments
            m.prompt_tokens.inc(prompt_tokens, tags)
        try:
            async for e in events:
                now = self._last_event = time.monotonic()
                is_echo = e.index in echoed and e.index not in seen
                seen.add(e.index)
                if not is_echo and e.index not in first:
                    first[e.index] = now
                    if self.ttft_s is None:
                        self.ttft_s = max(now - self.t0, 0.0)
                    m.ttft.observe(max(now - self.t0, 0.0), tags)
                    m.priority_ttft.observe(max(now - self.t0, 0.0), by_priority)
                if e.finish_reason:
                    completion += e.completion_tokens
                    p = prompt_of.get(e.index, 0)
                    cached[p] = max(cached.get(p, 0), e.cached_tokens)
                    if e.completion_tokens > 1 and e.index in first:
                        tpot = max((now - first[e.index]) / (e.completion_tokens - 1), 0.0)
                        self.tpot_s = max(self.tpot_s or 0.0, tpot)
                        m.tpot.observe(tpot, tags)
                yield e
            self.finish("ok")
        except (asyncio.CancelledError, GeneratorExit):
            self.finish("aborted")  # the client left (or the response was never read): closed early
            raise
        except Exception as e:  # noqa: BLE001 - classified by the status the client gets
            err = api_error(e)
            self.finish(status_of(err.status))
            if err is e:
                raise
            raise err from e
        finally:
            self.served_tokens = prompt_tokens + completion
            if completion:
                m.completion_tokens.inc(completion, tags)
            if sum(cached.values()):
                m.cached_tokens.inc(sum(cached.values()), tags)


class MetricsMiddleware:
    """ASGI middleware, outermost: one RequestRecord per generation request (see the module doc)."""

    def __init__(self, app, metrics: IngressMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        endpoint = ENDPOINTS.get(scope.get("path", "")) if scope["type"] == "http" else None
        if endpoint is None or scope.get("method") != "POST":
            return await self.app(scope, receive, send)
        rec = self.metrics.start(endpoint)
        scope.setdefault("state", {})[STATE_KEY] = rec
        code = 0

        async def send_status(message):
            nonlocal code
            if message["type"] == "http.response.start":
                code = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        except asyncio.CancelledError:
            rec.finish("aborted")
            raise
        except BaseException:
            rec.finish("error")  # nothing below answered: the server turns this into a 500
            raise
        rec.finish(status_of(code) if code else "aborted")  # no response started: the client left first


def record_of(state: Any) -> RequestRecord | None:
    """The record MetricsMiddleware left in a Starlette request.state (None without the middleware)."""
    return getattr(state, STATE_KEY, None)


def track(rec: RequestRecord | None, events: AsyncGenerator, prepared: PreparedRequest,
          echo: list[str] | None = None) -> AsyncGenerator:
    """rec.track(...), or `events` untouched when there is no record (an app without the middleware)."""
    return events if rec is None else rec.track(events, prepared, echo)
