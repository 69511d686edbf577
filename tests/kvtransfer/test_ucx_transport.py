"""Reading which UCX transports an agent's writes took from UCX's protocol tables
(kvtransfer/nixl/ucx_transport.py): the put tables of the one agent that wrote, its own endpoint to
itself and every other agent's (its notifier's too) left out; a network transport told from a
same-machine one; a node's endpoint, one agent for all its peers, reported as the union of its
tables, so one peer reached by CMA makes the whole report not a network one; the log read again
only when it grew; the report asked for from the environment once, before nixl loads; and an answer
of "unknown" with the reason where UCX printed nothing, was loaded too early or the report is off.
The log lines are UCX 1.23's, as the wheel's UCX wrote them on this machine (UCX_PROTO_INFO=y,
UCX_LOG_FILE)."""
from __future__ import annotations

import os
import tempfile

import pytest

from raypd.kvtransfer.nixl import ucx_transport
from raypd.kvtransfer.nixl.ucx_transport import REPORT_ENV, PeerTransport, ProtocolTables, put_tables, transport_of


def table(prefix: str, title: str, operation: str, rows: list[tuple[str, str, str]]) -> str:
    border = f"{prefix}   +--------+-------------+-----------------------------------+"
    lines = [border, f"{prefix}   | {title:56s} |", f"{prefix}   | {operation} |", border,
             f"{prefix}   | Range  | Description |              Config               |", border]
    lines += [f"{prefix}   | {r:6s} | {d:11s} | {c:33s} |" for r, d, c in rows]
    return "\n".join([*lines, border])


PUT = "remote memory write by ucp_put* from host memory to host"
AM = "active message by ucp_am_send* from host memory"
AGENT = "links-0-1-3f2a9c"
LOG = "\n".join([
    "[1795870805.500001] [vm:9764 :0] UCX  WARN  a warning between the tables",
    table("[1795870805.537687] [vm:9764 :0]", f"{AGENT} self cfg#0", PUT, [("0..inf", "zero-copy", "cma/memory")]),
    table("[1795870805.540266] [vm:9764 :0]", f"{AGENT} intra-node cfg#1", AM, [("0..inf", "short", "posix/memory")]),
    table("[1795870805.725516] [vm:9764 :1]", f"{AGENT} intra-node cfg#1", PUT,
          [("0..8172", "short", "tcp/eth0"), ("8173..inf", "zero-copy", "52% on tcp/lo and 48% on tcp/eth0")]),
    table("[1795870805.837320] [vm:9764 :1]", f"{AGENT}.notify intra-node cfg#1", PUT, [("0..inf", "zero-copy", "cma/memory")]),
    table("[1795870805.860991] [vm:9764 :2]", "links-0-2-77aa01 intra-node cfg#1", PUT, [("0..inf", "zero-copy", "cma/memory")]),
    table("[1795870805.870000] [vm:9764 :2]", "links-0-3-1b2c3d inter-node cfg#2", PUT,
          [("0..inf", "zero-copy", "rc_mlx5/mlx5_0:1")]),
])


def test_the_put_table_of_the_agent_that_wrote_names_its_peer_transport():
    assert put_tables(LOG, AGENT) == [("intra-node", ["tcp/eth0", "52% on tcp/lo and 48% on tcp/eth0"])]
    # UCX_TLS=tcp between two processes of one machine: part of the bytes over the loopback device,
    # which no two machines share, so not a network transport.
    assert transport_of(LOG, AGENT) == PeerTransport(("tcp/eth0", "tcp/lo"), "intra-node", False,
                                                     "UCX protocol table (UCX_PROTO_INFO)")
    assert transport_of(LOG, AGENT).describe() == "tcp/eth0,tcp/lo (intra-node)"


