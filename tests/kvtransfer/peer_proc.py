"""A KVSender or KVReceiver in a child process, driven over a multiprocessing pipe by the test.

The child builds its pool from a seed, so the parent can predict its original bytes. Pipes carry
test commands between trusted local processes; the transfer itself uses the real backends.
Peer.start_in() starts the child inside a lab host (benchmarks/lab/hosts.py) instead, through
`ip netns exec` (which also shows the host's own /sys/class/net, where UCX looks for interfaces),
and the pipe is a Unix socket with a random key.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Client, Listener
from pathlib import Path

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
                elif op == "broken":
                    result = ep.broken
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


class _HostProcess:
    """A child started in a lab host, seen through the three things Peer uses of an mp.Process."""

    def __init__(self, popen: subprocess.Popen):
        self.popen, self.pid = popen, popen.pid  # `ip netns exec` execs the command: the same pid

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    def join(self, timeout: float | None = None) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass


@dataclass
class Peer:
    """The parent's handle on one child endpoint. stop() or kill() always ends the process."""
    proc: mp.Process | _HostProcess
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

    @classmethod
    def start_in(cls, lab, host, role: str, config_kwargs: dict, seed: int, num_blocks: int, aux_slots: int,
                 env: dict[str, str], shape: tuple = POOL_SHAPE, timeout: float = 90.0) -> Peer:
        """The child endpoint in lab host `host`, with `env` added to its environment (UCX_TLS...).
        `lab` kills it at close() too, whatever happens here."""
        address = str(lab.host_folder(host) / f"peer-{secrets.token_hex(4)}.sock")
        key = secrets.token_hex(16)
        popen = lab.popen(host, [sys.executable, "-m", "tests.kvtransfer.peer_proc", address],
                          env={**os.environ, **env, "RAYPD_PEER_KEY": key}, cwd=Path(__file__).resolve().parents[2])
        peer = cls(_HostProcess(popen), None, {})
        try:
            deadline = time.monotonic() + timeout
            while peer.conn is None:   # the child listens once it runs
                try:
                    peer.conn = Client(address, "AF_UNIX", authkey=bytes.fromhex(key))
                except (FileNotFoundError, ConnectionRefusedError):
                    if not peer.proc.is_alive() or time.monotonic() > deadline:
                        raise RuntimeError(f"child in {host.namespace} never listened "
                                           f"(exit code {popen.poll()})") from None
                    time.sleep(0.02)
            peer.conn.send((role, config_kwargs, seed, num_blocks, aux_slots, shape))
            peer.info = peer._reply(max(1.0, deadline - time.monotonic()))
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


def host_main(address: str) -> None:
    """The child of Peer.start_in(): listen at `address`, take the start arguments, serve the parent."""
    with Listener(address, "AF_UNIX", authkey=bytes.fromhex(os.environ.pop("RAYPD_PEER_KEY"))) as listener:
        conn = listener.accept()
    child_main(conn, *conn.recv())


def rand_tables(rng: np.random.Generator, rooms: int, src_blocks: int, dst_blocks: int, max_len: int):
    """Per room: random source ids (may repeat across rooms) and disjoint random destination ids."""
    lens = rng.integers(1, max_len + 1, rooms)
    dst_all = rng.permutation(dst_blocks)[: int(lens.sum())]
    out, at = [], 0
    for n in lens.tolist():
        out.append((rng.choice(src_blocks, n, replace=False).tolist(), dst_all[at:at + n].tolist()))
        at += n
    return out


if __name__ == "__main__":
    host_main(sys.argv[1])
