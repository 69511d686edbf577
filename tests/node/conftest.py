"""Fixtures the PD node tests share (their helpers are in pd.py)."""
from __future__ import annotations

import pytest

from tests.node.pd import TokenSink


@pytest.fixture(scope="module")
def sink():
    """The caller's end of the token streams, one per test module."""
    s = TokenSink()
    yield s
    s.close()
