"""DataPlaneIdentity: who a process is on the data plane, and whom its server sockets admit.

A principal is a node, or a driver (an ingress replica, `raypd generate`) receiving tokens. Each has
its own CURVE key pair:

- A node's is derived by the control plane from the deployment's secret and the node's name
  (DataPlaneSecret.identity, data_plane_auth.py). The secret stays with the control plane (the node
  pool, `raypd generate`'s launcher): a node holds only its own secret key, so a node, or anyone who
  reads one node's memory, can be only that node. A node Ray restarts under its name, from the same
  constructor arguments, comes back with the same keys.
- A driver's is random (DataPlaneIdentity.generate): nodes learn its public key from the reply
  address they are handed.

Servers admit a client only if its public key is in the server's PeerKeys: the allow-list the
control plane registers. For a node that is the nodes its launcher started (at construction, then
NodeActor.admit_peers() when the pool adds a node or a node restarts). For a driver it is the nodes
it sends requests to (their NodeHandle.public_key). ZMQ tags each message with the key its
connection authenticated (the User-Id property); principal_of() maps it to the principal. A
principal registers and writes only under the endpoint names it owns (owns(): its name, or its name
and a "-" suffix: a node's import or decode receiver). The routing id a peer picks names nothing.

Clients learn a server's public key from its address. A keyed address,
"tcp://host:port?curve=<the 32-byte key in hex>", travels with the address: through the control
plane (NodeInfo.bootstrap_address, NodeRequest.reply_address), or over the authenticated bootstrap
(a receiver's tcp metadata).

One principal is special: ANY ("*"), the shared identity of a secret (DataPlaneSecret.shared_identity).
It is one key pair for everyone holding the secret and owns every endpoint name. Endpoints and nodes
made without an identity use it with this process's own secret, so they talk only inside this
process. Tools that run endpoints in two processes of their own (benchmarks, two-process tests) use it
too. A deployment never hands it to a node.
"""
from __future__ import annotations

import secrets
import threading
from collections.abc import Mapping

import zmq
from zmq.utils import z85

from raypd.kvtransfer.errors import KVTransferError

ANY = "*"
_KEY_PARAM = "?curve="
_Z85_KEY_LEN = 40  # a 32-byte CURVE key in Z85


class UnkeyedAddressError(KVTransferError, ValueError):
    """An address with no (or a malformed) server key: nobody can prove who listens there."""


def owns(principal: str, endpoint_name: str) -> bool:
    """Whether `principal` may act under `endpoint_name`: its own name, or its name and a "-" suffix
    (node names end in their index, so no other node's name starts with "<name>-")."""
    return principal == ANY or endpoint_name == principal or endpoint_name.startswith(principal + "-")


def connection_id(endpoint_name: str) -> bytes:
    """A DEALER's routing id: unique per connection and unguessable, so a ROUTER needs no handover (a
    restarted peer comes with a new one) and never generates ids of its own (libzmq asserts if a peer
    picks the id it would generate next). It names nothing: who a peer is comes from its key."""
    return f"{endpoint_name[:200]}/{secrets.token_hex(8)}".encode()


def _z85_key(key: bytes | str) -> bytes:
    raw = key.encode() if isinstance(key, str) else bytes(key)
    if len(raw) != _Z85_KEY_LEN:
        raise ValueError(f"a CURVE public key is {_Z85_KEY_LEN} characters of Z85, got {len(raw)}")
    z85.decode(raw)  # raises on characters outside Z85
    return raw


def keyed_address(url: str, public_key: bytes) -> str:
    """`url` ("tcp://host:port") with the key of the server that listens there."""
    return f"{url}{_KEY_PARAM}{z85.decode(public_key).hex()}"


def split_address(address: str) -> tuple[str, bytes]:
    """(url to connect to, the server's public key in Z85) of a keyed address."""
    url, sep, hex_key = address.partition(_KEY_PARAM)
    if not sep or not url:
        raise UnkeyedAddressError(f"{address!r:.200} names no server key ({_KEY_PARAM}<hex>)")
    try:
        raw = bytes.fromhex(hex_key)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise UnkeyedAddressError(f"{address!r:.200}: the server key is not 32 bytes of hex")
    return url, z85.encode(raw)


class PeerKeys:
    """The allow-list: each admitted principal's public key. Thread-safe: libzmq's ZAP thread reads
    it while the owner's control calls add to it. A principal has one key: admitting a new one
    replaces the old (a principal the control plane re-keyed)."""

    def __init__(self, keys: Mapping[str, bytes | str] | None = None):
        self._lock = threading.Lock()
        self._by_name: dict[str, bytes] = {}
        self._by_key: dict[bytes, str] = {}
        self.admit_all(keys or {})

    def admit(self, principal: str, public_key: bytes | str) -> None:
        key = _z85_key(public_key)
        with self._lock:
            old = self._by_name.pop(principal, None)
            if old is not None:
                self._by_key.pop(old, None)
            self._by_name[principal] = key
            self._by_key[key] = principal

    def admit_all(self, keys: Mapping[str, bytes | str]) -> None:
        for principal, key in keys.items():
            self.admit(principal, key)

    def forget(self, principal: str) -> None:
        with self._lock:
            key = self._by_name.pop(principal, None)
            if key is not None:
                self._by_key.pop(key, None)

    def principal_of(self, public_key: bytes | str | None) -> str | None:
        """Who holds `public_key` (Z85, as ZAP and the User-Id property give it), or None."""
        if public_key is None:
            return None
        key = public_key.encode() if isinstance(public_key, str) else bytes(public_key)
        with self._lock:
            return self._by_key.get(key)

    def as_dict(self) -> dict[str, bytes]:
        with self._lock:
            return dict(self._by_name)

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_name)

    def __reduce__(self):
        return (PeerKeys, (self.as_dict(),))


class DataPlaneIdentity:
    """One principal's key pair and allow-list. Pickles (Ray hands a node its own) but never prints
    its secret key."""

    __slots__ = ("principal", "public_key", "_secret_key", "peers")

    def __init__(self, principal: str, public_key: bytes, secret_key: bytes, peers: PeerKeys | None = None):
        if not principal:
            raise ValueError("a data plane identity needs a principal name")
        self.principal = principal
        self.public_key = _z85_key(public_key)
        self._secret_key = _z85_key(secret_key)
        self.peers = peers if peers is not None else PeerKeys()

    @classmethod
    def generate(cls, principal: str, peers: PeerKeys | None = None) -> DataPlaneIdentity:
        """A fresh random key pair (a driver's: nobody derives it, nodes read it from its address)."""
        public, secret = zmq.curve_keypair()
        return cls(principal, public, secret, peers)

    @property
    def secret_key(self) -> bytes:
        return self._secret_key

    def owns(self, endpoint_name: str) -> bool:
        return owns(self.principal, endpoint_name)

    def address(self, url: str) -> str:
        """The keyed address of a server socket of this identity bound at `url`."""
        return keyed_address(url, self.public_key)

    def __repr__(self) -> str:
        return f"DataPlaneIdentity({self.principal!r}, <secret key hidden>, {len(self.peers)} peers)"

    __str__ = __repr__

    def __reduce__(self):
        return (DataPlaneIdentity, (self.principal, self.public_key, self._secret_key, self.peers))