def test_a_same_machine_transport_is_not_a_network_one_and_rdma_is():
    assert transport_of(LOG, "links-0-2-77aa01") == PeerTransport(("cma/memory",), "intra-node", False,
                                                                  "UCX protocol table (UCX_PROTO_INFO)")
    assert transport_of(LOG, "links-0-3-1b2c3d").transports == ("rc_mlx5/mlx5_0:1",)
    assert transport_of(LOG, "links-0-3-1b2c3d").network is True
    assert [ucx_transport.same_machine(t) for t in ("tcp/eth0", "tcp/lo", "posix/memory", "dc_mlx5/mlx5_1:1")] \
        == [False, True, True, False]


def test_no_table_for_the_agent_is_unknown_with_the_reason():
    got = transport_of(LOG, "links-9-9-000000")
    assert (got.transports, got.scope, got.network) == ((), None, None)
    assert "no put table for agent links-9-9-000000" in got.note and "no connection" in got.note
    assert got.describe() == "unknown"
    assert transport_of("", AGENT).network is None


def test_the_tables_are_asked_for_only_before_ucx_loads(monkeypatch, tmp_path):
    monkeypatch.setattr(ucx_transport, "ucx_loaded", lambda: True)
    monkeypatch.delenv("UCX_PROTO_INFO", raising=False)
    assert "loaded in this process before" in ucx_transport.ask_for_tables(tmp_path)
    assert "UCX_PROTO_INFO" not in os.environ
    monkeypatch.setattr(ucx_transport, "ucx_loaded", lambda: False)
    monkeypatch.setenv("UCX_PROTO_INFO", "n")   # restored by monkeypatch, as is UCX_LOG_FILE below
    monkeypatch.setenv("UCX_LOG_FILE", "")
    assert ucx_transport.ask_for_tables(tmp_path) is None
    assert (os.environ["UCX_PROTO_INFO"], os.environ["UCX_LOG_FILE"]) == ("y", str(tmp_path / "ucx.%p.log"))


def test_logs_are_read_from_the_folder_bounded(monkeypatch, tmp_path):
    (tmp_path / "ucx.11.log").write_text("a" * 10)
    (tmp_path / "ucx.12.log").write_text("b" * 10)
    (tmp_path / "other.txt").write_text("c")
    assert ucx_transport.read_logs(tmp_path) == "a" * 10 + "\n" + "b" * 10
    monkeypatch.setattr(ucx_transport, "MAX_LOG_BYTES", 15)
    assert ucx_transport.read_logs(tmp_path) == "a" * 10 + "\n" + "b" * 5


# A prefill node's sender: one agent for every peer, so one table per endpoint configuration, naming no peer.
NODE = "prefill-0"
NODE_LOG = "\n".join([
    table("[1795870900.100000] [h1:4242 :0]", f"{NODE} self cfg#0", PUT, [("0..inf", "zero-copy", "self/memory")]),
    table("[1795870900.200000] [h1:4242 :1]", f"{NODE} inter-node cfg#1", PUT,
          [("0..8172", "short", "tcp/eth0"), ("8173..inf", "zero-copy", "tcp/eth0")]),
    table("[1795870900.300000] [h1:4242 :1]", f"{NODE}.notify inter-node cfg#1", AM, [("0..inf", "short", "tcp/eth0")]),
    table("[1795870900.400000] [h1:4242 :2]", f"{NODE} inter-node cfg#2", PUT,
          [("0..inf", "zero-copy", "rc_mlx5/mlx5_0:1")]),
])
# ... and the same node once one more peer was reached on the same machine, by CMA.
WITH_CMA = NODE_LOG + "\n" + table("[1795870900.500000] [h1:4242 :3]", f"{NODE} intra-node cfg#3", PUT,
                                   [("0..inf", "zero-copy", "cma/memory")])


def test_an_endpoint_with_several_peers_reports_the_union_of_its_tables():
    assert transport_of(NODE_LOG, NODE) == PeerTransport(("rc_mlx5/mlx5_0:1", "tcp/eth0"), "inter-node", True,
                                                         "UCX protocol table (UCX_PROTO_INFO)")


