"""Where a deployment's data plane secret comes from, and that it reaches the nodes and the ingress
without ever being printed or read from a Serve config file."""
from __future__ import annotations

import pickle

import pytest

from raypd.cluster.serve.config import ServeConfig, ServeConfigError
from raypd.kvtransfer.data_plane_auth import SECRET_ENV, DataPlaneSecret


def test_a_fresh_secret_per_deployment_shared_by_its_nodes(monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    a, b = ServeConfig(), ServeConfig()
    assert isinstance(a.secret, DataPlaneSecret) and a.secret != b.secret
    assert a.cluster_spec().data_plane_secret == a.secret       # the node actors get it through Ray
    assert pickle.loads(pickle.dumps(a)).secret == a.secret     # so does every ingress replica
    assert a == b  # configs compare by their options, not by their random secrets


def test_the_secret_comes_from_the_environment_when_set(monkeypatch):
    monkeypatch.setenv(SECRET_ENV, "q8Vw3kZ1xR7tY2uN5mB9cL4aJ6hG0fD+eS/pO=\n")   # base64 text
    assert ServeConfig().secret == DataPlaneSecret(b"q8Vw3kZ1xR7tY2uN5mB9cL4aJ6hG0fD+eS/pO=")
    monkeypatch.setenv(SECRET_ENV, "short")
    with pytest.raises(ServeConfigError, match=SECRET_ENV):
        ServeConfig()


def test_the_secret_never_prints_and_is_not_an_app_arg(monkeypatch):
    monkeypatch.setenv(SECRET_ENV, "q8Vw3kZ1xR7tY2uN5mB9cL4aJ6hG0fD+eS/pO=")
    cfg = ServeConfig()
    assert "q8Vw3kZ1" not in repr(cfg) and "q8Vw3kZ1" not in repr(cfg.cluster_spec())
    with pytest.raises(ServeConfigError, match=SECRET_ENV):
        ServeConfig.from_args({"data_plane_secret": "q8Vw3kZ1xR7tY2uN5mB9cL4aJ6hG0fD+eS/pO="})
