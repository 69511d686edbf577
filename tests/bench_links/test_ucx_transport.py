"""Reading a peer's UCX transport from UCX's protocol tables (benchmarks/links/ucx_transport.py): the put
tables of the one agent that wrote to the peer, its own endpoint to itself and every other agent's
left out; a network transport told from a same-machine one; and an answer of "unknown" with the
reason where UCX printed nothing or was loaded too early. The log lines are UCX 1.23's, as the
wheel's UCX wrote them on this machine (UCX_PROTO_INFO=y, UCX_LOG_FILE)."""
from __future__ import annotations

import os

from raypd.benchmarks.links import ucx_transport
from raypd.benchmarks.links.ucx_transport import PeerTransport, put_tables, transport_of


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
    assert transport_of(LOG, AGENT) == PeerTransport(("tcp/eth0", "tcp/lo"), "intra-node", True,
                                                     "UCX protocol table (UCX_PROTO_INFO)")
    assert transport_of(LOG, AGENT).describe() == "tcp/eth0,tcp/lo (intra-node)"


def test_a_same_machine_transport_is_not_a_network_one_and_rdma_is():
    assert transport_of(LOG, "links-0-2-77aa01") == PeerTransport(("cma/memory",), "intra-node", False,
                                                                  "UCX protocol table (UCX_PROTO_INFO)")
    assert transport_of(LOG, "links-0-3-1b2c3d").transports == ("rc_mlx5/mlx5_0:1",)
    assert transport_of(LOG, "links-0-3-1b2c3d").network is True


def test_no_table_for_the_agent_is_unknown_with_the_reason():
    got = transport_of(LOG, "links-9-9-000000")
    assert (got.transports, got.scope, got.network) == ((), None, None)
    assert "no put table for agent links-9-9-000000" in got.note
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
