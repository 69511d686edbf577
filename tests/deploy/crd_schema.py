"""Validate rendered objects against KubeRay's CRDs offline.

A CRD's `openAPIV3Schema` is JSON Schema plus Kubernetes extensions. `to_jsonschema` turns it into
plain draft-7: `x-kubernetes-int-or-string` becomes integer-or-string, `nullable` allows null, the
other `x-kubernetes-*` keys and `format` are dropped (the API server checks those, not us). In
strict mode every object schema with `properties` and without `x-kubernetes-preserve-unknown-fields`
gets `additionalProperties: false`: the API server silently prunes unknown fields of a structural
CRD, so a misspelt key (`replica:`) would otherwise vanish without an error.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema

# Pinned copies of the CRDs' v1 schemas (source, version and license in kuberay/README.md).
KUBERAY_DIR = Path(__file__).resolve().parent / "kuberay"
CRD_FILES = {"RayService": "rayservice.v1.json", "RayCluster": "raycluster.v1.json"}


def to_jsonschema(node: Any, strict: bool = True) -> Any:
    if isinstance(node, list):
        return [to_jsonschema(x, strict) for x in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key in ("nullable", "format", "description"):
            continue
        if key in ("properties", "patternProperties", "definitions"):
            # Keys here are field names, not schema keywords: convert the values only.
            out[key] = {name: to_jsonschema(sub, strict) for name, sub in value.items()}
        else:
            out[key] = to_jsonschema(value, strict)
    if node.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    if (strict and "properties" in node and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@functools.cache
def crd_schema(kind: str, version: str = "v1") -> dict:
    """The raw openAPIV3Schema of a KubeRay CRD version."""
    pinned = json.loads((KUBERAY_DIR / CRD_FILES[kind]).read_text())
    assert (pinned["kind"], pinned["version"]) == (kind, version), f"no pinned schema for {kind} {version}"
    return pinned["openAPIV3Schema"]


@functools.cache
def validator(kind: str, strict: bool = True, path: tuple[str, ...] = ()) -> jsonschema.Draft7Validator:
    """A validator for the CRD's schema, or for the sub-schema at `path` (a chain of keys)."""
    schema = crd_schema(kind)
    for key in path:
        schema = schema[key]
    converted = to_jsonschema(schema, strict)
    jsonschema.Draft7Validator.check_schema(converted)
    return jsonschema.Draft7Validator(converted)


def errors(kind: str, obj: dict, path: tuple[str, ...] = (), strict: bool = True) -> list[str]:
    """Every schema violation, as 'a.b.c: message' lines (empty when valid)."""
    found = validator(kind, strict, path).iter_errors(obj)
    return sorted(f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in found)
