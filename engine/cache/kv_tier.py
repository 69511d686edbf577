"""A node's disk tier below the pool: KV blocks kept in a local directory under their chained block
hash and loaded back when a prompt's prefix runs past the pool into them, so a returning
conversation reloads its prefix instead of recomputing it. kv_tiers.py decides what goes down here
and when (the last tier of the stack); this module keeps the files honest.

One file per block, `<dir>/<block hash as 16 hex digits>.kv`:

    field          bytes              why
    magic          8   b"RAYPDKV1"    not a tier file otherwise
    layout         8                  hash of the model's KV geometry and dtype: another model's or
                                      another dtype's blocks are foreign
    block hash     8                  the file's name, again
    parent hash    8                  with the tokens, recomputes the block hash: equal names mean
                                      equal prefixes (protocol/block_hash.py)
    payload crc32  4                  a torn or flipped payload is caught
    payload bytes  8
    tokens         4 x block_size
    payload        the pool block: every layer's K and V

A file is written to a temporary name and renamed into place (never seen half-written), and read
only when every field agrees; otherwise it is deleted and counted as rejected, and the prompt
computes those tokens instead. The tier holds at most `size_bytes` of files: has_room() says when
the stack must drop the least recently used (oldest()) first. On start it indexes the files already
there that carry its layout and a consistent name (a node restart keeps its tier), dropping the
oldest beyond its size, and deletes the rest.
"""
from __future__ import annotations

import hashlib
import os
import struct
import time
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from raypd.protocol.block_hash import block_hash
from raypd.protocol.kv_events import KVTier

MAGIC = b"RAYPDKV1"
_HEAD = struct.Struct("<8sQQQIQ")  # magic, layout, hash, parent hash, crc32, payload bytes
SUFFIX = ".kv"


@dataclass(slots=True)
class TierStats:
    stored: int = 0      # blocks written
    loaded: int = 0      # blocks read back into the pool
    rejected: int = 0    # blocks that failed a check (dropped, recomputed)
    evicted: int = 0     # blocks dropped (or moved down) for the size bound
    bytes_written: int = 0
    bytes_read: int = 0
    load_seconds: float = 0.0  # wall time of the loads (on a GPU, of issuing them)

    def load_rate(self) -> float:
        """Measured bytes/s of loads into the pool; 0 before the first."""
        return self.bytes_read / self.load_seconds if self.load_seconds > 0 else 0.0


def layout_fingerprint(pool: torch.Tensor) -> int:
    """The KV geometry of a pool block ([layers, 2, kv heads, block size, head dim]) and its dtype."""
    text = f"{tuple(pool.shape[1:])}:{pool.dtype}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


