"""`raypd serve --place-by-role` across hosts (issue 32, items 2 and 5): on a lab of a head host, a
prefill host and two decode hosts in another rack, with Ray started on each as an operator would, the
openai client on the head host gets from chat (greedy, streamed and not) and completions what the
engine gives in one process for the same requests; the ingress replica, the node pool and the
Conductor run on the head host (the control plane stays off node hosts), each node actor on a host
of its role; every block is accounted for afterwards, and the stop leaves nothing in any host.

The tiny random model (tests/tiny_model.py): what is checked is the path and the placement, not the
135 M model's tokens (tests/lab/test_pd_across_hosts.py compares with transformers)."""
from __future__ import annotations

import json
import signal
import sys
import textwrap

import pytest

from raypd.benchmarks.lab.hosts import Lab, LabSpec, unavailable_reason
from tests.lab.served import actors_by_host, serve_on_lab, url, wait_live_and_idle

pytestmark = [pytest.mark.cluster,  # starts Ray and raypd inside namespaces
              pytest.mark.skipif(unavailable_reason() is not None, reason=f"no lab here: {unavailable_reason()}")]

MAX_TOKENS = 12
PROMPTS = ["Tell me about the lighthouse.", "Which ships came in today?", "Count to five."]
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
def expected(tiny_model_dir) -> dict[str, list[str]]:
    """The same requests through the engine in this process: the chat template, greedy, ignore_eos."""
    from raypd.engine import LLM, SamplingParams

    llm = LLM(tiny_model_dir, kv_cache_memory_mb=64)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    chats = [o.text for o in llm.generate([{"messages": [{"role": "user", "content": p}]} for p in PROMPTS], params)]
    completions = [o.text for o in llm.generate(PROMPTS, params)]
    return {"chat": chats, "stream": chats, "completion": completions}


def test_serve_across_hosts_answers_as_one_process_with_the_control_plane_on_the_head(tiny_model_dir, expected,
                                                                                      tmp_path):
    lab = Lab(LabSpec(hosts_per_rack=(2, 2)))
    with lab:
        head, prefill_host, *decode_hosts = lab.hosts
        lab_ray, server = serve_on_lab(lab, tiny_model_dir, tmp_path / "raypd-serve.log")
        where = actors_by_host(lab)
        done = lab.run(head, [sys.executable, "-c", CLIENT, url(head), json.dumps(PROMPTS),
                              str(MAX_TOKENS)], env=lab_ray.driver_env(), timeout_s=300, check=False)
        after = wait_live_and_idle(lab, head, nodes=3, timeout_s=60)
        server.send_signal(signal.SIGINT)
        code = server.wait(120)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert {k: seen[k] for k in expected} == expected
    assert len(after["live"]) == 3 and after["idle"] and after["held"] == 0, after
    assert where == {"ingress": {head.ip}, "pool": {head.ip}, "conductor": {head.ip}, "prefill": {prefill_host.ip},
                     "decode": {h.ip for h in decode_hosts}}, where
    assert code == 0, (tmp_path / "raypd-serve.log").read_text()[-3000:]
    assert (lab.namespaces(), lab.links(), lab.folder.exists()) == ([], [], False)

