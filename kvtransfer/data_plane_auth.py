"""The data plane's authentication: CURVE on every ZMQ connection, each principal with its own keys.

Every socket that carries KV metadata, KV bytes or tokens between raypd processes (the bootstrap
ROUTER/DEALERs, the tcp backend's data sockets, the token PUSH/PULL pipes) is a CURVE socket of its
owner's DataPlaneIdentity (identity.py: a node's key pair, derived by the control plane from the
deployment's secret and the node's name, and the allow-list of the peers it admits). The binding side
is the CURVE server and runs a ZAP handler (pyzmq's ThreadAuthenticator) that admits only the public
keys in its owner's allow-list, so:

- a peer the control plane did not register never completes the handshake: it sends no message and
  cannot take a registered receiver's route (the impostor problem of a plain ROUTER);
- a registered peer is known by its key (the User-Id ZMQ tags its messages with: principal_of()),
  not by a routing id it picks, so it can act only as itself;
- everything is encrypted and every message is authenticated with a nonce (no replay, no tampering).

Why CURVE rather than an HMAC per message: the handshake runs before any of our code sees a byte, so
no loop has to check tags or keep replay windows. Its cost is encryption: 4 MiB messages move at
~600 MB/s per core against ~3.3 GB/s in the clear on loopback, which matters only to the tcp backend
(NIXL's bytes travel over UCX; its metadata, which holds the memory keys a writer needs, travels over
the authenticated bootstrap).

The secret: at least 32 bytes that, by their own byte frequencies, carry at least 128 bits (random
bytes, or the hex or base64 text of 32 random bytes, pass; a repeated or short phrase does not); all
of it goes into every key (BLAKE2b of the whole secret keys the derivation of each principal's key
pair). Server sockets set ZAP_ENFORCE_DOMAIN: without its ZAP handler a server refuses everyone
(libzmq's default would admit any client that knows the server's public key). The secret never leaves
a DataPlaneSecret, nor a secret key its identity: repr() hides both and no key is logged.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import math
import os
import secrets
import threading
from collections.abc import Iterable
from typing import TypeVar

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85
from zmq.utils.monitor import parse_monitor_message

from raypd.kvtransfer.identity import ANY, DataPlaneIdentity, PeerKeys

log = logging.getLogger(__name__)

# The environment variable `raypd serve` reads the secret from (a Kubernetes Secret mounts it there).
SECRET_ENV = "RAYPD_DATA_PLANE_SECRET"
MIN_SECRET_BYTES = 32
MIN_SECRET_BITS = 128
LOG_EVERY = 1000  # a flood of refused peers logs its first refusal and then one in a thousand


def log_refusal(count: int, msg: str, *args: object) -> None:
    """Log the 1st, 1001st, ... of a repeated refusal, with how many so far: whoever floods the data
    plane with what it refuses must not flood the log too."""
    if count % LOG_EVERY == 1:
        log.warning(msg + " (%d so far)", *args, count)
_ZAP_DOMAIN = "raypd"
SocketT = TypeVar("SocketT", bound=zmq.Socket)
_KEY_CONTEXT = b"raypd data plane curve key v3"  # v3: one key pair per principal


def estimated_bits(value: bytes) -> float:
    """A crude upper bound of a secret's entropy: its length times the Shannon entropy of its byte
    frequencies. It cannot tell a random secret from a clever pattern, only refuse the obvious ones."""
    counts = [value.count(b) for b in set(value)]
    return -sum(c * math.log2(c / len(value)) for c in counts) if value else 0.0


class DataPlaneSecret:
    """The per-deployment secret. Pickles (Ray hands it to node actors) but never prints."""

    __slots__ = ("_value", "_keys")

    def __init__(self, value: bytes):
        if not isinstance(value, bytes) or len(value) < MIN_SECRET_BYTES:
            raise ValueError(f"a data plane secret needs at least {MIN_SECRET_BYTES} bytes "
                             f"(e.g. `openssl rand -hex 32`)")
        if estimated_bits(value) < MIN_SECRET_BITS:
            raise ValueError(f"the data plane secret is guessable: about {estimated_bits(value):.0f} bits by its "
                             f"own byte frequencies, {MIN_SECRET_BITS} needed (e.g. `openssl rand -hex 32`)")
        self._value = value
        self._keys: dict[str, tuple[bytes, bytes]] = {}

    @classmethod
    def generate(cls) -> DataPlaneSecret:
        return cls(secrets.token_bytes(32))

    @classmethod
    def from_text(cls, text: str) -> DataPlaneSecret:
        """From a Secret's text: its UTF-8 bytes, surrounding whitespace (a trailing newline) removed."""
        return cls(text.strip().encode())

    def key_pair_of(self, principal: str) -> tuple[bytes, bytes]:
        """(public, secret) CURVE keys of `principal`, in Z85: the same for every holder of the secret."""
        found = self._keys.get(principal)
        if found is None:
            whole = hashlib.blake2b(self._value, digest_size=64).digest()  # every byte counts; a key is <= 64
            raw = hashlib.blake2b(_KEY_CONTEXT + b"\0" + principal.encode(), key=whole, digest_size=32).digest()
            secret_z85 = z85.encode(raw)
            found = self._keys[principal] = (zmq.curve_public(secret_z85), secret_z85)
        return found

    def public_key_of(self, principal: str) -> bytes:
        return self.key_pair_of(principal)[0]

    def identity(self, principal: str, peers: Iterable[str] = ()) -> DataPlaneIdentity:
        """`principal`'s identity, admitting itself and `peers` (what the control plane hands a node)."""
        public, secret = self.key_pair_of(principal)
        admitted = PeerKeys({p: self.public_key_of(p) for p in {principal, *peers}})
        return DataPlaneIdentity(principal, public, secret, admitted)

    def shared_identity(self) -> DataPlaneIdentity:
        """The one identity of every holder of the secret (identity.py's ANY): for endpoints of one
        process, or tools that run their own; never a deployment's node."""
        return self.identity(ANY)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DataPlaneSecret) and hmac.compare_digest(self._value, other._value)

    def __hash__(self) -> int:
        return hash(self.public_key_of(ANY))

    def __repr__(self) -> str:
        return "DataPlaneSecret(<hidden>)"

    __str__ = __repr__

    def __reduce__(self):
        return (DataPlaneSecret, (self._value,))


