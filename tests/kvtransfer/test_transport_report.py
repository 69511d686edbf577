"""The transport report of a real NIXL endpoint (NixlBackend.transports, kvtransfer/nixl/ucx_transport.py),
from fresh processes with RAYPD_UCX_TRANSPORT_REPORT=1: one agent writes into another's pool, in
two processes on this machine and in two hosts of a lab (network namespaces: one kernel). With UCX
free to choose, the write takes a same-machine transport (CMA) and the report says so, network False:
what it must say of two "hosts" that are one machine. Restricted to the network (UCX_TLS=tcp,self,
as the lab's Ray clusters run), it names tcp only, and between the lab's hosts (tcp/eth0) says
network True. The reader reports the same of the connection its writer made back to it; UCX's log
lands in each process's temp dir."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from contextlib import ExitStack

import pytest

from raypd.benchmarks.lab.hosts import Lab, LabSpec, unavailable_reason
from raypd.kvtransfer.nixl.ucx_transport import REPORT_ENV, same_machine

pytestmark = pytest.mark.cluster  # starts other processes

# The reading peer, a process of its own (in the lab, on the other host): prints its metadata,
# progresses until told to stop on stdin, then prints its own report.
READER = textwrap.dedent("""
    import json, os, select, sys
    from dataclasses import asdict
    import torch
    from raypd.kvtransfer import TransferConfig
    from raypd.kvtransfer.nixl.backend import NixlBackend

    reader = NixlBackend(TransferConfig(), "report-reader")
    pool = torch.zeros(4, 4096), torch.zeros(2, 8, dtype=torch.int64)   # registered: must outlive the agent
    reader.register(*pool)
    print(reader.metadata().hex(), flush=True)
    while not select.select([sys.stdin], [], [], 0.001)[0]:
        reader.notifications()
    print(json.dumps(asdict(reader.transports())), flush=True)
    os._exit(0)
""")
# The writer: one write of 4 blocks and the aux slot into the reader, then both reports.
WRITE_AND_REPORT = textwrap.dedent("""
    import json, os, subprocess, sys, time
    from dataclasses import asdict
    import numpy as np, torch
    from raypd.kvtransfer import TransferConfig, TransferState as S
    from raypd.kvtransfer.nixl.backend import NixlBackend

    # argv: the reader's code, then the command prefix that runs it in its host (none: here)
    peer_proc = subprocess.Popen([*sys.argv[2:], sys.executable, "-c", sys.argv[1]], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
    writer = NixlBackend(TransferConfig(), "report-writer")
    pool = torch.ones(4, 4096), torch.ones(2, 8, dtype=torch.int64)
    writer.register(*pool)
    peer = writer.add_peer(bytes.fromhex(peer_proc.stdout.readline().strip())).name
    xfer = writer.write(peer, np.arange(4), np.arange(4), 0, 0, b"done")
    deadline = time.monotonic() + 30
    while writer.poll(xfer) == S.TRANSFERRING and time.monotonic() < deadline:
        writer.notifications()
    state = writer.poll(xfer)
    while (after := writer.transports()).network is None and time.monotonic() < deadline:
        time.sleep(0.1)   # the log is read again at most every REREAD_EVERY_S
    peer_proc.stdin.write("stop\\n"); peer_proc.stdin.flush()
    reader = json.loads(peer_proc.stdout.readline())
    peer_proc.wait(30)
    print(json.dumps({"state": state.name, "after": asdict(after), "reader": reader}), flush=True)
    os._exit(0)   # no teardown: only the reports are under test
""")


TLS = {"open": None, "network": "tcp,self"}   # UCX_TLS: UCX's own choice, or the lab's NETWORK_ONLY


def env_for(folder, ucx_tls: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UCX_")}
    env |= {REPORT_ENV: "1", "TMPDIR": str(folder), "NIXL_LOG_LEVEL": "WARN"}
    return env | ({"UCX_TLS": ucx_tls} if ucx_tls else {})


@pytest.mark.parametrize("where", ["one machine", pytest.param("two lab hosts", marks=pytest.mark.skipif(
    unavailable_reason() is not None, reason=f"no lab here: {unavailable_reason()}"))])
def test_a_same_machine_transport_is_reported_as_not_network_and_tcp_as_network(tmp_path, where):
    with ExitStack() as stack:
        if where == "one machine":
            def start(argv: list[str], **kwargs) -> subprocess.Popen:
                proc = subprocess.Popen(argv, **kwargs)
                stack.callback(proc.kill)   # a no-op once it ended; its reader ends on its stdin's EOF
                return proc
        else:   # the writer in one host, its reader in the other; the lab's close ends both
            lab = stack.enter_context(Lab(LabSpec(hosts_per_rack=(2,))))
            writer_host, reader_host = lab.hosts

            def start(argv: list[str], **kwargs) -> subprocess.Popen:
                return lab.popen(writer_host, [*argv, *reader_host.exec_prefix], **kwargs)
        runs = {}
        for name, tls in TLS.items():
            (folder := tmp_path / name).mkdir()
            runs[name] = start([sys.executable, "-c", WRITE_AND_REPORT, READER], env=env_for(folder, tls),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        seen = {}
        for name, proc in runs.items():
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err[-3000:]
            seen[name] = json.loads(out.strip().splitlines()[-1])
    print(where, {name: (run["after"]["transports"], run["after"]["scope"]) for name, run in seen.items()})
    for run in seen.values():
        assert run["state"] == "SUCCESS"
    open_, network = seen["open"], seen["network"]
    assert open_["after"]["network"] is False and open_["reader"]["network"] is False, open_
    assert any(same_machine(t) for t in open_["after"]["transports"]), open_["after"]
    assert network["after"]["transports"] and all(t.startswith("tcp/") for t in network["after"]["transports"])
    if where == "two lab hosts":   # eth0 is the hosts' only way to each other
        assert network["after"]["network"] is True and network["reader"]["network"] is True, network
    else:   # on one machine UCX also sends over tcp/lo (no two machines share one): not network either
        assert network["after"]["network"] is ("tcp/lo" not in network["after"]["transports"]), network["after"]
    for name in TLS:   # the writer's log folder and the reader's
        assert sorted(p.name.split("-")[:2] for p in (tmp_path / name).iterdir()) == [["raypd", "ucx"]] * 2
