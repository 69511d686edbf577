"""docs/grafana/raypd-dashboard.json against the metrics the code declares: every series a panel
queries is one Ray exports (prefix `ray_`; `_total` on counters; `_bucket/_sum/_count` on
histograms), every label it groups or filters by is one of that metric's tags, and every declared
metric has a panel. Renaming a metric without the dashboard (or the reverse) fails here."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from raypd.cluster.openai.metrics import IngressMetrics
from raypd.conductor.metrics import ConductorMetrics
from raypd.node.node_metrics import NodeMetrics
from tests.fake_metrics import FakeMetricsAPI

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "raypd-dashboard.json"
SERIES = re.compile(r"\bray_raypd_\w+")
GROUPING = re.compile(r"\bby \(([^)]*)\)")
MATCHER = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)\s*\"")  # label="x", label=~"x", ...


@pytest.fixture(scope="module")
def declared(request) -> dict:
    """Exported series name -> (base metric name, tag keys), for every metric of the three modules."""
    api = FakeMetricsAPI()
    IngressMetrics(api)
    NodeMetrics(api)
    ConductorMetrics(api)
    series = {}
    for name, m in api.made.items():
        exported = "ray_" + name
        if m.kind == "counter":
            names = [exported if exported.endswith("_total") else exported + "_total"]
        elif m.kind == "histogram":
            names = [exported + s for s in ("_bucket", "_sum", "_count")]
        else:
            names = [exported]
        for n in names:
            series[n] = (name, set(m.tag_keys))
    return series


def targets() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    out = [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]
    out += [(v["name"], v["definition"]) for v in dash["templating"]["list"] if "definition" in v]
    return out


def test_every_queried_series_is_exported(declared):
    unknown = [(title, s) for title, expr in targets() for s in SERIES.findall(expr) if s not in declared]
    assert not unknown


def test_grouping_and_filter_labels_are_the_metrics_tags(declared):
    for title, expr in targets():
        labels = {lab.strip() for g in GROUPING.findall(expr) for lab in g.split(",")} - {"le", ""}
        labels |= set(MATCHER.findall(expr))
        for s in SERIES.findall(expr):
            assert labels <= declared[s][1], (title, s, labels - declared[s][1])


def test_every_declared_metric_has_a_panel(declared):
    queried = {declared[s][0] for _, expr in targets() for s in SERIES.findall(expr) if s in declared}
    assert {base for base, _ in declared.values()} - queried == set()


def test_panels_use_the_prometheus_datasource_variable():
    dash = json.loads(DASHBOARD.read_text())
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    assert all(p["datasource"]["uid"] == "${datasource}" for p in panels)
    assert {r["title"] for r in dash["panels"] if r["type"] == "row"} == {"Ingress", "Conductor", "Nodes"}
