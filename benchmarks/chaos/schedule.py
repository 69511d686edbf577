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
"""
from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

Kind = Literal["ray_kill", "sigkill", "engine_crash"]
KINDS: tuple[Kind, ...] = ("ray_kill", "sigkill", "engine_crash")
ROLES = ("prefill", "decode", "mixed", "flex", "conductor")
CONDUCTOR = "conductor"


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
    return not (kind == "engine_crash" and role == CONDUCTOR)


class KillSchedule:
    def __init__(self, duration_s: float, every_s: float, roles: Iterable[str], seed: int = 0,
                 spare_last_node: bool = False):
        if every_s <= 0:
            raise ValueError("--kill-every must be > 0")
        self.roles = frozenset(roles)
        unknown = self.roles - set(ROLES)
        if not self.roles or unknown:
            raise ValueError(f"targets must be some of {', '.join(ROLES)}; got {sorted(self.roles)}")
        self.kinds = [k for k in KINDS if any(kind_fits(k, r) for r in self.roles)]
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