def data_plane_secret_from_env() -> DataPlaneSecret:
    """The secret in RAYPD_DATA_PLANE_SECRET, or a fresh random one when it is unset or empty."""
    text = os.environ.get(SECRET_ENV, "")
    return DataPlaneSecret.from_text(text) if text.strip() else DataPlaneSecret.generate()


# What a process uses when it is given no secret: endpoints, nodes and drivers made without one talk
# to each other inside this process and to no other process (a deployment hands every process its own).
_PROCESS_SECRET = DataPlaneSecret.generate()
_PROCESS_IDENTITY = _PROCESS_SECRET.shared_identity()


def process_secret() -> DataPlaneSecret:
    return _PROCESS_SECRET


def process_identity() -> DataPlaneIdentity:
    """The shared identity of this process's secret: what endpoints and nodes made without one use."""
    return _PROCESS_IDENTITY


def as_server(sock: SocketT, identity: DataPlaneIdentity) -> SocketT:
    """Make a socket (before bind) a CURVE server of `identity`, admitting only its peers' keys."""
    guard(sock.context, identity.peers)
    sock.setsockopt(zmq.ZAP_DOMAIN, _ZAP_DOMAIN.encode())
    sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)  # no ZAP handler: refuse, never admit by default
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, identity.secret_key)
    return sock


def as_client(sock: SocketT, identity: DataPlaneIdentity, server_key: bytes) -> SocketT:
    """Make a socket (before connect) a CURVE client of `identity`, talking only to the holder of
    `server_key` (identity.split_address gives it with the address)."""
    sock.setsockopt(zmq.CURVE_SERVERKEY, server_key)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, identity.public_key)
    sock.setsockopt(zmq.CURVE_SECRETKEY, identity.secret_key)
    return sock


def sender_of(peers: PeerKeys, frame: zmq.Frame) -> str | None:
    """The principal whose key authenticated the connection `frame` came on (received with
    copy=False), or None: a key no longer admitted, or a socket without CURVE."""
    try:
        user_id = frame.get("User-Id")
    except zmq.ZMQError:  # no such property: the connection was not authenticated
        return None
    return peers.principal_of(user_id) if isinstance(user_id, str) else None


