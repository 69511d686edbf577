"""A run's KV tier figures from the nodes' own stats() (engine/cache/kv_tiers.py): running totals
read before and after the run (node_stats.py), and what grew in between.

    kv_tier_<T>_stored, _loaded, _rejected, _evicted   blocks, for T in host, disk
    kv_tier_<T>_bytes_written, _bytes_read
    kv_tier_<T>_load_seconds                          time spent loading blocks from T
    kv_tier_lookup_blocks                             prompt blocks that missed the pool, asked of the tiers

Each total is summed over the nodes. Hit rate of tier T = blocks loaded from T / blocks looked up; a
run's `hit_rate` is that of every tier together. A node without a tier has none of these keys, and
a system without one has no figures (None).
"""
from __future__ import annotations

TIERS = ("host", "disk")
OPS = ("stored", "loaded", "rejected", "evicted")
DIRECTIONS = ("written", "read")
FIELDS = (*OPS, *(f"bytes_{d}" for d in DIRECTIONS), "load_seconds")
LOOKUPS = "lookup_blocks"

Totals = dict[str, float]  # "disk_loaded", "disk_bytes_read", "disk_load_seconds", ..., "lookup_blocks"


def totals(nodes: list[dict]) -> Totals:
    """The tier totals of every node's stats(), summed, by key (see Totals)."""
    keys = [*(f"{t}_{f}" for t in TIERS for f in FIELDS), LOOKUPS]
    out: Totals = {}
    for stats in nodes:
        for key in keys:
            value = stats.get(f"kv_tier_{key}")
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[key] = out.get(key, 0.0) + value
    return out


def figures(before: Totals, after: Totals) -> dict | None:
    """What the run added: lookups, overall hit rate, and per tier its hit rate, blocks stored,
    loaded, rejected and evicted, bytes written and read, and load time. None without a tier."""
    tiers = [t for t in TIERS if any(k.startswith(f"{t}_") for k in after)]
    if not tiers:
        return None

    def grown(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    lookups = grown(LOOKUPS)
    loaded = sum(grown(f"{t}_loaded") for t in tiers)
    out: dict = {"lookup_blocks": int(lookups), "hit_rate": loaded / lookups if lookups > 0 else None}
    for t in tiers:
        hits = grown(f"{t}_loaded")
        out[t] = {"hit_rate": hits / lookups if lookups > 0 else None,
                  **{f"{op}_blocks": int(grown(f"{t}_{op}")) for op in OPS},
                  **{f"bytes_{d}": int(grown(f"{t}_bytes_{d}")) for d in DIRECTIONS},
                  "load_s": grown(f"{t}_load_seconds")}
    return out


def format_lines(fig: dict | None) -> list[str]:
    """One line per tier for the printed table."""
    if fig is None:
        return ["KV tier: none"]
    if "error" in fig:
        return [f"KV tier: {fig['error']}"]
    lines = []
    for t in TIERS:
        f = fig.get(t)
        if f is None:
            continue
        hit = "-" if f["hit_rate"] is None else f"{f['hit_rate']:.0%}"
        per_block = f"{1e3 * f['load_s'] / f['loaded_blocks']:.2f} ms/block" if f["loaded_blocks"] else "-"
        lines.append(f"KV tier {t}: hit rate {hit} of {fig['lookup_blocks']} blocks past the pool; loaded "
                     f"{f['loaded_blocks']} blocks ({_mb(f['bytes_read'])}) in {f['load_s']:.2f} s ({per_block}); "
                     f"stored {f['stored_blocks']} ({_mb(f['bytes_written'])}); evicted {f['evicted_blocks']}, "
                     f"rejected {f['rejected_blocks']}")
    return lines


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"
