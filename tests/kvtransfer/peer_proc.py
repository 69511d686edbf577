"""A KVSender or KVReceiver in a child process, driven over a multiprocessing pipe by the test.

The child builds its pool from a seed, so the parent can predict its original bytes. Pipes carry
test commands between trusted local processes; the transfer itself uses the real backends.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
from dataclasses import dataclass

import numpy as np

POOL_SHAPE = (2, 2, 4, 2, 8)  # (layers, K/V, block_size, kv_heads, head_dim) per block: 1 KiB in float32
AUX_WIDTH = 4                 # int64 per aux slot: first token and friends


def make_pool(seed: int, num_blocks: int, aux_slots: int, shape: tuple = POOL_SHAPE):
    import torch
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(num_blocks, *shape, generator=g),
            torch.randint(0, 1 << 40, (aux_slots, AUX_WIDTH), generator=g, dtype=torch.int64))


def child_main(conn, role: str, config_kwargs: dict, seed: int, num_blocks: int, aux_slots: int,
               shape: tuple) -> None:
    from raypd.kvtransfer import KVReceiver, KVSender, TransferConfig
    pool, aux = make_pool(seed, num_blocks, aux_slots, shape)
    cls = KVSender if role == "sender" else KVReceiver
    ep = cls(pool, aux, TransferConfig(**config_kwargs))
    conn.send(("ok", {"name": ep.name, "address": getattr(ep, "bootstrap_address", None), "pid": os.getpid()}))
    try:
        while conn.poll(120):  # a parent that vanished for 2 minutes is not coming back
            op, args = conn.recv()
            try:
                if op == "pool":
                    result = (pool.numpy().copy(), aux.numpy().copy())
                elif op == "many":  # [(method, args), ...] in one round trip
                    result = [getattr(ep, m)(*a) for m, a in args[0]]
                elif op == "stats":
                    result = tuple(ep.stats().__getattribute__(f) for f in ("rooms", "live_rooms", "held_blocks", "peers"))
                elif op == "release_all":
                    result = [ep.release(r).room for r in list(ep.rooms.snapshot())]
                elif op == "close":
                    ep.close()
                    conn.send(("ok", None))
                    return
                else:
                    result = getattr(ep, op)(*args)
                    if hasattr(result, "__dataclass_fields__"):
                        result = repr(result)
                conn.send(("ok", result))
            except Exception as e:
                conn.send(("err", f"{type(e).__name__}: {e}"))
    finally:
        ep.close()


@dataclass
class Peer:
    """The parent's handle on one child endpoint. stop() or kill() always ends the process."""
    proc: mp.Process
    conn: object
    info: dict

    @classmethod
    def start(cls, role: str, config_kwargs: dict, seed: int, num_blocks: int, aux_slots: int,
              shape: tuple = POOL_SHAPE, timeout: float = 90.0) -> Peer:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=child_main, args=(child, role, config_kwargs, seed, num_blocks, aux_slots, shape),
                           daemon=True)
        proc.start()
        child.close()
        peer = cls(proc, parent, {})
        try:
            peer.info = peer._reply(timeout)
        except BaseException:
            peer.kill()
            raise
        return peer

    def call(self, op: str, *args, timeout: float = 30.0):
        self.conn.send((op, args))
        return self._reply(timeout)

    def _reply(self, timeout: float):
        if not self.conn.poll(timeout):
            raise TimeoutError(f"child {self.proc.pid} did not answer within {timeout} s")
        status, value = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"child: {value}")
        return value

    def kill(self) -> None:
        if self.proc.is_alive():
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.join(10)

    def stop(self) -> None:
        try:
            if self.proc.is_alive():
                self.call("close", timeout=15)
        except Exception:
            pass
        self.proc.join(5)
        self.kill()
        self.conn.close()


def rand_tables(rng: np.random.Generator, rooms: int, src_blocks: int, dst_blocks: int, max_len: int):
    """Per room: random source ids (may repeat across rooms) and disjoint random destination ids."""
    lens = rng.integers(1, max_len + 1, rooms)
    dst_all = rng.permutation(dst_blocks)[: int(lens.sum())]
    out, at = [], 0
    for n in lens.tolist():
        out.append((rng.choice(src_blocks, n, replace=False).tolist(), dst_all[at:at + n].tolist()))
        at += n
    return out
