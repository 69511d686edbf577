"""EndpointLoop: the one thread that touches an endpoint's backend and sockets.

NIXL agents and ZMQ sockets are not thread-safe, and heartbeats must be answered while the caller's
thread sits in a long forward pass, so each endpoint runs this loop. The caller's thread talks to it
only through submit() (a command queue plus a wake-up byte) and the endpoint's RoomTable.
Each pass: wait on the sockets (or the wake-up) for at most the timeout the last pass returned, then
run `tick`, which handles commands, messages, progress, deadlines and heartbeats.
"""
from __future__ import annotations

import collections
import logging
import socket
import threading
import time
from collections.abc import Callable

import zmq

log = logging.getLogger(__name__)


class EndpointLoop:
    def __init__(self, name: str, tick: Callable[[], float], sockets: Callable[[], list[zmq.Socket]],
                 on_stop: Callable[[], None] | None = None):
        self.name = name
        self._tick, self._sockets, self._on_stop = tick, sockets, on_stop
        self._cmds: collections.deque = collections.deque()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kvtransfer-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, *cmd) -> None:
        self._cmds.append(cmd)
        self._wake()

    def commands(self) -> list[tuple]:
        out = []
        while self._cmds:
            out.append(self._cmds.popleft())
        return out

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.error("kvtransfer loop %s did not stop within %.1f s", self.name, timeout)
        self._wake_r.close()
        self._wake_w.close()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except (BlockingIOError, OSError):  # already has a wake-up pending, or closed
            pass

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._wake_r.fileno(), zmq.POLLIN)
        registered: set[zmq.Socket] = set()
        timeout = 0.0
        while not self._stop.is_set():
            current = set(self._sockets())
            for s in registered - current:
                poller.unregister(s)
            for s in current - registered:
                poller.register(s, zmq.POLLIN)
            registered = current
            try:
                if timeout >= 0.001:
                    poller.poll(int(timeout * 1000.0))
                elif not poller.poll(0):
                    # zmq_poll counts whole milliseconds. Sleep rather than spin: a spinning loop was
                    # measured to delay NIXL completions on a busy 2-core host (they need CPU elsewhere).
                    time.sleep(timeout)
                try:
                    while self._wake_r.recv(4096):
                        pass
                except (BlockingIOError, OSError):
                    pass
                timeout = self._tick()
            except Exception:  # a bug in one pass must not take the endpoint down
                log.exception("kvtransfer loop %s: pass failed", self.name)
                timeout = 0.01
                time.sleep(0.001)
        if self._on_stop is not None:
            try:
                self._on_stop()
            except Exception:
                log.exception("kvtransfer loop %s: shutdown failed", self.name)
