from __future__ import annotations

import numpy as np
import pytest

from raypd.conductor.estimates import DecodeStepModel, PrefillTimeModel


def test_prefill_model_shape_and_fallback_speed():
    m = PrefillTimeModel(default_speed=2000.0, attention_coeff=0.0, overhead_s=0.0)
    assert m.estimate(1000, 0, 1000.0) == pytest.approx(1.0)
    assert m.speeds(np.array([0.0, 0.0])).tolist() == [2000.0, 2000.0]
    assert m.speeds(np.array([0.0, 500.0, 1500.0])).tolist() == [1000.0, 500.0, 1500.0]


def test_prefill_model_refits_the_attention_term():
    m = PrefillTimeModel(default_speed=1000.0, attention_coeff=0.0, overhead_s=0.0)
    true_k = 2e-4
    for n_new, n_cached in [(100, 0), (500, 1000), (1000, 4000), (200, 8000)] * 4:
        t = n_new / 1000.0 * (1 + true_k * (n_cached + n_new / 2))
        m.observe(n_new, n_cached, t, 1000.0)
    assert m.k == pytest.approx(true_k, rel=1e-6)


def test_decode_model_fits_reports_and_keeps_prior_when_unidentifiable():
    m = DecodeStepModel(base_s=0.01, per_seq_s=0.001)
    for _ in range(10):
        m.observe(8, 0.04)
    assert (m.base_s, m.per_seq_s) == (0.01, 0.001)         # not refitted before 16 reports
    for b in (8, 16, 24, 32) * 6:
        m.observe(b, 0.0167 + 0.00292 * b)
    assert m.per_seq_s == pytest.approx(0.00292, rel=0.01) and m.base_s == pytest.approx(0.0167, rel=0.01)


def test_one_batch_size_moves_the_base_to_what_nodes_measure():
    """A slower machine than the prior's: the slope cannot be fitted from one batch size, but the
    estimate at that size must still meet the measurement."""
    m = DecodeStepModel(base_s=0.0167, per_seq_s=0.00292)
    for _ in range(16):
        m.observe(8, 0.15)
    assert m.per_seq_s == 0.00292 and float(m.step_time(8)) == pytest.approx(0.15)
