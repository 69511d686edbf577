"""Fixtures for the deployment manifests: the Helm chart rendered offline by Helm's own engine
(helm-python-sdk binds Helm's Go SDK; no helm binary, no cluster, no chart repository)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import helm_python  # the `test` extra's helm-python-sdk
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "raypd"
CLUSTER_YAML = REPO / "cluster" / "cluster.yaml"
CLUSTER_LOCAL_YAML = REPO / "cluster" / "cluster.local.yaml"


@dataclass
class Rendered:
    """One `helm template`: the parsed objects, plus NOTES.txt as text."""
    objects: list[dict]
    notes: str
    files: dict[str, str] = field(repr=False, default_factory=dict)

    def of_kind(self, kind: str) -> list[dict]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str) -> dict:
        (obj,) = self.of_kind(kind)
        return obj

    @property
    def rayservice(self) -> dict:
        return self.one("RayService")

    @property
    def cluster(self) -> dict:
        return self.rayservice["spec"]["rayClusterConfig"]

    @property
    def head(self) -> dict:
        return self.cluster["headGroupSpec"]

    def group(self, name: str) -> dict:
        (g,) = [g for g in self.cluster["workerGroupSpecs"] if g["groupName"] == name]
        return g

    @property
    def serve_config(self) -> dict:
        return yaml.safe_load(self.rayservice["spec"]["serveConfigV2"])

    @property
    def app_args(self) -> dict:
        (app,) = self.serve_config["applications"]
        return app["args"]


@pytest.fixture(scope="session")
def chart():
    with helm_python.Chart.load(str(CHART)) as loaded:
        yield loaded


@pytest.fixture(scope="session")
def render(chart):
    """render(values=None, name="raypd", namespace="llm") -> Rendered."""
    def _render(values: dict | None = None, name: str = "raypd", namespace: str = "llm") -> Rendered:
        files = chart.render(values or {}, name=name, namespace=namespace, is_install=True)
        objects, notes = [], ""
        for path, text in files.items():
            if path.endswith("NOTES.txt"):
                notes = text
                continue
            objects += [doc for doc in yaml.safe_load_all(text) if doc]
        return Rendered(objects, notes, files)
    return _render
