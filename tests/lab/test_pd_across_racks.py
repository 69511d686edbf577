"""Issue 32's must-hold 1 on its lab: a head host and 2 prefill + 2 decode hosts in two racks
(ray_hosts.PD_RACKS and PD_ROLES: rack 0 = head, prefill, decode; rack 1 = prefill, decode), Ray
started once on every host as an operator would, with its role and rack labels. UCX is restricted
to the network (NETWORK_ONLY: the namespaces share one kernel, so UCX could otherwise move KV by CMA
or shared memory between "hosts", as no two real hosts can) and every node reports which UCX
transports its endpoint uses (RAYPD_UCX_TRANSPORT_REPORT, kvtransfer/nixl/ucx_transport.py). One
lab and one Ray serve every test, in file order:

    generate[nixl], generate[tcp]   `raypd generate --mode pd --place-by-role --address HEAD`, 2 prefill
                                    and 2 decode nodes: the Conductor on the head host, each node on a
                                    host of its role, one per host; the tokens equal transformers' greedy
                                    continuation; its actors gone when it exits
    serve                           `raypd serve --place-by-role`, 2 + 2 nodes: the openai client's chat
                                    (plain and streamed) and completions equal the engine in one process;
                                    ingress, node pool and Conductor on the head host, each node on a host
                                    of its role; every node's endpoint reports network transports only
                                    (tcp, no CMA or shared memory); afterwards every node is live and
                                    idle with no block in use; the stop exits 0 and leaves no raypd actor
    (module end)                    the lab leaves no namespace, link or folder

The serve run routes round-robin so that both prefill nodes take requests: an endpoint reports the
connections it has made, and the default cost policy may keep every request on the prefill node
whose cache holds the chat template. The model is the tiny random one (tests/tiny_model.py): what is
checked is the path and the placement, not the 135 M model's tokens.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from raypd.benchmarks.lab.hosts import Lab, LabSpec, unavailable_reason
from raypd.benchmarks.lab.ray_hosts import NETWORK_ONLY, PD_RACKS, PD_ROLES, start_ray
from raypd.kvtransfer.nixl.ucx_transport import REPORT_ENV, same_machine
from tests.lab.served import actors_by_host, serve, url, wait_live_and_idle

pytestmark = [pytest.mark.cluster,  # starts Ray and raypd inside namespaces
              pytest.mark.skipif(unavailable_reason() is not None, reason=f"no lab here: {unavailable_reason()}")]

GENERATE_PROMPTS = ["The lighthouse keeper opened the bottle and read", "Count the ships in the harbour: one, two,",
                    " ".join(f"Item {i}: the quick brown fox." for i in range(40))]   # several blocks of KV
GENERATE_TOKENS = 16
CHAT_PROMPTS = ["Tell me about the lighthouse.", "Which ships came in today?", "Count to five."]
CHAT_TOKENS = 12
# The openai client on the head host: greedy chat (plain and streamed) and a completion per prompt.
CLIENT = textwrap.dedent("""
    import json, sys
    from openai import OpenAI
    base, prompts, max_tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    out = {"chat": [], "stream": [], "completion": []}
    for p in prompts:
        msgs = [{"role": "user", "content": p}]
        r = client.chat.completions.create(model=model, messages=msgs, max_tokens=max_tokens, temperature=0,
                                           extra_body={"ignore_eos": True})
        out["chat"].append(r.choices[0].message.content)
        parts = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model=model, messages=msgs, max_tokens=max_tokens, temperature=0, stream=True,
            extra_body={"ignore_eos": True}) if c.choices]
        out["stream"].append("".join(parts))
        r = client.completions.create(model=model, prompt=p, max_tokens=max_tokens, temperature=0,
                                      extra_body={"ignore_eos": True})
        out["completion"].append(r.choices[0].text)
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def lab_ray():
    """The lab and Ray on every host, shared by the module's tests; at the end nothing is left."""
    lab = Lab(LabSpec(hosts_per_rack=PD_RACKS))
    with lab:
        # TMPDIR: each node's UCX log folder (the report's) goes under the lab's folder, removed with it.
        env = {**NETWORK_ONLY, REPORT_ENV: "1", "TMPDIR": str(lab.folder)}
        yield lab, start_ray(lab, PD_ROLES, cpus_per_host=1, extra_env=env)   # one node fits a host
    assert (lab.namespaces(), lab.links(), lab.folder.exists()) == ([], [], False)


def hosts_of(lab, role: str) -> set[str]:
    return {h.ip for h in lab.hosts if PD_ROLES.get(h.index) == role}


