"""The bootstrap messages: round trips and strict rejection of anything else."""
from __future__ import annotations

import msgpack
import pytest

from raypd.kvtransfer.bootstrap import schema as s
from raypd.kvtransfer.errors import SchemaError

EXAMPLES = [s.Register("decode-1", "nixl", b"\x00md"), s.Registered("prefill-1", True, ""),
            s.Destination(2**63 - 1, [0, 5, 9], 3), s.Destination(1, [], None), s.Sending(4), s.Done(4),
            s.Abort(4, "why"), s.Aborted(4), s.Ping(1), s.Pong(1, "prefill-1", False), s.Error("bad")]


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(msg):
    assert s.decode(s.encode(msg)) == msg


def raw(**d) -> bytes:
    return msgpack.packb(d, use_bin_type=True)


@pytest.mark.parametrize("data, match", [
    (b"\xc1garbage", "not msgpack"),
    (msgpack.packb([1, 2]), "expected a map"),
    (raw(v=2, t="done", room=1), "version"),
    (raw(t="done", room=1), "version"),
    (raw(v=1, t="nope", room=1), "unknown message type"),
    (raw(v=1, t="done"), "fields"),
    (raw(v=1, t="done", room=1, extra=2), "fields"),
    (raw(v=1, t="done", room="1"), "bad value"),
    (raw(v=1, t="done", room=-1), "bad value"),
    (raw(v=1, t="done", room=2**63), "bad value"),
    (raw(v=1, t="done", room=True), "bad value"),
    (raw(v=1, t="destination", room=1, blocks=[1, "2"], aux_slot=None), "bad value"),
    (raw(v=1, t="destination", room=1, blocks=[1], aux_slot=-3), "bad value"),
    (raw(v=1, t="register", name="a", backend="nixl", metadata="not bytes"), "bad value"),
    (raw(v=1, t="error", reason="x" * 5000), "bad value"),
])
def test_rejects(data, match):
    with pytest.raises(SchemaError, match=match):
        s.decode(data)


def test_notification_tags():
    assert s.room_of(s.notification_for(123)) == 123
    assert s.room_of(b"something else") is None
    assert s.room_of(b"kvx1:12x") is None
