"""Every way a request can fail is counted under its kind, and completed requests around the
failures still measure (against the fake server of conftest.py)."""
from __future__ import annotations

from raypd.benchmarks.serve import runner
from raypd.benchmarks.serve.datasets import Request, Session, Workload
from raypd.benchmarks.serve.metrics import SLO, summarize

KINDS = {"500": "http_500", "429": "http_429", "drop": "disconnected", "malformed": "malformed",
         "error_event": "stream_error", "no_done": "disconnected"}


def _workload(prompts: list[str], chat: bool = False) -> Workload:
    reqs = [Request(8, messages=[{"role": "user", "content": p}]) if chat else Request(8, prompt=p) for p in prompts]
    return Workload("t", [Session((r,)) for r in reqs])


def test_each_failure_is_counted_by_kind(fake_server):
    prompts = ["ok", *KINDS, "ok"]
    for chat in (False, True):
        run = runner.run(runner.Target(fake_server, "fake-model", {}), _workload(prompts, chat), [0.0] * len(prompts),
                         None, 30.0)
        kinds = sorted(r.error or "ok" for r in run.results)
        assert kinds == sorted(["ok", "ok", *KINDS.values()])
        s = summarize(run, SLO(10.0, 10.0))
        assert s["completed"] == 2 and s["requests"] == len(prompts)
        assert s["errors"] == {"http_500": 1, "http_429": 1, "disconnected": 2, "malformed": 1, "stream_error": 1}
        assert s["slo_met"] == 2 and s["output_tokens"] == 10 and s["cached_prompt_share"] == 3 / 7


def test_refused_connection_and_unsent_requests(fake_server):
    from raypd.benchmarks.serve.systems import free_port

    dead = runner.Target(f"http://127.0.0.1:{free_port()}/v1", "m", {})
    run = runner.run(dead, _workload(["ok"]), [0.0], None, 10.0)
    assert [r.error for r in run.results] == ["connect"]
    # a start after the run's deadline is never sent
    run = runner.run(runner.Target(fake_server, "fake-model", {}), _workload(["ok", "ok"]), [0.0, 0.3], None, 10.0,
                     deadline_s=0.1)
    assert sorted(r.error or "ok" for r in run.results) == ["not_sent", "ok"]


def test_timings_of_a_good_stream(fake_server):
    run = runner.run(runner.Target(fake_server, "fake-model", {}), _workload(["ok"]), [0.0], 1, 10.0)
    (r,) = run.results
    assert r.ok and r.text == "Hello there, friend." and r.output_tokens == 5 and r.prompt_tokens == 7
    assert len(r.chunk_times) == 5 and len(r.itl_s) == 4 and r.ttft_s is not None and r.e2e_s is not None
    assert r.ttft_s <= r.chunk_times[-1] <= r.e2e_s and r.tpot_s is not None
