"""Which UCX transports a NIXL agent's writes take, read from UCX's own protocol tables: for
`raypd bench links` (one agent per link, so one peer's transport) and for every node's transfer
endpoint at run time (one agent for all its peers, so the union over them).

Why tables: NIXL's Python API names only the plugin (query_xfer_backend says "UCX"), and UCX's
ucp_ep_print_info is C only, on an endpoint NIXL keeps to itself. UCX (>= 1.16 with its protocols v2,
the default; the wheel has 1.23) prints, with UCX_PROTO_INFO=y, one table per endpoint configuration
and operation when it first selects a protocol for them, which is as it configures the endpoint (a
connection to a peer: measured, a writer's put table is in the log before its first write, and a
reader's too, for the connection its writer made back to it). The table is headed by the UCP
context's name, which NIXL sets to the agent's name, and by UCX's label for the endpoint (`self`,
`intra-node`, `inter-node`: reported as printed, not relied on; the lab's namespaces got
`intra-node` with CMA allowed and `inter-node` with UCX_TLS=tcp,self); its rows give, per message
size, the transport and device:

    | links-0-1-3f2a intra-node cfg#1                          |
    | remote memory write by ucp_put* from host memory to host |
    | Range  | Description | Config                            |
    | 0..inf | zero-copy   | 52% on tcp/lo and 48% on tcp/eth0 |

A NIXL WRITE is a ucp_put, so an agent's put tables are the transports its writes take: with one
peer (the probe makes one sender per link for this, benchmarks/links/probe.py) that peer's; with
several (a prefill node's sender writes to every decode node and prefix importer with one agent)
only their union, since UCX prints one table per endpoint configuration, shared by every peer
reached the same way, and names no peer. The union is what proves "no same-machine transport":
network is True only when no table of the agent names one (nor the loopback device). Its own
endpoint to itself (`self`) and its notifier agent (`<name>.notify`, active messages, no puts) are
left out.

The tables go to UCX's log, UCX_LOG_FILE, which UCX reads when its library loads, so asking for
them must happen before anything in the process has loaded nixl: ask_for_tables(folder) (the probe)
says why not otherwise. A node asks with an environment variable, off by default (UCX then writes
its tables and its warnings to that file instead of stderr):

    RAYPD_UCX_TRANSPORT_REPORT=1   NixlBackend, before it loads nixl, calls ask_from_env(): once per
                                   process, a folder raypd-ucx-<pid>-* under the process's temp dir
                                   (TMPDIR) gets UCX's log, ucx.<pid>.log; writes_of(agent) reads it
"""
from __future__ import annotations

import ctypes
import functools
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPORT_ENV = "RAYPD_UCX_TRANSPORT_REPORT"
# Transports that move bytes inside one machine only (memory copies, shared memory, GPU IPC), and
# devices that do (loopback: tcp/lo never leaves the machine); any other transport (tcp, rc_*,
# dc_*, ud_*, srd, ...) on any other device goes over a network device.
SAME_MACHINE = frozenset({"cma", "knem", "xpmem", "posix", "sysv", "self", "cuda_ipc", "cuda_copy", "gdr_copy",
                          "rocm_ipc", "rocm_copy", "ze_ipc", "ze_copy"})
LOOPBACK = frozenset({"lo"})
MAX_LOG_BYTES = 16 << 20  # a probe's log holds a few dozen tables per link; read no more than this
# A node's stats ask for its report every 0.1 s on the engine thread (its published load): the log
# is read again only when it grew, and then at most this often.
REREAD_EVERY_S = 1.0

# "[1795870632.451476] [host:5528 :2]   | cell | cell |": the prefix is one table's (one log call's).
_ROW = re.compile(r"^(\[[^\]]*\]\s*\[[^\]]*\])\s*\|(.*)\|\s*$")
_TITLE = re.compile(r"^(?P<context>\S+) (?P<scope>self|intra-node|inter-node) cfg#\d+$")
_TRANSPORT = re.compile(r"\b([a-z][a-z0-9_]*)/([A-Za-z0-9_.:-]+)")


@dataclass(frozen=True, slots=True)
class PeerTransport:
    """The transports one agent's writes took: to its one peer (a probe's link), or to all of them."""
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
        return "UCX was loaded in this process before its protocol tables could be asked for"
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
    return _read_flushed(folder)


def _read_flushed(folder: Path) -> str:
    parts, left = [], MAX_LOG_BYTES
    for path in sorted(folder.glob("ucx.*.log")):
        with open(path, errors="replace") as f:
            text = f.read(left)
        parts.append(text)
        left -= len(text)
        if left <= 0:
            break
    return "\n".join(parts)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None)
    except OSError:  # no C library to ask
        return None


