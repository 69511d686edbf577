"""The bootstrap channel's messages: one msgpack map per ZMQ message, {"v": VERSION, "t": type, ...fields}.

    decode (receiver) -> prefill (sender)         prefill (sender) -> decode (receiver)
    Register     once per peer: transfer metadata   Registered   ok / why not
    Destination  per room: block ids, aux slot      Sending      the write for this room is posted
    Done         per room: bytes + aux landed       Aborted      nothing of this room can still land
    Abort        either way                         Abort        either way
    Ping         heartbeat                          Pong         heartbeat; says whether we are known
    Error        either way: a message was rejected

Decoding is strict: unknown versions, types or fields, wrong field types and out-of-range numbers
raise SchemaError. Nothing is ever unpickled. Bump VERSION on any change of meaning.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import msgpack

from raypd.kvtransfer.errors import SchemaError

VERSION = 1
MAX_ROOM = (1 << 63) - 1
MAX_BLOCKS = 1 << 20
_MAX_TEXT = 4096


@dataclass(frozen=True, slots=True)
class Register:
    name: str          # the receiver endpoint's name, also its backend peer name and ZMQ routing id
    backend: str
    metadata: bytes    # TransferBackend.metadata()


@dataclass(frozen=True, slots=True)
class Registered:
    name: str          # the sender endpoint's name: notifications from it carry this peer name
    ok: bool
    error: str


@dataclass(frozen=True, slots=True)
class Destination:
    room: int
    blocks: list[int]
    aux_slot: int | None


@dataclass(frozen=True, slots=True)
class Sending:
    room: int


@dataclass(frozen=True, slots=True)
class Done:
    room: int


@dataclass(frozen=True, slots=True)
class Abort:
    room: int
    reason: str


@dataclass(frozen=True, slots=True)
class Aborted:
    room: int


@dataclass(frozen=True, slots=True)
class Ping:
    seq: int


@dataclass(frozen=True, slots=True)
class Pong:
    seq: int
    name: str
    registered: bool


@dataclass(frozen=True, slots=True)
class Error:
    reason: str


Message = Register | Registered | Destination | Sending | Done | Abort | Aborted | Ping | Pong | Error
_TYPES: dict[str, type] = {c.__name__.lower(): c for c in
                           (Register, Registered, Destination, Sending, Done, Abort, Aborted, Ping, Pong, Error)}


def _int(v: object, hi: int = MAX_ROOM) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= hi


# Field annotations (strings under `from __future__ import annotations`) -> validator.
_CHECKS = {
    "int": _int,
    "str": lambda v: isinstance(v, str) and len(v) <= _MAX_TEXT,
    "bytes": lambda v: isinstance(v, bytes),
    "bool": lambda v: isinstance(v, bool),
    "int | None": lambda v: v is None or _int(v),
    "list[int]": lambda v: isinstance(v, list) and len(v) <= MAX_BLOCKS and all(_int(x) for x in v),
}


def encode(msg: Message) -> bytes:
    return msgpack.packb({"v": VERSION, "t": type(msg).__name__.lower(), **asdict(msg)}, use_bin_type=True)


def decode(data: bytes) -> Message:
    try:
        d = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises several unrelated types for bad input
        raise SchemaError(f"not msgpack: {type(e).__name__}: {e}") from None
    if not isinstance(d, dict):
        raise SchemaError(f"expected a map, got {type(d).__name__}")
    if d.get("v") != VERSION:
        raise SchemaError(f"unsupported schema version {d.get('v')!r} (this endpoint speaks {VERSION})")
    kind = d.get("t")
    cls = _TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise SchemaError(f"unknown message type {kind!r}")
    want = {f.name: str(f.type) for f in fields(cls)}
    got = set(d) - {"v", "t"}
    if got != set(want):
        raise SchemaError(f"{cls.__name__}: fields {sorted(got)} != {sorted(want)}")
    for name, typ in want.items():
        if not _CHECKS[typ](d[name]):
            raise SchemaError(f"{cls.__name__}.{name}: bad value {d[name]!r:.100}")
    return cls(**{k: d[k] for k in want})


# The backend notification that travels with a room's write (not over the bootstrap channel).
_NOTIF_PREFIX = b"kvx%d:" % VERSION


def notification_for(room: int) -> bytes:
    return _NOTIF_PREFIX + b"%d" % room


def room_of(notification: bytes) -> int | None:
    """The room a notification names, or None if it is not one of ours."""
    if not notification.startswith(_NOTIF_PREFIX):
        return None
    tail = notification[len(_NOTIF_PREFIX):]
    return int(tail) if tail.isdigit() and len(tail) <= 19 else None
