"""`raypd status`: rows from a Conductor's status() or from the node actors themselves, the table and
the JSON; one line and status 2 when no cluster answers; and against the package's running server."""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys

import pytest

from raypd.cluster.cli.status import format_status, from_conductor, from_nodes, run_status
from raypd.protocol.messages import HostInfo

pytestmark = pytest.mark.cluster  # starts Ray, a server or other processes

CONDUCTOR_STATUS = {  # the shape of ConductorCore.status()
    "policy": "cost", "decisions": 12, "rejected": 1,
    "migrations": {"started": 2, "finished": 1, "failed": 1, "active": 0, "bytes_started": 10, "skips": {}},
    "nodes": {
        "raypd-prefill-0": {"role": "prefill", "alive": True, "death_reason": None, "host": "gpu-a",
                            "queued_prefill_tokens": 512, "waiting": 1, "running": 2, "free_blocks": 90,
                            "total_blocks": 128, "cached_blocks": 30, "delivered_hit_rate": 0.75,
                            "predicted_hit_rate": 0.8, "migrations_in": 1, "migrations_out": 0},
        "raypd-decode-0": {"role": "decode", "alive": False, "death_reason": "actor died", "host": "gpu-b",
                           "queued_prefill_tokens": 0, "waiting": 0, "running": 0, "free_blocks": 0,
                           "total_blocks": 128, "cached_blocks": 0, "delivered_hit_rate": None,
                           "predicted_hit_rate": 0.0, "migrations_in": 0, "migrations_out": 2},
    },
}


def rows_by_name(table: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in table.splitlines() if line.startswith("raypd-")}


def test_conductor_table():
    text = format_status(from_conductor(CONDUCTOR_STATUS))
    lines = text.splitlines()
    assert lines[0].startswith("Conductor: policy cost, 12 decisions, 1 rejected")
    assert lines[1].split() == ["NODE", "ROLE", "HOST", "STATE", "QUEUED", "RUNNING", "WAITING", "FREE", "KV",
                                "CACHED", "HIT", "RATE", "MIGR", "IN/OUT"]
    rows = rows_by_name(text)
    assert rows["raypd-prefill-0"] == ["raypd-prefill-0", "prefill", "gpu-a", "up", "512", "2", "1", "90/128",
                                       "30", "75.0%", "1/0"]
    assert rows["raypd-decode-0"][3] == "dead" and rows["raypd-decode-0"][9] == "-"  # no hit rate yet
    assert lines[-1] == "raypd-decode-0: actor died"
    # the columns line up: every row's cells start where the header's do
    starts = [m.start() for m in re.finditer(r"(?<!\S)\S", lines[1].replace("FREE KV", "FREE_KV")
                                             .replace("HIT RATE", "HIT_RATE").replace("MIGR IN/OUT", "MIGR_IN/OUT"))]
    for line in lines[2:4]:
        assert [m.start() for m in re.finditer(r"(?<!\S)\S", line)] == starts


def test_node_fallback_rows():
    host = HostInfo(node_id="abc", ip="10.0.0.5", hostname="box-1", pid=1)
    load = {"node_name": "raypd-prefill-0", "role": "prefill", "queued_prefill_tokens": 40, "waiting": 0,
            "running": 1, "free_blocks": 60, "total_blocks": 64, "cached_blocks": 4}
    answers = [{"name": "raypd-prefill-0", "info": {"host": host}, "load": load,
                "stats": {"prefix_copies": {"exported": 3, "imported": 2, "failed": 0}}},
               {"name": "raypd-decode-0", "error": "GetTimeoutError: timed out"}]
    status = from_nodes(answers)
    json.dumps(status)  # --json must work: no HostInfo or other objects left in it
    text = format_status(status)
    assert text.splitlines()[0].startswith("no Conductor running")
    rows = rows_by_name(text)
    assert rows["raypd-prefill-0"][2:] == ["box-1", "up", "40", "1", "0", "60/64", "4", "-", "2/3"]
    assert rows["raypd-decode-0"][1:5] == ["decode", "-", "no", "answer"]
    assert "raypd-decode-0: GetTimeoutError: timed out" in text


def test_no_cluster_is_one_line_and_status_2(capsys):
    # Port 1 never runs a GCS: the probe fails at once instead of ray.init waiting for minutes.
    code = run_status(argparse.Namespace(address="127.0.0.1:1", json=False))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and re.fullmatch(r"raypd status: error: no Ray cluster answers at \S+:1", err[0]), err


def test_status_of_the_running_server(server):
    found = re.search(r"Ray cluster: (\S+)", server.log())
    assert found, "raypd serve logs its Ray address"
    proc = subprocess.run([sys.executable, "-m", "raypd.cluster.cli.main", "status", "--address", found.group(1), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    status = json.loads(proc.stdout)
    assert status["source"] in ("conductor", "nodes")  # "nodes" until raypd serve starts a Conductor
    assert sorted(n["role"] for n in status["nodes"]) == ["decode", "prefill"]
    for n in status["nodes"]:
        assert n["alive"] and n["host"] and 0 <= n["free_blocks"] <= n["total_blocks"] and n["total_blocks"] > 0, n
