"""Write after free over real tcp sockets: a write whose pieces are already in flight when the
receiver gives its room up (closes the window) must not land, even though the receiver reads them
later, and even when the same blocks were handed to another write meanwhile."""
from __future__ import annotations

import time

import numpy as np
import torch

from raypd.kvtransfer import TransferConfig
from raypd.kvtransfer import TransferState as S
from raypd.kvtransfer.tcp_backend import TcpBackend
from tests.kvtransfer.peer_proc import make_pool

CFG = TransferConfig(backend="tcp", tcp_chunk_bytes=4096)  # 1 KiB blocks: a piece holds 4 of them


def pair():
    writer, reader = TcpBackend(CFG, "writer"), TcpBackend(CFG, "reader")
    writer.register(*make_pool(1, 32, 4))
    reader.register(*make_pool(2, 32, 4))
    writer.add_peer(reader.metadata())
    return writer, reader


def drain(writer: TcpBackend, reader: TcpBackend, *xfers, timeout: float = 10.0) -> list[S]:
    """Pump both sides until every write is acknowledged; the reader's notifications."""
    deadline, notes = time.monotonic() + timeout, []
    while any(writer.poll(x) == S.TRANSFERRING for x in xfers) and time.monotonic() < deadline:
        notes += reader.notifications()
        time.sleep(0.002)
    return notes + reader.notifications()


def test_pieces_in_flight_when_the_window_closes_never_land_in_the_reused_blocks():
    writer, reader = pair()
    try:
        dst = np.array([3, 4, 5, 6, 7, 8])
        reader.open_window("writer", b"kvx1:1", dst, 1)
        late = writer.write("reader", np.arange(6), dst, 0, 1, b"kvx1:1")
        time.sleep(0.2)  # every piece is in the reader's socket, not yet read
        reader.close_window(b"kvx1:1")  # the room was aborted: its blocks go to another request
        reader.open_window("writer", b"kvx1:2", dst, 1)
        fresh = writer.write("reader", np.arange(10, 16), dst, 2, 1, b"kvx1:2")
        notes = drain(writer, reader, late, fresh)
        assert writer.poll(late) == S.FAILED and "window" in str(writer.failure(late))
        assert writer.poll(fresh) == S.SUCCESS and [n.message for n in notes] == [b"kvx1:2"]
        assert torch.equal(reader._pool.view(32, -1)[dst], writer._pool.view(32, -1)[10:16])  # the second's bytes
        assert torch.equal(reader._aux.view(4, -1)[1], writer._aux.view(4, -1)[2])
        assert reader.num_refused > 0 and not reader._in  # no state kept for the refused write
    finally:
        writer.close()
        reader.close()


def test_a_write_outside_its_window_is_refused_whole():
    writer, reader = pair()
    try:
        before = reader._pool.clone()
        reader.open_window("writer", b"kvx1:3", np.array([1, 2]), None)
        x = writer.write("reader", np.array([5, 6, 7]), np.array([1, 2, 9]), None, None, b"kvx1:3")  # 9 is not its
        assert drain(writer, reader, x) == [] and writer.poll(x) == S.FAILED
        assert torch.equal(reader._pool[9], before[9])
        y = writer.write("reader", np.array([5]), np.array([1]), 0, 0, b"kvx1:3")  # an aux slot it was not given
        assert drain(writer, reader, y) == [] and writer.poll(y) == S.FAILED
    finally:
        writer.close()
        reader.close()
