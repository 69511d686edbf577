"""oneDNN projections see a bounded set of row counts (engine/model/linear.py, padded_rows): oneDNN
keeps one primitive (~0.7 MB) per input shape it meets, so unbounded prefill step sizes were the
prefill node's RSS growth under the soak (issue 33). No model: one packed projection."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from raypd.engine.model import linear
from raypd.engine.model.linear import EXACT_ROWS, PackedLinear, packing_unavailable, padded_rows
from tests.engine.rounding import assert_within, float32_sum_bound


def test_row_counts_up_to_a_step_fall_in_56_buckets_of_at_most_an_eighth_padding():
    padded = [padded_rows(r) for r in range(1, 513)]
    assert len(set(padded)) == 56
    assert padded[:EXACT_ROWS] == list(range(1, EXACT_ROWS + 1))  # small decode batches pay nothing
    for rows, p in zip(range(1, 513), padded):
        assert rows <= p <= rows * 1.125 and padded_rows(p) == p
    assert padded == sorted(padded)


@pytest.fixture
def calls(monkeypatch) -> list[int]:
    """The row counts the projection hands oneDNN."""
    if packing_unavailable(torch.device("cpu"), torch.float32) is not None:
        pytest.skip("no oneDNN float32 linear here")
    op = torch.ops.mkldnn._linear_pointwise
    seen: list[int] = []

    def recording(x, *args):
        seen.append(x.shape[0])
        return op(x, *args)
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", recording)
    return seen


def test_packed_projection_pads_rows_and_returns_only_the_real_ones(calls):
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(40, 24, generator=g), torch.randn(40, generator=g)
    packed = PackedLinear(w, b)
    for rows in (1, EXACT_ROWS, EXACT_ROWS + 1, 37, 300):
        x = torch.randn(rows, 24, generator=g)
        y = packed(x)
        assert y.shape == (rows, 40) and y.is_contiguous()
        exact = F.linear(x.double(), w.double(), b.double())
        assert_within(y, exact, float32_sum_bound(x, w))
    assert calls == [1, 16, 18, 40, 320]


def test_leading_dimensions_are_kept(calls):
    packed = PackedLinear(torch.randn(8, 4))
    x = torch.randn(3, 7, 4)  # 21 rows -> 22
    assert packed(x).shape == (3, 7, 8)
    assert calls == [22]


def test_a_prefill_of_every_length_meets_only_the_buckets(calls):
    packed = linear.LinearFactory("onednn")(torch.randn(16, 8), None)
    for rows in range(1, 513):
        packed(torch.randn(rows, 8))
    assert set(calls) == {padded_rows(r) for r in range(1, 513)}


def test_padding_changes_no_real_row_bit_for_bit():
    """So an engine's outputs are exactly what they were unpadded (rows computed alone: 1 row takes
    another kernel, and is never padded)."""
    if packing_unavailable(torch.device("cpu"), torch.float32) is not None:
        pytest.skip("no oneDNN float32 linear here")
    g = torch.Generator().manual_seed(1)
    for k in (576, 1536):  # SmolLM2's hidden and MLP widths
        packed = PackedLinear(torch.randn(64, k, generator=g) * 0.05, torch.randn(64, generator=g))
        for rows in (EXACT_ROWS + 1, 23, 37, 100, 257, 300):
            x = torch.randn(rows, k, generator=g)
            alone = torch.ops.mkldnn._linear_pointwise(x, packed.weight, packed.bias, "none", [], "")
            assert padded_rows(rows) > rows and torch.equal(packed(x), alone)
