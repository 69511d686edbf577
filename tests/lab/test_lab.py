"""The lab (benchmarks/lab): hosts as network namespaces on rack bridges. A host reaches another only
over its link, in its rack or across the rate-limited link between racks, never by the other's
127.0.0.1; a cut link is a partition and a restored one heals it; a Ray cluster across the hosts
places work by label on the host that carries it, each raylet at its own address. Afterwards no
namespace, link, folder or process of the lab is left. Skipped, with the reason, where namespaces
cannot be made (not root)."""
from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
import textwrap

import pytest

from raypd.benchmarks.lab.hosts import Lab, LabSpec, LabState, unavailable_reason
from raypd.benchmarks.lab.ray_hosts import ROLE_LABEL, start_ray

pytestmark = [pytest.mark.cluster,  # starts Ray and processes inside namespaces
              pytest.mark.skipif(unavailable_reason() is not None, reason=f"no lab here: {unavailable_reason()}")]

PORT = 18080
# Answers GET / with its own host's address; stops by itself after a minute.
SERVER = textwrap.dedent("""
    import http.server, sys, threading
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = sys.argv[1].encode()
            self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
            self.wfile.write(body)
        def log_message(self, *a): pass
    srv = http.server.HTTPServer((sys.argv[1], int(sys.argv[2])), H)
    threading.Timer(60, srv.shutdown).start()
    srv.serve_forever()
""")
# GET from inside a host: the body, or the error's class name.
FETCH = textwrap.dedent("""
    import sys, urllib.request
    try:
        print(urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])).read().decode())
    except OSError as e:
        print(type(e).__name__)
""")


def fetch(lab, host, url: str, timeout_s: float = 2.0) -> str:
    return lab.run(host, [sys.executable, "-c", FETCH, url, str(timeout_s)], timeout_s=30).stdout.strip()


def leftovers(lab) -> dict:
    return {"namespaces": lab.namespaces(), "links": lab.links(), "folder": lab.folder.exists()}


def test_a_spec_names_a_bounded_lab():
    with pytest.raises(ValueError, match="hosts_per_rack"):
        LabSpec(hosts_per_rack=())
    with pytest.raises(ValueError, match="tag"):
        LabSpec(tag="not-alnum!")


def test_hosts_reach_each_other_only_over_their_links():
    lab = Lab(LabSpec(hosts_per_rack=(2, 1)))
    with lab:
        server, same_rack, other_rack = lab.hosts
        assert [h.rack for h in lab.hosts] == [0, 0, 1] and len({h.ip for h in lab.hosts}) == 3
        assert all(ipaddress.ip_address(h.ip) in ipaddress.ip_network("198.18.0.0/15") for h in lab.hosts)
        lab.popen(server, [sys.executable, "-c", SERVER, server.ip, str(PORT)])
        url = f"http://{server.ip}:{PORT}/"
        for _ in range(50):  # until it listens
            if fetch(lab, same_rack, url) == server.ip:
                break
        assert fetch(lab, other_rack, url) == server.ip            # across the racks' link
        assert fetch(lab, same_rack, f"http://127.0.0.1:{PORT}/") == "URLError"  # its own loopback: nobody
        qdiscs = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout
        assert sum(f"dev {a} " in qdiscs and "tbf" in qdiscs for a in lab.rack_links[0]) == 2
        lab.cut(server)
        assert fetch(lab, other_rack, url) in ("URLError", "TimeoutError")  # a partition
        lab.restore(server)
        for _ in range(20):
            if (answer := fetch(lab, other_rack, url, timeout_s=3)) == server.ip:
                break
        assert answer == server.ip                                  # healed
        pids = {ns: lab.pids_in(ns) for ns in lab.namespaces()}
        assert pids[server.namespace], "the server runs inside its host"
    assert lab.state is LabState.CLOSED
    assert leftovers(lab) == {"namespaces": [], "links": [], "folder": False}
    assert not [p for ps in pids.values() for p in ps if _alive(p)]


def test_a_ray_cluster_across_hosts_places_work_by_label_at_each_hosts_address():
    lab = Lab(LabSpec(hosts_per_rack=(2, 1)))
    with lab:
        lab_ray = start_ray(lab, {1: "prefill", 2: "decode"}, cpus_per_host=1)
        driver = textwrap.dedent(f"""
            import json, socket, ray
            ray.init()
            @ray.remote(num_cpus=0.5)
            def where():
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                s.connect(("{lab.hosts[0].ip}", 9))
                return s.getsockname()[0]
            placed = {{role: ray.get(where.options(label_selector={{"{ROLE_LABEL}": role}}).remote(), timeout=60)
                       for role in ("prefill", "decode")}}
            print(json.dumps({{"placed": placed, "raylets": sorted(n["NodeManagerAddress"] for n in ray.nodes())}}))
        """)
        done = lab.run(lab.hosts[0], [sys.executable, "-c", driver], env=lab_ray.driver_env(), timeout_s=180)
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        pids = [p for ns in lab.namespaces() for p in lab.pids_in(ns)]
    assert seen["placed"] == {"prefill": lab.hosts[1].ip, "decode": lab.hosts[2].ip}
    assert seen["raylets"] == sorted(h.ip for h in lab.hosts)
    assert leftovers(lab) == {"namespaces": [], "links": [], "folder": False}
    assert pids and not [p for p in pids if _alive(p)]   # GCS, raylets and workers, daemonized or not


def test_a_lab_that_fails_to_build_removes_what_it_made(monkeypatch):
    lab = Lab(LabSpec(hosts_per_rack=(2,)))
    made = []
    real = Lab._add_host

    def second_host_fails(self, index, rack):
        if index == 1:
            raise RuntimeError("planted failure")
        made.append(real(self, index, rack))
        return made[-1]
    monkeypatch.setattr(Lab, "_add_host", second_host_fails)
    with pytest.raises(RuntimeError, match="planted failure"):
        lab.build()
    assert made and lab.state is LabState.CLOSED
    assert leftovers(lab) == {"namespaces": [], "links": [], "folder": False}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
