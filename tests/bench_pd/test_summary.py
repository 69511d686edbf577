"""`raypd bench pd`'s summary of hand-built request records: latency percentiles per kind, goodput
against both SLOs, and each kind's handoff phases kept apart from the other kind's."""
from __future__ import annotations

from raypd.benchmarks.pd_vs_mixed import Record, summarize


def record(kind: str, ttft_s: float, tpot_s: float, tokens: int = 5, **timings: float) -> Record:
    times = [ttft_s + i * tpot_s for i in range(tokens)]
    return Record(kind, 0.0, times, [1] * tokens, timings=timings)


def test_percentiles_goodput_and_phases_per_kind():
    decoders = [record("decoder", 0.1 * (i + 1), 0.05, **{"decode.kv_wait_s": 0.01 * (i + 1)}) for i in range(10)]
    bursts = [record("burst", 2.0, 0.3, **{"decode.kv_wait_s": 1.5})]   # over the TPOT SLO below
    failed = Record("decoder", 0.0, error="boom")
    out = summarize([*decoders, *bursts, failed], window_s=10.0, slo_ttft_s=0.95, slo_tpot_s=0.1)
    d = out["decoder"]
    assert (d["requests"], d["errors"]) == (10, 1)
    assert (d["ttft_p50_ms"], d["ttft_p90_ms"], d["ttft_p99_ms"]) == (500.0, 900.0, 1000.0)  # nearest rank
    assert d["tpot_p99_ms"] == 50.0
    # The burst's 1.5 s wait for its KV does not reach the decoders' tail, and the other way round.
    assert d["handoff_ms_p99"] == {"decode.kv_wait_s": 100.0}
    assert out["burst"]["handoff_ms_p99"] == {"decode.kv_wait_s": 1500.0}
    # Nine decoders meet TTFT <= 0.95 s (the tenth waited 1.0 s); the burst breaks the TPOT SLO.
    assert out["goodput_rps"] == 0.9 and out["requests_per_s"] == 1.1
    assert out["output_tokens_per_s"] == 5.5


def test_ttft_beyond_the_prefill_nodes_phases_on_the_split_path_only():
    split = [record("decoder", 0.3 + 0.01 * i, 0.05, **{"prefill.bootstrap_s": 0.01, "prefill.queue_s": 0.04,
                                                        "prefill.prefill_s": 0.2}) for i in range(5)]
    local = record("decoder", 2.0, 0.05, **{"local_prefill_s": 1.9})   # no prefill node: not counted
    d = summarize([*split, local], window_s=10.0, slo_ttft_s=5, slo_tpot_s=1)["decoder"]
    assert (d["ttft_beyond_prefill_p50_ms"], d["ttft_beyond_prefill_p99_ms"]) == (70.0, 90.0)
    assert "ttft_beyond_prefill_p50_ms" not in summarize([local], 10.0, 5, 1)["decoder"]
