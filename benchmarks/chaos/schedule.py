"""When to kill, how, and whom: a seeded plan.

Kills happen at every_s, 2 x every_s, ... while before the end of the run. Their kinds rotate
through KINDS (those the allowed targets can take), so a run of three kills or more does each:

    ray_kill      ray.kill(actor, no_restart=False): Ray kills the worker and restarts the actor
    sigkill       SIGKILL of the actor's worker process, as if the process crashed
    engine_crash  the node's crash_engine(): its engine thread raises, the node reports itself
                  failed and Ray restarts it (nodes only; the Conductor has no engine)

The target is drawn at kill time, with the plan's own seeded RNG, from the allowed roles' actors
that are live then (the caller leaves out those still recovering from an earlier kill). The last
live node of a role is a candidate too: the cluster must ride its death out (requests wait for its
restart, serve/generation.py), so a 1 prefill + 1 decode run kills nodes as well as the Conductor.
With spare_last_node (`--spare-last-node`) a node is a candidate only while another node of its role
is live: a kill then tests failover alone, as the runs recorded before that option did.

On the lab (`--lab`, lab_mode.py) two more targets hit a whole host (never the head host):

    host_kill     target `host`: every process of the host SIGKILLed at once (Lab.kill_host); the
                  host stays lost, so the last live host of a role is never taken (the rest of the
                  run would have nothing to serve that role)
    partition     target `partition`: the host's link down for `--partition-s`, then up again; any
                  host that is neither lost nor already cut off
"""
from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

Kind = Literal["ray_kill", "sigkill", "engine_crash", "host_kill", "partition"]
KINDS: tuple[Kind, ...] = ("ray_kill", "sigkill", "engine_crash")   # of one actor
ROLES = ("prefill", "decode", "mixed", "flex", "conductor")
CONDUCTOR = "conductor"
# Host-level targets (the lab's) and the one kind each takes.
HOST_TARGETS: dict[str, Kind] = {"host": "host_kill", "partition": "partition"}
HOST_KINDS: tuple[Kind, ...] = ("host_kill", "partition")
TARGETS = (*ROLES, *HOST_TARGETS)


class Named(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def role(self) -> str: ...


T = TypeVar("T", bound=Named)


@dataclass(frozen=True, slots=True)
class PlannedKill:
    t_s: float   # seconds after the chaos run starts
    kind: Kind


def kind_fits(kind: Kind, role: str) -> bool:
    """Whether an actor of `role` can take a kill of `kind` (host kinds hit hosts, not actors)."""
    return kind not in HOST_KINDS and not (kind == "engine_crash" and role == CONDUCTOR)


def parse_targets(text: str) -> list[str]:
    """`--targets`' comma-separated names; ValueError for an unknown one."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = sorted(set(names) - set(TARGETS))
    if not names or unknown:
        raise ValueError(f"targets must be some of {', '.join(TARGETS)}; got {unknown or names}")
    return names


class KillSchedule:
    def __init__(self, duration_s: float, every_s: float, roles: Iterable[str], seed: int = 0,
                 spare_last_node: bool = False):
        if every_s <= 0:
            raise ValueError("--kill-every must be > 0")
        targets = frozenset(roles)
        unknown = targets - set(TARGETS)
        if not targets or unknown:
            raise ValueError(f"targets must be some of {', '.join(TARGETS)}; got {sorted(targets)}")
        self.roles = targets - set(HOST_TARGETS)
        self.host_kinds = {HOST_TARGETS[t] for t in targets & set(HOST_TARGETS)}
        self.kinds = [k for k in KINDS if any(kind_fits(k, r) for r in self.roles)] + \
                     [k for k in HOST_KINDS if k in self.host_kinds]
        times = []
        k = 1
        while k * every_s < duration_s:
            times.append(k * every_s)
            k += 1
        self.planned = [PlannedKill(t, self.kinds[i % len(self.kinds)]) for i, t in enumerate(times)]
        self._rng = random.Random(seed)
        self.spare_last_node = spare_last_node

    def eligible(self, kind: Kind, candidates: Sequence[T], live: set[str]) -> list[T]:
        """The candidates this kind may hit now, by name: allowed role, live, and (with spare_last_node)
        not the last live node of its role."""
        out = []
        for c in candidates:
            if c.role not in self.roles or not kind_fits(kind, c.role) or c.name not in live:
                continue
            if self.spare_last_node and c.role != CONDUCTOR and not any(
                    o.role == c.role and o.name != c.name and o.name in live for o in candidates):
                continue
            out.append(c)
        return sorted(out, key=lambda c: c.name)

    def pick(self, kind: Kind, candidates: Sequence[T], live: set[str]) -> T | None:
        choices = self.eligible(kind, candidates, live)
        return self._rng.choice(choices) if choices else None

    def pick_host(self, kind: Kind, hosts: Sequence[T], live: set[str]) -> T | None:
        """A host for a host kind, drawn among `hosts` (the non-head hosts, role = the host's role label)
        whose names are in `live` (neither lost nor cut off); a host kill never takes the last live
        host of its role."""
        if kind not in self.host_kinds:
            return None
        choices = sorted((h for h in hosts if h.name in live and (kind != "host_kill" or any(
            o.role == h.role and o.name != h.name and o.name in live for o in hosts))), key=lambda h: h.name)
        return self._rng.choice(choices) if choices else None