class _Gate:
    """ZAP credentials check: the client's public key must be in the allow-list of one of the
    identities this context's server sockets were made with (a process's shared context may serve
    two drivers; each socket's owner still checks the sender of every message against its own list:
    sender_of()). Refusals are logged, the first one and then every 1000th, so a flood of strangers
    cannot flood the log."""

    def __init__(self) -> None:
        self.allow_lists: list[PeerKeys] = []
        self.refused = 0

    def add(self, peers: PeerKeys) -> None:
        if not any(p is peers for p in self.allow_lists):
            self.allow_lists.append(peers)

    def remove(self, peers: PeerKeys) -> None:
        self.allow_lists = [p for p in self.allow_lists if p is not peers]

    def callback(self, domain: str, key: bytes) -> bool:
        if any(peers.principal_of(key) is not None for peers in self.allow_lists):
            return True
        self.refused += 1
        log_refusal(self.refused, "data plane: refused a connection whose key the control plane did not register")
        return False


# Keyed by the libzmq context's address: asyncio shadows of one context share its ZAP endpoint.
class HandshakeWatch:
    """Logs the connections a CURVE server socket refused during the handshake: no CURVE at all, a
    guessed key, or a key ZAP refused. libzmq drops those before any of our code reads a byte and
    tells only a monitor socket; the owner polls `socket` with its others and calls drain(). Logged
    like the ZAP refusals: the first, then every 1000th, with the count."""

    EVENTS = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH

    def __init__(self, server: zmq.Socket, what: str):
        self._server = server
        self.socket = server.get_monitor_socket(self.EVENTS)
        self.what = what
        self.refused = 0

    def drain(self) -> int:
        """Read and log what the monitor reported (never blocks); how many refusals it read."""
        n = 0
        while True:
            try:
                frames = self.socket.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return n
            self.note(frames)
            n += 1

    def note(self, frames: list[bytes]) -> None:
        """Count and log one monitor message (for owners that read the socket themselves, e.g. asyncio)."""
        try:
            event = parse_monitor_message(frames)
            why = zmq.Event(event["value"]).name if event["event"] != zmq.EVENT_HANDSHAKE_FAILED_AUTH else "ZAP"
        except Exception:  # noqa: BLE001 - a monitor message we cannot parse is still a refusal
            why = "unknown"
        self.refused += 1
        log_refusal(self.refused, "data plane: %s refused a connection in the handshake (%s): a peer whose key "
                    "this deployment did not register", self.what, why)

    def close(self) -> None:
        try:
            self._server.disable_monitor()
        except zmq.ZMQError:  # the server socket is closed already
            pass
        self.socket.close(linger=0)


_guards: dict[int, tuple[ThreadAuthenticator, _Gate]] = {}
_guards_lock = threading.Lock()


def guard(ctx: zmq.Context, peers: PeerKeys) -> _Gate:
    """Start (once per context) the ZAP handler that CURVE server sockets of `ctx` consult; it admits
    the keys of `peers` too."""
    with _guards_lock:
        found = _guards.get(ctx.underlying)
        if found is None:
            # A plain shadow: the handler thread must not get asyncio sockets from an asyncio context.
            auth = ThreadAuthenticator(zmq.Context.shadow(ctx.underlying), log=logging.getLogger("raypd.zap"))
            auth.start()
            gate = _Gate()
            auth.configure_curve_callback(domain=_ZAP_DOMAIN, credentials_provider=gate)
            found = _guards[ctx.underlying] = (auth, gate)
        found[1].add(peers)
        return found[1]


def withdraw(ctx: zmq.Context, peers: PeerKeys) -> None:
    """Stop admitting `peers` on `ctx`, whose handler lives on (a closed driver's token socket on the
    process's shared context: its allow-list must not keep growing the handler's with each driver)."""
    with _guards_lock:
        found = _guards.get(ctx.underlying)
        if found is not None:
            found[1].remove(peers)


def unguard(ctx: zmq.Context) -> None:
    """Stop the context's ZAP handler; call before ctx.term() (the handler holds a socket of it)."""
    with _guards_lock:
        found = _guards.pop(ctx.underlying, None)
    if found is not None:
        found[0].stop()


def refused(ctx: zmq.Context) -> int:
    """Connections the context's ZAP handler refused so far (0 if unguarded)."""
    found = _guards.get(ctx.underlying)
    return 0 if found is None else found[1].refused
