"""`raypd serve --autoscale ...` as flags and as ServeConfig: what reaches the pool scaler, every
inconsistency refused with the line a user sees, the room made for the nodes a pool may grow to,
and the ingress's count of each request against the SLO (what its SloReporter sends)."""
from __future__ import annotations

import asyncio

import pytest

from raypd.cluster.autoscale.config import RoleRange
from raypd.cluster.autoscale.slo_counts import SloCounts, SloTally
from raypd.cluster.autoscale.slo_reporter import SloReporter
from raypd.cluster.cli.main import build_parser
from raypd.cluster.cli.serve import config_from_args
from raypd.cluster.openai.metrics import IngressMetrics
from raypd.cluster.serve.config import ServeConfig, ServeConfigError
from raypd.protocol.roles import Role


def config(*flags: str) -> ServeConfig:
    return config_from_args(build_parser().parse_args(["serve", *flags]))


TARGETS = ("--autoscale-ttft", "2", "--autoscale-tpot", "0.2")


def test_the_flags_reach_the_scaler_and_size_the_admission_for_the_largest_pool():
    c = config("--prefill-nodes", "1", "--decode-nodes", "2", "--autoscale", "prefill=1:3,decode=1:4", *TARGETS,
               "--autoscale-window", "20", "--autoscale-option", "down_hold_s=90", "--autoscale-option", "min_samples=5")
    scaling = c.autoscale_config()
    assert scaling is not None
    assert scaling.ranges == (RoleRange(Role.PREFILL, 1, 3), RoleRange(Role.DECODE, 1, 4))
    assert (scaling.ttft_target_s, scaling.tpot_target_s, scaling.window_s, scaling.attainment) == (2, 0.2, 20, 0.9)
    assert (scaling.down_hold_s, scaling.min_samples) == (90.0, 5)
    assert c.most_nodes() == (3, 4, 0)
    fixed = config("--prefill-nodes", "1", "--decode-nodes", "2")
    assert fixed.autoscale_config() is None and fixed.most_nodes() == (1, 2, 0)
    assert c.admission_limits()[0] == 2 * fixed.admission_limits()[0]     # room for 4 decode nodes, not 2
    flex = config("--adaptive", "--prefill-nodes", "1", "--decode-nodes", "1", "--autoscale", "2:5", *TARGETS)
    assert flex.autoscale_config().ranges == (RoleRange(Role.FLEX, 2, 5),)
    assert flex.most_nodes() == (4, 1, 0)


@pytest.mark.parametrize("flags, message", [
    (("--mixed-nodes", "1", "--autoscale", "1:3"), "needs the SLO it scales for"),
    (("--mixed-nodes", "1", *TARGETS), "need --autoscale"),
    (("--mixed-nodes", "1", "--autoscale", "decode=1:3", *TARGETS), "starts no decode nodes"),
    (("--mixed-nodes", "3", "--autoscale", "1:2", *TARGETS), "starts 3 mixed node(s), outside that range"),
    (("--mixed-nodes", "1", "--autoscale", "0:2", *TARGETS), "at least one mixed node must stay"),
    (("--mixed-nodes", "1", "--autoscale", "1:2", *TARGETS, "--autoscale-option", "hold=3"), "autoscale options"),
    (("--mixed-nodes", "1", "--autoscale", "1:2", *TARGETS, "--autoscale-option", "up_hold_s"), "NAME=NUMBER"),
    (("--mixed-nodes", "1", "--autoscale", "1:2", "--autoscale-ttft", "0", "--autoscale-tpot", "1"), "must be > 0"),
])
def test_an_autoscale_setting_that_cannot_work_is_refused_with_its_reason(flags, message):
    with pytest.raises(ServeConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config(*flags)


def test_each_request_is_counted_against_the_targets_and_a_refusal_as_a_miss():
    metrics = IngressMetrics()
    metrics.slo = SloTally(ttft_target_s=1.0, tpot_target_s=0.1)
    for ttft, tpot, status in ((0.5, 0.05, "ok"), (2.0, 0.05, "ok"), (0.5, 0.3, "ok"), (None, None, "rejected"),
                               (None, None, "unavailable"), (None, None, "client_error"), (0.1, None, "aborted")):
        rec = metrics.start("chat")
        rec.ttft_s, rec.tpot_s = ttft, tpot
        rec.finish(status)
    sent: list[SloCounts] = []

    async def send(counts):
        sent.append(counts)
    reporter = SloReporter(metrics.slo, send)
    assert asyncio.run(reporter.report()) == SloCounts(ttft_met=2, ttft_total=3, tpot_met=2, tpot_total=3, rejected=2)
    assert asyncio.run(reporter.report()) == SloCounts.ZERO and len(sent) == 1   # nothing new: nothing sent
