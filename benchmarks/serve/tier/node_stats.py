"""Every raypd node's stats() on a Ray cluster, as `raypd status` finds the nodes (their actor
names), read in a subprocess so the bench never joins Ray itself: ray.init would take over its
SIGTERM handler, and a driver's threads outlive ray.shutdown.

    python -m raypd.benchmarks.serve.tier.node_stats ADDRESS   ->   one JSON line: [each node's stats()]
    python -m raypd.benchmarks.serve.tier.node_stats ADDRESS --routing
        ->   one JSON line: the Conductor's recent decisions, by branch, with the explain() of the
             latest one served from a tier (how the Conductor priced the tier hit; conductor/policies/cost.py)

A reading takes a few seconds (Ray's import and connection), once before and once after each run;
the totals are exact when read (no export interval to wait out). One that fails says why on stderr
and gives no figures; the run's other figures stand.
"""
from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

from raypd.benchmarks.serve.tier.figures import figures, totals

MODULE = "raypd.benchmarks.serve.tier.node_stats"
CALL_TIMEOUT_S = 30.0
ROUTING_DECISIONS = 256  # the Conductor keeps a bounded window of recent decisions


def read(address: str, timeout_s: float = 120.0, routing: bool = False) -> list[dict] | None:
    """The nodes' stats() (with `routing`, [the Conductor's decisions summary]), or None (with the
    reason on stderr) when they could not be read."""
    try:
        done = subprocess.run([sys.executable, "-m", MODULE, address, *(["--routing"] if routing else [])],
                              capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        _warn(f"reading the nodes' stats at {address} took over {timeout_s:.0f}s")
        return None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        _warn(f"reading the nodes' stats at {address} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
        return None
    return list(json.loads(lines[-1]))


def read_routing(address: str) -> dict | None:
    """{"decisions": n, "branches": {branch: count}, "tier_explain": text or None} over the Conductor's
    recent decisions; None when there is no Conductor or it could not be read."""
    got = read(address, routing=True)
    return got[0] if got else None


def routing_summary(decisions: list) -> dict:
    """Branch counts and the explain() of the latest decision served from a tier (RouteDecisions)."""
    branches: dict[str, int] = {}
    for d in decisions:
        branches[d.branch] = branches.get(d.branch, 0) + 1
    tier = next((d for d in reversed(decisions) if d.branch == "tier"), None)
    return {"decisions": len(decisions), "branches": branches, "tier_explain": tier.explain() if tier else None}


def _warn(msg: str) -> None:
    print(f"raypd bench serve: no KV tier figures: {msg}", file=sys.stderr, flush=True)


class TierReader:
    """before() ahead of a run, after() behind it: the run's tier figures (figures.py)."""

    def __init__(self, address: str, read: Callable[[str], list[dict] | None] = read):
        self.address = address
        self.read = read
        self._before: list[dict] | None = None

    def before(self) -> None:
        self._before = self.read(self.address)

    def after(self) -> dict | None:
        """figures.py's figures (None: no tier), or {"error": ...} when a reading failed."""
        after = self.read(self.address)
        if self._before is None or after is None:
            return {"error": f"the nodes' stats at {self.address} could not be read (the log says why)"}
        return figures(totals(self._before), totals(after))


def main(argv: list[str] | None = None) -> int:
    import ray

    from raypd.cluster.cli.status import NODE_ACTOR, StatusError, connect

    args = sys.argv[1:] if argv is None else argv
    address, routing = args[0], "--routing" in args[1:]
    try:
        connect(address)
    except StatusError as e:
        print(e, file=sys.stderr)
        return 2
    if routing:
        from raypd.conductor.actor import DEFAULT_NAME
        try:
            named = [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"] == DEFAULT_NAME]
            if not named:
                print("no Conductor in this cluster", file=sys.stderr)
                return 3
            conductor = ray.get_actor(named[0]["name"], namespace=named[0]["namespace"])
            decisions = ray.get(conductor.recent_decisions.remote(ROUTING_DECISIONS), timeout=CALL_TIMEOUT_S)
        finally:
            ray.shutdown()
        print(json.dumps([routing_summary(decisions)], default=str))
        return 0
    try:
        named = sorted((a for a in ray.util.list_named_actors(all_namespaces=True) if NODE_ACTOR.match(a["name"])),
                       key=lambda a: a["name"])
        actors = [ray.get_actor(a["name"], namespace=a["namespace"]) for a in named]
        stats = ray.get([a.stats.remote() for a in actors], timeout=CALL_TIMEOUT_S)
    finally:
        ray.shutdown()
    print(json.dumps(stats, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
