"""benchmarks/soak/heap_probe.py: the prefill engine under the soak's prompts, in this process (no
Ray), sampled every --every measured requests. Shape only: the memory figures are the probe's to report."""
from __future__ import annotations

import json

from raypd.benchmarks.soak import heap_probe


def test_slope_is_the_least_squares_one():
    assert heap_probe.slope([0, 1, 2, 3], [5, 7, 9, 11]) == 2.0
    assert heap_probe.slope([4, 4], [1, 9]) == 0.0


def test_the_probe_samples_its_measured_requests(tmp_path, tiny_model_dir):
    out = tmp_path / "probe.json"
    assert heap_probe.main(["--model", tiny_model_dir, "--requests", "6", "--warmup", "2", "--every", "3",
                            "--engine-options", '{"kv_cache_memory_mb": 16}', "--json", str(out), "--quiet"]) == 0
    report = json.loads(out.read_text())
    assert [s["requests"] for s in report["samples"]] == [0, 3, 6]
    assert all(s["rss"] > 0 for s in report["samples"])
    assert report["engine_options"] == {"kv_cache_memory_mb": 16, "num_threads": 1}
    assert report["prompt_tokens_per_s"] > 0


def test_too_few_requests_for_two_samples_is_refused():
    assert heap_probe.main(["--requests", "3", "--every", "2"]) == 2