@pytest.fixture(scope="module")
def reference(tiny_model_dir) -> list[list[int]]:
    """transformers' greedy tokens for GENERATE_PROMPTS on the tiny model, stopping at EOS as the engine does."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    out = []
    with torch.inference_mode():
        for p in GENERATE_PROMPTS:
            ids = tok(p, return_tensors="pt").input_ids
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=GENERATE_TOKENS,
                                 do_sample=False)
            out.append(gen[0, ids.shape[1]:].tolist())
    return out


@pytest.fixture(scope="module")
def expected(tiny_model_dir) -> dict[str, list[str]]:
    """The serve run's requests through the engine in this process: the chat template, greedy, ignore_eos."""
    from raypd.engine import LLM, SamplingParams

    llm = LLM(tiny_model_dir, kv_cache_memory_mb=64)
    params = SamplingParams(max_tokens=CHAT_TOKENS, temperature=0.0, ignore_eos=True)
    chats = [o.text for o in llm.generate([{"messages": [{"role": "user", "content": p}]} for p in CHAT_PROMPTS],
                                          params)]
    completions = [o.text for o in llm.generate(CHAT_PROMPTS, params)]
    return {"chat": chats, "stream": chats, "completion": completions}


@pytest.mark.parametrize("backend", ["nixl", "tcp"])
def test_generate_pd_across_racks_equals_transformers(lab_ray, tiny_model_dir, reference, backend):
    lab, ray_ = lab_ray
    head = lab.hosts[0]
    cmd = [sys.executable, "-m", "raypd", "generate", "--mode", "pd", "--address", ray_.address, "--place-by-role",
           "--prefill-nodes", "2", "--decode-nodes", "2", "--cpus-per-node", "1", "--transfer-backend", backend,
           "--model", tiny_model_dir, "--kv-cache-memory", "64", "--json", "--max-tokens", str(GENERATE_TOKENS),
           "--timeout", "120", *GENERATE_PROMPTS]
    proc = lab.popen(head, cmd, env=ray_.driver_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        placed = watch_actors(lab, proc, timeout_s=400)
        stdout, stderr = proc.communicate(timeout=60)
    finally:   # the next test shares this Ray
        if proc.poll() is None:
            proc.kill()
    left = wait_no_raypd_actors(lab, timeout_s=60)
    assert proc.returncode == 0, stderr[-3000:]
    outputs = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    assert [o["token_ids"] for o in outputs] == reference and all(reference)
    assert placed == {"conductor": {head.ip}, "prefill": hosts_of(lab, "prefill"),
                      "decode": hosts_of(lab, "decode")}, placed
    assert left == {}, left   # the driver's actors die with it


def test_serve_across_racks_answers_as_one_process_over_network_transports(lab_ray, tiny_model_dir, expected,
                                                                           tmp_path):
    lab, ray_ = lab_ray
    head = lab.hosts[0]
    log_path = tmp_path / "raypd-serve.log"
    server = serve(lab, ray_, tiny_model_dir, log_path, prefill_nodes=2, decode_nodes=2,
                   extra_args=["--policy", "round_robin"])
    try:
        where = actors_by_host(lab)
        done = lab.run(head, [sys.executable, "-c", CLIENT, url(head), json.dumps(CHAT_PROMPTS), str(CHAT_TOKENS)],
                       env=ray_.driver_env(), timeout_s=300, check=False)
        after = wait_live_and_idle(lab, head, nodes=4, timeout_s=60)
    finally:
        server.send_signal(signal.SIGINT)
        code = server.wait(120)
    left = wait_no_raypd_actors(lab, timeout_s=60)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert {k: seen[k] for k in expected} == expected
    assert len(after["live"]) == 4 and after["idle"] and after["held"] == 0, after
    assert set(after["blocks_in_use"].values()) == {0}, after["blocks_in_use"]
    assert where == {"ingress": {head.ip}, "pool": {head.ip}, "conductor": {head.ip},
                     "prefill": hosts_of(lab, "prefill"), "decode": hosts_of(lab, "decode")}, where
    reports = after["transports"]
    print("transports:", {name: f"{r['transports']} {r['scope']} network={r['network']}" if r else r
                          for name, r in reports.items()})
    assert len(reports) == 4 and all(r is not None for r in reports.values()), reports
    for name, r in reports.items():   # each endpoint: the union of its connections' tables
        assert r["network"] is True and r["transports"], (name, r)
        assert not [t for t in r["transports"] if same_machine(t)], (name, r)
        assert all(t.startswith("tcp/") for t in r["transports"]), (name, r)   # UCX_TLS=tcp,self
    assert code == 0, log_path.read_text()[-3000:]
    assert left == {}, left


def watch_actors(lab, proc: subprocess.Popen, timeout_s: float) -> dict[str, set[str]]:
    """While `proc` runs: on which hosts each raypd actor's process was seen, by the host's address."""
    seen: dict[str, set[str]] = {}
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None:
        assert time.monotonic() < deadline, "raypd generate did not finish"
        for what, hosts in actors_by_host(lab).items():
            seen.setdefault(what, set()).update(hosts)
        time.sleep(0.2)
    return seen


def wait_no_raypd_actors(lab, timeout_s: float) -> dict[str, set[str]]:
    """Until no raypd actor (served.TITLES) runs on any host, bounded; what still runs."""
    deadline = time.monotonic() + timeout_s
    while (left := actors_by_host(lab)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left