def flush_c_streams() -> None:
    libc = _libc()
    try:
        if libc is not None:
            libc.fflush(None)   # fflush(NULL): every open output stream of this process
    except AttributeError:   # no fflush to call: the file holds what was flushed
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


def same_machine(transport: str) -> bool:
    """Does "tl/device" (as the tables name it) move bytes inside one machine only?"""
    tl, _, device = transport.partition("/")
    return tl in SAME_MACHINE or device in LOOPBACK


def transport_of(log: str, agent: str) -> PeerTransport:
    """The transports of the agent's writes, from its put tables in `log`."""
    tables = put_tables(log, agent)
    if not tables:
        return PeerTransport.unknown(f"UCX printed no put table for agent {agent}: no connection to a peer yet "
                                     "(UCX prints an endpoint's tables as it configures it), or UCX prints none "
                                     "(protocols v1, UCX_PROTO_ENABLE=n, a UCX older than 1.16)")
    names = sorted({f"{tl}/{dev}" for _, configs in tables for c in configs for tl, dev in _TRANSPORT.findall(c)})
    scopes = sorted({scope for scope, _ in tables})
    network = not any(same_machine(n) for n in names) if names else None
    return PeerTransport(tuple(names), ",".join(scopes), network, "UCX protocol table (UCX_PROTO_INFO)")


class ProtocolTables:
    """The tables UCX writes into one folder, for many agents and callers: looked at (a flush and a
    stat) at most every REREAD_EVERY_S and read again only when it grew, so asking every 0.1 s, as a
    node's published load does, costs a clock read and a dict lookup."""

    def __init__(self, folder: Path, clock: Callable[[], float] = time.monotonic):
        self.folder = folder
        self._clock = clock
        self._lock = threading.Lock()   # the engine thread and the actor's threads may ask at once
        self._size = -1
        self._read_at = float("-inf")
        self._log = ""
        self._answers: dict[str, PeerTransport] = {}

    def transport_of(self, agent: str) -> PeerTransport:
        with self._lock:
            now = self._clock()
            if now - self._read_at >= REREAD_EVERY_S:   # between looks, the last answer: no flush, no stat
                self._read_at = now
                flush_c_streams()
                if (size := self._log_bytes()) != self._size:
                    self._size, self._answers = size, {}
                    self._log = _read_flushed(self.folder)
            if agent not in self._answers:
                self._answers[agent] = transport_of(self._log, agent)
            return self._answers[agent]

    def _log_bytes(self) -> int:
        total = 0
        for path in self.folder.glob("ucx.*.log"):
            try:
                total += path.stat().st_size
            except OSError:  # removed meanwhile
                pass
        return total


@dataclass
class _ThisProcess:
    """What this process asked UCX for (UCX's settings are per process): its tables, or why none."""
    tables: ProtocolTables | None = None
    why_none: str = f"off: {REPORT_ENV}=1 in the node's environment turns the report on"
    asked: bool = False


_this_process = _ThisProcess()


def report_requested() -> bool:
    """Is REPORT_ENV on for this process?"""
    return os.environ.get(REPORT_ENV, "").strip().lower() in ("1", "y", "yes", "true", "on")


def ask_from_env() -> None:
    """When REPORT_ENV is on, have UCX write its tables into a folder of this process's own under its
    temp dir; once per process, and only before nixl loads (NixlBackend calls this first). A process
    whose UCX log someone else already directs (UCX_LOG_FILE set: the operator, or the bench's probe,
    which reads its own) is left alone; its report says so."""
    me = _this_process
    if me.asked or not report_requested():
        return
    me.asked = True
    if os.environ.get("UCX_LOG_FILE"):
        me.why_none = f"UCX_LOG_FILE was already set ({os.environ['UCX_LOG_FILE']}): the report reads a log of its own"
        return
    folder = Path(tempfile.mkdtemp(prefix=f"raypd-ucx-{os.getpid()}-"))
    why = ask_for_tables(folder)
    if why is not None:
        shutil.rmtree(folder, ignore_errors=True)
        me.why_none = why
        return
    me.tables = ProtocolTables(folder)


def writes_of(agent: str) -> PeerTransport:
    """The transports this process's agent `agent` writes with (its put tables: the union over the
    peers it is connected to so far), or unknown with the reason (the report is off, was asked for
    too late, no connection yet)."""
    me = _this_process
    if me.tables is None:
        return PeerTransport.unknown(me.why_none)
    return me.tables.transport_of(agent)
