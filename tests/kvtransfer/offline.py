"""made_offline(): endpoints made inside see a host with no interface up but loopback, as a process
started while its host's link was cut does (kvtransfer/bootstrap/endpoint_health.py reads the host's
interfaces when an endpoint's backend is made)."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from raypd.kvtransfer.bootstrap import endpoint_health


@contextmanager
def made_offline() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as m:
        m.setattr(endpoint_health, "host_network_up", lambda *a: False)
        yield
