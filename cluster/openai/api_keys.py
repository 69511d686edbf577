"""The API keys an ingress accepts, each with the caller it names: a tenant, a default priority and a
fair-share weight.

    raypd serve --api-key KEY              one key: tenant "default", priority 0
    raypd serve --api-keys-file keys.yaml  several, each with its own tenant and default priority

The file (YAML, or JSON, which YAML reads):

    keys:
      - key: sk-interactive-7f3a...   # the bearer secret (required, unique)
        tenant: web                   # whose requests these are (default: key-<n>, its place in the list)
        priority: -1                  # for requests that send no `priority` (default 0; lower is more urgent)
        weight: 2                     # its share of a contended ingress against other tenants (default 1)
      - key: sk-batch-19c2...
        tenant: batch
        priority: 10

A request's tenant is its `x-raypd-tenant` header when it sends one (a gateway in front that knows
the end user), else its key's (guard.py). Tenants share a contended ingress by tokens served, in
proportion to their weights (protocol/fair_share.py).

A request's `priority` field, when sent, wins over its key's default (the key's is what an operator
promises a tenant, the field what a client asks for one request; vLLM and SGLang take the field).
Without any key the ingress is open and every caller is ANONYMOUS. Secrets never reach a repr or a
log line: a KeyRing shows only its tenants.
"""
from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path

import yaml

from raypd.protocol.sampling_params import PRIORITY_BOUND


@dataclass(frozen=True, slots=True)
class Caller:
    tenant: str
    priority: int = 0   # the default priority of the caller's requests
    weight: float = 1.0  # its share against other tenants' (fair_share.py)


ANONYMOUS = Caller("anonymous")


class KeysFileError(ValueError):
    """The keys file cannot be used; the message names the file and the entry."""


class KeyRing:
    def __init__(self, callers: dict[bytes, Caller]):
        if not callers:
            raise KeysFileError("a key ring needs at least one key")
        self._callers = dict(callers)

    @classmethod
    def single(cls, key: str) -> KeyRing:
        return cls({key.encode(): Caller("default")})

    @classmethod
    def from_file(cls, path: str | Path) -> KeyRing:
        path = Path(path)
        try:
            doc = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as e:
            raise KeysFileError(f"{path}: cannot read the keys file: {e}") from None
        entries = doc.get("keys") if isinstance(doc, dict) else None
        if not isinstance(entries, list) or not entries:
            raise KeysFileError(f"{path}: expected a non-empty list under `keys:`")
        callers: dict[bytes, Caller] = {}
        for i, entry in enumerate(entries):
            where = f"{path}: keys[{i}]"
            if not isinstance(entry, dict) or set(entry) - {"key", "tenant", "priority", "weight"}:
                raise KeysFileError(f"{where}: expected a mapping of key, tenant, priority and weight")
            key, tenant, priority = entry.get("key"), entry.get("tenant", f"key-{i}"), entry.get("priority", 0)
            weight = entry.get("weight", 1)
            if not isinstance(key, str) or not key.strip() or key != key.strip():
                raise KeysFileError(f"{where}: `key` must be a non-empty string without surrounding spaces")
            if not isinstance(tenant, str) or not tenant:
                raise KeysFileError(f"{where}: `tenant` must be a non-empty string")
            if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > PRIORITY_BOUND:
                raise KeysFileError(f"{where}: `priority` must be an integer in [-{PRIORITY_BOUND}, {PRIORITY_BOUND}]")
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight <= 1e6:
                raise KeysFileError(f"{where}: `weight` must be a number in (0, 1e6]")
            if key.encode() in callers:
                raise KeysFileError(f"{where}: the same key is listed twice")
            callers[key.encode()] = Caller(tenant, priority, float(weight))
        return cls(callers)

    def merged(self, other: KeyRing) -> KeyRing:
        """Both rings' keys; a key in both keeps this ring's caller."""
        return KeyRing({**other._callers, **self._callers})

    def caller(self, presented: bytes) -> Caller | None:
        """Whose key this is, or None. Every key is compared, in constant time each, so the time
        taken says nothing about which key came close."""
        found = None
        for key, caller in self._callers.items():
            if hmac.compare_digest(presented, key):
                found = caller
        return found

    def __len__(self) -> int:
        return len(self._callers)

    def __repr__(self) -> str:
        return f"KeyRing(tenants={sorted({c.tenant for c in self._callers.values()})})"
