"""Which UCX transport a NIXL agent's writes to its one peer take, read from UCX's own protocol tables.

Why tables: NIXL's Python API names only the plugin (query_xfer_backend says "UCX"), and UCX's
ucp_ep_print_info is C only, on an endpoint NIXL keeps to itself. UCX (>= 1.16 with its protocols v2,
the default; the wheel has 1.23) prints, with UCX_PROTO_INFO=y, one table per endpoint configuration
and operation when it first selects a protocol for them. The table is headed by the UCP context's
name, which NIXL sets to the agent's name, and by UCX's label for the endpoint (`self`, `intra-node`,
`inter-node`: reported as printed, not relied on; the lab's namespaces got `intra-node` with CMA
allowed and `inter-node` with UCX_TLS=tcp,self); its rows give, per message size, the transport and
device:

    | links-0-1-3f2a intra-node cfg#1                          |
    | remote memory write by ucp_put* from host memory to host |
    | Range  | Description | Config                            |
    | 0..inf | zero-copy   | 52% on tcp/lo and 48% on tcp/eth0 |

A NIXL WRITE is a ucp_put, so the put table of an agent that writes to one peer only is that peer's
transport: the probe makes one sender (one agent) per link for this (probe.py). The tables go to
UCX's log, UCX_LOG_FILE, which UCX reads when its library loads; so ask_for_tables() must run before
anything in the process has loaded nixl, and says why not otherwise.
"""
from __future__ import annotations

import ctypes
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

# Transports that move bytes inside one machine only (memory copies, shared memory, GPU IPC); any
# other (tcp, rc_*, dc_*, ud_*, srd, ...) goes over a network device.
SAME_MACHINE = frozenset({"cma", "knem", "xpmem", "posix", "sysv", "self", "cuda_ipc", "cuda_copy", "gdr_copy",
                          "rocm_ipc", "rocm_copy", "ze_ipc", "ze_copy"})
MAX_LOG_BYTES = 16 << 20  # a probe's log holds a few dozen tables per link; read no more than this

# "[1795870632.451476] [host:5528 :2]   | cell | cell |": the prefix is one table's (one log call's).
_ROW = re.compile(r"^(\[[^\]]*\]\s*\[[^\]]*\])\s*\|(.*)\|\s*$")
_TITLE = re.compile(r"^(?P<context>\S+) (?P<scope>self|intra-node|inter-node) cfg#\d+$")
_TRANSPORT = re.compile(r"\b([a-z][a-z0-9_]*)/([A-Za-z0-9_.:-]+)")


@dataclass(frozen=True, slots=True)
class PeerTransport:
    transports: tuple[str, ...]   # "tcp/eth0", "rc_mlx5/mlx5_0:1", "cma/memory": every one UCX may use
    scope: str | None             # UCX's label of the endpoint: "inter-node" or "intra-node"; None when unknown
    network: bool | None          # every transport goes over a network device; None when unknown
    note: str                     # where the answer came from, or why there is none

    @classmethod
    def unknown(cls, why: str) -> PeerTransport:
        return cls((), None, None, why)

    def describe(self) -> str:
        if not self.transports:
            return "unknown"
        return ",".join(self.transports) + (f" ({self.scope})" if self.scope else "")


def ask_for_tables(folder: Path) -> str | None:
    """Have UCX write its protocol tables into `folder` (one log per process); None when set, else why
    it cannot be (UCX already loaded here, so it read its settings before this)."""
    if ucx_loaded():
        return "UCX was loaded in this process before the probe could ask for its protocol tables"
    os.environ["UCX_PROTO_INFO"] = "y"
    os.environ["UCX_LOG_FILE"] = str(folder / "ucx.%p.log")   # UCX puts the pid in for %p
    return None


def ucx_loaded() -> bool:
    """Has this process loaded nixl or UCX's libraries already?"""
    if any(m.split(".")[0].startswith("nixl") for m in sys.modules):
        return True
    try:
        return "libucs" in Path("/proc/self/maps").read_text()
    except OSError:  # not Linux: nothing more to tell from
        return False


def read_logs(folder: Path) -> str:
    """The UCX logs in `folder`, at most MAX_LOG_BYTES of them, everything UCX has written so far
    included: UCX writes its log through a block-buffered C stream, whose last few KiB (the latest
    link's tables among them) reach the file only when flushed, so this flushes every C stream of
    the process first."""
    flush_c_streams()
    parts, left = [], MAX_LOG_BYTES
    for path in sorted(folder.glob("ucx.*.log")):
        with open(path, errors="replace") as f:
            text = f.read(left)
        parts.append(text)
        left -= len(text)
        if left <= 0:
            break
    return "\n".join(parts)


def flush_c_streams() -> None:
    try:
        ctypes.CDLL(None).fflush(None)   # fflush(NULL): every open output stream of this process
    except (OSError, AttributeError):   # no C library to ask: the file holds what was flushed
        pass


def put_tables(log: str, agent: str) -> list[tuple[str, list[str]]]:
    """(scope, the Config cell of every row) of each ucp_put table headed by the agent's context,
    its own endpoint to itself (scope `self`) left out."""
    tables: dict[str, list[list[str]]] = {}   # log-call prefix -> its rows' cells, in order
    for line in log.splitlines():
        m = _ROW.match(line)
        if m:
            tables.setdefault(m.group(1), []).append([c.strip() for c in m.group(2).split("|")])
    found = []
    for rows in tables.values():
        if len(rows) < 3 or len(rows[0]) != 1 or len(rows[1]) != 1:
            continue
        title = _TITLE.match(rows[0][0])
        if title is None or title["context"] != agent or title["scope"] == "self" or "ucp_put" not in rows[1][0]:
            continue
        configs = [cells[2] for cells in rows[2:] if len(cells) == 3 and cells[0] != "Range"]
        found.append((title["scope"], configs))
    return found


def transport_of(log: str, agent: str) -> PeerTransport:
    """The transports of the agent's writes, from its put tables in `log`."""
    tables = put_tables(log, agent)
    if not tables:
        return PeerTransport.unknown(f"UCX printed no put table for agent {agent} (protocols v1, "
                                     "UCX_PROTO_ENABLE=n, or a UCX older than 1.16)")
    names = sorted({f"{tl}/{dev}" for _, configs in tables for c in configs for tl, dev in _TRANSPORT.findall(c)})
    scopes = sorted({scope for scope, _ in tables})
    network = all(n.split("/")[0] not in SAME_MACHINE for n in names) if names else None
    return PeerTransport(tuple(names), ",".join(scopes), network, "UCX protocol table (UCX_PROTO_INFO)")
