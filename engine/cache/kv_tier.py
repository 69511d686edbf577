"""A node's KV tier below the pool: blocks the radix cache evicts are written to a local directory
under their chained block hash, and loaded back when a prompt's prefix runs past the pool into them,
so a returning conversation reloads its prefix instead of recomputing it (write-back on eviction).

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
computes those tokens instead. The tier keeps at most `size_bytes` of files, dropping the least
recently used first. On start it indexes the files already there that carry its layout (a node
restart keeps its tier) and deletes the rest.
"""
from __future__ import annotations

import hashlib
import os
import struct
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch

from raypd.protocol.block_hash import block_hash

MAGIC = b"RAYPDKV1"
_HEAD = struct.Struct("<8sQQQIQ")  # magic, layout, hash, parent hash, crc32, payload bytes
SUFFIX = ".kv"


@dataclass(slots=True)
class TierStats:
    stored: int = 0      # blocks written
    loaded: int = 0      # blocks read back into the pool
    rejected: int = 0    # files that failed a check (deleted, recomputed)
    evicted: int = 0     # files dropped for the size bound
    bytes_written: int = 0
    bytes_read: int = 0


def layout_fingerprint(pool: torch.Tensor) -> int:
    """The KV geometry of a pool block ([layers, 2, kv heads, block size, head dim]) and its dtype."""
    text = f"{tuple(pool.shape[1:])}:{pool.dtype}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


class DiskKVTier:
    def __init__(self, folder: str | os.PathLike, size_bytes: int, pool: torch.Tensor):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.size_bytes = size_bytes
        self.pool = pool
        self.block_size = pool.shape[4]
        self.layout = layout_fingerprint(pool)
        self.file_bytes = _HEAD.size + 4 * self.block_size + pool[0].numel() * pool.element_size()
        self.stats = TierStats()
        self._files: OrderedDict[int, None] = OrderedDict()  # block hash -> present; least recently used first
        self._adopt_existing()

    @property
    def num_blocks(self) -> int:
        return len(self._files)

    @property
    def used_bytes(self) -> int:
        return len(self._files) * self.file_bytes

    def __contains__(self, block: int) -> bool:
        return block in self._files

    # -- write ------------------------------------------------------------------------------------
    def store(self, hash_: int, parent_hash: int, tokens: tuple[int, ...], block: int) -> None:
        """Keep pool block `block` (whose prefix is named hash_) in the tier."""
        if hash_ in self._files:
            self._files.move_to_end(hash_)
            return
        if self.file_bytes > self.size_bytes:
            return
        while self.used_bytes + self.file_bytes > self.size_bytes:
            self._drop(next(iter(self._files)), evicted=True)
        payload = self.pool[block].cpu().contiguous().view(torch.uint8).numpy().tobytes()
        head = _HEAD.pack(MAGIC, self.layout, hash_, parent_hash, zlib.crc32(payload), len(payload))
        path = self._path(hash_)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                f.write(head)
                f.write(struct.pack(f"<{self.block_size}I", *tokens))
                f.write(payload)
            os.replace(tmp, path)
        except OSError:  # a full or vanished disk: the block is just not kept (it is recomputed)
            tmp.unlink(missing_ok=True)
            return
        self._files[hash_] = None
        self.stats.stored += 1
        self.stats.bytes_written += self.file_bytes

    # -- read -------------------------------------------------------------------------------------
    def load(self, hash_: int, parent_hash: int, tokens: tuple[int, ...], block: int) -> bool:
        """Copy the tier's block named hash_ into pool block `block`; False (and the file gone) when it
        is missing or fails a check: the caller computes those tokens instead."""
        if hash_ not in self._files:
            return False
        try:
            data = self._path(hash_).read_bytes()
        except OSError:
            data = b""
        payload = self._verified_payload(data, hash_, parent_hash, tokens)
        if payload is None:
            self._drop(hash_, evicted=False)
            self.stats.rejected += 1
            return False
        src = torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(self.pool.dtype).view(self.pool.shape[1:])
        self.pool[block].copy_(src)
        self._files.move_to_end(hash_)
        self.stats.loaded += 1
        self.stats.bytes_read += len(data)
        return True

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
    def _adopt_existing(self) -> None:
        """Index the files a previous run of this node left (oldest first); delete foreign ones."""
        found = []
        for path in self.folder.iterdir():
            if path.name.endswith(SUFFIX) and path.stat().st_size == self.file_bytes and self._is_ours(path):
                found.append((path.stat().st_mtime_ns, int(path.stem, 16)))
            elif path.is_file():
                path.unlink(missing_ok=True)
        for _, hash_ in sorted(found):
            self._files[hash_] = None
        while self.used_bytes > self.size_bytes:
            self._drop(next(iter(self._files)), evicted=True)

    def _is_ours(self, path: Path) -> bool:
        try:
            with open(path, "rb") as f:
                magic, layout, stored_hash = _HEAD.unpack(f.read(_HEAD.size))[:3]
            return magic == MAGIC and layout == self.layout and f"{stored_hash:016x}" == path.stem
        except (OSError, struct.error, ValueError):
            return False

    def _drop(self, hash_: int, evicted: bool) -> None:
        self._files.pop(hash_, None)
        self._path(hash_).unlink(missing_ok=True)
        if evicted:
            self.stats.evicted += 1

    def _path(self, hash_: int) -> Path:
        return self.folder / f"{hash_:016x}{SUFFIX}"
