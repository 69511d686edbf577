"""Workloads, arrivals and the sweep's search, without a server: seeded, exact lengths, shared
prefixes where the workload promises them."""
from __future__ import annotations

import json
import math

import pytest

from raypd.benchmarks.serve.arrivals import native_rate, session_starts
from raypd.benchmarks.serve.datasets import TextSource, gsp_dataset, multiturn_dataset, random_dataset
from raypd.benchmarks.serve.sweep import sweep
from raypd.benchmarks.serve.trace import trace_dataset


@pytest.fixture(scope="module")
def src():
    from transformers import AutoTokenizer

    from raypd.engine.model.source import resolve_model

    hf = AutoTokenizer.from_pretrained(str(resolve_model(None)))
    return TextSource(lambda t: hf.encode(t, add_special_tokens=False), lambda ids: hf.decode(ids))


def test_random_is_seeded_and_in_range(src):
    a = random_dataset(src, 5, 64, 16, 0.5, seed=1)
    assert a.sessions == random_dataset(src, 5, 64, 16, 0.5, seed=1).sessions
    assert a.sessions != random_dataset(src, 5, 64, 16, 0.5, seed=2).sessions
    for s in a.sessions:
        (r,) = s.requests
        assert 32 <= r.prompt_len <= 64 and 8 <= r.max_tokens <= 16 and abs(len(src.encode(r.prompt)) - r.prompt_len) <= 3


def test_gsp_groups_share_their_system_prompt(src):
    w = gsp_dataset(src, groups=3, questions=4, system_len=40, question_len=8, output_len=4, seed=0)
    systems = [s.requests[0].messages[0]["content"] for s in w.sessions]
    assert w.num_requests == 12 and len(set(systems)) == 3 and all(systems.count(x) == 4 for x in set(systems))


def test_multiturn_resends_the_history(src):
    w = multiturn_dataset(src, conversations=2, turns=3, user_len=10, output_len=5, system_len=0, seed=0)
    turns = w.sessions[0].requests
    assert [len(t.messages) for t in turns] == [1, 3, 5]
    assert turns[2].messages[:3] == turns[1].messages and turns[2].messages[3]["role"] == "assistant"
    assert turns[1].messages[1]["role"] == "assistant" and turns[2].prompt_len == 10 + 5 + 10 + 5 + 10


def test_trace_blocks_and_times(src, tmp_path):
    rows = [{"timestamp": 1000, "input_length": 1024, "output_length": 320, "hash_ids": [0, 1]},
            {"timestamp": 3000, "input_length": 1200, "output_length": 64, "hash_ids": [0, 1, 2]},
            {"timestamp": 5000, "input_length": 512, "output_length": 10, "hash_ids": [3]}]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    w = trace_dataset(path, src, 1 / 32, None, 2048)
    a, b, c = (s.requests[0] for s in w.sessions)
    assert b.prompt.startswith(a.prompt) and not c.prompt.startswith(a.prompt[:20])
    assert [a.prompt_len, b.prompt_len, c.prompt_len] == [32, 38, 16] and [a.max_tokens, c.max_tokens] == [10, 1]
    assert [s.timestamp_s for s in w.sessions] == [0.0, 2.0, 4.0] and native_rate(w) == 3 / 4
    salted = trace_dataset(path, src, 1 / 32, None, 2048, salt=1)
    assert salted.sessions[0].requests[0].prompt != a.prompt
    assert session_starts(w, None, time_scale=2.0, use_timestamps=True) == [0.0, 1.0, 2.0]


def test_arrivals_mean_rate(src):
    w = multiturn_dataset(src, conversations=400, turns=2, user_len=2, output_len=1, system_len=0, seed=0)
    starts = session_starts(w, 4.0, burstiness=0.5, seed=0)
    assert starts[0] == 0.0 and starts == sorted(starts)
    assert 3.4 < 2 * len(starts) / starts[-1] < 4.6  # 4 requests/s = 2 conversations/s
    assert session_starts(w, math.inf) == [0.0] * 400


def test_sweep_search():
    calls = []

    def measure(rate, step):
        calls.append((rate, step))
        return {"slo_attainment": 1.0 if rate <= 3 else 0.0}

    goodput, steps = sweep(measure, 0.9, start=1.0, max_steps=6, refine=1)
    assert [r for r, _ in calls] == [1.0, 2.0, 4.0, math.sqrt(8)] and [s for _, s in calls] == [0, 1, 2, 3]
    assert goodput == math.sqrt(8) and [s["passed"] for s in steps] == [True, True, False, True]
    calls.clear()
    goodput, _ = sweep(measure, 0.9, rates=[8, 2, 4, 1])
    assert [r for r, _ in calls] == [1, 2, 4] and goodput == 2


def test_sweep_stops_halving_below_min_rate():
    rates = []

    def measure(rate, step):
        rates.append(rate)
        return {"slo_attainment": 0.0}

    goodput, steps = sweep(measure, 0.9, start=0.25, max_steps=5, min_rate=0.1)
    assert rates == [0.25, 0.125] and goodput == 0.0 and not any(s["passed"] for s in steps)


def test_llamacpp_isa_flags_follow_the_cpu_and_never_amx():
    from raypd.benchmarks.serve.llamacpp_build import isa_options

    tag, opts = isa_options({"avx", "avx2", "fma", "f16c", "amx_tile", "amx_int8"})
    assert tag == "avx2" and opts["GGML_AVX2"] and opts["GGML_F16C"] and not opts["GGML_AVX512"]
    assert not any(v for k, v in opts.items() if "AMX" in k)
    tag, opts = isa_options({"avx", "avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16"})
    assert tag == "avx512" and opts["GGML_AVX512_VNNI"] and opts["GGML_AVX512_BF16"] and not opts["GGML_AMX_BF16"]
