"""PD across hosts (issue 32, item 2): on a lab of a head host, a prefill host in the head's rack and
a decode host in another rack, `raypd generate --mode pd --place-by-role --address HEAD` run on the
head host puts each node actor on its host, moves the KV across the rate-limited link between the
racks and streams the tokens back across hosts; the output equals transformers' greedy continuation
of the same prompts. UCX is restricted to tcp (and `self`, which NIXL uses for its own endpoint) so
that it cannot take a same-machine shortcut (CMA, shared memory) between the namespaces, as two real
hosts could not. Both transfer backends: NIXL (UCX) and raypd's tcp backend. The model is the tiny
random one (tests/tiny_model.py): what is checked is the path, not the 135 M model's tokens."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from raypd.benchmarks.lab.hosts import Lab, LabSpec, unavailable_reason
from raypd.benchmarks.lab.ray_hosts import NETWORK_ONLY, start_ray

pytestmark = [pytest.mark.cluster,  # starts Ray and raypd inside namespaces
              pytest.mark.skipif(unavailable_reason() is not None, reason=f"no lab here: {unavailable_reason()}")]

PROMPTS = ["The lighthouse keeper opened the bottle and read", "Count the ships in the harbour: one, two,",
           " ".join(f"Item {i}: the quick brown fox." for i in range(40))]   # several blocks of KV
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def reference(tiny_model_dir) -> list[list[int]]:
    """transformers' greedy tokens for PROMPTS on the tiny model, stopping at EOS as the engine does."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    out = []
    with torch.inference_mode():
        for p in PROMPTS:
            ids = tok(p, return_tensors="pt").input_ids
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS, do_sample=False)
            out.append(gen[0, ids.shape[1]:].tolist())
    return out


@pytest.mark.parametrize("backend", ["nixl", "tcp"])
def test_pd_across_hosts_equals_transformers(tiny_model_dir, reference, backend):
    lab = Lab(LabSpec(hosts_per_rack=(2, 1)))
    with lab:
        head, prefill_host, decode_host = lab.hosts
        assert prefill_host.rack != decode_host.rack
        lab_ray = start_ray(lab, {prefill_host.index: "prefill", decode_host.index: "decode"}, cpus_per_host=2,
                            extra_env=NETWORK_ONLY)
        cmd = [sys.executable, "-m", "raypd", "generate", "--mode", "pd", "--address", lab_ray.address,
               "--place-by-role", "--prefill-nodes", "1", "--decode-nodes", "1", "--cpus-per-node", "1",
               "--transfer-backend", backend, "--model", tiny_model_dir, "--kv-cache-memory", "64", "--json",
               "--max-tokens", str(MAX_TOKENS), "--timeout", "120", *PROMPTS]
        proc = lab.popen(head, cmd, env=lab_ray.driver_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
        placed = watch_node_actors(lab, proc, timeout_s=400)
        stdout, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0, stderr[-3000:]
        outputs = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    assert [o["token_ids"] for o in outputs] == reference and all(reference)
    assert (lab.namespaces(), lab.links(), lab.folder.exists()) == ([], [], False)
    assert placed == {"prefill": {prefill_host.ip}, "decode": {decode_host.ip}}, placed


def watch_node_actors(lab, proc: subprocess.Popen, timeout_s: float) -> dict[str, set[str]]:
    """While `proc` runs: in which host's namespace each node actor's process (ray::PrefillNode...,
    ray::DecodeNode...) was seen, by the host's address."""
    seen: dict[str, set[str]] = {"prefill": set(), "decode": set()}
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None:
        assert time.monotonic() < deadline, "raypd generate did not finish"
        for host in lab.hosts:
            for title in lab.titles(host):
                for role, actor in (("prefill", "ray::PrefillNode"), ("decode", "ray::DecodeNode")):
                    if title.startswith(actor):
                        seen[role].add(host.ip)
        time.sleep(0.2)
    return seen
