"""A decode host lost under load (issue 32, must-hold 3 and item 4): `raypd serve --place-by-role` on a
lab of a head host, a prefill host and two decode hosts; six concurrent greedy streams; then the
decode host whose node holds the most of them (the Conductor's choice: after the partition's replays
every prompt may be cached on one node) is
    partition   cut off: its link goes down for 10 s (twice the node pool's probe timeout), then up again
    host_loss   lost: every process on it SIGKILLed at once (its raylet and the node actor with it)
Every stream completes with the text of a fault-free run (those on the lost host are replayed on the
other decode node: once the pool's probe of the cut node times out, or at once when its process is
gone), a request sent meanwhile succeeds, and afterwards every node is live again (a lost host's node
restarted by Ray on a host with room) and nothing is held. One lab and one server serve both faults,
and the streams' fault-free texts are taken once: the partition leaves every node live again, and the
lost host comes last. Ray's health check runs every second (served.FAST_HOST_LOSS), so the lost host
is seen, and its node restarted, within seconds.

The tiny random model (tests/tiny_model.py); long outputs keep the streams running when the link goes
down."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from raypd.benchmarks.lab.hosts import Lab, LabSpec, unavailable_reason
from tests.lab.served import busiest_decode_host, serve_on_lab, url, wait_live_and_idle

pytestmark = [pytest.mark.cluster,  # starts Ray and raypd inside namespaces
              pytest.mark.skipif(unavailable_reason() is not None, reason=f"no lab here: {unavailable_reason()}")]

STREAMS = 6
MAX_TOKENS = 600
PARTITION_S = 10.0   # at least; the link comes back only once every stream is done (within ~7 s here)
# On the head host: the fault-free run of the streams (once per server: the first fault's client
# writes it to the file named by argv[5], the next reads it back), then the same streams again; once
# each has 4 chunks it writes `started` and waits for `cut` (the test cut a decode host's link) to send
# one more request during the partition. Prints the texts and the late answer as JSON.
CLIENT = textwrap.dedent("""
    import json, os, sys, threading, time
    from openai import OpenAI
    base, folder, streams, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    reference_file = sys.argv[5]
    client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=180)
    model = client.models.list().data[0].id
    def stream(i, started=None):
        parts = []
        for c in client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": f"Story number {i}, please."}],
                max_tokens=max_tokens, temperature=0, stream=True, extra_body={"ignore_eos": True}):
            if c.choices and c.choices[0].delta.content:
                parts.append(c.choices[0].delta.content)
                if started is not None and len(parts) == 4:
                    started.set()
        return "".join(parts)
    finished = [None] * streams
    def together(started=None):
        out = [None] * streams
        def run(i):
            try:
                out[i] = stream(i, started[i] if started else None)
            except Exception as e:
                out[i] = repr(e)
                if started:
                    started[i].set()
            finished[i] = time.monotonic()
        ts = [threading.Thread(target=run, args=(i,)) for i in range(streams)]
        [t.start() for t in ts]
        return ts, out
    if os.path.exists(reference_file):
        with open(reference_file) as f:
            reference = json.load(f)
    else:
        ts, reference = together()
        [t.join(300) for t in ts]
        with open(reference_file, "w") as f:
            json.dump(reference, f)
    started = [threading.Event() for _ in range(streams)]
    ts, faulted = together(started)
    [e.wait(120) for e in started]
    open(os.path.join(folder, "started"), "w").close()
    while not os.path.exists(os.path.join(folder, "cut")):
        time.sleep(0.02)
    t0 = cut_seen = time.monotonic()
    late_error = None
    try:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Late one."}],
                                       max_tokens=8, temperature=0)
    except Exception as e:
        late_error = repr(e)
    late_s = time.monotonic() - t0
    [t.join(300) for t in ts]
    print(json.dumps({"reference": reference, "faulted": faulted, "late_error": late_error, "late_s": late_s,
                      "finished_after_cut_s": [round(f - cut_seen, 2) for f in finished]}))
""")


@pytest.fixture(scope="module")
def served(tiny_model_dir, tmp_path_factory):
    """The lab and `raypd serve` on it, shared by both faults, and the file of the streams' fault-free
    texts on it; stopped with SIGINT at the end, exit 0."""
    folder = tmp_path_factory.mktemp("host-faults")
    log_path = folder / "raypd-serve.log"
    lab = Lab(LabSpec(hosts_per_rack=(2, 2)))
    with lab:
        lab_ray, server = serve_on_lab(lab, tiny_model_dir, log_path)
        try:
            yield lab, lab_ray, folder / "reference.json"
        finally:
            server.send_signal(signal.SIGINT)
            code = server.wait(120)
    assert code == 0, log_path.read_text()[-3000:]


@pytest.mark.parametrize("fault", ["partition", "host_loss"])  # in this order: the lost host stays lost
def test_a_decode_host_lost_under_load_loses_no_stream(served, tmp_path, fault):
    lab, lab_ray, reference = served
    head, prefill_host, *decode_hosts = lab.hosts
    replayed_before = len(replay_lines(lab, head))
    client = lab.popen(head, [sys.executable, "-c", CLIENT, url(head), str(tmp_path), str(STREAMS), str(MAX_TOKENS),
                              str(reference)], env=lab_ray.driver_env(), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (tmp_path / "started").exists():
        assert client.poll() is None and time.monotonic() < deadline, client.communicate()[1][-3000:]
        time.sleep(0.02)
    lost = busiest_decode_host(lab, head, decode_hosts)
    if fault == "partition":
        lab.cut(lost)
    else:
        assert lab.kill_host(lost)
    (tmp_path / "cut").touch()
    cut_at = time.monotonic()
    try:
        out, err = client.communicate(timeout=400)
        replayed = len(replay_lines(lab, head)) - replayed_before
    finally:
        if fault == "partition":
            time.sleep(max(0.0, PARTITION_S - (time.monotonic() - cut_at)))
            lab.restore(lost)
    after = wait_live_and_idle(lab, head, nodes=3, timeout_s=240)
    assert client.returncode == 0, err[-3000:]
    seen = json.loads(out.strip().splitlines()[-1])
    assert all(isinstance(t, str) and len(t) > 0 for t in seen["reference"]), seen["reference"]
    assert seen["faulted"] == seen["reference"]          # no stream lost, none changed
    assert replayed > 0, "no stream was replayed: none ran on the lost host"
    print(f"{fault}: {replayed} replayed; streams finished {seen['finished_after_cut_s']} s after it; "
          f"the request sent meanwhile took {seen['late_s']:.1f} s")
    assert seen["late_error"] is None, seen["late_error"]   # a request sent meanwhile is answered
    assert len(after["live"]) == 3 and after["idle"] and after["held"] == 0, after


def replay_lines(lab, head) -> list[str]:
    """The ingress's log lines that say a stream was replayed (its worker's stderr, in the head host's Ray folder)."""
    logs = [f for f in lab.host_folder(head).glob("session_2*/logs/worker-*.err") if f.is_file()]
    return [line for f in logs for line in f.read_text(errors="replace").splitlines() if "replaying" in line]