class DiskKVTier:
    kind = KVTier.DISK

    def __init__(self, folder: str | os.PathLike, size_bytes: int, pool: torch.Tensor):
        """`pool`: the engine's KV pool, for the block layout (files are checked against it)."""
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.size_bytes = size_bytes
        self.block_size = pool.shape[4]
        self.dtype = pool.dtype
        self.block_shape = tuple(pool.shape[1:])
        self.layout = layout_fingerprint(pool)
        self.file_bytes = _HEAD.size + 4 * self.block_size + pool[0].numel() * pool.element_size()
        self.stats = TierStats()
        # block hash -> (parent hash, tokens), least recently used first
        self._files: OrderedDict[int, tuple[int, tuple[int, ...]]] = OrderedDict()
        self._adopt_existing()

    @property
    def num_blocks(self) -> int:
        return len(self._files)

    @property
    def used_bytes(self) -> int:
        return len(self._files) * self.file_bytes

    def __contains__(self, block: int) -> bool:
        return block in self._files

    def has_room(self) -> bool:
        return self.used_bytes + self.file_bytes <= self.size_bytes

    def oldest(self) -> int | None:
        return next(iter(self._files), None)

    def items(self) -> Iterator[tuple[int, int, tuple[int, ...]]]:
        """(hash, parent hash, tokens) of every block held, least recently used first."""
        return ((h, parent, tokens) for h, (parent, tokens) in self._files.items())

    def entry(self, hash_: int) -> tuple[int, tuple[int, ...]]:
        return self._files[hash_]

    def touch(self, hash_: int) -> None:
        self._files.move_to_end(hash_)

    def load_rate(self) -> float:
        return self.stats.load_rate()

    def kv(self, hash_: int) -> torch.Tensor:
        """The block's KV from its file (checked); KeyError when it is gone or fails a check."""
        payload = self._read_checked(hash_, *self._files[hash_])
        if payload is None:
            raise KeyError(f"tier block {hash_:016x} failed its checks")
        return self._as_block(payload)

    # -- write ------------------------------------------------------------------------------------
    def put(self, hash_: int, parent_hash: int, tokens: tuple[int, ...], kv: torch.Tensor) -> bool:
        """Write one block's KV (any device) under hash_; the caller made room. False when the disk
        refused (full, vanished): the block is just not kept."""
        payload = kv.cpu().contiguous().view(torch.uint8).numpy().tobytes()
        head = _HEAD.pack(MAGIC, self.layout, hash_, parent_hash, zlib.crc32(payload), len(payload))
        path = self._path(hash_)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                f.write(head)
                f.write(struct.pack(f"<{self.block_size}I", *tokens))
                f.write(payload)
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)
            return False
        self._files[hash_] = (parent_hash, tuple(tokens))
        self.stats.stored += 1
        self.stats.bytes_written += self.file_bytes
        return True

    # -- read -------------------------------------------------------------------------------------
    def read_into(self, hash_: int, parent_hash: int, tokens: tuple[int, ...], dst: torch.Tensor) -> bool:
        """Copy the block named hash_ into `dst` (a pool block); False (and the file gone) when it
        is missing or fails a check: the caller computes those tokens instead."""
        if hash_ not in self._files:
            return False
        start = time.perf_counter()
        payload = self._read_checked(hash_, parent_hash, tokens)
        if payload is None:
            self.drop(hash_)
            self.stats.rejected += 1
            return False
        dst.copy_(self._as_block(payload))
        self._files.move_to_end(hash_)
        self.stats.loaded += 1
        self.stats.bytes_read += self.file_bytes
        self.stats.load_seconds += time.perf_counter() - start
        return True

    def _read_checked(self, hash_: int, parent_hash: int, tokens: tuple[int, ...]) -> bytes | None:
        """The payload of hash_'s file when every check passes, else None."""
        try:
            data = self._path(hash_).read_bytes()
        except OSError:
            data = b""
        return self._verified_payload(data, hash_, parent_hash, tokens)

    def _as_block(self, payload: bytes) -> torch.Tensor:
        return torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(self.dtype).view(self.block_shape)

    def _verified_payload(self, data: bytes, hash_: int, parent_hash: int, tokens: tuple[int, ...]) -> bytes | None:
        if len(data) != self.file_bytes:
            return None
        magic, layout, stored_hash, stored_parent, crc, length = _HEAD.unpack_from(data)
        stored_tokens = struct.unpack_from(f"<{self.block_size}I", data, _HEAD.size)
        payload = data[_HEAD.size + 4 * self.block_size:]
        if (magic, layout, stored_hash, stored_parent) != (MAGIC, self.layout, hash_, parent_hash):
            return None
        if stored_tokens != tuple(tokens) or block_hash(stored_parent, stored_tokens) != hash_:
            return None
        if length != len(payload) or zlib.crc32(payload) != crc:
            return None
        return payload

    # -- bookkeeping ------------------------------------------------------------------------------
    def drop(self, hash_: int) -> None:
        self._files.pop(hash_, None)
        self._path(hash_).unlink(missing_ok=True)

    def _adopt_existing(self) -> None:
        """Index the files a previous run of this node left (oldest first); delete foreign ones."""
        found = []
        for path in self.folder.iterdir():
            entry = self._own_entry(path) if path.name.endswith(SUFFIX) else None
            if entry is not None:
                found.append((path.stat().st_mtime_ns, int(path.stem, 16), entry))
            elif path.is_file():
                path.unlink(missing_ok=True)
        for _, hash_, entry in sorted(found):
            self._files[hash_] = entry
        while self.used_bytes > self.size_bytes:
            self.drop(next(iter(self._files)))
            self.stats.evicted += 1

    def _own_entry(self, path: Path) -> tuple[int, tuple[int, ...]] | None:
        """(parent hash, tokens) from the head of a file of this tier's layout whose name is its
        block's hash; None for anything else (the payload is checked when it is loaded)."""
        try:
            if path.stat().st_size != self.file_bytes:
                return None
            with open(path, "rb") as f:
                data = f.read(_HEAD.size + 4 * self.block_size)
            magic, layout, stored_hash, parent = _HEAD.unpack_from(data)[:4]
            tokens = struct.unpack_from(f"<{self.block_size}I", data, _HEAD.size)
        except (OSError, struct.error, ValueError):
            return None
        if magic != MAGIC or layout != self.layout or f"{stored_hash:016x}" != path.stem:
            return None
        if block_hash(parent, tokens) != stored_hash:
            return None
        return parent, tokens

    def _path(self, hash_: int) -> Path:
        return self.folder / f"{hash_:016x}{SUFFIX}"
