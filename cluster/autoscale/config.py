"""Frozen configuration of the autoscaler: each scaled role's node range (the `--autoscale` flag)
and the SLO targets, windows, holds and cooldowns the policy (policy.py) judges by.

`--autoscale` takes one range for every role the deployment starts, or one range per role:

    --autoscale 1:4                      every started role between 1 and 4 nodes
    --autoscale prefill=1:4,decode=2:6   only the roles named are scaled; the others keep their count

A range names how many nodes of the role may serve (MIN, MAX); whether the deployment can still
serve at MIN (a decode-serving role at 0) is the caller's check, since it depends on the other
roles and on the local prefill path. Errors are AutoscaleConfigError, worded for the flag's user.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from raypd.protocol.roles import Role


class AutoscaleConfigError(ValueError):
    """An --autoscale value or an AutoscaleConfig field that cannot be used; the message says why."""


@dataclass(frozen=True, slots=True)
class RoleRange:
    """How many nodes of `role` the autoscaler keeps serving: never fewer than `least` (a node lost
    below it is replaced at once), never more than `most`."""
    role: Role
    least: int
    most: int

    def __post_init__(self) -> None:
        if self.least < 0:
            raise AutoscaleConfigError(f"{self.role}: MIN must be >= 0, got {self.least}")
        if self.most < 1:
            raise AutoscaleConfigError(f"{self.role}: MAX must be >= 1, got {self.most}")
        if self.least > self.most:
            raise AutoscaleConfigError(f"{self.role}: MIN {self.least} is above MAX {self.most}")

    def __str__(self) -> str:
        return f"{self.role}={self.least}:{self.most}"


_FORMS = "MIN:MAX or role=MIN:MAX[,role=MIN:MAX...]"


def parse_autoscale(text: str, started: Sequence[Role]) -> tuple[RoleRange, ...]:
    """The ranges an --autoscale value names. `started`: the roles the deployment starts nodes of
    (repeats allowed); a bare MIN:MAX applies to each of them, in their first order."""
    text = text.strip()
    roles = tuple(dict.fromkeys(started))
    if not text:
        raise AutoscaleConfigError(f"autoscale: empty; expected {_FORMS}")
    if "=" not in text:
        if not roles:
            raise AutoscaleConfigError("autoscale: the deployment starts no nodes to scale")
        least, most = _bounds(text, text)
        return tuple(RoleRange(r, least, most) for r in roles)
    out: dict[Role, RoleRange] = {}
    for item in text.split(","):
        name, eq, bounds = item.strip().partition("=")
        if not eq or not name.strip():
            raise AutoscaleConfigError(f"autoscale: {item.strip()!r} is not role=MIN:MAX (in {text!r}; "
                                       f"expected {_FORMS})")
        try:
            role = Role.parse(name.strip().lower())
        except ValueError as e:
            raise AutoscaleConfigError(f"autoscale: {e}") from None
        if role not in roles:
            raise AutoscaleConfigError(f"autoscale: the deployment starts no {role} nodes "
                                       f"(it starts {', '.join(map(str, roles)) or 'none'})")
        if role in out:
            raise AutoscaleConfigError(f"autoscale: {role} is given twice")
        out[role] = RoleRange(role, *_bounds(bounds, item.strip()))
    return tuple(out.values())


def _bounds(text: str, item: str) -> tuple[int, int]:
    """MIN and MAX of `text` ("1:4"), checked; `item` is what the message quotes."""
    parts = text.split(":")
    try:
        if len(parts) != 2:
            raise ValueError(text)
        least, most = int(parts[0]), int(parts[1])
    except ValueError:
        raise AutoscaleConfigError(f"autoscale: {item!r} is not {_FORMS} (MIN and MAX whole numbers)") from None
    if least < 0 or most < 0:
        raise AutoscaleConfigError(f"autoscale: {item!r}: node counts cannot be negative")
    if most < 1:
        raise AutoscaleConfigError(f"autoscale: {item!r}: MAX must be at least 1")
    if least > most:
        raise AutoscaleConfigError(f"autoscale: {item!r}: MIN {least} is above MAX {most}")
    return least, most


@dataclass(frozen=True, slots=True)
class AutoscaleConfig:
    """What the policy judges by (policy.py says how each field acts). Derive a variant with
    dataclasses.replace, never mutate."""
    ranges: tuple[RoleRange, ...]
    ttft_target_s: float
    tpot_target_s: float
    attainment: float = 0.9         # share of requests that must meet both targets
    window_s: float = 30.0          # attainment is judged over the requests of this window
    min_samples: int = 8            # fewer requests than this in the window: attainment unknown, queues judge
    tick_s: float = 2.0             # how often the pool measures and asks the policy
    up_hold_s: float = 6.0          # a shortfall must last this long before a node is added
    up_cooldown_s: float = 20.0     # after a role's addition ended, before its next (new samples fill the window)
    down_hold_s: float = 60.0       # idleness must last this long before a node is removed ...
    down_break_s: float = 10.0      # ... broken only by a spell of more than this without it (a burst)
    down_cooldown_s: float = 60.0   # after any order was given or ended, before a removal
    idle_share: float = 0.5         # a role shrinks only if its busy share over one node fewer stays under this
    queue_per_node: float = 2.0     # requests waiting per live node above which a role counts as queueing
    kv_full: float = 0.9            # a decode-serving role's KV share in use above which it counts as queueing
    # Early signals, before requests finish: a role is short once its step time passes this share of
    # the TPOT target (roles that decode) or its prompts' wait for compute this share of the TTFT target
    early_share: float = 0.8
    drain_timeout_s: float = 300.0  # the caller stops a removed node after this long draining

    def __post_init__(self) -> None:
        if not self.ranges:
            raise AutoscaleConfigError("autoscale: no role to scale")
        roles = [r.role for r in self.ranges]
        if len(set(roles)) != len(roles):
            raise AutoscaleConfigError(f"autoscale: a role has two ranges: {', '.join(map(str, self.ranges))}")
        positive = {"ttft_target_s": self.ttft_target_s, "tpot_target_s": self.tpot_target_s,
                    "window_s": self.window_s, "tick_s": self.tick_s, "queue_per_node": self.queue_per_node,
                    "drain_timeout_s": self.drain_timeout_s}
        for name, value in positive.items():
            if not value > 0:
                raise AutoscaleConfigError(f"autoscale: {name} must be > 0, got {value}")
        waits = {"up_hold_s": self.up_hold_s, "up_cooldown_s": self.up_cooldown_s,
                 "down_hold_s": self.down_hold_s, "down_cooldown_s": self.down_cooldown_s,
                 "down_break_s": self.down_break_s}
        for name, value in waits.items():
            if not value >= 0:
                raise AutoscaleConfigError(f"autoscale: {name} must be >= 0, got {value}")
        shares = {"attainment": self.attainment, "idle_share": self.idle_share, "kv_full": self.kv_full,
                  "early_share": self.early_share}
        for name, value in shares.items():
            if not 0 < value <= 1:
                raise AutoscaleConfigError(f"autoscale: {name} must be in (0, 1], got {value}")
        if self.min_samples < 1:
            raise AutoscaleConfigError(f"autoscale: min_samples must be >= 1, got {self.min_samples}")

    @property
    def roles(self) -> tuple[Role, ...]:
        """The scaled roles, in the ranges' order."""
        return tuple(r.role for r in self.ranges)

    def range_of(self, role: Role) -> RoleRange | None:
        """The range of `role`; None when it is not scaled."""
        return next((r for r in self.ranges if r.role is role), None)