def test_one_peer_reached_by_a_same_machine_transport_makes_the_report_false():
    got = transport_of(WITH_CMA, NODE)
    assert got.network is False and "cma/memory" in got.transports
    assert (got.scope, got.describe()) == ("inter-node,intra-node",
                                           "cma/memory,rc_mlx5/mlx5_0:1,tcp/eth0 (inter-node,intra-node)")
    posix = NODE_LOG + "\n" + table("[1795870900.600000] [h1:4242 :4]", f"{NODE} intra-node cfg#4", PUT,
                                     [("0..inf", "short", "posix/memory")])
    assert transport_of(posix, NODE).network is False


def test_the_tables_are_read_again_only_when_the_log_grew_and_at_most_so_often(tmp_path):
    now = [100.0]
    tables = ProtocolTables(tmp_path, clock=lambda: now[0])
    log = tmp_path / "ucx.4242.log"
    assert tables.transport_of(NODE).network is None            # no log yet: no connection
    log.write_text(NODE_LOG)
    assert tables.transport_of(NODE).network is None            # grown, but read less than a second ago
    now[0] += ucx_transport.REREAD_EVERY_S
    assert tables.transport_of(NODE).network is True
    log.write_text(WITH_CMA)
    now[0] += ucx_transport.REREAD_EVERY_S
    assert tables.transport_of(NODE).network is False
    assert tables.transport_of("decode-0").network is None      # another agent: none of its tables here


@pytest.fixture
def this_process(monkeypatch, tmp_path):
    """A fresh process state for the report, the temp dir in tmp_path and UCX not loaded."""
    monkeypatch.setattr(ucx_transport, "_this_process", ucx_transport._ThisProcess())
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(ucx_transport, "ucx_loaded", lambda: False)
    for name in (REPORT_ENV, "UCX_PROTO_INFO", "UCX_LOG_FILE"):
        # set, then removed: monkeypatch restores what it set (here: absent) even after the code under
        # test writes the variable itself, which a bare delenv of an absent name would not undo (a
        # later test of this worker then found UCX_LOG_FILE pointing into this test's folder)
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    return tmp_path


def test_the_report_is_off_unless_the_environment_asks(this_process):
    ucx_transport.ask_from_env()
    assert "UCX_LOG_FILE" not in os.environ and not list(this_process.iterdir())
    got = ucx_transport.writes_of(NODE)
    assert got.network is None and f"{REPORT_ENV}=1" in got.note


def test_the_environment_asks_once_for_a_log_of_this_process_under_its_temp_dir(this_process, monkeypatch):
    monkeypatch.setenv(REPORT_ENV, "1")
    ucx_transport.ask_from_env()
    [folder] = list(this_process.iterdir())
    assert folder.name.startswith(f"raypd-ucx-{os.getpid()}-")
    assert (os.environ["UCX_PROTO_INFO"], os.environ["UCX_LOG_FILE"]) == ("y", str(folder / "ucx.%p.log"))
    ucx_transport.ask_from_env()                                  # a second endpoint: the same folder
    assert list(this_process.iterdir()) == [folder]
    (folder / f"ucx.{os.getpid()}.log").write_text(WITH_CMA)
    assert ucx_transport.writes_of(NODE).network is False


def test_a_report_asked_too_late_or_of_a_log_directed_elsewhere_says_why(this_process, monkeypatch):
    monkeypatch.setenv(REPORT_ENV, "1")
    monkeypatch.setattr(ucx_transport, "ucx_loaded", lambda: True)
    ucx_transport.ask_from_env()
    assert "loaded in this process before" in ucx_transport.writes_of(NODE).note
    assert not list(this_process.iterdir()) and "UCX_LOG_FILE" not in os.environ
    monkeypatch.setattr(ucx_transport, "_this_process", ucx_transport._ThisProcess())
    monkeypatch.setenv("UCX_LOG_FILE", "/var/log/ucx.log")
    ucx_transport.ask_from_env()
    assert "UCX_LOG_FILE was already set (/var/log/ucx.log)" in ucx_transport.writes_of(NODE).note
